"""Ratings against a fixed pool of opponents: Wilson intervals and an anchored Elo fit.

Vocabulary:
- **score**: points of player A against B, a win 1 and a tie 1/2, over n games.
- **Wilson interval**: the 95% interval of a win rate (Wilson 1927), which, unlike the normal
  approximation, stays inside [0, 1] and is not empty at 0 or n wins out of n.
- **pool**: opponents whose strength does not change (the random player, GNU Go levels).
  Every player (a generation at a search budget, or a pool member) gets a rating; the
  logistic Elo model says A scores 1 / (1 + 10^((R_B - R_A) / 400)) against B.
- **anchor**: one pool member whose rating is fixed (GNU Go level 1 at `ANCHOR_ELO`, see
  `training.strength`); the rest, pool members included, are fitted to all the games at
  once. Pool members never play each other: their ratings follow from the games our players
  played against several of them.
- **fit**: the maximum of the likelihood times a weak Gaussian prior (mean the anchor's
  rating, `PRIOR_SD`) on every free rating, so that 0 or n wins out of n give a finite
  rating instead of infinity; with a few wins and losses it is within a few Elo of the
  maximum-likelihood rating. The 95% interval is +-1.96 standard errors from the curvature
  (the inverse Hessian) at the maximum.

Pure functions on numbers: no games, no files, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

Z95 = 1.959963984540054
PRIOR_SD = 800.0
"""Elo; the prior's spread: weak against tens of games, decisive only with none."""
_K = math.log(10.0) / 400.0


def wilson(points: float, games: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson interval of a win rate of `points` out of `games` ((0, 1) for no games)."""
    if games <= 0:
        return 0.0, 1.0
    if not 0 <= points <= games:
        raise ValueError(f"points must be within 0..{games}, got {points}")
    p = points / games
    denominator = 1 + z * z / games
    centre = (p + z * z / (2 * games)) / denominator
    half = z * math.sqrt(p * (1 - p) / games + z * z / (4 * games * games)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Result:
    """`points` of `player` against `opponent` in `games` games."""

    player: str
    opponent: str
    points: float
    games: int


@dataclass(frozen=True)
class Rating:
    elo: float
    ci_low: float
    ci_high: float


def fit(results: Sequence[Result], anchor: str, anchor_elo: float,
        prior_sd: float = PRIOR_SD) -> dict[str, Rating]:
    """Ratings of every player in `results`, `anchor` fixed at `anchor_elo` (see the module
    docstring). Raises ValueError if the anchor played no game."""
    names = sorted({r.player for r in results} | {r.opponent for r in results})
    if anchor not in names:
        raise ValueError(f"the anchor {anchor!r} played no game")
    free = [n for n in names if n != anchor]
    index = {n: i for i, n in enumerate(free)}
    out = {anchor: Rating(anchor_elo, anchor_elo, anchor_elo)}
    if not free:
        return out
    x = np.full(len(free), float(anchor_elo))

    def rating(name: str) -> float:
        return anchor_elo if name == anchor else x[index[name]]

    for _ in range(200):  # Newton's method on a concave function: a handful of steps
        grad = -(x - anchor_elo) / prior_sd**2
        hess = -np.eye(len(free)) / prior_sd**2
        for r in results:
            if r.games == 0:
                continue
            p = 1.0 / (1.0 + math.exp(-_K * (rating(r.player) - rating(r.opponent))))
            g = _K * (r.points - r.games * p)
            h = _K * _K * r.games * p * (1 - p)
            a, b = index.get(r.player), index.get(r.opponent)
            if a is not None:
                grad[a] += g
                hess[a, a] -= h
            if b is not None:
                grad[b] -= g
                hess[b, b] -= h
            if a is not None and b is not None:
                hess[a, b] += h
                hess[b, a] += h
        step = np.linalg.solve(hess, -grad)
        step = np.clip(step, -400.0, 400.0)  # far from the maximum the curvature misleads
        x += step
        if np.max(np.abs(step)) < 1e-6:
            break
    se = np.sqrt(np.diag(np.linalg.inv(-hess)))
    for name, i in index.items():
        out[name] = Rating(float(x[i]), float(x[i] - Z95 * se[i]), float(x[i] + Z95 * se[i]))
    return out
