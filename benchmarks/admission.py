"""Benchmark: the long-lived trainer's admission of one new batch after a million batches.

The long-lived trainer (training.mode: continuous) pins its window to the admitted batch
names (`ReplayWindow(files=...)`) and takes in each poll's admissions with
`ReplayWindow.add_files`, then selects the window again. This script builds that state as
the trainer has it after `--admitted` admissions and times `add_files` of one new batch,
`--new` times, one after the other (each a poll with one admission):

  - the newest `--real` batches are real one-game batch files of the board in `--config`,
    with their sidecars as the coach writes them at ingest (`records.write_batch`,
    `sidecars.write_sidecar`, the rest copied from a few of them under their own names);
  - the older ones exist as the sidecar index's lines only (`index.jsonl`): the window
    knows their generation, positions and worker, as it would of old batches, and never
    opens them (the newest batches fill the window).

Figures: the time to build the window (every name, once), and per admitted batch the median,
p90 and max of `add_files` (wall and CPU), with the window's files and positions.

    python3 benchmarks/admission.py                         # 1,000,000 admitted, tiny.yaml
    python3 benchmarks/admission.py --config configs/config.yaml --real 5000
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from configs import load_config
from training.go.records import (
    BATCH_SUFFIX,
    Batch,
    BatchMeta,
    batch_name,
    random_record,
    replay_boards,
    write_batch,
)
from training.learn.replay_buffer import ReplayWindow
from training.learn.sidecars import INDEX_NAME, SIDECAR_VERSION, sidecar_dir, write_sidecar
from training.learn.window_shares import WINDOW_SHARE_SLACK

REPO = Path(__file__).resolve().parent.parent


def build(replay: Path, board_size: int, komi: float, old: int, real: int,
          distinct: int = 16) -> list[str]:
    """`old` index-only batch names, then `real` real one-game batches; returns every name,
    oldest first."""
    rng = np.random.default_rng(0)
    templates = replay.parent / "templates"
    templates.mkdir()
    made = []
    for k in range(distinct):
        rec = random_record(board_size, komi, rng, seed=k)
        batch = Batch(BatchMeta.from_records("worker1", [rec]), [rec], [replay_boards(rec)])
        name = batch_name("worker1", 0, k)
        write_batch(templates / name, batch.records, batch.meta)
        folder = write_sidecar(batch, name, templates / "cache")
        arrays = {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix == ".npy"}
        made.append(((templates / name).read_bytes(), arrays,
                     json.loads((folder / "info.json").read_text())))
    cache = sidecar_dir(replay)
    cache.mkdir(parents=True)
    names = []
    with open(cache / INDEX_NAME, "w") as index:
        positions = made[0][2]["positions"]
        for i in range(old):
            name = batch_name("worker1", 0, i)
            names.append(name)
            index.write(json.dumps({"name": name, "version": SIDECAR_VERSION, "generation": 0,
                                    "positions": positions, "games": 1,
                                    "board_size": board_size}, sort_keys=True) + "\n")
        for i in range(old, old + real):
            data, arrays, info = made[i % distinct]
            name = batch_name("worker1", 1, i)
            names.append(name)
            (replay / name).write_bytes(data)
            folder = cache / name[: -len(BATCH_SUFFIX)]
            folder.mkdir()
            for key, raw in arrays.items():
                (folder / key).write_bytes(raw)
            info = {**info, "name": name, "generation": 1}
            (folder / "info.json").write_text(json.dumps(info))
            index.write(json.dumps({"name": name, "version": info["version"],
                                    **{k: info[k] for k in ("generation", "positions", "games",
                                                            "board_size")}},
                                   sort_keys=True) + "\n")
    shutil.rmtree(templates)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "tiny.yaml")
    parser.add_argument("--admitted", type=int, default=1_000_000,
                        help="batches admitted before the timed ones")
    parser.add_argument("--real", type=int, default=600,
                        help="of them, the newest, real batch files (they fill the window)")
    parser.add_argument("--new", type=int, default=50, help="batches admitted and timed")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    with tempfile.TemporaryDirectory() as tmp:
        replay = Path(tmp) / "replay"
        replay.mkdir()
        t0 = time.perf_counter()
        names = build(replay, cfg.go.board_size, cfg.go.komi, args.admitted - args.real,
                      args.real + args.new)
        built_s = time.perf_counter() - t0
        pinned, fresh = names[: args.admitted], names[args.admitted:]
        t0 = time.perf_counter()
        window = ReplayWindow(replay, cfg.replay, cfg.net.history, cfg.go.board_size,
                              seed=cfg.run.seed, files=pinned,
                              worker_weights=cfg.distributed.worker_weights,
                              share_slack=WINDOW_SHARE_SLACK, liberties=cfg.net.liberties)
        open_s = time.perf_counter() - t0
        wall, cpu = [], []
        for name in fresh:
            w0, c0 = time.perf_counter(), time.process_time()
            assert window.add_files([replay / name]) == [True]
            wall.append(1000 * (time.perf_counter() - w0))
            cpu.append(1000 * (time.process_time() - c0))
        stats = window.stats()

    def figures(ms: list[float]) -> dict[str, float]:
        ms = sorted(ms)
        return {"median_ms": round(statistics.median(ms), 3),
                "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3), "max_ms": round(ms[-1], 3)}

    print(json.dumps({
        "config": str(args.config), "admitted": args.admitted, "real": args.real,
        "new": args.new, "build_s": round(built_s, 1), "window_open_s": round(open_s, 2),
        "window_files": stats.files, "window_positions": stats.positions,
        "add_one_wall": figures(wall), "add_one_cpu": figures(cpu)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
