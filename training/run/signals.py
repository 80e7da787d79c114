"""Stop signals for the long-running entry points (coach, worker daemon, sandbox).

`on_stop_signals(callback)` makes SIGTERM and SIGINT call `callback` once. Signal handlers run
in the main thread between bytecodes, also inside an earlier handler: a second signal that
arrives while the first handler holds a lock (`threading.Event.set` takes one) would run a
second handler that waits for that lock forever. `timeout` forwarding SIGINT while `pkill`
sent one too hung the sandbox that way. Here later signals return at once, so a stop in
progress is never re-entered; SIGKILL remains the hard stop.

`die_with_parent()` (a `preexec_fn`, or called in a child) makes the parent's death, even by
SIGKILL, deliver SIGTERM to this process, so that no trainer outlives its coach or launcher.
"""

from __future__ import annotations

import signal
from typing import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signals(callback: Callable[..., None], *, with_signal: bool = False) -> None:
    """SIGTERM and SIGINT call `callback()` the first time (`callback(signum)` with
    `with_signal`); later ones are ignored."""
    fired = False

    def handler(signum: int, frame: object) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        callback(signum) if with_signal else callback()

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)


def die_with_parent() -> None:
    """Get SIGTERM when the parent process dies, even by SIGKILL (Linux; a no-op elsewhere).

    Used for the coach's trainer child (a restarted coach never races an orphaned round), for
    the ranks under torchrun (each in its own session, so stopping a node's trainer by its
    process group would otherwise leave them running) and for the relaunching trainer's
    torchrun.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
