"""A worker's batch as the run's config judges it, before the collector lets it in.

  - `batch_rules(cfg)`: the rules every game of a batch is replayed under
    (`records.BatchRules`: move cap, simulations, games per batch, early passes, a CPU
    budget of `VALIDATE_CPU_S`).
  - `validate_with_records(...)`: the coach's validator, a function of a batch file that
    returns its `BatchInfo` or raises `BatchRejected` (the message names the file and why).
  - `game_key(moves)`: a game's identity, for dropping a repeated game.
  - `full_batch_positions(cfg)`, `partial_batch_pace(cfg)`: the collector's pace for partial
    batches (see `training.fleet.collector`).

It must not: move, delete or count files (the collector does), or trust a batch before
replaying it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

if TYPE_CHECKING:
    from training.go.records import Batch, BatchRules

log = logging.getLogger(__name__)

VALIDATE_CPU_S = 60.0
"""CPU seconds the replay of one batch may take (an honest 100-game 9x9 batch takes about 1)."""
DECOMPRESS_TIMEOUT_S = 20.0
"""A batch whose zstd layer takes longer than this to decompress is rejected (a bomb)."""


class BatchRejected(Exception):
    """A batch failed validation; the message names the file and the reason."""


@dataclass(frozen=True)
class BatchInfo:
    """What validation learned about a batch."""

    games: int
    positions: int
    generations: tuple[int, ...]  # model generation of each game
    game_keys: tuple[str, ...] = ()  # `game_key` of each game: a repeated game is dropped
    keep: "Callable[[Sequence[int]], BatchInfo] | None" = field(
        default=None, compare=False, repr=False)
    """Rewrites the validated file (and its sidecar) with only the games at these indices and
    returns their info; None when the validator cannot (a batch with a repeated game is then
    refused whole)."""


def game_key(moves: Any) -> str:
    """A game's identity for duplicate detection: a hash of its moves alone (int16 points).
    The seed a worker writes is not part of it: the same moves under another seed are the
    same game. (Ledger lines written before hashed the seed too; they still count as the
    games they were.)"""
    digest = hashlib.blake2b(b"moves", digest_size=10)
    digest.update(memoryview(np.ascontiguousarray(moves, np.int16)).cast("B"))
    return digest.hexdigest()


def batch_rules(cfg: Any) -> "BatchRules":
    """What a run with config `cfg` demands of every batch (`records.BatchRules`)."""
    from training.go.records import BatchRules

    n = cfg.go.board_size
    slack = max(cfg.self_play.parallel_games, 1)  # one step may finish a cohort of games
    return BatchRules(
        move_cap=cfg.go.max_moves or 2 * n * n,
        max_simulations=2 * max(cfg.mcts.simulations, cfg.evaluation.simulations),
        max_games=cfg.distributed.batch_size + slack,
        early_pass=cfg.self_play.early_pass,
        cpu_budget_s=VALIDATE_CPU_S,
    )


def full_batch_positions(cfg: Any) -> int:
    """Positions a full batch holds at the least to go unpaced: `distributed.batch_size`
    games of a quarter of the board's points each (honest games are several times longer; a
    batch of three-move resignations is paced like a partial batch)."""
    return cfg.distributed.batch_size * cfg.go.board_size ** 2 // 4


def partial_batch_pace(cfg: Any) -> float:
    """Seconds between two partial batches taken from one worker: the config's
    `distributed.partial_batch_interval_s`, but never more than the `batch_max_wait_s` after
    which an honest worker sends a partial batch (so an honest one never waits for it)."""
    dist = cfg.distributed
    pace = float(dist.partial_batch_interval_s)
    if dist.batch_max_wait_s > 0:
        pace = min(pace, float(dist.batch_max_wait_s))
    return pace


def validate_with_records(board_size: int, komi: float, *,
                          sidecar_dir: str | os.PathLike | None = None,
                          max_generation: Callable[[], int] | None = None,
                          max_bytes: int | None = None,
                          decompress_timeout_s: float = DECOMPRESS_TIMEOUT_S,
                          rules: "BatchRules | Callable[[], BatchRules] | None" = None,
                          ) -> Callable[[Path], BatchInfo]:
    """The coach's validator: bound the zstd layer (size and time, streaming, no memory;
    by default at the most a batch under `rules` can hold, `records.decompressed_bound`),
    replay every game (`records.load_batch`) under the run's `rules` (`batch_rules(cfg)`, or
    a function returning them, read per batch so that a reloaded config applies:
    move cap, simulations, games per batch, early passes, a CPU budget), check the board
    size, komi, and that no game claims a model newer than the coach published; then, with
    `sidecar_dir`, write the replay window's sidecar from that one replay. The info's `keep`
    rewrites the file and its sidecar with some of its games (the collector drops repeats)."""

    def validate(path: Path) -> BatchInfo:
        from distributed.transfer import TransferError, check_decompressed_size
        from training.go import records

        run_rules = rules() if callable(rules) else rules
        limit_bytes = max_bytes if max_bytes is not None else (
            records.DEFAULT_MAX_BYTES if run_rules is None
            else records.decompressed_bound(run_rules, board_size))
        try:
            check_decompressed_size(path, limit_bytes, timeout_s=decompress_timeout_s)
        except TransferError as e:
            raise BatchRejected(f"{path.name}: cannot decompress within bounds: {e}") from e
        limit = max_generation() if max_generation is not None else None
        try:
            batch = records.load_batch(path, max_generation=limit, max_bytes=limit_bytes,
                                       rules=run_rules)
        except records.BatchError as e:
            raise BatchRejected(str(e)) from e
        games = batch.records
        if not games:
            raise BatchRejected(f"{path.name}: holds no games")
        for i, g in enumerate(games):
            if g.board_size != board_size or float(g.komi) != float(komi):
                raise BatchRejected(
                    f"{path.name}: game {i} is {g.board_size}x{g.board_size} komi {g.komi}, "
                    f"this run plays {board_size}x{board_size} komi {komi}; check the "
                    "worker's config"
                )
        return info_of(path, batch)

    def info_of(path: Path, batch: "Batch") -> BatchInfo:
        """The batch's info, after writing its sidecar (with `sidecar_dir`)."""
        if sidecar_dir is not None:
            from training.learn.replay_buffer import write_sidecar

            try:
                write_sidecar(batch, path.name, sidecar_dir)
            except OSError as e:  # the trainer rebuilds a missing sidecar itself
                log.warning("%s: sidecar not written: %s", path.name, e)
        games = batch.records

        def keep(indices: Sequence[int]) -> BatchInfo:
            from training.go import records

            kept = records.Batch(batch.meta, [games[i] for i in indices],
                                 [batch.boards[i] for i in indices])
            records.write_batch(path, kept.records, kept.meta)
            return info_of(path, kept)

        return BatchInfo(len(games), sum(g.num_moves for g in games),
                         tuple(int(g.generation) for g in games),
                         tuple(game_key(g.moves) for g in games), keep)

    return validate
