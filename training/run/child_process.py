"""One function call in a child process that can be stopped at any time (the coach's arena).

Why not a thread: a Python thread running torch when the interpreter exits makes the C++
runtime abort with "terminate called without an active exception" (torch's intra-op thread
pool is torn down under it), which is what a Ctrl-C during the coach's evaluation printed. A
child process is stopped with SIGTERM instead and leaves nothing behind.

The child is spawned (never forked: the coach holds threads, sockets and OpenMP state) and
ignores SIGINT before it imports the function it runs (a Ctrl-C reaches the whole process
group, and importing torch takes seconds; the coach stops the child itself), and gets
SIGTERM when the coach dies (`signals.die_with_parent`). Arguments and the result cross a
pipe between two processes of this program (pickle), never anything from the network.

It must not: be handed data that came from a worker or another host.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import sys
import threading
import time
from typing import Any, Callable

from training.run.logsetup import CurrentStderrHandler


class ChildStopped(Exception):
    """The call was stopped before it finished (the coach is stopping)."""


class ChildFailed(Exception):
    """The child raised or died; the message has the child's error."""


def _logging_of_this_process() -> tuple[str | None, str, bool]:
    """(log file, level, to stderr) of the root logger, for the child to log the same way."""
    root = logging.getLogger()
    files = [h.baseFilename for h in root.handlers if isinstance(h, logging.FileHandler)]
    to_stderr = any(isinstance(h, CurrentStderrHandler)
                    or (type(h) is logging.StreamHandler and h.stream is sys.stderr)
                    for h in root.handlers)
    return (files[0] if files else None), logging.getLevelName(root.level), to_stderr


def _child_main(conn, where: tuple[str, str], args: tuple,
                logs: tuple[str | None, str, bool]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import importlib

    from training.run.logsetup import configure_logging
    from training.run.signals import die_with_parent

    die_with_parent()
    if logs[0] is not None or logs[2]:
        configure_logging(logs[0], logs[1], stderr=logs[2])
    try:
        fn = getattr(importlib.import_module(where[0]), where[1])  # torch: after SIG_IGN
        conn.send((True, fn(*args)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, then exit
        conn.send((False, f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def run_in_child(fn: Callable, *args: Any, stop: threading.Event,
                 grace_s: float = 5.0) -> Any:
    """`fn(*args)` in a spawned child; its result, or ChildStopped once `stop` is set (the
    child is terminated), or ChildFailed. `fn` must be a module-level function."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, daemon=True,
                       args=(child, (fn.__module__, fn.__qualname__), args,
                             _logging_of_this_process()))
    proc.start()
    child.close()
    try:
        while True:
            if parent.poll(0.2):
                try:
                    ok, value = parent.recv()
                except EOFError:
                    raise ChildFailed(f"{fn.__name__}: the child exited with code "
                                      f"{proc.exitcode}") from None
                if not ok:
                    raise ChildFailed(f"{fn.__name__}: {value}")
                return value
            if stop.is_set():
                raise ChildStopped(fn.__name__)
            if not proc.is_alive() and not parent.poll(0):
                raise ChildFailed(f"{fn.__name__}: the child exited with code {proc.exitcode}")
    finally:
        parent.close()
        if proc.is_alive():
            proc.terminate()
            deadline = time.monotonic() + grace_s
            proc.join(timeout=grace_s)
            if proc.is_alive() and time.monotonic() >= deadline:
                proc.kill()
        proc.join(timeout=grace_s)
