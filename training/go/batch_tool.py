"""`python -m training.go.batch_tool FILE`: a game batch file validated, summarised, its games
exported as SGF; `--bench N` measures how fast `records.decode_batch` validates.

The batch format and its checks are `training.go.records`; SGF is `training.go.sgf`. Writes
only the SGF files asked for, each through `distributed.transfer.write_atomic`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from distributed.transfer import compress_bytes, write_atomic
from training.go.coords import BLACK, WHITE
from training.go.records import (BATCH_SUFFIX, DEFAULT_MAX_BYTES, Batch, BatchError, BatchMeta,
                                 decode_batch, encode_batch, load_batch, random_record)
from training.go.sgf import result_text, to_sgf


def _summary(path: Path, batch: Batch) -> str:
    meta, recs = batch.meta, batch.records
    lengths = [r.num_moves for r in recs]
    wins = sum(r.result == BLACK for r in recs), sum(r.result == WHITE for r in recs)
    lines = [
        f"{path.name}: worker {meta.worker} generation {meta.generation} "
        f"{meta.board_size}x{meta.board_size} komi {meta.komi:g} {meta.simulations} sims, "
        f"{len(recs)} games, {sum(lengths)} positions, written "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(meta.created))} UTC",
        f"black wins {wins[0]}, white wins {wins[1]}, draws {len(recs) - sum(wins)}, "
        f"resigned {sum(r.resigned for r in recs)}, "
        f"moves per game min/mean/max {min(lengths, default=0)}/"
        f"{(sum(lengths) / max(len(lengths), 1)):.1f}/{max(lengths, default=0)}",
    ]
    for g, r in enumerate(recs):
        lines.append(f"  game {g:3d}: {r.num_moves:3d} moves {result_text(r):>8s} "
                     f"gen {r.generation} seed {r.seed}")
    return "\n".join(lines)


def measure_validation(board_size: int, n_games: int = 100, seed: int = 0) -> dict:
    """Games and moves per second that `decode_batch` validates (random legal games)."""
    rng = np.random.default_rng(seed)
    games = [random_record(board_size, 7.5, rng, pass_prob=0.03, seed=i) for i in range(n_games)]
    raw = compress_bytes(encode_batch(games, BatchMeta.from_records("bench", games)))
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        decode_batch(raw)
        best = min(best, time.perf_counter() - start)
    moves = sum(g.num_moves for g in games)
    return {
        "board_size": board_size,
        "games": n_games,
        "mean_moves": round(moves / n_games, 1),
        "bytes_per_game": round(len(raw) / n_games),
        "validate_games_per_s": round(n_games / best, 1),
        "validate_moves_per_s": round(moves / best),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.go.batch_tool",
        description="Validate a game batch file, print a summary, export games as SGF.",
    )
    parser.add_argument("file", type=Path, nargs="?",
                        help="a <worker>_<gen>_<seq>.npz.zst batch file")
    parser.add_argument("--sgf-dir", type=Path, help="write each game as SGF into this folder")
    parser.add_argument("--game", type=int, help="only this game (0-based); print its SGF")
    parser.add_argument("--max-mb", type=int, default=DEFAULT_MAX_BYTES >> 20,
                        help="decompressed size limit in MiB")
    parser.add_argument("--bench", type=int, metavar="N",
                        help="measure validation speed on random N x N games instead")
    parser.add_argument("--bench-games", type=int, default=100)
    args = parser.parse_args(argv)
    if args.bench:
        print(json.dumps(measure_validation(args.bench, args.bench_games)))
        return 0
    if args.file is None:
        parser.error("a batch FILE is needed (or --bench N)")
    try:
        batch = load_batch(args.file, max_bytes=args.max_mb << 20)
    except BatchError as e:
        print(f"rejected: {e}", file=sys.stderr)
        return 1
    print(_summary(args.file, batch))
    games = range(len(batch.records))
    if args.game is not None:
        if not 0 <= args.game < len(batch.records):
            print(f"--game {args.game}: the batch has games 0..{len(batch.records) - 1}",
                  file=sys.stderr)
            return 2
        games = [args.game]
        if args.sgf_dir is None:
            print(to_sgf(batch.records[args.game], comment=f"{args.file.name} game {args.game}"),
                  end="")
    if args.sgf_dir is not None:
        args.sgf_dir.mkdir(parents=True, exist_ok=True)
        stem = args.file.name.removesuffix(BATCH_SUFFIX)
        for g in games:
            out = args.sgf_dir / f"{stem}_game{g:04d}.sgf"
            write_atomic(out, to_sgf(batch.records[g], comment=f"{args.file.name} game {g}"))
            print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
