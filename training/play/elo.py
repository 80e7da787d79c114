"""Elo from game results: estimates with a 95% confidence interval, chained ratings, SPRT.

Vocabulary:
- **W, D, L**: wins, draws and losses of player A against player B; n = W + D + L.
- **score** s = (W + D / 2) / n; the logistic Elo difference is -400 * log10(1 / s - 1).
- **CI**: the 95% interval of the score (normal approximation, per-game variance of the
  W/D/L outcomes) mapped through the same curve, so it is asymmetric in Elo.
- **chained rating**: generation g's rating is the rating of the generation it played plus
  the measured difference; the CI half-widths add in quadrature along the chain.
- **SPRT** as Leela Zero's validation (the fishtest "BayesElo" test): H0 says A is elo0
  stronger, H1 says elo1 stronger (BayesElo units); the log-likelihood ratio of the W/D/L
  counts is compared with log(beta / (1 - alpha)) (accept H0) and log((1 - beta) / alpha)
  (accept H1); the draw rate is estimated from the games played.

Pure functions on numbers: no torch, no files, no games.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054


class WinsDrawsLosses:
    """What a W/D/L record means, spelled once: its games and A's score (a draw is half a
    win; 0.5 before any game). A base of the arena's `MatchResult` and of `EloEstimate`."""

    wins: int
    draws: int
    losses: int

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    @property
    def score(self) -> float:
        return (self.wins + 0.5 * self.draws) / self.games if self.games else 0.5


@dataclass(frozen=True)
class EloEstimate(WinsDrawsLosses):
    """Elo difference of A over B from W/D/L, with its 95% confidence interval."""

    wins: int
    draws: int
    losses: int
    elo: float
    ci_low: float
    ci_high: float

    @property
    def ci_half_width(self) -> float:
        return (self.ci_high - self.ci_low) / 2


def elo_from_score(score: float) -> float:
    """Logistic Elo difference for an expected score in (0, 1)."""
    if not 0.0 < score < 1.0:
        raise ValueError(f"score must be strictly between 0 and 1, got {score}")
    return -400.0 * math.log10(1.0 / score - 1.0)


def score_from_elo(elo: float) -> float:
    """Expected score of a player `elo` points stronger."""
    return 1.0 / (1.0 + 10.0 ** (-elo / 400.0))


def estimate(wins: int, draws: int, losses: int, z: float = Z95) -> EloEstimate:
    """The Elo difference and its CI from W/D/L counts.

    A clean sweep has no finite maximum-likelihood Elo; the score is then clamped to
    1/(2n) from 0 or 1 (half a game), which keeps the numbers finite and honest in sign.
    """
    if min(wins, draws, losses) < 0:
        raise ValueError(f"counts must be >= 0, got W={wins} D={draws} L={losses}")
    n = wins + draws + losses
    if n == 0:
        return EloEstimate(0, 0, 0, 0.0, -math.inf, math.inf)
    s = (wins + 0.5 * draws) / n
    var = (wins * (1 - s) ** 2 + draws * (0.5 - s) ** 2 + losses * s**2) / n
    eps = 0.5 / n

    def _elo(p: float) -> float:
        return elo_from_score(min(max(p, eps), 1 - eps))

    if var == 0.0:
        # Every game had the same outcome: the normal interval collapses to a point, so use
        # Wilson's score interval, which stays honest for sweeps and small n.
        centre = (s + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(s * (1 - s) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return EloEstimate(wins, draws, losses, _elo(s), _elo(centre - half),
                           _elo(centre + half))
    stderr = math.sqrt(var / n)
    return EloEstimate(wins, draws, losses, _elo(s), _elo(s - z * stderr), _elo(s + z * stderr))


def chain(previous_elo: float, previous_half_width: float, step: EloEstimate
          ) -> tuple[float, float, float]:
    """(rating, ci_low, ci_high) of a player measured against one rated `previous_elo`."""
    half = math.hypot(previous_half_width, step.ci_half_width)
    rating = previous_elo + step.elo
    return rating, rating - half, rating + half


# ------------------------------------------------------------------------------------ SPRT


@dataclass(frozen=True)
class SprtResult:
    llr: float
    lower: float
    """Accept H0 (A is not elo1 stronger) at or below this."""
    upper: float
    """Accept H1 (A is elo1 stronger) at or above this."""

    @property
    def decision(self) -> str:
        """"H1" (promote), "H0" (reject) or "continue" (play more games)."""
        if self.llr >= self.upper:
            return "H1"
        if self.llr <= self.lower:
            return "H0"
        return "continue"


def _bayeselo_probs(elo: float, drawelo: float) -> tuple[float, float, float]:
    win = 1.0 / (1.0 + 10.0 ** ((-elo + drawelo) / 400.0))
    loss = 1.0 / (1.0 + 10.0 ** ((elo + drawelo) / 400.0))
    return win, 1.0 - win - loss, loss


def sprt(wins: int, draws: int, losses: int, elo0: float = 0.0, elo1: float = 35.0,
         alpha: float = 0.05, beta: float = 0.05) -> SprtResult:
    """Leela Zero's SPRT on W/D/L counts (BayesElo model, draw Elo from the games)."""
    lower = math.log(beta / (1.0 - alpha))
    upper = math.log((1.0 - beta) / alpha)
    if wins + draws + losses == 0:
        return SprtResult(0.0, lower, upper)
    # Half a game of pseudo-count in each bin keeps the draw estimate finite (fishtest).
    w, d, l_ = wins + 0.5, draws + 0.5, losses + 0.5
    n = w + d + l_
    pw, pl = w / n, l_ / n
    drawelo = 200.0 * math.log10((1.0 - pl) / pl * (1.0 - pw) / pw)
    p0 = _bayeselo_probs(elo0, drawelo)
    p1 = _bayeselo_probs(elo1, drawelo)
    llr = (
        wins * math.log(p1[0] / p0[0])
        + draws * math.log(p1[1] / p0[1])
        + losses * math.log(p1[2] / p0[2])
    )
    return SprtResult(llr, lower, upper)
