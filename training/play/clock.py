"""A game clock for the GTP engine: what `time_settings`, `kgs-time_settings` and `time_left`
say, and how long the next move may think.

    clock = Clock()
    clock.settings(main=300, byo_time=5, byo_stones=1)   # GTP time_settings 300 5 1
    clock.time_left(BLACK, 281.5, 0)                     # GTP time_left black 281.5 0
    seconds = clock.budget(BLACK, board_size=9, moves_played=12)   # None: no time limit
    share, limit = clock.allowance(BLACK, board_size=9, moves_played=12)

Kinds (GTP's `time_settings main byo_time byo_stones`):
- no limit: byo_time > 0 and byo_stones == 0 (GTP's convention), or never set: `budget` is None
  and the engine thinks by its own budget (--seconds-per-move or --simulations);
- absolute: byo_time == 0: the main time is all there is;
- Canadian byo-yomi: `byo_stones` stones in each period of `byo_time` seconds after the main time
  (`kgs-time_settings canadian`); Japanese byo-yomi (`kgs-time_settings byoyomi M B P`) is P
  periods of one stone each, which KGS reports in `time_left` as periods left.

The budget is a share of what is left, never all of it: in main time, the time left over the
moves still expected (at least `MIN_MOVES_LEFT`, more early in a game), plus a part of one
byo-yomi period when there is byo-yomi to fall back on; in byo-yomi, the period over its stones.
Both keep `SAFETY` (the controller's and the pipes' latency) in hand. `allowance` gives the budget
and the most the move may take without losing on time (the main time left, or the period, less
the same margins): a search that must do a minimum of simulations may go past the budget up to
that limit. Without `time_left` from the controller the clock counts down by the time each
genmove took.

It must not: search or keep the board (the engine calls `budget` and `spent`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SAFETY_S = 0.5
"""Seconds kept in hand on every move for the controller's and the pipes' latency."""
SAFETY_FRACTION = 0.1
"""And this share of a byo-yomi period."""
MIN_MOVES_LEFT = 10
"""The main time is never spread over fewer moves than this."""
MIN_SECONDS = 0.05
"""The shortest budget: one chunk of the search still runs."""


@dataclass
class Side:
    """One player's clock: main time left, then `stones` stones in `period` seconds."""

    main: float = 0.0
    period: float = 0.0  # seconds left in the current byo-yomi period
    stones: int = 0  # stones left to play in it; 0 while in main time


class Clock:
    """The clock of both players and the settings of the game."""

    def __init__(self) -> None:
        self.limited = False
        self.main_time = 0.0
        self.byo_time = 0.0
        self.byo_stones = 0
        self.sides: dict[int, Side] = {}

    def settings(self, main: float, byo_time: float, byo_stones: int) -> None:
        """GTP `time_settings`: raises ValueError for negative or non-finite values."""
        for name, v in (("main_time", main), ("byo_yomi_time", byo_time),
                        ("byo_yomi_stones", byo_stones)):
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        self.limited = not (byo_time > 0 and byo_stones == 0)
        self.main_time, self.byo_time = float(main), float(byo_time)
        self.byo_stones = int(byo_stones)
        self.sides = {}

    def kgs_settings(self, kind: str, values: list[float]) -> None:
        """`kgs-time_settings none | absolute M | canadian M B S | byoyomi M B P`."""
        counts = {"none": 0, "absolute": 1, "canadian": 3, "byoyomi": 3}
        if kind not in counts or len(values) < counts[kind]:
            raise ValueError("expected none, absolute M, canadian M B S or byoyomi M B P")
        if kind == "none":
            self.settings(0, 1, 0)
        elif kind == "absolute":
            self.settings(values[0], 0, 0)
        elif kind == "canadian":
            self.settings(values[0], values[1], int(values[2]))
        else:  # Japanese byo-yomi: each period is one stone, time_left counts periods
            self.settings(values[0], values[1], 1 if values[2] > 0 else 0)
            self.limited = True

    def time_left(self, color: int, seconds: float, stones: int) -> None:
        """GTP `time_left color time stones`: stones 0 = still in main time."""
        if not math.isfinite(seconds) or seconds < 0 or stones < 0:
            raise ValueError("time_left needs a finite time >= 0 and stones >= 0")
        if stones == 0:
            self.sides[color] = Side(main=float(seconds))
        else:
            self.sides[color] = Side(main=0.0, period=float(seconds), stones=int(stones))

    def _side(self, color: int) -> Side:
        if color not in self.sides:
            self.sides[color] = Side(main=self.main_time)
        return self.sides[color]

    def budget(self, color: int, board_size: int, moves_played: int) -> float | None:
        """Seconds the next move of `color` may think; None without a time limit."""
        allowed = self.allowance(color, board_size, moves_played)
        return None if allowed is None else allowed[0]

    def allowance(self, color: int, board_size: int, moves_played: int
                  ) -> tuple[float, float] | None:
        """(budget, limit): the seconds the next move of `color` should think, and the most
        it may think without losing on time (>= the budget); None without a time limit."""
        if not self.limited:
            return None
        side = self._side(color)
        byo = self.byo_time > 0 and self.byo_stones > 0
        if side.stones > 0:  # in byo-yomi: the period over its stones, some kept in hand
            share = side.period / side.stones
            budget = max(MIN_SECONDS, share - SAFETY_S - SAFETY_FRACTION * share)
            return budget, budget
        expected = max(MIN_MOVES_LEFT, 0.4 * board_size * board_size - moves_played / 2)
        share = side.main / expected
        if byo:
            period_share = self.byo_time / self.byo_stones
            share += 0.5 * period_share
            limit = side.main + period_share - SAFETY_S - SAFETY_FRACTION * period_share
        else:
            limit = side.main - SAFETY_S
        budget = max(MIN_SECONDS, min(share, limit))
        return budget, max(budget, limit)

    def spent(self, color: int, seconds: float) -> None:
        """Count down `color`'s clock by a move's time (the controller's time_left corrects
        it before the next move when it sends one)."""
        if not self.limited:
            return
        side = self._side(color)
        if side.stones == 0:
            side.main -= seconds
            if side.main >= 0 or not (self.byo_time > 0 and self.byo_stones > 0):
                side.main = max(0.0, side.main)
                return
            over = -side.main
            side.main = 0.0
            side.period, side.stones = self.byo_time - over, self.byo_stones
            if side.stones > 1:
                side.stones -= 1
            else:
                side.period, side.stones = self.byo_time, self.byo_stones
            return
        side.period -= seconds
        side.stones -= 1
        if side.stones == 0:  # a new period
            side.period, side.stones = self.byo_time, self.byo_stones
