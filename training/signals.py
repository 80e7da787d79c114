"""Stop signals for the long-running entry points (coach, worker daemon, sandbox).

`on_stop_signals(callback)` makes SIGTERM and SIGINT call `callback` once. Signal handlers run
in the main thread between bytecodes, also inside an earlier handler: a second signal that
arrives while the first handler holds a lock (`threading.Event.set` takes one) would run a
second handler that waits for that lock forever. `timeout` forwarding SIGINT while `pkill`
sent one too hung the sandbox that way. Here later signals return at once, so a stop in
progress is never re-entered; SIGKILL remains the hard stop.
"""

from __future__ import annotations

import signal
from typing import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signals(callback: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call `callback()` the first time; later ones are ignored."""
    fired = False

    def handler(signum: int, frame: object) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        callback()

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
