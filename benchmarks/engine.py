"""The GTP engine's search at a time budget: simulations per second of one position's search
with `mcts.leaf_batch` leaves per net call (virtual loss), against one leaf per call, on this
machine.

It saves a net of the config's size (random weights: the speed does not depend on them),
loads it as the GTP engine does (`NetPlayer`, the config's `net.inference`, one torch
thread), and for each leaf batch searches the same P positions (a few random legal moves
each) at `--seconds` a move. It prints, per leaf batch, the median simulations per move,
simulations per second, net calls per move and the ratio of simulations to leaf batch 1
measured in the same run, then one JSON line.

Usage: python benchmarks/engine.py [--config FILE] [--seconds 1] [--positions 8]
       [--leaf-batches 1 4 8 16]
Timings are only meaningful on a quiet machine. More simulations a move is not yet more
strength: virtual loss spreads a batch's walks, so check the strength at the same time
budget (`python -m training.strength --seconds-per-move 1`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=None, help="config file (default configs/config.yaml)")
    ap.add_argument("--seconds", type=float, default=1.0, help="seconds per move")
    ap.add_argument("--positions", type=int, default=8, help="positions searched per row")
    ap.add_argument("--leaf-batches", type=int, nargs="+", default=[1, 4, 8, 16])
    args = ap.parse_args()

    import torch

    from configs import load_config
    from training.go.coords import from_gtp
    from training.learn.net import net_from_config, save_model
    from training.play.gnugo import random_opening
    from training.play.players import NetPlayer

    torch.set_num_threads(1)
    cfg = load_config(args.config)
    size = cfg.go.board_size
    rng = random.Random(1)
    games = [[from_gtp(m, size) for m in random_opening(size, rng.randint(2, 12), rng)]
             for _ in range(args.positions)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model_000001.pt"
        save_model(model, net_from_config(cfg.net, size), generation=1)
        for k in args.leaf_batches:
            run_cfg = dataclasses.replace(cfg, mcts=dataclasses.replace(cfg.mcts, leaf_batch=k))
            player = NetPlayer(model, cfg.mcts.simulations, run_cfg,
                               seconds_per_move=args.seconds).player
            sims, rates, calls = [], [], []
            for moves in games:
                before = player.mcts.net_calls
                player.genmove(moves, cfg.go.komi)
                sims.append(player.last_simulations)
                rates.append(player.last_simulations / player.last_seconds)
                calls.append(player.mcts.net_calls - before)
            rows.append({"leaf_batch": k, "simulations_per_move": statistics.median(sims),
                         "simulations_per_s": round(statistics.median(rates), 1),
                         "net_calls_per_move": statistics.median(calls)})
    base = rows[0]["simulations_per_move"]
    print(f"{size}x{size}, {cfg.net.blocks}x{cfg.net.filters} net ({cfg.net.inference}), "
          f"{cfg.mcts.algorithm}, {args.seconds:g} s a move, {args.positions} positions")
    print("| leaf batch | simulations a move (median) | simulations/s | net calls a move | "
          f"vs leaf batch {rows[0]['leaf_batch']} |")
    print("|---|---|---|---|---|")
    for r in rows:
        r["ratio"] = round(r["simulations_per_move"] / base, 2) if base else None
        print(f"| {r['leaf_batch']} | {r['simulations_per_move']:.0f} | "
              f"{r['simulations_per_s']:.0f} | {r['net_calls_per_move']:.0f} | {r['ratio']}x |")
    print(json.dumps({"seconds_per_move": args.seconds, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
