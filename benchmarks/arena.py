"""The arena's wall and CPU time with one torch thread against more, in one run.

    python3 benchmarks/arena.py                                   # two fresh nets of config.yaml
    python3 benchmarks/arena.py --run-dir runs/main --generation 33  # gen 33 vs 32 of a run
    python3 benchmarks/arena.py --threads 1,2 --rounds 3 --games 20 --simulations 32

Each new generation plays the one before it (`evaluation.games` games, `training.play.arena`)
in a child process beside the workers and the trainer; on a CPU it runs with one torch thread
(`evaluate_generation`). This measures what that choice costs and saves: for each thread
count in turn, `--rounds` times (so a drift of the machine's speed falls on all of them), the
two evaluators are made anew under that count (ONNX Runtime and OpenVINO take their threads
from torch when a session is made) and `play_arena` plays the same games (same seed); wall
time and the process's CPU time (every thread's) are taken around the games alone. The
games are the same whatever the threads: the result is printed beside each line as a check.

Prints one line per measurement and one JSON object last: per thread count the medians of
`wall_s` and `cpu_s`, and `cpu_ratio` = the CPU of the most threads over that of one. Run it
on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from configs import load_config
from training.learn.net import load_model, make_evaluator, net_from_config
from training.play.arena import play_arena
from training.run.model_store import model_stem

REPO = Path(__file__).resolve().parent.parent


def _nets(args, cfg):
    """(new, old): generations of a run, or two fresh nets of the config (seeds 1 and 2)."""
    if args.run_dir is None:
        nets = []
        for seed in (1, 2):
            torch.manual_seed(seed)
            nets.append(net_from_config(cfg.net, cfg.go.board_size).eval())
        return nets
    models = Path(args.run_dir) / "models"
    new, old = args.generation, args.generation - 1
    paths = [models / f"{model_stem(g)}.pt" for g in (new, old)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        sys.exit(f"arena: no model {', '.join(missing)} (give --run-dir and a --generation "
                 "that has the one before it)")
    return [load_model(p)[0] for p in paths]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs" / "config.yaml"))
    ap.add_argument("--run-dir", default=None, help="a run folder: rate --generation against "
                    "the one before it (default: two fresh nets of the config)")
    ap.add_argument("--generation", type=int, default=1)
    ap.add_argument("--threads", default="1,2", help="torch thread counts to compare")
    ap.add_argument("--games", type=int, default=0, help="default: evaluation.games")
    ap.add_argument("--simulations", type=int, default=0,
                    help="default: evaluation.simulations, else mcts.simulations")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    try:
        threads = [int(x) for x in args.threads.split(",")]
    except ValueError:
        threads = []
    if not threads or min(threads) < 1:
        sys.exit(f"arena: --threads {args.threads!r}: expected a comma list of counts, e.g. 1,2")
    games = args.games or cfg.evaluation.games
    if games < 2:
        sys.exit("arena: at least 2 games (--games, or evaluation.games in the config)")
    sims = args.simulations or cfg.evaluation.simulations or cfg.mcts.simulations
    new_net, old_net = _nets(args, cfg)
    batch = max(cfg.self_play.batch_size, games)
    runs: dict[int, list[tuple[float, float]]] = {k: [] for k in threads}
    for r in range(args.rounds):
        for k in threads:
            torch.set_num_threads(k)
            new = make_evaluator(new_net, jit=cfg.net.inference, max_batch=batch)
            old = make_evaluator(old_net, jit=cfg.net.inference, max_batch=batch)
            wall0, cpu0 = time.perf_counter(), time.process_time()
            match = play_arena(new, old, games, cfg, seed=12345, simulations=sims)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            runs[k].append((wall, cpu))
            print(f"round {r + 1}, {k} thread(s): {wall:.1f} s wall, {cpu:.1f} CPU s, "
                  f"{games} games at {sims} simulations: new {match.wins}-{match.draws}-"
                  f"{match.losses}", file=sys.stderr, flush=True)
    result = {f"threads_{k}": {"wall_s": round(statistics.median(w for w, _ in v), 2),
                               "cpu_s": round(statistics.median(c for _, c in v), 2)}
              for k, v in runs.items()}
    result["cpu_ratio"] = round(result[f"threads_{max(threads)}"]["cpu_s"]
                                / result[f"threads_{min(threads)}"]["cpu_s"], 2)
    result.update(games=games, simulations=sims, rounds=args.rounds,
                  inference=cfg.net.inference)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
