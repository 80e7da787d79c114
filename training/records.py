"""Finished self-play games: `GameRecord`, game batch files, and SGF export.

Vocabulary (see `training.coords`): N is the board size, a move is a flat index
``row * N + col`` (row 0 = top) or PASS = ``N * N``. A *game batch* is one file of finished
games from one worker and one model generation (docs/DESIGN.md, "Game batch").

This module must not import torch, and must not trust a batch file: readers validate every
array and replay every game through the rules before the trainer sees it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)


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

    @property
    def num_moves(self) -> int:
        return int(len(self.moves))
