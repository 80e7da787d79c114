"""A name a worker lists in its outbox, untrusted, and the local names built from it.

A listing may hold anything: a folder part (`../x`), 255 bytes of odd characters, another
worker's batch name. `is_bare_name` says whether a name is a plain file name at all (only
those are fetched or handed back to the source); `name_digest` and `safe_worker` give short,
fixed-length local names for the collector's `incoming/` and `quarantine/` files, whatever
was listed or whatever a worker is called.

It must not: touch any file, or trust a name it has not checked.
"""

from __future__ import annotations

import hashlib


def is_bare_name(name: str) -> bool:
    """A plain file name: no folder part, not . or .., no NUL, not too long.

    Odd but plain names (spaces, newlines, `;`) are safe to reject: names are never handed
    to a shell, and only owned batch names (bounded by their rule) become local file names.
    """
    return (
        isinstance(name, str)
        and bool(name)
        and name not in (".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and len(name.encode("utf-8", "surrogateescape")) <= 255
    )


def name_digest(worker: str, name: str) -> str:
    """A short, fixed-length local file name for a listed name (which may be 255 bytes of
    anything: a local name built from it could pass NAME_MAX with a suffix)."""
    raw = f"{worker}\0{name}".encode("utf-8", "surrogateescape")
    return hashlib.sha256(raw).hexdigest()[:24]


def safe_worker(worker: str) -> str:
    """`worker` as a folder name: itself when plain and short, else its digest."""
    return worker if is_bare_name(worker) and len(worker) <= 64 else name_digest(worker, "")
