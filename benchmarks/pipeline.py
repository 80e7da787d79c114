"""Benchmark: the distributed pipeline end to end, on hosts in network namespaces.

Everything here is the real coach (`training.coach.Coach` in distributed mode, its
`training.fleet.ssh_workers.SSHFleet`, `SSHConnector`, the exactly-once `Collector` with validation
by replay) against real sshd hosts (`distributed.sshd_hosts.NetnsHosts`, needs root). The worker
daemons are simulated (`training.simworker`: the real folder protocol, random legal games at a
set pace), except in the self-play part of the scaling table, which runs real
`start_worker.py` daemons.

Figures:
  - model sync: a published model of the config's net (default config: 9x9, 4 blocks x 32)
    pushed to 1, 8 and 32 hosts with `SSHConnector.push_files` (model, then manifest; the
    coach's push), connections already open; best of --repeats;
  - network bytes per game and batch collection latency: --hosts simulated daemons for
    --seconds; bytes = every byte on the hosts' links (veth counters: SSH, SFTP, heartbeat
    polls, listings, model push) / games ingested; latency = coach ledger time (ingested) -
    the daemon's written.jsonl time (renamed into its outbox), median / p95 / max;
  - scaling table (games/hour with 1, 4, 8, 16 workers): self-play measured with 1 and 2 real
    daemons side by side (this machine has 2 cores), N x the per-daemon rate beyond that
    (marked extrapolated: one core or GPU per worker assumed); the coach's ingest capacity
    measured with N simulated daemons producing faster than it collects; and the training
    time of one generation (one real trainer round of the daemon config, measured alone),
    beside the self-play time of one generation (games_per_worker x N games), which gives
    the generations per hour and which of the two bounds them.

    python benchmarks/pipeline.py                 # short: about 6 minutes (9 on a busy machine)
    python benchmarks/pipeline.py --seconds 120 --daemon-seconds 300 --config configs/config.yaml

The last line is one JSON object of the figures. Timings of a busy machine are low.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from pathlib import Path
from typing import Any

from training.simworker import read_jsonl

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "configs" / "config.yaml"

log = logging.getLogger("benchmarks.pipeline")

# short intervals so that a minute of benchmark holds many polls
FAST = {
    "distributed.heartbeat_interval_s": 1.0, "distributed.offline_after_s": 6,
    "distributed.poll_interval_s": 0.5, "distributed.connect_timeout_s": 5,
    "distributed.command_timeout_s": 60, "distributed.transfer_timeout_s": 30,
    "distributed.retries": 2, "distributed.backoff_base_s": 0.5,
    "distributed.backoff_max_s": 5, "distributed.keepalive_s": 2,
    "distributed.stop_grace_s": 3, "distributed.max_outbox_batches": 1000,
}


class SimCluster:
    """N namespace hosts, each running a simulated daemon, and the real coach (in a thread)
    collecting from them over SSH. `close()` removes everything.

    The SSH fleet's start command is `training.simworker.SIM_START_COMMAND` plus the pace
    (`self_play.worker_class` would run SimWorker too, but through `training.worker`, which
    imports torch, and without a way to pass the pace over SSH). The daemons import this
    checkout's code (PYTHONPATH), not whichever checkout is installed, so that a benchmark of
    an older commit measures that commit's collector against that commit's batches."""

    def __init__(self, state: Path, n: int, *, config: Path = DEFAULT_CONFIG,
                 games_per_s: float = 5.0, overrides: dict[str, Any] | None = None,
                 hosts: Any = None):
        from configs import load_config, override
        from distributed.ssh_connector import SSHConnector
        from distributed.sshd_hosts import NetnsHosts
        from training.coach import Coach
        from training.fleet.ssh_workers import SSHFleet
        from training.simworker import SIM_START_COMMAND

        self.state = Path(state)
        self.own_hosts = hosts is None
        self.hosts = hosts or NetnsHosts(self.state / "hosts", n).up()
        self.n = n
        workers = [{"host": self.hosts.addr(i), "user": self.hosts.servers[i - 1].user,
                    "name": f"sim{i:02d}", "key_path": str(self.hosts.client_key),
                    "gpu_id": -1, "remote_dir": str(self.state / f"host{i:02d}")}
                   for i in range(1, n + 1)]
        values = {
            "run.dir": str(self.state / "run"), "logging.dir": str(self.state / "logs"),
            "self_play.games_per_worker": 10_000_000,  # collection only: no training rounds
            "distributed.enabled": True, "distributed.workers": workers,
            "distributed.worker_weights": {}, "distributed.load_balancing": False,
            "distributed.known_hosts": str(self.hosts.known_hosts),
            "distributed.deploy": False, "distributed.python": sys.executable,
            **FAST, **(overrides or {}),
        }
        self.cfg = override(load_config(config), values, source="benchmarks/pipeline.py")
        start = ("env", f"PYTHONPATH={REPO}", *SIM_START_COMMAND,
                 "--games-per-s", str(games_per_s))

        class _SimCoach(Coach):
            def _make_fleet(self) -> Any:
                conn = SSHConnector(self.cfg.distributed, start_command=start,
                                    stats=self.stats)
                return SSHFleet(self.cfg, self.run_dir, self.run_config_path, stats=self.stats,
                                next_seq=self.collector.next_seq, connector=conn)

        self.run = self.state / "run"
        self.status = self.state / "status.txt"
        self.names = [w["name"] for w in workers]
        self.coach = _SimCoach(self.cfg, distributed=True, status_path=self.status,
                               requests_dir=self.state / "requests", watch_config=False)
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> SimCluster:
        def run() -> None:
            try:
                self.coach.run()
            except BaseException as e:  # noqa: BLE001 - handed to the caller in stop()
                self.error = e

        self.thread = threading.Thread(target=run, name="coach", daemon=True)
        self.thread.start()
        return self

    def stop(self, timeout_s: float = 120) -> None:
        if self.thread is None:
            return
        self.coach.stop()
        self.thread.join(timeout=timeout_s)
        self.thread = None
        if self.error is not None:
            raise RuntimeError(f"the coach failed: {self.error!r}") from self.error

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self.own_hosts:
                self.hosts.close()

    def states(self) -> dict[str, str]:
        from distributed.status import parse_status_text

        try:
            snap = parse_status_text(self.status.read_text())
        except (OSError, ValueError):
            return {}
        return {r.name: str(r.state) for r in snap.workers}

    def all_active(self) -> bool:
        s = self.states()
        return len(s) == self.n and all(v == "Active" for v in s.values())

    def wait_active(self, timeout_s: float = 300) -> float:
        t0 = time.monotonic()
        while not self.all_active():
            if self.error is not None:
                raise RuntimeError(f"the coach failed: {self.error!r}")
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"not all {self.n} workers Active after {timeout_s:.0f}s: "
                                   f"{self.states()}")
            time.sleep(0.3)
        return time.monotonic() - t0

    def ledger(self) -> list[dict]:
        return read_jsonl(self.run / "ledger.jsonl")

    def worker_dir(self, i: int) -> Path:
        return self.state / f"host{i:02d}" / "workers" / self.names[i - 1]

    def written(self) -> list[dict]:
        out = []
        for i in range(1, self.n + 1):
            out += read_jsonl(self.worker_dir(i) / "written.jsonl")
        return out

    def link_bytes(self) -> int:
        """Bytes both ways on every host's link so far (root-side veth counters)."""
        total = 0
        for veth in self.hosts.veths[: self.n]:
            for d in ("rx_bytes", "tx_bytes"):
                total += int(Path(f"/sys/class/net/{veth}/statistics/{d}").read_text())
        return total


