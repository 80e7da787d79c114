"""The JSON analysis engine (`python -m training.analysis`): queries sent together against the
same queries sent one at a time, on this machine.

It saves a net of the default config's size (random weights: the speed does not depend on
them), starts the engine as KaTrain would (a subprocess, JSON lines over pipes), warms it up,
then times Q queries of distinct 9x9 positions (a few random legal moves each, `maxVisits`
V):
- one at a time: each query sent after the answer to the one before;
- together: all Q written at once, answered in the engine's batched search (`--slots`).
It prints seconds per query both ways and their ratio (one at a time / together; above 1
means batching pays), then one JSON line.

Usage: python benchmarks/analysis.py [--queries 64] [--visits 64] [--slots 64]
Timings are only meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def positions(count: int, size: int, seed: int = 0) -> list[list[list[str]]]:
    from training.go.coords import to_gtp
    from training.go.rules import Position

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        pos = Position(size, komi=7.0)
        moves = []
        for _ in range(rng.randint(2, 12)):
            legal = [p for p in range(size * size) if pos.is_legal(p)]
            move = rng.choice(legal)
            moves.append(["B" if pos.to_play == 1 else "W", to_gtp(move, size)])
            pos.play(move)
        out.append(moves)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--visits", type=int, default=64)
    ap.add_argument("--slots", type=int, default=64)
    args = ap.parse_args()
    from configs import load_config
    from training.learn.net import net_from_config, save_model

    cfg = load_config(None)
    size = cfg.go.board_size
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model_000001.pt"
        save_model(model, net_from_config(cfg.net, size), generation=1)
        proc = subprocess.Popen(
            [sys.executable, "-m", "training.analysis", "--model", str(model), "--slots",
             str(args.slots), "--max-visits", str(max(args.visits, 64))],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            env={**os.environ, "OMP_NUM_THREADS": "1"})

        def ask(qid: str, moves: list) -> None:
            proc.stdin.write(json.dumps({"id": qid, "moves": moves, "rules": "chinese",
                                         "komi": cfg.go.komi, "boardXSize": size,
                                         "boardYSize": size, "maxVisits": args.visits}) + "\n")
            proc.stdin.flush()

        def answer() -> dict:
            return json.loads(proc.stdout.readline())

        games = positions(args.queries, size)
        for k in range(4):  # warm-up: numba, TorchScript, first batches
            ask(f"w{k}", games[k])
        for _ in range(4):
            answer()
        t0 = time.perf_counter()
        for k, moves in enumerate(games):
            ask(f"s{k}", moves)
            assert answer()["id"] == f"s{k}"
        one = (time.perf_counter() - t0) / len(games)
        t0 = time.perf_counter()
        for k, moves in enumerate(games):
            ask(f"t{k}", moves)
        got = {answer()["id"] for _ in games}
        together = (time.perf_counter() - t0) / len(games)
        assert got == {f"t{k}" for k in range(len(games))}
        proc.stdin.close()
        proc.wait(timeout=60)
    print(f"{args.queries} queries of {args.visits} visits, {size}x{size}, "
          f"{cfg.net.blocks}x{cfg.net.filters} net, --slots {args.slots}")
    print(f"  one at a time: {one * 1000:8.1f} ms per query")
    print(f"  together:      {together * 1000:8.1f} ms per query")
    print(f"  ratio (one at a time / together): {one / together:.2f}")
    print(json.dumps({"queries": args.queries, "visits": args.visits, "slots": args.slots,
                      "ms_per_query_one_at_a_time": round(one * 1000, 2),
                      "ms_per_query_together": round(together * 1000, 2),
                      "ratio": round(one / together, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
