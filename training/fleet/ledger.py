"""One line of the run's ledger (`runs/<run>/ledger.jsonl`, `RunDir.ledger`), typed.

The collector (`training.fleet.collector`) appends a `LedgerEntry` for every batch it
ingests and every file it rejects, and rebuilds its counts from them at start; the coach
reads the ingested ones for status.txt's window. A line is JSON (`to_json`/`from_json`);
lines written by earlier versions lack some fields and read with the defaults, and a line
that is not an entry is a ValueError (the collector skips it as torn).

It must not: read or write the ledger file (the collector owns it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LedgerEntry:
    """One line of `ledger.jsonl`: a batch ingested or a file rejected (see the module
    docstring). Lines written by earlier versions lack some fields; they read as the
    defaults. `key` is the batch name, or `foreign:<worker>:<name>` / `reused:...` for a
    rejected file that is not (or not only) the lister's batch."""

    name: str
    worker: str
    status: str  # "ingested" or "rejected"
    time: float
    generation: int = -1  # from the batch name; -1 for foreign files
    seq: int = -1
    games: int = 0
    positions: int = 0
    size: int = 0  # bytes of the file in replay/ (or quarantine/)
    sha256: str = ""  # of the bytes the worker sent (before any repeated game was dropped)
    reason: str = ""
    kept: bool | None = None  # a rejected file's bytes are in quarantine/
    listed_name: str = ""  # what the worker listed, when the key is not the name itself
    generation_mean: float | None = None  # mean model generation of its games
    coach_generation: int = -1  # the newest published generation when it was ingested
    game_keys: tuple[str, ...] = ()  # `game_key` of each game
    repeats: int = 0  # games dropped from the batch: they repeated games ingested before

    @property
    def ingested(self) -> bool:
        return self.status == "ingested"

    @classmethod
    def from_json(cls, data: Any) -> "LedgerEntry":
        """An entry from a parsed ledger line; ValueError when it is not one."""
        if not isinstance(data, dict):
            raise ValueError("a ledger line must be a JSON object")
        known = {f.name: f for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for k in ("name", "worker", "status", "time"):
            if k not in values:
                raise ValueError(f"a ledger line without {k!r}")
        if "game_keys" in values:
            values["game_keys"] = tuple(str(x) for x in values["game_keys"])
        entry = cls(**values)
        for k in ("name", "worker", "status"):
            if not isinstance(getattr(entry, k), str):
                raise ValueError(f"ledger {k} must be a string")
        for k in ("generation", "seq", "games", "positions", "size", "coach_generation",
                  "repeats"):
            if not isinstance(getattr(entry, k), int) or isinstance(getattr(entry, k), bool):
                raise ValueError(f"ledger {k} must be an integer")
        return entry

    def to_json(self) -> dict:
        """The line's JSON object: the fields that hold something (older readers see the
        keys they know)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default or f.name in ("generation", "seq", "games", "positions",
                                                "size", "sha256"):
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out
