"""Benchmark: one coach driving 32 worker hosts while some of them fail, and 256 workers.

The coach is the real one, run as a user runs it: `start_main.py --distributed` in its own
process, from a config file. Everything it sees is real: each host is a network namespace with
its own sshd (`distributed.sshd_hosts.NetnsHosts`, needs root), reached over SSH/SFTP through a
veth link, and each worker on it is a daemon the coach starts there, writing real, valid
batches and heartbeats (`training.simworker`: random legal games at a set pace, so that 256 of
them fit on a small machine; the coach validates them by replay like any other). This script
reads only what a user can read: status.txt, the run's ledger.jsonl, each daemon's
written.jsonl (when it renamed a batch into its outbox), and the coach's /proc entry.

Runs, each on fresh hosts, in this order:
  - baseline: `--hosts` hosts, one worker each, no faults, `--seconds` of measurement after
    every worker reads Active;
  - faults: the same, but from the start of the window `--slow` hosts are rate-limited (tc tbf
    at `--slow-rate`, both ways) and `--cut-after-s` later `--cut` hosts are black-holed
    (nftables in their namespace drops every packet, both ways);
  - scale: `--scale-workers` workers spread over `--scale-hosts` hosts, no faults.

Figures per run (printed, in the JSON and in the plot):
  - status refresh: the intervals between rewrites of status.txt (a watcher thread stats it
    every 50 ms), median and max, the time since the last rewrite at the window's end
    included (a coach that stopped writing shows here);
  - Offline detection: for each black-holed host, seconds from the cut to the first status.txt
    that reads Offline for it (None: never within `--detect-timeout-s`);
  - collection latency of the healthy workers (neither cut nor slowed), batch renamed into the
    worker's outbox -> its ledger line, for batches written from `--cut-after-s` into the
    window on: p50/p95 with the batches not collected by the window's end counted as later
    than any (`latency_figures`), and the longest time one healthy worker went without an
    ingested batch; ratios fault run / baseline;
  - the coach's CPU (user+system seconds of its process over the window, % of one core) and
    memory (VmRSS, median over the window), in total and per worker; with the scale run, the
    RSS and CPU each worker beyond the baseline's adds;
  - how many workers read Active during the window (the window starts when all do, or after
    `--startup-timeout-s`: a coach that cannot bring them all up is measured all the same);
  - exactly-once: duplicates and rejections in the final ledger, written batches never
    ingested (after the faults are lifted and the coach stopped).

    python3 benchmarks/load.py                                  # 15 to 25 minutes
    python3 benchmarks/load.py --seconds 60 --skip scale         # baseline and faults only
    python3 benchmarks/load.py --json load.json --plot docs/img/load.png

The simulated hosts' Python is a small wrapper (written per run): `-m training.worker` runs
`training.simworker` at the set pace, and the preflight's `import torch` finds a stand-in
module, because importing real torch 2.3 s of CPU per worker would measure the sandbox hosts'
start-up (which real hosts do on their own CPUs), not the coach. The last line printed is one
JSON object. The hosts, their sshds and daemons share this machine's cores with the coach:
figures taken on a small or busy machine are upper bounds of the coach's costs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

log = logging.getLogger("benchmarks.load")

# Short intervals, so that a minute holds many polls; the same for every run.
TIMINGS = {
    "distributed.heartbeat_interval_s": 1.0, "distributed.offline_after_s": 6,
    "distributed.poll_interval_s": 0.5, "distributed.connect_timeout_s": 5,
    "distributed.command_timeout_s": 30, "distributed.transfer_timeout_s": 30,
    "distributed.retries": 2, "distributed.backoff_base_s": 0.5,
    "distributed.backoff_max_s": 5, "distributed.keepalive_s": 2,
    "distributed.stop_grace_s": 3, "distributed.max_outbox_batches": 1000,
}
SETTLE_S = 5.0  # after all Active, before the window: the start-up backlog is collected

_TORCH_STAND_IN = '''"""torch as a simulated host's preflight sees it (benchmarks/load.py):
the host's daemons are training.simworker, which never imports torch."""
__version__ = "0+simulated-host"


class cuda:
    @staticmethod
    def is_available():
        return False

    @staticmethod
    def device_count():
        return 0
