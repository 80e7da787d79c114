"""One coach per run folder: `run_dir/coach.lock`, an exclusive fcntl lock with the pid inside.

The lock, not the file, is what counts: the kernel drops it when the coach exits, even by
SIGKILL, so a crashed coach never leaves a stale lock behind; the pid in the file is only
there to name the running coach in the refusal.

It must not: delete or move anything in the run folder.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from training.run.run_dir import LOCK_NAME


class RunFolderBusy(Exception):
    """Another coach runs on this run folder; the message names its pid."""


class RunLock:
    """`run_dir/coach.lock`: an exclusive fcntl lock held while a coach runs, with its pid
    inside (the lock, not the file, is what counts: a crashed coach leaves no stale lock)."""

    NAME = LOCK_NAME

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / self.NAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 200).decode(errors="replace").split()
            finally:
                os.close(fd)
            pid = holder[0] if holder else "unknown"
            raise RunFolderBusy(
                f"{self.path.parent}: a coach is already running on this run folder (pid "
                f"{pid}); stop it first (kill -TERM {pid}) or use another --run-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None
