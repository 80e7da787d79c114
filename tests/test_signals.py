"""training.run.signals: a second stop signal inside the first handler must not deadlock."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

# The callback holds a lock (as threading.Event.set does) while a second SIGTERM arrives; the
# nested handler runs at the next bytecode in the main thread. A handler that called the
# callback again would wait for the lock forever.
CHILD = """
import os, signal, threading, time
from training.run.signals import on_stop_signals
lock = threading.Lock()
calls = []
def stop():
    with lock:
        calls.append(1)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            time.sleep(0)
on_stop_signals(stop)
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.1)
print("stopped", len(calls))
"""

NAIVE = CHILD.replace("from training.run.signals import on_stop_signals",
                      "def on_stop_signals(cb):\n"
                      "    for s in (signal.SIGTERM, signal.SIGINT):\n"
                      "        signal.signal(s, lambda *a: cb())")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=10)


def test_a_nested_stop_signal_returns_at_once_and_the_callback_runs_once():
    out = _run(CHILD)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["stopped", "1"]


def test_the_naive_handler_deadlocks_in_the_same_situation():
    """The case the guard exists for is real: without it the child hangs."""
    with pytest.raises(subprocess.TimeoutExpired):
        _run(NAIVE)
