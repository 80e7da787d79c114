"""Requests from the command line to a running coach, as files (`distributed/requests/`).

`python distributed/ssh_connector.py --restart worker1` drops `restart_worker1` here
(atomically) and waits a few seconds. A running coach calls `take_requests()` once per loop: it
claims each file by deleting it (so exactly one party acts on it) and restarts the worker
itself, keeping its own restart count and backoff. If no coach took the file in time, the
command line deletes it (again, whoever deletes it owns it) and restarts the worker directly
over SSH. `--direct` skips the coach.

It must not: act on the requests itself.
"""

from __future__ import annotations

import time
from pathlib import Path

from distributed.transfer import write_atomic

DEFAULT_DIR = Path("distributed", "requests")
"""Relative to the folder the coach and `ssh_connector.py --restart` run in (as status.txt)."""
ACTIONS = ("restart",)


def request_restart(name: str, requests_dir: Path = DEFAULT_DIR) -> Path:
    """Drop a restart request for worker `name`; returns its path."""
    requests_dir.mkdir(parents=True, exist_ok=True)
    path = requests_dir / f"restart_{name}"
    write_atomic(path, f"{time.time():.3f}\n")
    return path


def take_requests(requests_dir: Path = DEFAULT_DIR) -> list[tuple[str, str]]:
    """Claim every pending request: [(action, worker name)], oldest first (coach side)."""
    if not requests_dir.is_dir():
        return []
    found = []
    for path in requests_dir.iterdir():
        action, sep, name = path.name.partition("_")
        if not sep or action not in ACTIONS or path.name.endswith(".tmp"):
            continue
        try:
            mtime = path.stat().st_mtime
            path.unlink()  # the claim: only one party's unlink succeeds
        except FileNotFoundError:
            continue
        found.append((mtime, action, name))
    return [(a, n) for _, a, n in sorted(found)]


def wait_taken(path: Path, timeout_s: float) -> bool:
    """True once `path` is gone (a coach claimed it) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not path.exists():
            return True
        time.sleep(0.1)
    return not path.exists()


def withdraw(path: Path) -> bool:
    """Take back our own request; False if a coach claimed it first."""
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
