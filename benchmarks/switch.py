"""Model switch time: from a new model's manifest in a worker's folder to its games using it.

    python3 benchmarks/switch.py [--config configs/config.yaml] [--models 5] [--interval 6]
                                 [--device cpu]

A real `training.worker.Worker` runs in this process (its own thread, one torch thread) on a
temporary folder, with random nets of the config's size published as the coach publishes
them (`model_store.publish_model`, `copy_published`: the model first, the manifest last).
After generation 0 has played a move, generations 1..--models arrive --interval seconds
apart; for each the switch time is from its manifest being written until the worker's games
use it (their `SelfPlay.generation`, polled every 5 ms). It prints one row per switch, with
the worker's own phases when it reports them (`Worker.switch_phases`: unpack = verify +
decompress, build = read + net + inference form + warm-up), then the median and one JSON
line. Games/s over the whole window are printed too: a switch that stops self-play costs
games.

Timings are only meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from configs import load_config, override
from training.learn.net import net_from_config, save_model
from training.run import model_store
from training.worker import Worker


def publish(cfg, src: Path, dst: Path, generation: int) -> float:
    """Write a random net as `generation` and copy it to the worker's models/ folder the way
    the coach does; returns the monotonic time the manifest was written."""
    torch.manual_seed(generation)
    save_model(src / f"{model_store.model_stem(generation)}.pt",
               net_from_config(cfg.net, cfg.go.board_size), generation)
    manifest = model_store.publish_model(src, generation, cfg.distributed.wire_level)
    model_store.copy_published(src, manifest, dst)
    return time.monotonic()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/config.yaml")
    p.add_argument("--models", type=int, default=5, help="switches to time (default 5)")
    p.add_argument("--interval", type=float, default=6.0, help="seconds between models")
    p.add_argument("--device", default="cpu")
    p.add_argument("--timeout", type=float, default=120.0, help="most seconds per switch")
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="azgo-switch-") as tmp:
        root = Path(tmp)
        cfg = override(load_config(args.config), {
            "run.dir": str(root / "run"), "distributed.max_outbox_batches": 1_000_000})
        folder = root / "worker"
        worker = Worker(cfg, "bench", folder, device=args.device, seed=1)
        publish(cfg, root / "published", folder / "models", 0)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + args.timeout
        while getattr(worker._selfplay, "moves_played", 0) == 0:  # generation 0 plays
            if time.monotonic() > deadline or not thread.is_alive():
                raise SystemExit("generation 0 did not play in time")
            time.sleep(0.05)
        rows = []
        games0, t0 = worker.games_done, time.monotonic()
        for g in range(1, args.models + 1):
            time.sleep(args.interval)
            written = publish(cfg, root / "published", folder / "models", g)
            while getattr(worker._selfplay, "generation", -1) < g:  # its games use it
                if time.monotonic() - written > args.timeout:
                    raise SystemExit(f"generation {g} not in use after {args.timeout} s")
                time.sleep(0.005)
            row = {"generation": g, "switch_s": round(time.monotonic() - written, 3)}
            phases = getattr(worker, "switch_phases", lambda: {})()
            row.update({k: v for k, v in phases.items() if k in ("unpack_s", "build_s")})
            rows.append(row)
            print("  " + "  ".join(f"{k} {v}" for k, v in row.items()), flush=True)
        games_per_s = (worker.games_done - games0) / (time.monotonic() - t0)
        worker.stop()
        thread.join(timeout=120)
    median = statistics.median(r["switch_s"] for r in rows)
    print(f"\n| config | device | switches | median switch s | max switch s | games/s |\n"
          f"|---|---|---|---|---|---|\n| {args.config} | {args.device} | {len(rows)} | "
          f"{median:.2f} | {max(r['switch_s'] for r in rows):.2f} | {games_per_s:.2f} |")
    print(json.dumps({"config": args.config, "device": args.device, "median_switch_s": median,
                      "games_per_s": round(games_per_s, 3), "switches": rows}))


if __name__ == "__main__":
    main()
