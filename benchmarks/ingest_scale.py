"""Benchmark: what one ingested batch costs the coach when the run has ingested a million.

A run folder is given a ledger of `--sizes` ingested one-game batches (written directly, as the
collector writes its lines: names, sizes, digests, game keys), then the coach is set up on it
as a run sets it up (`Coach.setup`: its collector reads the ledger; configs/tiny.yaml, no
worker started), and `--batches` real batches (3 random 5x5 games each) are ingested one at a
time, each followed by the bookkeeping the coach does on every pass that ingested something:
the counts a round reads (`Coach.counts`: new positions, the names ingested since the last
pass, which the long-lived trainer is admitted from) and the window figure of status.txt (`Coach.window`).

Figures per size: the coach's start (reading the ledger), and per batch the median of
collect (fetch, validate by replay, ingest, ledger line) and of the bookkeeping, in ms; the
ratio of the largest size's to the smallest's; the coach's memory (VmRSS) after start.

    python3 benchmarks/ingest_scale.py                       # 1,000 and 1,000,000 (~3 min)
    python3 benchmarks/ingest_scale.py --sizes 1000 100000

To measure another checkout's coach (an older commit's, from `git worktree add`), copy this
file into it and run it there with `PYTHONPATH=<that checkout>`.

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

WORKER = "worker1"


def write_ledger(path: Path, batches: int) -> None:
    """`batches` ingested one-game batches of `WORKER`, generation 0, as ledger lines."""
    now = time.time() - 3600
    with open(path, "w", encoding="utf-8") as f:
        for seq in range(batches):
            digest = hashlib.blake2b(seq.to_bytes(8, "little"), digest_size=42).hexdigest()
            f.write(json.dumps({
                "name": f"{WORKER}_000000_{seq:08d}.npz.zst", "worker": WORKER,
                "status": "ingested", "time": now + seq * 1e-3, "generation": 0, "seq": seq,
                "games": 1, "positions": 3, "size": 600, "sha256": digest[:64],
                "coach_generation": 0, "game_keys": [digest[64:84]]}, sort_keys=True) + "\n")


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_size(size: int, batches: int, work: Path) -> dict:
    import numpy as np

    from configs import load_config, override
    from training.coach import Coach
    from training.fleet.collector import LocalSource
    from training.go.records import BatchMeta, batch_name, random_record, write_batch

    run_dir = work / f"run_{size}"
    run_dir.mkdir(parents=True)
    write_ledger(run_dir / "ledger.jsonl", size)
    cfg = override(load_config(REPO / "configs" / "tiny.yaml"),
                   {"run.dir": str(run_dir), "logging.dir": str(work / f"logs_{size}")})
    t0 = time.perf_counter()
    coach = Coach(cfg, status_path=run_dir / "status.txt", watch_config=False)
    coach.setup()
    start_s = time.perf_counter() - t0
    rss = _rss_mb()
    outbox = work / f"outbox_{size}"
    outbox.mkdir()
    rng = np.random.default_rng(size)
    collect_ms, books_ms = [], []
    source = LocalSource(outbox)
    for i in range(batches):
        recs = [random_record(cfg.go.board_size, cfg.go.komi, rng, seed=i * 10 + g,
                              honest_passes=True) for g in range(3)]
        write_batch(outbox / batch_name(WORKER, 0, size + i), recs,
                    BatchMeta.from_records(WORKER, recs))
        t = time.perf_counter()
        res = coach.collector.collect(WORKER, source, paced=False)
        collect_ms.append(1e3 * (time.perf_counter() - t))
        assert len(res.ingested) == 1, res
        t = time.perf_counter()
        counts = coach.counts()  # the pass's new positions and new batches, as values
        if callable(counts.new_positions):  # an older checkout's coach: closures, called here
            counts.new_positions(0)
            try:
                counts.ingested(size + i)  # the long-lived trainer's admissions: the new ones
            except TypeError:  # an older still: every name, as its passes did
                counts.ingested()
        coach.window()
        books_ms.append(1e3 * (time.perf_counter() - t))
    coach.rounds.close()
    return {"batches_in_ledger": size, "start_s": round(start_s, 2), "rss_mb": round(rss),
            "collect_ms": round(statistics.median(collect_ms), 2),
            "bookkeeping_ms": round(statistics.median(books_ms), 2),
            "per_batch_ms": round(statistics.median(
                c + b for c, b in zip(collect_ms, books_ms)), 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 1_000_000],
                    help="ingested batches in the ledger before the measured ones")
    ap.add_argument("--batches", type=int, default=20, help="batches ingested per size")
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="ingest_scale_") as tmp:
        for size in args.sizes:
            r = run_size(size, args.batches, Path(tmp))
            results.append(r)
            print(f"{size:>9,} batches in the ledger: start {r['start_s']:.1f} s, "
                  f"RSS {r['rss_mb']} MB; per batch collect {r['collect_ms']:.1f} ms, "
                  f"bookkeeping {r['bookkeeping_ms']:.1f} ms, together "
                  f"{r['per_batch_ms']:.1f} ms", flush=True)
    ratio = results[-1]["per_batch_ms"] / results[0]["per_batch_ms"]
    print(f"per-batch cost at {results[-1]['batches_in_ledger']:,} / at "
          f"{results[0]['batches_in_ledger']:,}: {ratio:.2f}x")
    print(json.dumps({"sizes": results, "ratio": round(ratio, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