'''


def write_host_python(folder: Path, games_per_s: float, code: Path = REPO) -> Path:
    """The simulated hosts' `distributed.python`: see the module docstring."""
    site = folder / "site"
    (site / "torch").mkdir(parents=True, exist_ok=True)
    (site / "torch" / "__init__.py").write_text(_TORCH_STAND_IN)
    path = folder / "python"
    path.write_text(f"""#!/bin/sh
# a simulated host's python (benchmarks/load.py)
export PYTHONPATH='{site}:{code}'
if [ "$1" = "-m" ] && [ "$2" = "training.worker" ]; then
    shift 2
    exec '{sys.executable}' -m training.simworker "$@" --games-per-s {games_per_s}
fi
exec '{sys.executable}' "$@"
""")
    path.chmod(0o755)
    return path


# ----------------------------------------------------------------------------- watchers


def worker_states(text: str) -> dict[str, str]:
    """{worker: state} from status.txt's worker table, found by its NAME and STATE headers
    (not `distributed.status.parse_status_text`, so that a coach of another version, whose
    table has other columns, is read too)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        words = line.split()
        if words[:1] == ["NAME"] and "STATE" in words:
            start = line.index(" STATE ") + 1
            states = {}
            for row in lines[i + 1:]:
                if not row.strip():
                    break
                words = row[start:].split()  # a state's indicator may come first
                states[row.split()[0]] = next(
                    (w for w in words[:2] if w in ("Active", "Syncing", "Error", "Offline")),
                    words[0] if words else "")
            return states
    return {}


class StatusWatcher(threading.Thread):
    """Stats status.txt every `interval_s`; keeps each rewrite's time and the states it shows."""

    def __init__(self, path: Path, interval_s: float = 0.05):
        super().__init__(name="status-watcher", daemon=True)
        self.path = path
        self.interval_s = interval_s
        self.rewrites: list[tuple[float, dict[str, str]]] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        last = None
        while not self._halt.wait(self.interval_s):
            try:
                st = os.stat(self.path)
                key = (st.st_ino, st.st_mtime_ns)
                if key == last:
                    continue
                text = self.path.read_text()
            except OSError:
                continue
            last = key
            states = worker_states(text)
            with self._lock:
                self.rewrites.append((st.st_mtime, states))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def snapshot(self) -> list[tuple[float, dict[str, str]]]:
        with self._lock:
            return list(self.rewrites)

    def states(self) -> dict[str, str]:
        snap = self.snapshot()
        return snap[-1][1] if snap else {}

    def gaps(self, t0: float, t1: float) -> list[float]:
        """Intervals between rewrites within [t0, t1], and the open one up to t1."""
        times = [t for t, _ in self.snapshot() if t0 <= t <= t1]
        if not times:
            return [t1 - t0]
        return [b - a for a, b in zip(times, times[1:])] + [t1 - times[-1]]

    def first(self, name: str, state: str, after: float) -> float | None:
        """Time of the first rewrite at or after `after` where `name` reads `state`."""
        for t, states in self.snapshot():
            if t >= after and states.get(name) == state:
                return t
        return None


class CoachProcess:
    """`start_main.py --distributed` as a child process; its CPU and memory from /proc."""

    def __init__(self, config: Path, status: Path, folder: Path, code: Path = REPO):
        self.cmd = [sys.executable, str(code / "start_main.py"), "--config", str(config),
                    "--distributed", "--status-file", str(status), "--no-watch"]
        self.env = dict(os.environ, PYTHONPATH=str(code))
        self.folder = folder
        self.out = folder / "coach.out"
        self.proc: subprocess.Popen | None = None

    def start(self) -> CoachProcess:
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, cwd=self.folder, stdout=out, stderr=out,
                                         stdin=subprocess.DEVNULL, env=self.env)
        return self

    def check(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"the coach exited: {self.out.read_text()[-3000:]}")

    def cpu_s(self) -> float:
        """User + system CPU seconds of the coach (all its threads, and waited children)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self, timeout_s: float = 180) -> float:
        """SIGTERM, then SIGKILL after `timeout_s`; returns the seconds it took to exit."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("the coach did not stop in %.0fs after SIGTERM: killed", timeout_s)
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - t0


# ----------------------------------------------------------------------------- one run


@dataclass
class Plan:
    """One run: hosts, workers per host, pace, measurement window and faults."""

    label: str
    hosts: int
    per_host: int = 1
    seconds: float = 90.0
    games_per_s: float = 2.0
    cut: int = 0  # black-holed hosts: the last ones
    slow: int = 0  # rate-limited hosts: before the cut ones
    cut_after_s: float = 10.0
    slow_rate: str = "64kbit"
    detect_timeout_s: float = 120.0
    late_s: float = 15.0  # batches written this close to the window's end are not judged
    startup_timeout_s: float = 900.0
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def workers(self) -> int:
        return self.hosts * self.per_host

    @property
    def cut_hosts(self) -> list[int]:
        return list(range(self.hosts - self.cut + 1, self.hosts + 1)) if self.cut else []

    @property
    def slow_hosts(self) -> list[int]:
        first = self.hosts - self.cut - self.slow + 1
        return list(range(first, first + self.slow)) if self.slow else []


def _read_jsonl(path: Path) -> list[dict]:
    from training.simworker import read_jsonl

    return read_jsonl(path)


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def latency_figures(lat: list[float], late: int) -> dict[str, Any]:
    """Percentiles of the collection latency: `latency_p50_s`/`latency_p95_s` over every
    judged batch, those not collected by the window's end (`late`) counted as later than any
    (None when the percentile falls among them); `collected_*` over the collected ones."""
    padded = sorted(lat) + [float("inf")] * late

    def pct(q: float) -> float | None:
        x = _pct(padded, q)
        return None if x is None or x == float("inf") else x

    return {"latency_p50_s": pct(0.5), "latency_p95_s": pct(0.95),
            "collected_latency_p50_s": _pct(lat, 0.5),
            "collected_latency_p95_s": _pct(lat, 0.95),
            "latency_max_s": max(lat) if lat else None, "latency_batches": len(lat),
            "uncollected_share": late / len(padded) if padded else None}


def _longest_gap(times: list[float], t0: float, t1: float) -> float:
    """Longest interval in [t0, t1] without any of `times` (the edges count)."""
    ts = [t0] + sorted(t for t in times if t0 <= t <= t1) + [t1]
    return max(b - a for a, b in zip(ts, ts[1:]))


def _write_config(plan: Plan, state: Path, hosts: Any, base_config: Path,
                  code: Path) -> tuple[Path, dict, dict]:
    """The run's config file: `base_config` with the hosts, folders and `TIMINGS` set (plain
    YAML, so that the coach of `code` validates it with its own schema); the workers' hosts
    and the config as a dict."""
    import yaml

    python = write_host_python(state / "simhost", plan.games_per_s, code)
    workers, where = [], {}
    for h in range(1, plan.hosts + 1):
        for j in range(plan.per_host):
            name = f"sim{len(workers) + 1:03d}"
            workers.append({"host": hosts.addr(h), "user": hosts.servers[h - 1].user,
                            "name": name, "key_path": str(hosts.client_key), "gpu_id": -1,
                            "remote_dir": str(state / f"host{h:02d}")})
            where[name] = h
    values = {
        "run.dir": str(state / "run"), "logging.dir": str(state / "logs"),
        "self_play.games_per_worker": 10_000_000,  # collection only: no training rounds
        "distributed.enabled": True, "distributed.workers": workers,
        "distributed.worker_weights": {}, "distributed.load_balancing": False,
        "distributed.known_hosts": str(hosts.known_hosts), "distributed.deploy": False,
        "distributed.python": str(python), **TIMINGS, **plan.overrides,
    }
    data = yaml.safe_load(base_config.read_text()) or {}
    for key, value in values.items():
        section, _, leaf = key.partition(".")
        data.setdefault(section, {})[leaf] = value
    path = state / "config.yaml"
    path.write_text("# written by benchmarks/load.py\n" + yaml.safe_dump(data, sort_keys=False))
    return path, where, data


def run_cluster(plan: Plan, state: Path, base_config: Path | None = None,
                code: Path = REPO) -> dict[str, Any]:
    """Bring up `plan`'s hosts and the coach, measure the window, tear down; the figures.

    `code` is the project tree the coach and the daemons run from (default this one), e.g. an
    exported older commit to measure a coach before a change; `base_config` defaults to its
    configs/tiny.yaml."""
    from distributed.sshd_hosts import NetnsHosts

    state.mkdir(parents=True, exist_ok=True)
    hosts = NetnsHosts(state / "hosts", plan.hosts).up()
    coach = watcher = None
    faulted: list[tuple[str, int]] = []
    out: dict[str, Any] = {"label": plan.label, "hosts": plan.hosts, "workers": plan.workers,
                           "games_per_s_per_worker": plan.games_per_s,
                           "seconds": plan.seconds}
    try:
        config, where, data = _write_config(plan, state, hosts,
                                            base_config or code / "configs" / "tiny.yaml", code)
        offline_after_s = float(data["distributed"]["offline_after_s"])
        status = state / "status.txt"
        watcher = StatusWatcher(status)
        watcher.start()
        t_start = time.monotonic()
        coach = CoachProcess(config, status, state, code).start()
        deadline = t_start + plan.startup_timeout_s
        while True:
            coach.check()
            s = watcher.states()
            if len(s) == plan.workers and all(v == "Active" for v in s.values()):
                out["startup_s"] = time.monotonic() - t_start
                break
            if time.monotonic() > deadline:  # measured all the same: what this coach drives
                out["startup_s"] = None
                log.warning("%s: %d of %d workers Active after %.0fs; measuring anyway",
                            plan.label, sum(v == "Active" for v in s.values()), plan.workers,
                            plan.startup_timeout_s)
                break
            time.sleep(0.2)
        time.sleep(SETTLE_S)

        cut_names = [n for n, h in where.items() if h in plan.cut_hosts]
        slow_names = [n for n, h in where.items() if h in plan.slow_hosts]
        healthy = [n for n in where if n not in cut_names and n not in slow_names]
        rss: list[float] = []
        t0, cpu0 = time.time(), coach.cpu_s()
        for h in plan.slow_hosts:
            hosts.rate_both_ways(h, plan.slow_rate)
            faulted.append(("slow", h))
        t_cut = t0 + plan.cut_after_s
        while (now := time.time()) < t0 + plan.seconds:
            coach.check()
            if now >= t_cut and plan.cut_hosts and not any(k == "cut" for k, _ in faulted):
                t_cut = time.time()
                for h in plan.cut_hosts:
                    hosts.blackhole(h)
                    faulted.append(("cut", h))
            rss.append(coach.rss_mb())
            time.sleep(1.0)
        t1, cpu1 = time.time(), coach.cpu_s()
        ledger = _read_jsonl(state / "run" / "ledger.jsonl")
        # hosts not yet Offline get more time (the CPU and latency window is closed)
        while (any(watcher.first(n, "Offline", t_cut) is None for n in cut_names)
               and time.time() < t_cut + plan.detect_timeout_s):
            coach.check()
            time.sleep(0.5)
        detect = {n: (None if (t := watcher.first(n, "Offline", t_cut)) is None else t - t_cut)
                  for n in cut_names}
        t_end_watch = time.time()
    finally:
        for kind, h in faulted:
            (hosts.unblackhole if kind == "cut" else
             lambda i: hosts.rate_both_ways(i, None))(h)
        stop_s = coach.stop() if coach is not None else 0.0
        if watcher is not None:
            watcher.stop()
        hosts.close()

    written = {}  # batch name -> the daemon's line, with the worker (its folder's name)
    for h in range(1, plan.hosts + 1):
        for path in (state / f"host{h:02d}").rglob("written.jsonl"):
            for w in _read_jsonl(path):
                written[w["name"]] = {**w, "worker": path.parent.name}
    final = _read_jsonl(state / "run" / "ledger.jsonl")
    left = {f.name for f in state.glob("host*/**/outbox/*.npz.zst")}
    ingested_at = {e["name"]: e["time"] for e in ledger if e.get("status") == "ingested"}
    judged_from = t0 + plan.cut_after_s
    lat, late = [], 0
    for w in written.values():
        if w["worker"] not in healthy or not judged_from <= w["time"] <= t1 - plan.late_s:
            continue
        if w["name"] in ingested_at:
            lat.append(ingested_at[w["name"]] - w["time"])
        else:
            late += 1
    healthy_times = [e["time"] for e in ledger
                     if e.get("status") == "ingested" and e.get("worker") in healthy]
    per_worker_gap = []
    for n in healthy:
        ts = [e["time"] for e in ledger if e.get("status") == "ingested" and e.get("worker") == n]
        per_worker_gap.append(_longest_gap(ts, judged_from, t1))
    window = [e for e in ledger if t0 <= e["time"] <= t1]
    names = [e["name"] for e in final]
    ingested = {e["name"] for e in final if e.get("status") == "ingested"}
    gaps = watcher.gaps(t0, t1)
    shown = watcher.snapshot()  # what status.txt showed at t0 and at each rewrite until t1
    before = [st for t, st in shown if t < t0][-1:]
    active = [sum(v == "Active" for v in st.values())
              for st in before + [st for t, st in shown if t0 <= t <= t1]] or [0]
    cpu_pct = 100 * (cpu1 - cpu0) / (t1 - t0)
    q = max(1, len(rss) // 4)
    rss_med = statistics.median(rss) if rss else None
    out.update({
        "offline_after_s": offline_after_s,
        "active_median": statistics.median(active), "active_min": min(active),
        "window_s": t1 - t0,
        "status_refresh_median_s": statistics.median(gaps),
        "status_refresh_max_s": max(gaps),
        "status_refresh_intervals": [[round(t - t0, 3), round(g, 3)] for t, g in
                                     _gap_series(watcher, t0, t1)],
        "offline_detection_s": detect,
        "offline_never_detected": sum(1 for v in detect.values() if v is None),
        "cut_workers": cut_names, "slow_workers": slow_names, "healthy_workers": len(healthy),
        "cut_at_s": (t_cut - t0) if cut_names else None,
        "detection_watched_s": (t_end_watch - t_cut) if cut_names else None,
        "latencies_s": [round(x, 3) for x in sorted(lat)],
        "late_batches": late,
        **latency_figures(lat, late),
        "healthy_longest_gap_s": max(per_worker_gap) if per_worker_gap else None,
        "healthy_gap_median_s": statistics.median(per_worker_gap) if per_worker_gap else None,
        "healthy_any_ingest_gap_s": _longest_gap(healthy_times, judged_from, t1),
        "batches_in_window": len(window),
        "games_per_s_ingested": sum(int(e.get("games", 0)) for e in window) / (t1 - t0),
        "games_per_s_offered": plan.workers * plan.games_per_s,
        "coach_cpu_pct": cpu_pct, "coach_cpu_pct_per_worker": cpu_pct / plan.workers,
        "coach_rss_mb": rss_med,
        "coach_rss_mb_max": max(rss) if rss else None,
        "coach_rss_mb_per_worker": rss_med / plan.workers if rss_med else None,
        "coach_stop_s": stop_s,
        "written": len(written), "ingested": len(ingested),
        "duplicates": len(names) - len(set(names)),
        "rejected": sum(1 for e in final if e.get("status") != "ingested"),
        "never_ingested": len(set(written) - ingested),
        "left_in_outboxes": len(left),
        "lost": len(set(written) - ingested - left),
        "coach_rss_mb_first_quarter": statistics.mean(rss[:q]) if rss else None,
        "coach_rss_mb_last_quarter": statistics.mean(rss[-q:]) if rss else None,
    })
    return out


def _gap_series(watcher: StatusWatcher, t0: float, t1: float) -> list[tuple[float, float]]:
    """(time, seconds since the previous rewrite) for each rewrite in [t0, t1], and for t1."""
    times = [t for t, _ in watcher.snapshot() if t0 <= t <= t1]
    return [(b, b - a) for a, b in zip(times, times[1:])] + ([(t1, t1 - times[-1])]
                                                             if times else [])


# ----------------------------------------------------------------------------- report


def _f(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _late(x: float | None, short: bool = False) -> str:
    if x is None:
        return "> window" if short else "not collected in the window"
    return f"{x:.2f}s"


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if a is not None and b else None


def summary_lines(runs: dict[str, dict]) -> list[str]:
    lines = []
    for key, r in runs.items():
        up = ("not all Active by the deadline" if r["startup_s"] is None
              else f"all Active after {r['startup_s']:.0f}s")
        lines.append(
            f"{key}: {r['workers']} workers on {r['hosts']} hosts, {up}; window "
            f"{r['window_s']:.0f}s, workers Active: median {r.get('active_median', '?')}, min "
            f"{r.get('active_min', '?')}; {r['games_per_s_ingested']:.1f} games/s ingested of "
            f"{r['games_per_s_offered']:.1f} offered")
        lines.append(
            f"  status.txt refresh: median {_f(r['status_refresh_median_s'])}s, max "
            f"{_f(r['status_refresh_max_s'])}s")
        if r["cut_workers"]:
            d = r["offline_detection_s"]
            shown = ", ".join(f"{n} {_f(v, '.1f')}s" if v is not None else f"{n} never"
                              for n, v in d.items())
            lines.append(f"  Offline after the cut (offline_after_s {r['offline_after_s']:g}): "
                         f"{shown}")
        lines.append(
            f"  healthy workers ({r['healthy_workers']}): collection latency p50 "
            f"{_late(r['latency_p50_s'])}, p95 {_late(r['latency_p95_s'])} "
            f"({r['latency_batches'] + r['late_batches']} batches, {r['late_batches']} not "
            f"collected by the window's end; of the collected: p50 "
            f"{_f(r['collected_latency_p50_s'])}s, p95 {_f(r['collected_latency_p95_s'])}s, "
            f"max {_f(r['latency_max_s'])}s); longest gap without an "
            f"ingest: one worker {_f(r['healthy_longest_gap_s'], '.1f')}s, all "
            f"{_f(r['healthy_any_ingest_gap_s'], '.1f')}s")
        lines.append(
            f"  coach: CPU {_f(r['coach_cpu_pct'], '.1f')}% of a core "
            f"({_f(r['coach_cpu_pct_per_worker'], '.3f')}% per worker), RSS "
            f"{_f(r['coach_rss_mb'], '.0f')} MB ({_f(r['coach_rss_mb_per_worker'], '.1f')} MB "
            f"per worker), stopped in {r['coach_stop_s']:.1f}s")
        lines.append(
            f"  exactly once: {r['written']} written, {r['ingested']} ingested, "
            f"{r['duplicates']} duplicates, {r['rejected']} rejected, {r['never_ingested']} "
            f"never ingested ({r['left_in_outboxes']} left in outboxes, {r['lost']} lost)")
    return lines


def compare(runs: dict[str, dict]) -> dict[str, Any]:
    """Ratios of the fault run and the scale run against the baseline of the same benchmark."""
    out: dict[str, Any] = {}
    base = runs.get("baseline")
    if base is None:
        return out
    for key in ("faults", "scale"):
        r = runs.get(key)
        if r is None:
            continue
        out[key] = {k: _ratio(r[k], base[k]) for k in (
            "status_refresh_median_s", "status_refresh_max_s", "latency_p50_s",
            "latency_p95_s", "healthy_longest_gap_s", "coach_cpu_pct_per_worker",
            "coach_rss_mb_per_worker")}
    sc = runs.get("scale")
    if sc is not None and sc.get("coach_rss_mb") and base.get("coach_rss_mb"):
        out["rss_mb_per_added_worker"] = ((sc["coach_rss_mb"] - base["coach_rss_mb"])
                                          / (sc["workers"] - base["workers"]))
        out["cpu_pct_per_added_worker"] = ((sc["coach_cpu_pct"] - base["coach_cpu_pct"])
                                           / (sc["workers"] - base["workers"]))
    return out


def ratio_lines(vs_baseline: dict[str, Any]) -> list[str]:
    lines = []
    for key, ratios in vs_baseline.items():
        if isinstance(ratios, dict):
            lines.append(f"{key} / baseline: "
                         + " ".join(f"{k}={_f(v)}" for k, v in ratios.items()))
        else:
            lines.append(f"{key}: {_f(ratios, '.3f')}")
    return lines


def plot(runs: dict[str, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"baseline": "tab:gray", "faults": "tab:red", "scale": "tab:blue"}
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    a = ax[0][0]
    for key, r in runs.items():
        xs = [p[0] for p in r["status_refresh_intervals"]]
        ys = [p[1] for p in r["status_refresh_intervals"]]
        a.plot(xs, ys, ".", ms=3, color=colors.get(key), label=f"{key} ({r['workers']} workers)")
        if r.get("cut_at_s") is not None:
            a.axvline(r["cut_at_s"], color=colors.get(key), ls="--", lw=1)
    a.set_yscale("log")
    a.set_xlabel("seconds into the window (dashed: the cut)")
    a.set_ylabel("seconds since the previous rewrite")
    a.set_title("status.txt refresh interval")
    a.legend(fontsize=8)
    a = ax[0][1]
    for key, r in runs.items():
        lat, n = r["latencies_s"], len(r["latencies_s"]) + r["late_batches"]
        if lat:
            a.plot(lat, [(i + 1) / n for i in range(len(lat))], color=colors.get(key),
                   label=f"{key}: p50 {_late(r['latency_p50_s'], short=True)}, "
                         f"p95 {_late(r['latency_p95_s'], short=True)}")
    a.set_xscale("log")
    a.set_xlabel("seconds, batch written -> ingested")
    a.set_ylabel("fraction of batches (the rest: not collected in the window)")
    a.set_ylim(0, 1.02)
    a.set_title("healthy workers' collection latency")
    a.legend(fontsize=8)
    a = ax[1][0]
    r = runs.get("faults")
    if r and r["offline_detection_s"]:
        names = list(r["offline_detection_s"])
        vals = [r["offline_detection_s"][n] for n in names]
        watched = r["detection_watched_s"] or 0
        a.bar(names, [v if v is not None else watched for v in vals],
              color=["tab:red" if v is not None else "black" for v in vals])
        a.axhline(r["offline_after_s"], color="tab:green", ls="--",
                  label=f"offline_after_s = {r['offline_after_s']:g}")
        a.legend(fontsize=8)
    a.set_ylabel("seconds from the cut to Offline (black: never)")
    a.set_title("Offline detection of black-holed hosts")
    a = ax[1][1]
    keys = list(runs)
    cpu = [runs[k]["coach_cpu_pct_per_worker"] for k in keys]
    a.bar([f"{k}\n{runs[k]['workers']} workers" for k in keys], cpu,
          color=[colors.get(k) for k in keys])
    a.set_ylabel("coach CPU, % of one core per worker")
    a2 = a.twinx()
    a2.plot(range(len(keys)), [runs[k]["coach_rss_mb_per_worker"] or 0 for k in keys], "ko-")
    a2.set_ylabel("coach RSS MB per worker (dots)")
    a2.set_ylim(bottom=0)
    a.set_title("coach cost per worker")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def _commit(code: Path) -> str:
    """The git commit of `code`, or of the tree `git archive` exported there."""
    res = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    if res.returncode == 0 and Path(code, ".git").exists():
        dirty = subprocess.run(["git", "-C", str(code), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True).stdout
        return res.stdout.strip() + ("+uncommitted" if dirty.strip() else "")
    marker = Path(code, "COMMIT")
    return marker.read_text().strip() if marker.exists() else "unknown"


def _title(figures: dict) -> str:
    return (f"benchmarks/load.py, commit {figures['commit']}, {figures['started']}: "
            f"{figures['cpu_cores']} cores shared by the coach, the hosts' sshds and daemons "
            f"(load average {figures['load_average'][0]:.1f} at the end)")


def _mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=None,
                   help="config whose board and batch size the workers use (default "
                        "configs/tiny.yaml of --code)")
    p.add_argument("--code", default=str(REPO),
                   help="project tree the coach and daemons run from (default this one; e.g. "
                        "`git archive COMMIT | tar -x -C DIR` to measure an older coach)")
    p.add_argument("--hosts", type=int, default=32, help="hosts of the baseline and fault runs")
    p.add_argument("--cut", type=int, default=4, help="hosts black-holed in the fault run")
    p.add_argument("--slow", type=int, default=2, help="hosts rate-limited in the fault run")
    p.add_argument("--slow-rate", default="64kbit", help="their rate, both ways (tc tbf)")
    p.add_argument("--seconds", type=float, default=90.0, help="window of each run")
    p.add_argument("--cut-after-s", type=float, default=10.0,
                   help="seconds into the fault run's window when the hosts are cut")
    p.add_argument("--detect-timeout-s", type=float, default=120.0,
                   help="how long after the cut to wait for Offline at most")
    p.add_argument("--games-per-s", type=float, default=2.0, help="pace of each worker")
    p.add_argument("--startup-timeout-s", type=float, default=600.0,
                   help="the window starts when every worker reads Active, or after this")
    p.add_argument("--scale-workers", type=int, default=256)
    p.add_argument("--scale-hosts", type=int, default=32)
    p.add_argument("--scale-seconds", type=float, default=60.0)
    p.add_argument("--scale-games-per-s", type=float, default=0.25,
                   help="pace of each worker of the scale run (default: the same total as 32 "
                        "workers at 2 games/s, so that the difference is the per-worker cost)")
    p.add_argument("--skip", nargs="*", default=[], choices=["baseline", "faults", "scale"])
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--plot", default=None, help="PNG of the figures (e.g. docs/img/load.png)")
    p.add_argument("--keep", action="store_true", help="keep the state folder (logs)")
    p.add_argument("--from-json", default=None,
                   help="run nothing: print and plot the figures of an earlier --json file")
    args = p.parse_args(argv)
    if args.from_json:
        figures = json.loads(Path(args.from_json).read_text())
        for r in figures["runs"].values():
            r.update(latency_figures(r["latencies_s"], r["late_batches"]))
            r.setdefault("lost", "?")
            r.setdefault("left_in_outboxes", "?")
        figures["vs_baseline"] = compare(figures["runs"])
        for line in summary_lines(figures["runs"]) + ratio_lines(figures["vs_baseline"]):
            print(line)
        if args.plot:
            plot(figures["runs"], Path(args.plot), _title(figures))
        return 0
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C: the coach, the daemons and the
    # namespaces are removed by the `finally` blocks
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nft"):
        print("error: needs root, iproute2 and nftables (network namespaces)", file=sys.stderr)
        return 2
    logging.basicConfig(level=os.environ.get("AZGO_LOG", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    code = Path(args.code).resolve()
    config = Path(args.config) if args.config else code / "configs" / "tiny.yaml"
    plans = {
        "baseline": Plan("baseline", args.hosts, seconds=args.seconds,
                         games_per_s=args.games_per_s, cut_after_s=args.cut_after_s),
        "faults": Plan("faults", args.hosts, seconds=args.seconds, games_per_s=args.games_per_s,
                       cut=args.cut, slow=args.slow, slow_rate=args.slow_rate,
                       cut_after_s=args.cut_after_s, detect_timeout_s=args.detect_timeout_s),
        "scale": Plan("scale", args.scale_hosts, -(-args.scale_workers // args.scale_hosts),
                      seconds=args.scale_seconds, games_per_s=args.scale_games_per_s,
                      cut_after_s=args.cut_after_s),
    }
    for plan in plans.values():
        plan.startup_timeout_s = args.startup_timeout_s
    tmp = Path(tempfile.mkdtemp(prefix="azgo-load-"))
    runs: dict[str, dict] = {}
    failed: dict[str, str] = {}
    started = time.strftime("%Y-%m-%d %H:%M")
    try:
        for key, plan in plans.items():
            if key in args.skip:
                continue
            need_mb = plan.workers * 45 + 1500  # a simulated daemon ~35 MB, sshd sessions
            if _mem_available_mb() < need_mb:
                print(f"{key}: skipped, {need_mb:.0f} MB needed, "
                      f"{_mem_available_mb():.0f} MB available", file=sys.stderr)
                continue
            print(f"{key}: {plan.workers} workers on {plan.hosts} hosts ...", flush=True)
            try:
                runs[key] = run_cluster(plan, tmp / key, config, code)
            except (RuntimeError, TimeoutError, OSError, subprocess.SubprocessError) as e:
                print(f"{key}: failed: {e}"[:2000], file=sys.stderr, flush=True)
                failed[key] = str(e)[:2000]
                continue
            for line in summary_lines({key: runs[key]}):
                print(line, flush=True)
    finally:
        if args.keep:
            print(f"state kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    figures = {"started": started, "config": str(config), "code": str(code),
               "commit": _commit(code), "timings": TIMINGS,
               "cpu_cores": os.cpu_count(), "load_average": os.getloadavg(),
               "runs": runs, "failed": failed, "vs_baseline": compare(runs)}
    for line in ratio_lines(figures["vs_baseline"]):
        print(line)
    if args.plot and runs:
        plot(runs, Path(args.plot), _title(figures))
    text = json.dumps(figures, default=lambda o: round(o, 4) if isinstance(o, float) else str(o))
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
