"""The one logging setup, called once by each entry point (start_main.py, start_worker.py).

The coach logs to `logs/distributed_training.log`, each worker to `logs/worker_<name>.log`,
both also to stderr, one event per line with the time, process and module. A message is
always one line: newlines, terminal escape sequences and other control characters in it (text
from a worker host is untrusted) are written as escapes (`\\n`, `\\x1b`), so no host can forge
a log line or recolour a terminal; a traceback keeps its lines, escaped otherwise.

It must not: be called from library code (modules only do `logging.getLogger(__name__)`).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

_FORMAT = "%(asctime)s %(levelname)s %(processName)s[%(process)d] %(name)s: %(message)s"


def escape_controls(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every control or other non-printable character written as its Python
    escape (`\\n`, `\\x1b`, `\\u2028`); spaces and printable non-ASCII text are kept."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or c == " " or (keep_newlines and c == "\n")
        else c.encode("unicode_escape").decode("ascii") for c in text)


class OneLineFormatter(logging.Formatter):
    """A Formatter whose messages are one line of printable text (`escape_controls`)."""

    def format(self, record: logging.LogRecord) -> str:
        saved = record.msg, record.args
        try:
            record.msg, record.args = escape_controls(record.getMessage()), None
            return super().format(record)
        finally:
            record.msg, record.args = saved

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        return escape_controls(super().formatException(ei), keep_newlines=True)


class CurrentStderrHandler(logging.StreamHandler):
    """A StreamHandler to whatever `sys.stderr` is when a record comes, not the stream of
    when it was made (logging's own last resort does the same): a stderr replaced or
    redirected later still gets the records, and a closed one never does."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ and setStream assign it
        pass


def configure_logging(log_file: str | os.PathLike | None, level: str = "INFO",
                      *, stderr: bool = True) -> None:
    """Send the root logger to `log_file` (appended; folder created) and to stderr."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)
    formatter = OneLineFormatter(_FORMAT)
    if log_file is not None:
        path = Path(log_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(path, encoding="utf-8")
        file_handler.setFormatter(formatter)
        root.addHandler(file_handler)
    if stderr:
        err = CurrentStderrHandler()
        err.setFormatter(formatter)
        root.addHandler(err)
    # third-party chatter stays out of our INFO logs
    for noisy in ("paramiko", "watchdog", "matplotlib", "numba"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
