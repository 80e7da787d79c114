"""Load: the real coach (`start_main.py --distributed`) driving namespace hosts, some failing.

Both tests run `benchmarks/load.py`'s `run_cluster`: each host is a network namespace with its
own sshd (`distributed.sshd_hosts.NetnsHosts`) and `training.simworker` daemons writing valid
5x5 batches (configs/tiny.yaml) that the coach collects, validates by replay and ingests.
They check what must hold whatever the machine's speed (exactly once, nothing rejected or
lost, black-holed hosts end up Offline, no memory growth) and print the figures; timings are
the benchmark's business (`python3 benchmarks/load.py`, docs/PERFORMANCE.md), never asserted.

  - the smoke test (4 hosts, one rate-limited, one black-holed, ~1 minute) runs with the
    `netns` tests;
  - the load test (marker `load`, outside the default test command): 32 hosts, 4 black-holed
    and 2 rate-limited, for `AZGO_LOAD_S` seconds (default 180), each worker at
    `AZGO_LOAD_GAMES_PER_S` games/s (default 2):

    python -m pytest tests/test_load.py -m load -s
    AZGO_LOAD_HOSTS=32 AZGO_LOAD_S=600 python -m pytest tests/test_load.py -m load -s

`AZGO_LOAD_CODE=DIR` runs the coach and daemons of another project tree (e.g. an exported
older commit) instead of this one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.sshd import leftover_namespaces, require_netns

HOSTS = int(os.environ.get("AZGO_LOAD_HOSTS", "32"))
SECONDS = float(os.environ.get("AZGO_LOAD_S", "180"))
GAMES_PER_S = float(os.environ.get("AZGO_LOAD_GAMES_PER_S", "2"))
CODE = os.environ.get("AZGO_LOAD_CODE")  # another project tree's coach, e.g. an older commit

pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.netns]


def _print(figures: dict) -> None:
    from benchmarks.load import summary_lines

    for line in summary_lines({figures["label"]: figures}):
        print(line)


def _assert_up_and_exactly_once(r: dict) -> None:
    assert r["startup_s"] is not None, "not every worker read Active before the window"
    assert r["written"] > 0, "no batch was written"
    assert r["duplicates"] == 0, "a batch was counted twice"
    assert r["rejected"] == 0, "valid batches rejected"
    assert r["lost"] == 0, "a written batch was neither ingested nor left in its outbox"


def test_load_smoke_a_cut_host_and_a_slow_host_lose_no_batch(tmp_path):
    require_netns()
    from benchmarks.load import REPO, Plan, run_cluster

    plan = Plan("smoke", 4, seconds=15, cut=1, slow=1, cut_after_s=3, late_s=5,
                detect_timeout_s=10, startup_timeout_s=120)
    r = run_cluster(plan, tmp_path, code=Path(CODE) if CODE else REPO)
    _print(r)
    _assert_up_and_exactly_once(r)
    assert r["cut_workers"] == ["sim004"] and r["slow_workers"] == ["sim003"]
    assert r["healthy_workers"] == 2
    for key in ("status_refresh_median_s", "status_refresh_max_s", "coach_cpu_pct",
                "coach_rss_mb", "games_per_s_ingested"):
        assert r[key] is not None and r[key] >= 0, key
    assert not leftover_namespaces()


@pytest.mark.load
def test_load_32_hosts_4_black_holed_2_rate_limited(tmp_path):
    require_netns()
    from benchmarks.load import REPO, Plan, run_cluster

    plan = Plan("faults", HOSTS, seconds=SECONDS, games_per_s=GAMES_PER_S, cut=4, slow=2,
                detect_timeout_s=300)
    r = run_cluster(plan, tmp_path, code=Path(CODE) if CODE else REPO)
    _print(r)
    _assert_up_and_exactly_once(r)
    never = [n for n, s in r["offline_detection_s"].items() if s is None]
    assert not never, f"black-holed workers never read Offline: {never}"
    first, last = r["coach_rss_mb_first_quarter"], r["coach_rss_mb_last_quarter"]
    assert last <= 1.10 * first + 20, f"the coach's memory grew: {first:.0f} -> {last:.0f} MB"
    assert not leftover_namespaces()
