"""How much the replay window holds, and whose games: its size and each worker's share.

`window_size` is KataGo's growing window (min_positions * (total / min_positions) ** growth,
clamped); `select_newest` is the window's rule, shared by the trainer (units = games,
`training.learn.replay_buffer`) and status.txt (units = batches, `training.coach`): the newest
units up to the size, where no worker holds more than its `share_fractions` of the rows held.
Pure arithmetic over (owner, positions) lists: no files, no arrays.
"""

from __future__ import annotations

import math
from typing import Collection, Mapping, Sequence


def window_size(total: int, min_positions: int, max_positions: int, growth: float) -> int:
    """Positions in the window for `total` positions on disk (KataGo's growing window)."""
    if total <= min_positions:
        return int(total)
    size = min_positions * (total / min_positions) ** growth
    return int(min(total, max_positions, max(min_positions, math.floor(size))))


WINDOW_SHARE_SLACK = 1.5
"""A worker's games may fill up to 1.5 times its weight's share of the window held (2 equal
workers: 75% each; 4: 37.5%)."""


_SOLVE_ROUNDS = 40


def share_fractions(owners: Sequence[str], weights: Mapping[str, float],
                    slack: float | None) -> dict[str, float]:
    """Most of the window each worker's games may hold, as a fraction of the rows held: its
    weight's share (`distributed.worker_weights`, 1.0 when unlisted) among every worker with
    games in `owners`, times `slack`, at most 1. 1.0 for everyone without `slack` or with a
    single worker. A worker whose newest games are old still counts: a flood from another
    cannot push its older games out of their share, and a worker alone among the recent ones
    never holds more than its share while others have games in the window."""
    names = sorted(set(owners))
    if slack is None or len(names) < 2:
        return {n: 1.0 for n in names}
    w = {n: max(float(weights.get(n, 1.0)), 0.0) for n in names}
    total = sum(w.values()) or 1.0
    return {n: min(1.0, slack * w[n] / total) for n in names}


def take_newest(units: Sequence[tuple[str, int]], target: int,
                caps: Mapping[str, float], rows: Sequence[float] | None = None) -> list[int]:
    """The window's greedy pass: of `units` (owner, positions), ordered oldest first, the
    indices taken newest first until `target` positions are held, skipping an owner once it
    holds its cap, counted in `rows` (the sampled rows of each unit; its positions without
    them); returned oldest first. `select_newest` chooses the caps."""
    chosen: list[int] = []
    held = 0
    held_by: dict[str, float] = {}
    for i in range(len(units) - 1, -1, -1):
        if held >= target:
            break
        owner, n = units[i]
        if held_by.get(owner, 0) >= caps.get(owner, math.inf):
            continue
        chosen.append(i)
        held += n
        held_by[owner] = held_by.get(owner, 0) + (n if rows is None else rows[i])
    chosen.reverse()
    return chosen


def select_newest(units: Sequence[tuple[str, int]], target: int,
                  weights: Mapping[str, float], slack: float | None,
                  rows: Sequence[float] | None = None,
                  owners: Collection[str] | None = None) -> list[int]:
    """The window's rule, shared by the trainer (units = games) and status.txt (units =
    batches, `training.coach`): of `units` (owner, positions), ordered oldest first, the
    newest up to `target` positions, where no owner holds more than its `share_fractions`
    of the rows held (`rows[i]`: the sampled rows of unit i, `sample_rows`' expectation; its
    positions without them). Returned oldest first.

    Shares are measured on what is held, not on the target: an owner whose share is f holds
    at most f * R rows, where R is the largest total the others can match (R <= the rows
    held). Found by a few greedy passes (`take_newest`), each with R from the last one's
    counts (the owners at their cap hold f * R, the others what they had).

    `owners`: the set of every unit's owner, where the caller keeps it (the coach's collector
    does), so that a window over a million units costs what it takes, not a pass over all."""
    fractions = share_fractions(list(owners) if owners is not None else
                                [o for o, _ in units], weights, slack)
    if all(f >= 1.0 for f in fractions.values()):
        return take_newest(units, target, {}, rows)
    bound = math.inf
    chosen: list[int] = []
    for _ in range(_SOLVE_ROUNDS):
        caps = {o: f * bound for o, f in fractions.items()}
        chosen = take_newest(units, target, caps, rows)
        held_by: dict[str, float] = {}
        for i in chosen:
            held_by[units[i][0]] = held_by.get(units[i][0], 0.0) + (
                units[i][1] if rows is None else rows[i])
        held = sum(held_by.values())
        if held <= 0 or held >= bound * (1 - 1e-9):
            break  # every owner holds at most f * bound <= f * held
        capped = {o for o, h in held_by.items() if h >= caps[o]}
        free = held - sum(held_by[o] for o in capped)
        share = sum(fractions[o] for o in capped)
        root = free / (1.0 - share) if share < 1.0 else held
        bound = min(held, root) if root > 0 else held * 0.5
    return chosen
