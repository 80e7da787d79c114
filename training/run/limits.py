"""The process limits a long-running entry point raises at its start.

`raise_open_files_limit()` lifts the soft limit on open files (RLIMIT_NOFILE) to the hard
limit, which the kernel lets any process do, and logs the one line `open files limit: N`.
Linux distributions start processes with a soft limit of 1,024 and a far higher hard one; a
coach holds a connection per worker, a worker its search's files, and a trainer a replay
window over thousands of batch files (whose maps `training.learn.replay_buffer` bounds),
so each entry point raises it first, and the log says what it got.

It must not: be called from library code (the entry points call it once, after their
logging setup), or lower a limit.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

_NR_OPEN = "/proc/sys/fs/nr_open"  # Linux's ceiling for RLIMIT_NOFILE (an unlimited hard)


def raise_open_files_limit() -> int:
    """Raise the soft open-files limit to the hard limit; returns and logs the soft limit now
    in force (-1 for unlimited, or where the platform has no such limit)."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        log.info("open files limit: -1 (no RLIMIT_NOFILE on this platform)")
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard
    if hard == resource.RLIM_INFINITY:
        want = _nr_open()  # Linux refuses an unlimited soft limit for files
    if want != resource.RLIM_INFINITY and (soft == resource.RLIM_INFINITY or soft >= want):
        want = soft  # already there (never lower it)
    if want != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as e:
            log.warning("open files limit: cannot raise %d to %d: %s", soft, want, e)
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    shown = -1 if soft == resource.RLIM_INFINITY else int(soft)
    log.info("open files limit: %d", shown)
    return shown


def _nr_open() -> int:
    try:
        with open(_NR_OPEN, "rb") as f:
            return int(f.read(64).strip())
    except (OSError, ValueError):
        return 1 << 20  # Linux's default nr_open
