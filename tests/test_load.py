"""Load: 32 simulated workers on real sshd hosts feeding the real coach for several minutes.

Outside the default test command (marker `load`); run it with

    python -m pytest tests/test_load.py -m load -s            # 32 hosts, 180 s
    AZGO_LOAD_HOSTS=32 AZGO_LOAD_S=600 python -m pytest tests/test_load.py -m load -s

Each host is a network namespace with its own sshd (`distributed.sandbox.NetnsHosts`); each
runs a `training.simworker` daemon writing valid 5x5 batches (configs/tiny.yaml,
`distributed.batch_size` 10) at `AZGO_LOAD_GAMES_PER_S` games/s (default 2); the coach
(`benchmarks.pipeline.SimCluster`: the real `Coach` with its SSH fleet, in this process's
thread) collects, validates by replay and ingests exactly once. Measured over the window after
every worker is Active:
  - ingest throughput: batches/s and MB/s (ledger), and whether it kept up (outbox backlog);
  - coach CPU per worker: this process's CPU seconds (the coach's threads) per wall second,
    divided by the number of workers, in % of one core;
  - status refresh latency: the gaps between rewrites of status.txt (sampled every 0.1 s) and
    the heartbeat ages it shows;
  - memory: this process's RSS every 5 s; the last quarter's mean must not exceed the first
    quarter's by more than 10% + 20 MB (no growth with time).
Then every batch the workers wrote is ingested exactly once. Prints `load key=value ...`.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest

from tests.sshd import require_netns

REPO = Path(__file__).resolve().parent.parent
HOSTS = int(os.environ.get("AZGO_LOAD_HOSTS", "32"))
SECONDS = float(os.environ.get("AZGO_LOAD_S", "180"))
GAMES_PER_S = float(os.environ.get("AZGO_LOAD_GAMES_PER_S", "2"))

pytestmark = [pytest.mark.load, pytest.mark.slow, pytest.mark.ssh, pytest.mark.netns]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_32_simulated_workers_for_minutes(tmp_path):
    require_netns()
    from benchmarks.pipeline import SimCluster
    from distributed.status import parse_status_text

    cluster = SimCluster(tmp_path, HOSTS, config=REPO / "configs" / "tiny.yaml",
                         games_per_s=GAMES_PER_S,
                         overrides={"distributed.batch_size": 10,
                                    "distributed.poll_interval_s": 0.5})
    try:
        cluster.start()
        up_s = cluster.wait_active(timeout_s=600)
        time.sleep(5.0)  # past the first collection of the start-up backlog
        entries0 = cluster.ledger()
        cpu0, t0 = time.process_time(), time.monotonic()
        rss, gaps, ages = [], [], []
        last_mtime, next_rss = cluster.status.stat().st_mtime, 0.0
        while (now := time.monotonic()) - t0 < SECONDS:
            if now >= next_rss:
                rss.append(_rss_mb())
                next_rss = now + 5.0
                try:
                    snap = parse_status_text(cluster.status.read_text())
                    ages += [r.heartbeat_age_s for r in snap.workers
                             if r.heartbeat_age_s is not None]
                except (OSError, ValueError):
                    pass
            m = cluster.status.stat().st_mtime
            if m != last_mtime:
                gaps.append(m - last_mtime)
                last_mtime = m
            time.sleep(0.1)
        dt = time.monotonic() - t0
        cpu = time.process_time() - cpu0
        entries = cluster.ledger()
        states = cluster.states()
    finally:
        cluster.close()  # stops the daemons, then collects their last batches
    final = cluster.ledger()
    window = entries[len(entries0):]
    batches = len(window)
    mb = sum(int(e.get("size", 0)) for e in window) / 1e6
    games = sum(int(e.get("games", 0)) for e in window)
    expected_games = HOSTS * GAMES_PER_S * dt
    cpu_per_worker = 100 * cpu / dt / HOSTS
    q = max(1, len(rss) // 4)
    first, last = statistics.mean(rss[:q]), statistics.mean(rss[-q:])
    written = {w["name"] for w in cluster.written()}
    names = [e["name"] for e in final]
    ingested = {e["name"] for e in final if e["status"] == "ingested"}
    left = {p.name for i in range(1, HOSTS + 1)
            for p in (cluster.worker_dir(i) / "outbox").glob("*.npz.zst")}
    print(f"load hosts={HOSTS} seconds={dt:.0f} startup_s={up_s:.0f} batches={batches} "
          f"batches_per_s={batches / dt:.2f} mb_per_s={mb / dt:.3f} games_per_s={games / dt:.1f} "
          f"offered_games_per_s={expected_games / dt:.1f} "
          f"coach_cpu_pct_per_worker={cpu_per_worker:.2f} "
          f"coach_cpu_pct_total={100 * cpu / dt:.0f} "
          f"status_refresh_median_s={statistics.median(gaps):.2f} "
          f"status_refresh_max_s={max(gaps):.2f} "
          f"heartbeat_age_median_s={statistics.median(ages):.1f} "
          f"heartbeat_age_max_s={max(ages):.1f} rss_first_mb={first:.0f} "
          f"rss_last_mb={last:.0f} written={len(written)} ingested={len(ingested)} "
          f"duplicates={len(names) - len(set(names))} left_in_outboxes={len(left)}")
    assert all(s == "Active" for s in states.values()) and len(states) == HOSTS, states
    assert len(names) == len(set(names)), "a batch was counted twice"
    assert not [e for e in final if e["status"] != "ingested"], "valid batches rejected"
    assert written - ingested <= left, "a written batch was lost"
    assert games >= 0.8 * expected_games, "the coach did not keep up with the workers"
    assert last <= 1.10 * first + 20, f"memory grew: {first:.0f} -> {last:.0f} MB"
    assert max(gaps) < 30, "status.txt went stale"
