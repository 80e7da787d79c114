"""The data of game batches: a finished game (`GameRecord`), what a batch file says of itself
(`BatchMeta`), a validated batch (`Batch`), the parts of a batch name (`BatchName`), the
run's rules every batch must meet (`BatchRules`) and the error of a batch refused
(`BatchError`).

The file format, the batch names and every check are `training.go.records`, which imports
these (and every caller may import them from there). No files, no torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

RULES = "tromp-taylor-positional-superko"
FORMAT_VERSION = 1
BATCH_SUFFIX = ".npz.zst"
DEFAULT_MAX_BYTES = 256 << 20
"""Default cap on a batch's decompressed size (a 19x19 batch of 100 games is about 30 MB)."""


@dataclass
class GameRecord:
    """One finished game of self-play, with the search's policy target for every move.

    Shapes: T moves, P = N*N + 1 policy entries (pass last).
    """

    board_size: int
    komi: float
    moves: np.ndarray
    """int16 [T]: flat index row*N+col (row 0 = top), PASS = N*N."""
    visits: np.ndarray
    """uint16 [T, N*N+1]: root visit counts per move, the policy target."""
    result: int
    """+1 black won, -1 white won, 0 draw."""
    score: float
    """Tromp-Taylor area score from black's view with komi; NaN when resigned."""
    resigned: bool
    resign_disabled: bool
    would_resign_as: int
    """0, or the colour (1 black, -1 white) that would have resigned in a resign-disabled game."""
    generation: int
    seed: int
    simulations: int
    values: np.ndarray
    """float16 [T]: root value, from the side to move's view."""
    full_search: np.ndarray | None = None
    """bool [T]: the move's `visits` row is a policy target (a full search); False: a fast
    search of playout cap randomization, trained for the value only. None: all True (a
    record read from a batch always has the array)."""
    surprise: np.ndarray | None = None
    """float16 [T]: how much the search's policy target surprised the net, KL(target ||
    root prior) in nats (0 for fast searches); the window's policy surprise weighting reads
    it. None: all 0 (a record read from a batch always has the array)."""

    @property
    def num_moves(self) -> int:
        return int(len(self.moves))


@dataclass(frozen=True)
class BatchMeta:
    """What a batch file says about itself (stored as JSON inside the file)."""

    worker: str
    generation: int
    """The generation in the file name: by convention the oldest model generation that
    played a game of the batch (games carry their own generation)."""
    board_size: int
    komi: float
    simulations: int
    max_moves: int = 0
    """The move cap the games were played under; 0 means 2 * board_size**2."""
    rules: str = RULES
    created: float = field(default_factory=time.time)
    """Unix time the batch was written."""
    version: int = FORMAT_VERSION

    @property
    def move_cap(self) -> int:
        return self.max_moves or 2 * self.board_size**2

    @classmethod
    def from_records(
        cls, worker: str, records: Sequence[GameRecord], *, max_moves: int = 0
    ) -> "BatchMeta":
        """The meta of a non-empty batch, taken from its games (generation: the oldest).

        Pass the config's `go.max_moves`: validation replays games under that move cap.
        """
        if not records:
            raise ValueError("BatchMeta.from_records needs at least one game")
        first = records[0]
        return cls(
            worker=worker,
            generation=min(int(r.generation) for r in records),
            board_size=int(first.board_size),
            komi=float(first.komi),
            simulations=max(int(r.simulations) for r in records),
            max_moves=int(max_moves),
        )


class BatchName(NamedTuple):
    worker: str
    generation: int
    seq: int


FUTURE_SLACK_S = 86_400.0
"""A batch may say it was written at most this far in the future (clocks drift)."""


@dataclass(frozen=True)
class BatchRules:
    """What the run's own config demands of every batch, whatever the batch says of itself.

    None leaves a rule to the batch's meta (reading a file outside a run)."""

    move_cap: int | None = None
    """The run's move cap (`go.max_moves`, 0 = 2 N^2); a batch under another cap is refused."""
    max_simulations: int | None = None
    """Most simulations a game may claim."""
    max_games: int | None = None
    """Most games in one batch (the run's batch size, with slack)."""
    early_pass: bool = True
    """False: a pass that is not a reply to a pass, while a move other than filling an own
    single-point eye is left, is refused (the run's self-play never plays one)."""
    cpu_budget_s: float | None = None
    """CPU seconds the whole validation of one batch may take."""


class BatchError(ValueError):
    """A batch file that must not be trained on. `kind` is a short tag per kind of failure."""

    def __init__(self, path: str | Path, reason: str, *, kind: str, game: int | None = None):
        self.path = str(path)
        self.reason = reason
        self.kind = kind
        self.game = game
        where = f"{self.path}: game {game}" if game is not None else self.path
        super().__init__(f"{where}: {reason}")


@dataclass
class Batch:
    """A validated batch: its meta, its games, and each game's boards [T+1, N*N] int8."""

    meta: BatchMeta
    records: list[GameRecord]
    boards: list[np.ndarray]
