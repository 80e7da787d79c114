"""Load balancing in plain numbers: each worker's weight, the games a generation needs, each
worker's quota of them and its share of what was collected.

The coach (`training.coach`) reads the config, the fleet and the clock, passes the numbers in
here and hands the quotas to the supervisors (`Member.quota`). The rule
(`distributed.load_balancing`, `distributed.worker_weights`):

  - a worker's weight is its share of each generation's games: its configured weight; with
    none configured (and load balancing on) its measured games/s, equal weights until every
    worker has been measured;
  - a generation needs G = games_per_worker x active workers new games (at least one worker
    counts, so training never waits for G = 0);
  - only configured weights cap. With weights w_i over the active workers, worker i may
    deliver up to ceil(k * G * w_i / sum(w)) games, k = 1, 2, ... the smallest whole number
    that leaves some active worker under its cap; a worker at its cap keeps its batches in its
    outbox until the others catch up. A weight of 2.0 therefore means "twice the games of a
    1.0 worker in every generation", and a slow heavy worker makes the others wait for it.
    Without weights (or with `load_balancing: false`) nothing is capped: the generation's
    games come from whoever plays them, so each worker's share follows its own speed.

It must not: read a config, a fleet, a heartbeat or a clock, or keep state between calls.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

SPEED_FLOOR = 1e-3  # games/s: a worker below this has not been measured yet


def smoothed_speed(previous: float, games_per_s: float) -> float:
    """A worker's games/s smoothed over its heartbeats (0.3 of the newest reading); the first
    reading (`previous` 0) is taken as it is."""
    return (0.7 * previous + 0.3 * games_per_s) if previous else games_per_s


def weights(names: Sequence[str], configured: Mapping[str, float], load_balancing: bool,
            speeds: Mapping[str, float]) -> dict[str, float]:
    """Each worker's weight: `configured` (distributed.worker_weights; unlisted workers 1.0);
    with none configured and `load_balancing` on, its measured games/s (`speeds`), but 1.0 for
    everyone while any worker is still unmeasured; otherwise 1.0."""
    measured = load_balancing and not configured
    out: dict[str, float] = {}
    for name in names:
        if name in configured:
            out[name] = configured[name]
        elif measured:
            out[name] = max(speeds.get(name, 0.0), SPEED_FLOOR)
        else:
            out[name] = 1.0
    if measured and len([v for v in out.values() if v > SPEED_FLOOR]) < len(out):
        out = {n: 1.0 for n in out}  # not all measured yet: equal shares meanwhile
    return out


def capped(load_balancing: bool, configured: Mapping[str, float]) -> bool:
    """Whether quotas cap anyone: only configured weights (with load balancing on) do."""
    return load_balancing and bool(configured)


def generation_target(games_per_worker: int, active: int) -> int:
    """New games needed for the next training round with `active` workers (at least one)."""
    return games_per_worker * max(1, active)


def quotas(names: Sequence[str], active: Sequence[str], weights: Mapping[str, float] | None,
           collected: Mapping[str, int], target: int) -> dict[str, int | None]:
    """Games each worker may still deliver this generation (None: no cap).

    `weights` None means nothing is capped (see `capped`); `collected` holds each worker's
    games since the generation's count began, `target` the generation's G. Inactive workers
    are not capped (whatever is in their outbox is collected)."""
    out: dict[str, int | None] = {n: None for n in names}
    if weights is None:
        return out
    active = [n for n in active if n in weights]
    if not active:
        return out
    total_w = sum(weights[n] for n in active)
    per_round = {n: target * weights[n] / total_w for n in active}
    fill = min(collected[n] / per_round[n] for n in active)
    k = math.floor(fill) + 1
    for name in active:
        out[name] = max(0, math.ceil(k * per_round[name]) - collected[name])
    return out


def shares(collected: Mapping[str, int]) -> dict[str, float]:
    """Each worker's fraction of the games collected since the generation's count began (all
    0.0 before the first game)."""
    total = sum(collected.values())
    return {n: (games / total) if total else 0.0 for n, games in collected.items()}

