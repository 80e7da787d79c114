"""The coach's child processes: one function call that can be stopped at any time (the
arena), and a logged command (the trainer).

Why not a thread: a Python thread running torch when the interpreter exits makes the C++
runtime abort with "terminate called without an active exception" (torch's intra-op thread
pool is torn down under it), which is what a Ctrl-C during the coach's evaluation printed. A
child process is stopped with SIGTERM instead and leaves nothing behind.

The child is spawned (never forked: the coach holds threads, sockets and OpenMP state) and
ignores SIGINT before it imports the function it runs (a Ctrl-C reaches the whole process
group, and importing torch takes seconds; the coach stops the child itself), and gets
SIGTERM when the coach dies (`signals.die_with_parent`). Arguments and the result cross a
pipe between two processes of this program (pickle), never anything from the network.

`launch_logged(cmd, log_path)` starts a command from the repository with its output appended
to a log, dying with the coach; `log_tail(path)` reads that log's end when it has exited, and
`terminate(popen)` stops it (SIGTERM, then SIGKILL after a grace).

It must not: be handed data that came from a worker or another host.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from training.run.logsetup import CurrentStderrHandler
from training.run.signals import die_with_parent

REPO = Path(__file__).resolve().parents[2]
TAIL_MAX_BYTES = 64 * 1024
"""At most this much of a log is read for its tail (a trainer's log may be large)."""


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


def launch_logged(cmd: Sequence[str], log_path: Path) -> subprocess.Popen:
    """Start `cmd` in the repository, its stdout and stderr appended to `log_path` (its folder
    made), stdin closed; it gets SIGTERM when the coach dies (`signals.die_with_parent`)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    out = open(log_path, "ab")
    try:
        return subprocess.Popen(list(cmd), cwd=str(REPO), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    finally:
        out.close()


def log_tail(path: Path, lines: int = 15, max_bytes: int = TAIL_MAX_BYTES) -> str:
    """The last `lines` lines of the log at `path`, from at most its last `max_bytes`."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - max_bytes))
            text = f.read(max_bytes).decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def terminate(popen: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop a launched command: SIGTERM, then SIGKILL if it is still there after `grace_s`."""
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()
