"""Watching a folder for written files: the coach's config file, a worker's models/ folder.

`watch(folder, matches, changed)` starts a watchdog observer that sets the event `changed`
whenever a file whose path `matches` is written, created, closed after writing, or moved in
or out of `folder`. Reads never count (the coach reloading its own config must not trigger
another reload). Without watchdog, or past the kernel's inotify limits, it returns None and
logs why; the caller then polls (a modification time, a folder listing).

It must not: read the files it watches, or act on a change (the caller does, on its thread).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

WRITE_EVENTS = ("modified", "created", "moved", "closed")


def watch(folder: str | Path, matches: Callable[[str], bool],
          changed: threading.Event) -> Any | None:
    """A started observer (stop() and join() it when done), or None: poll instead."""
    try:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer
    except ImportError as e:
        log.warning("cannot watch %s (%s); polling instead", folder, e)
        return None

    class _Handler(FileSystemEventHandler):
        def on_any_event(self, event: Any) -> None:
            if event.event_type not in WRITE_EVENTS:
                return
            paths = (event.src_path, getattr(event, "dest_path", "") or "")
            if any(p and matches(str(p)) for p in paths):
                changed.set()

    try:  # making, scheduling or starting it can each meet the inotify limits
        observer = Observer()
        observer.daemon = True
        observer.schedule(_Handler(), str(folder), recursive=False)
        observer.start()
    except OSError as e:
        log.warning("cannot watch %s (%s); polling instead", folder, e)
        return None
    return observer