# ----------------------------------------------------------------------------- model sync


def model_sync(state: Path, config: Path, counts: list[int], repeats: int) -> dict[str, Any]:
    """Seconds to push the config's published model to 1, 8, 32 hosts (connections open)."""
    from configs import WorkerSpec, load_config, override
    from distributed.ssh_connector import SSHConnector
    from distributed.sshd_hosts import NetnsHosts
    from training.learn.net import net_from_config, save_model
    from training.run import model_store

    cfg = load_config(config)
    models = state / "models"
    models.mkdir(parents=True)
    save_model(models / "model_000001.pt", net_from_config(cfg.net, cfg.go.board_size), 1)
    manifest = model_store.publish_model(models, 1, level=cfg.distributed.compression_level)
    n = max(counts)
    hosts = NetnsHosts(state / "hosts", n).up()
    try:
        specs = [WorkerSpec(host=hosts.addr(i), user=hosts.servers[i - 1].user, name=f"h{i:02d}",
                            key_path=str(hosts.client_key), remote_dir=str(state / f"r{i:02d}"))
                 for i in range(1, n + 1)]
        dcfg = override(cfg, {
            "distributed.workers": [dataclasses.asdict(s) for s in specs],
            "distributed.known_hosts": str(hosts.known_hosts), "distributed.deploy": False,
            **FAST}).distributed
        conn = SSHConnector(dcfg)
        try:
            t0 = time.perf_counter()
            opened = conn.for_each(lambda name: conn.run(name, "true"))
            connect_s = time.perf_counter() - t0
            bad = {k: v for k, v in opened.items() if isinstance(v, Exception)}
            if bad:
                raise RuntimeError(f"hosts not reachable: {bad}")
            files = [(models / manifest.zst_name, "{models}/" + manifest.zst_name),
                     (models / manifest.json_name, "{models}/" + manifest.json_name)]
            out: dict[str, Any] = {"model_mb": manifest.size / 1e6, "connect_all_s": connect_s}
            for k in counts:
                best = float("inf")
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    res = conn.push_files(files, [s.name for s in specs[:k]])
                    dt = time.perf_counter() - t0
                    errors = [r for r in res.values() if isinstance(r, Exception)]
                    if errors:
                        raise RuntimeError(f"push to {k} hosts failed: {errors[0]}")
                    best = min(best, dt)
                out[f"sync_{k}_s"] = best
            return out
        finally:
            conn.close()
    finally:
        hosts.close()


