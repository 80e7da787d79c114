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


_CHILD_UNDER_CTRL_C = r"""
import os, signal, sys, threading, time, multiprocessing
from training.run.child_process import run_in_child
from training.learn.net import _plain  # a function of a module that imports torch

out = {}
def call():
    try:
        out["value"] = run_in_child(_plain, 7, stop=threading.Event())
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
t = threading.Thread(target=call)
t.start()
sent = 0
deadline = time.monotonic() + 60
while t.is_alive() and time.monotonic() < deadline:
    for child in multiprocessing.active_children():
        try:
            with open(f"/proc/{child.pid}/maps") as maps:
                importing = "libtorch" in maps.read()
        except OSError:
            continue
        if importing:  # Ctrl-C while the child loads torch
            os.kill(child.pid, signal.SIGINT)
            sent += 1
    time.sleep(0.005)
t.join()
print("sent", sent, out)
"""


def test_a_child_ignores_ctrl_c_while_it_imports_torch():
    """The coach's arena child ignores SIGINT before it imports the function it runs: a Ctrl-C
    (which reaches the coach's whole process group) while the child still loads torch
    (seconds) neither kills it nor prints a traceback; the coach stops it itself."""
    out = subprocess.run([sys.executable, "-c", _CHILD_UNDER_CTRL_C], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[1]) >= 3, out.stdout  # Ctrl-Cs came while it loaded torch
    assert "'error'" not in out.stdout and "'value': 7" in out.stdout, out.stdout
    assert "Traceback" not in out.stderr and "KeyboardInterrupt" not in out.stderr, out.stderr
