"""The one logging setup, called once by each entry point (start_main.py, start_worker.py).

The coach logs to `logs/distributed_training.log`, each worker to `logs/worker_<name>.log`,
both also to stderr, one event per line with the time, process and module.

It must not: be called from library code (modules only do `logging.getLogger(__name__)`).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

_FORMAT = "%(asctime)s %(levelname)s %(processName)s[%(process)d] %(name)s: %(message)s"


def configure_logging(log_file: str | os.PathLike | None, level: str = "INFO",
                      *, stderr: bool = True) -> None:
    """Send the root logger to `log_file` (appended; folder created) and to stderr."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)
    formatter = logging.Formatter(_FORMAT)
    if log_file is not None:
        path = Path(log_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(path, encoding="utf-8")
        file_handler.setFormatter(formatter)
        root.addHandler(file_handler)
    if stderr:
        err = logging.StreamHandler(sys.stderr)
        err.setFormatter(formatter)
        root.addHandler(err)
    # third-party chatter stays out of our INFO logs
    for noisy in ("paramiko", "watchdog", "matplotlib", "numba"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