# ----------------------------------------------------------------------------- collection


def collection(state: Path, config: Path, n: int, seconds: float, games_per_s: float,
               overrides: dict[str, Any] | None = None, hosts: Any = None) -> dict[str, Any]:
    """Run `n` simulated daemons for `seconds` after all are Active; bytes, games, latency."""
    cluster = SimCluster(state, n, config=config, games_per_s=games_per_s,
                         overrides=overrides, hosts=hosts)
    try:
        cluster.start()
        up_s = cluster.wait_active()
        time.sleep(2.0)
        n0 = len(cluster.ledger())
        games0 = sum(int(e.get("games", 0)) for e in cluster.ledger())
        b0 = cluster.link_bytes()
        t0, cpu0 = time.monotonic(), time.process_time()
        time.sleep(seconds)
        dt, cpu = time.monotonic() - t0, time.process_time() - cpu0
        entries = cluster.ledger()
        b1 = cluster.link_bytes()
        window = entries[n0:]
        games = sum(int(e.get("games", 0)) for e in entries) - games0
        batch_bytes = sum(int(e.get("size", 0)) for e in window)
        written_at = {w["name"]: w["time"] for w in cluster.written()}
        lat = sorted(e["time"] - written_at[e["name"]] for e in window
                     if e["name"] in written_at)
        offered = sum(1 for w in cluster.written() if w["time"] >= time.time() - dt)
    finally:
        cluster.close()
    rejected = sum(1 for e in entries if e["status"] != "ingested")
    return {
        "workers": n, "seconds": dt, "startup_s": up_s, "batches": len(window),
        "games": games, "games_per_hour": games * 3600 / dt,
        "batches_written_in_window": offered,
        "batches_per_s": len(window) / dt, "mb_per_s": batch_bytes / dt / 1e6,
        "link_bytes_per_game": (b1 - b0) / games if games else None,
        "batch_bytes_per_game": batch_bytes / games if games else None,
        "latency_median_s": statistics.median(lat) if lat else None,
        "latency_p95_s": lat[int(0.95 * (len(lat) - 1))] if lat else None,
        "latency_max_s": lat[-1] if lat else None,
        "rejected": rejected,
        # the coach runs in this process (the daemons and their sshds do not): its CPU time
        # for each game it fetched, validated by replay and ingested
        "coach_cpu_ms_per_game": 1000 * cpu / games if games else None,
    }


# ----------------------------------------------------------------------------- real daemons


def real_daemons(state: Path, config: Path, n: int, seconds: float) -> dict[str, Any]:
    """Games/hour of `n` real `start_worker.py` daemons side by side (one thread each)."""
    from configs import load_config
    from training.learn.net import net_from_config, save_model
    from training.run import model_store

    cfg = load_config(config)
    src = state / "models"
    src.mkdir(parents=True, exist_ok=True)
    if not (src / "model_000000.json").exists():
        save_model(src / "model_000000.pt", net_from_config(cfg.net, cfg.go.board_size), 0)
        model_store.publish_model(src, 0)
    manifest = model_store.newest_manifest(src)
    procs = []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        for i in range(n):
            d = state / f"d{n}_{i}"
            model_store.copy_published(src, manifest, d / "models")
            procs.append((d, subprocess.Popen(
                [sys.executable, str(REPO / "start_worker.py"), "--config", str(config),
                 "--name", f"real{i}", "--dir", str(d), "--device", "cpu"],
                cwd=str(REPO), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))

        def beats() -> list[dict]:
            out = []
            for d, _ in procs:
                try:
                    out.append(json.loads((d / "status.json").read_text()))
                except (OSError, ValueError):
                    out.append({})
            return out

        # the window starts once every daemon finished its first games (a warm pipeline)
        deadline = time.monotonic() + 600
        while not all(b.get("state") == "Active" and b.get("games_done", 0) > 0
                      for b in beats()):
            if time.monotonic() > deadline:
                raise TimeoutError("real daemons finished no game in 600s")
            time.sleep(0.2)
        b0, t0 = beats(), time.monotonic()
        time.sleep(seconds)
        b1, dt = beats(), time.monotonic() - t0
    finally:
        for _, p in procs:
            p.send_signal(signal.SIGTERM)
        for _, p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    games = sum(b.get("games_done", 0) for b in b1) - sum(b.get("games_done", 0) for b in b0)
    return {"daemons": n, "seconds": dt, "games": games, "games_per_hour": games * 3600 / dt}


# ----------------------------------------------------------------------------- main


def training_round(config: Path, state: Path) -> dict[str, Any]:
    """One real training round of `config` (`python -m training.trainer`, its
    steps_per_generation x batch_size, on synthetic samples, alone on this machine's CPU):
    the training time of one generation, which does not depend on the worker count."""
    from configs import load_config
    from training.learn.samples import config_samples

    cfg = load_config(config)
    state.mkdir(parents=True, exist_ok=True)
    samples = state / "samples.npz"
    config_samples(cfg, max(cfg.training.batch_size * 8, 2048)).save(samples)
    cmd = [sys.executable, "-m", "training.trainer", "--config", str(config),
           "--run-dir", str(state / "run"), "--samples", str(samples),
           "--steps", str(cfg.training.steps_per_generation), "--checkpoint", "none",
           "--no-progress", "--log-level", "WARNING"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"steps": cfg.training.steps_per_generation, "batch_size": cfg.training.batch_size,
            "train_s": sum(summary["step_seconds"]), "process_wall_s": wall}


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(DEFAULT_CONFIG),
                   help="config whose board, net and batch size are measured "
                        "(default configs/config.yaml)")
    p.add_argument("--daemon-config", default=str(REPO / "configs" / "tiny.yaml"),
                   help="config of the real self-play daemons (default configs/tiny.yaml, so "
                        "that a short run finishes games; use configs/config.yaml on a GPU)")
    p.add_argument("--seconds", type=float, default=20.0, help="collection window per run")
    p.add_argument("--daemon-seconds", type=float, default=30.0,
                   help="timed window of the real daemons")
    p.add_argument("--hosts", type=int, default=8, help="hosts of the latency/bytes run")
    p.add_argument("--games-per-s", type=float, default=10.0,
                   help="pace of each simulated daemon in the latency/bytes run")
    p.add_argument("--sync-hosts", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--scale", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--skip", nargs="*", default=[], choices=["sync", "collect", "scale"])
    args = p.parse_args(argv)
    if os.geteuid() != 0 or not shutil.which("ip"):
        print("error: needs root and iproute2 (network namespaces)", file=sys.stderr)
        return 2
    logging.basicConfig(level=os.environ.get("AZGO_LOG", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = Path(args.config)
    from configs import load_config

    cfg = load_config(config)
    figures: dict[str, Any] = {"config": str(config), "board_size": cfg.go.board_size,
                               "batch_size_games": cfg.distributed.batch_size}
    tmp = Path(tempfile.mkdtemp(prefix="azgo-pipeline-"))
    try:
        if "sync" not in args.skip:
            sync = model_sync(tmp / "sync", config, args.sync_hosts, args.repeats)
            figures["model_sync"] = sync
            print(f"model sync ({sync['model_mb']:.2f} MB compressed, net "
                  f"{cfg.net.blocks}x{cfg.net.filters}, {cfg.go.board_size}x{cfg.go.board_size}"
                  f"); opening {max(args.sync_hosts)} connections: {sync['connect_all_s']:.2f}s")
            for k in args.sync_hosts:
                print(f"  push to {k:>2} hosts: {sync[f'sync_{k}_s']:.2f}s")
        if "collect" not in args.skip:
            c = collection(tmp / "collect", config, args.hosts, args.seconds, args.games_per_s)
            figures["collection"] = c
            print(f"collection: {args.hosts} simulated daemons x {args.games_per_s} games/s, "
                  f"{c['seconds']:.0f}s, poll {cfg.distributed.poll_interval_s}s -> "
                  f"{FAST['distributed.poll_interval_s']}s")
            print(f"  games ingested {c['games']}, batches {c['batches']} "
                  f"({c['batches_per_s']:.2f}/s, {c['mb_per_s']:.3f} MB/s), rejected "
                  f"{c['rejected']}")
            print(f"  network bytes per game {_fmt(c['link_bytes_per_game'], '.0f')} on the "
                  f"links (batch file alone {_fmt(c['batch_bytes_per_game'], '.0f')})")
            print(f"  collection latency written -> ingested: median "
                  f"{_fmt(c['latency_median_s'])}s, p95 {_fmt(c['latency_p95_s'])}s, max "
                  f"{_fmt(c['latency_max_s'])}s")
        if "scale" not in args.skip:
            daemon_cfg = Path(args.daemon_config)
            measured = {}
            for n in (1, 2):
                measured[n] = real_daemons(tmp / "real", daemon_cfg, n, args.daemon_seconds)
            per_daemon = measured[2]["games_per_hour"] / 2
            dc = load_config(daemon_cfg)
            train = training_round(daemon_cfg, tmp / "train")
            rows = []
            from distributed.sshd_hosts import NetnsHosts

            hosts_state = NetnsHosts(tmp / "scalehosts", max(args.scale)).up()
            try:
                for n in args.scale:
                    cap = collection(tmp / f"cap{n}", daemon_cfg, n, args.seconds,
                                     games_per_s=max(5.0, 200.0 / n), hosts=hosts_state)
                    selfplay = measured[n]["games_per_hour"] if n in measured else None
                    games_per_hour = selfplay if selfplay is not None else per_daemon * n
                    per_generation = dc.self_play.games_per_worker * n
                    # self-play goes on while the trainer works: a round takes the longer
                    # of the two
                    selfplay_s = per_generation / games_per_hour * 3600
                    rows.append({
                        "workers": n,
                        "selfplay_games_per_hour": games_per_hour,
                        "selfplay_extrapolated": selfplay is None,
                        "games_per_generation": per_generation,
                        "selfplay_s_per_generation": selfplay_s,
                        "train_s_per_generation": train["train_s"],
                        "generations_per_hour": 3600 / max(selfplay_s, train["train_s"]),
                        "bound_by": "training" if train["train_s"] > selfplay_s
                        else "self-play",
                        "ingest_capacity_games_per_hour": cap["games_per_hour"],
                        "ingest_cpu_ms_per_game": cap["coach_cpu_ms_per_game"],
                        "ingest_backlog_batches": cap["batches_written_in_window"]
                        - cap["batches"],
                    })
            finally:
                hosts_state.close()
            figures["scaling"] = {"daemon_config": str(daemon_cfg),
                                  "real_daemons": list(measured.values()), "training": train,
                                  "rows": rows}
            print(f"scaling ({dc.go.board_size}x{dc.go.board_size}, net {dc.net.blocks}x"
                  f"{dc.net.filters}, {dc.mcts.simulations} simulations; real daemons "
                  f"measured with 1 and 2 side by side, one core each; one training round, "
                  f"{train['steps']} steps x {train['batch_size']}, measured alone: "
                  f"{train['train_s']:.1f}s):")
            print(f"  {'workers':>7} {'self-play games/h':>18} {'':<13} {'games/gen':>9} "
                  f"{'self-play s/gen':>15} {'training s/gen':>14} {'gens/h':>7} "
                  f"{'bound by':>9} {'coach ingest capacity games/h':>30} "
                  f"{'coach CPU ms/game':>17}")
            print(f"  (2 real daemons side by side measured: "
                  f"{measured[2]['games_per_hour']:,.0f} games/h, per daemon "
                  f"{per_daemon:,.0f}; beyond 2 = N x per daemon, extrapolated)")
            for r in rows:
                tag = "extrapolated" if r["selfplay_extrapolated"] else "measured"
                print(f"  {r['workers']:>7} {r['selfplay_games_per_hour']:>18,.0f} {tag:<13} "
                      f"{r['games_per_generation']:>9} {r['selfplay_s_per_generation']:>15.1f} "
                      f"{r['train_s_per_generation']:>14.1f} {r['generations_per_hour']:>7.1f} "
                      f"{r['bound_by']:>9} {r['ingest_capacity_games_per_hour']:>30,.0f} "
                      f"{_fmt(r['ingest_cpu_ms_per_game'])}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(figures, default=lambda o: round(o, 4) if isinstance(o, float) else str(o)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
