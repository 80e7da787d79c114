"""The coach: workers -> collect games -> train -> publish the next model -> status.

`Coach(cfg).run()` is the main node's loop, the same for local worker processes
(`training.local_workers.LocalFleet`, the default) and SSH hosts
(`training.ssh_workers.SSHFleet`, `--distributed`). Every worker has its own supervisor
thread (`training.fleet`) that brings it up, reads its heartbeat, restarts its daemon, pushes
it the newest model and collects its outbox through the `Collector` (exactly once, validated
by replay, rejects quarantined), each network operation under a deadline. The loop itself
never touches a host, so one dead link delays nobody; each pass (every
`distributed.poll_interval_s`):

  1. act on `ssh_connector.py --restart` requests and on edits of the watched config file
     (added workers start, removed ones stop, in their own threads); abandon a supervisor
     stuck past its deadline (`Fleet.watchdog`);
  2. heartbeats -> worker states (Active, Syncing, Error, Offline), aged by this clock
     (`distributed.status.HeartbeatTracker`): a worker whose heartbeat has not changed for
     `offline_after_s` is Offline whatever its network does;
  3. each worker's load-balancing quota, read by its supervisor (the arithmetic, in plain
     numbers, is `training.balance`);
  4. train: once `self_play.games_per_worker` x active workers new games have arrived since
     the last round, run one training round as a subprocess (`python -m training.trainer`, or
     `torchrun` for several GPUs) while collecting goes on; then (optional gating) publish
     `models/model_<gen>.pt.zst` + manifest, which every supervisor pushes to its worker;
  5. `distributed/status.txt` (atomic), the metrics row and `progress.png`
     (`training.metrics`), a progress line in the log.

One coach per run folder: `run_dir/coach.lock` is held (fcntl) while it runs, and a second
coach on the same folder is refused with the first one's pid (`RunFolderBusy`).

Load balancing (`distributed.load_balancing`, `worker_weights`; the rule is spelled out in
`training.balance`): a worker's weight is its share of each generation's games. With weights,
a worker that reached its share is simply not collected from (its surplus batches wait in its
outbox, bounded: the worker pauses at `max_outbox_batches`) until the others catch up; a
weight of 2.0 means "twice the games of a 1.0 worker in every generation". Without weights
nothing is capped: each worker's share equals its share of the measured speed (WEIGHT shows
its games/s) and nobody waits; `load_balancing: false` also collects everything as it comes.
The status file shows each worker's WEIGHT and its actual SHARE of the games collected since
the last training round started.

Resume: everything the loop needs is on disk (published models, checkpoints, the ledger), so
a coach started again on the same run folder (`--resume`, the default when it exists) picks up
where the last one stopped; batches are counted exactly once (see `training.collector`).

It must not: play games, talk to a host from its loop (supervisors and jobs do), touch
paramiko (the SSH fleet goes through `SSHConnector`), or import torch at module level (the
trainer subprocess and `net` do the torch work).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from configs import Config, ConfigError, dump_config, load_config
from configs import override as override_config
from distributed.restart_requests import DEFAULT_DIR as DEFAULT_REQUESTS_DIR
from distributed.status import (
    DEFAULT_STATUS_PATH,
    HeartbeatTracker,
    StatusSnapshot,
    WorkerRow,
    WorkerState,
    printable,
    write_status,
)
from distributed.transfer import TransferStats, write_atomic
from training import balance, model_store
from training.collector import Collector, validate_with_records
from training.fleet import Fleet, Job
from training.run_lock import RunFolderBusy, RunLock  # noqa: F401 - RunFolderBusy for callers
from training.signals import die_with_parent, on_stop_signals

log = logging.getLogger(__name__)

_WRITE_EVENTS = ("modified", "created", "moved", "closed")  # watchdog event types

REPO = Path(__file__).resolve().parent.parent


@dataclass
class _Round:
    """A training round running as a subprocess."""

    generation: int  # the generation it produces
    popen: subprocess.Popen
    started: float
    log_path: Path
    games_at_start: int
    train_s: float = 0.0
    evaluation: threading.Thread | None = None  # arena/gating, off the coach's loop
    promote: list = field(default_factory=list)  # the evaluation thread's verdict
    published: bool = False  # without gating the model goes out before its evaluation


@dataclass
class CoachSummary:
    generations: int
    games: int
    batches: int
    rejected: int
    last_generation: int
    seconds: float
    extra: dict = field(default_factory=dict)


class Coach:
    """The main node's loop; see the module docstring."""

    def __init__(
        self,
        cfg: Config,
        *,
        config_path: str | os.PathLike | None = None,
        overrides: dict[str, Any] | None = None,
        distributed: bool | None = None,
        status_path: str | os.PathLike | None = None,
        requests_dir: str | os.PathLike | None = None,
        trainer_cmd: list[str] | None = None,
        worker_class: str | None = None,
        watch_config: bool = True,
    ):
        self.cfg = cfg
        self.config_path = Path(config_path) if config_path else None
        self.overrides = dict(overrides or {})
        self.distributed = cfg.distributed.enabled if distributed is None else distributed
        self.run_dir = Path(cfg.run.dir)
        self.status_path = Path(status_path) if status_path else DEFAULT_STATUS_PATH
        self.requests_dir = Path(requests_dir) if requests_dir else DEFAULT_REQUESTS_DIR
        self.trainer_cmd = trainer_cmd
        self.worker_class = worker_class
        self.watch_config = watch_config and self.config_path is not None
        self.models_dir = self.run_dir / "models"
        self.stats = TransferStats()
        self._stop = threading.Event()
        self._config_changed = threading.Event()
        self.tracker = HeartbeatTracker(cfg.distributed.offline_after_s)
        self.states: dict[str, WorkerState] = {}  # each worker's state at the last pass
        self.ages: dict[str, float | None] = {}  # seconds since its heartbeat last changed
        self._hb_seen: dict[str, float] = {}  # heartbeat time last used for its speed
        self.generation = -1  # newest published generation
        self.generations_done = 0
        self.round: _Round | None = None
        self.last_loss: float | None = None
        self.elo: float | None = None
        self.model_sync_s: float | None = None
        self._push_started: dict[int, float] = {}
        self._games_at_gen = 0
        self._last_progress = 0.0
        self._retry_round_at = 0.0
        self._started = time.monotonic()
        self.fleet: Fleet | None = None
        self.collector: Collector | None = None
        self.training_nodes: Any = None  # remote_training.TrainingNodes when configured
        self._round_nodes: list[str] = []  # extra nodes of the running round
        self._node_start: Job | None = None  # the training nodes being started for a round
        self._lock: RunLock | None = None
        self._watching = False  # a watchdog observer watches the config file
        self._config_mtime: int | None = None

    # ------------------------------------------------------------------ setup

    def _prepare_run_dir(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self._lock is None:
            self._lock = RunLock(self.run_dir).acquire()
        for d in ("models", "checkpoints", "replay", "quarantine", "workers"):
            (self.run_dir / d).mkdir(exist_ok=True)
        commit = _git_commit()
        write_atomic(self.run_config_path, f"# git commit: {commit}\n" + dump_config(self.cfg))

    @property
    def run_config_path(self) -> Path:
        return self.run_dir / "config.yaml"

    def _ensure_first_model(self) -> None:
        gens = model_store.list_manifests(self.models_dir)
        if gens:
            self.generation = gens[-1]
            log.info("resuming at model generation %d", self.generation)
            return
        trained = model_store.list_models(self.models_dir)
        if trained:  # the coach stopped between training and publishing: publish now
            gen = trained[-1]
        else:
            from training.net import net_from_config, save_model

            import torch

            torch.manual_seed(self.cfg.run.seed)
            net = net_from_config(self.cfg.net, self.cfg.go.board_size)
            gen = 0
            save_model(self.models_dir / f"{model_store.model_stem(0)}.pt", net, 0,
                       meta={"random": True})
            log.info("wrote generation 0 (a random net)")
        self._publish(gen)

    def _make_fleet(self) -> Fleet:
        if self.distributed:
            from training.ssh_workers import SSHFleet

            return SSHFleet(self.cfg, self.run_dir, self.run_config_path, stats=self.stats,
                            next_seq=self.collector.next_seq)
        from training.local_workers import LocalFleet

        return LocalFleet(self.cfg, self.run_dir, self.run_config_path,
                          next_seq=self.collector.next_seq, worker_class=self.worker_class,
                          stats=self.stats)

    # ------------------------------------------------------------------ the loop

    def stop(self) -> None:
        """Finish the loop soon (signal-safe)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        on_stop_signals(self.stop)

    def setup(self) -> None:
        """Run folder, collector, generation 0, the fleet and the training nodes: everything
        `run` needs before it starts workers (no process is started, no host contacted)."""
        self._prepare_run_dir()
        from training.replay_buffer import sidecar_dir

        self.collector = Collector(self.run_dir, validate_with_records(
            self.cfg.go.board_size, self.cfg.go.komi,
            sidecar_dir=sidecar_dir(self.run_dir / "replay"),
            max_generation=lambda: self.generation))
        self._ensure_first_model()
        self._games_at_gen = self._total_games()
        self.fleet = self._make_fleet()
        self._sync_training_nodes()

    def run(self) -> CoachSummary:
        """Run until `run.iterations` new generations are published, or until stopped."""
        t0 = time.monotonic()
        observer = None
        try:
            self.setup()
            observer = self._watch_config() if self.watch_config else None
            log.info("coach: run folder %s, %s mode, workers %s, target %s generations",
                     self.run_dir, "distributed" if self.distributed else "local",
                     ",".join(self.fleet.names()) or "(none)",
                     self.cfg.run.iterations or "endless")
            self._start_fleet()
            while not self._stop.is_set():
                self._step()
                if self._done():
                    break
                self._stop.wait(self.cfg.distributed.poll_interval_s)
        finally:
            if self.fleet is not None:
                self._shut_down(observer)
            if self._lock is not None:
                self._lock.release()
                self._lock = None
        return self._summary(t0)

    def _shut_down(self, observer: Any) -> None:
        """Stop the round, the workers (in parallel, bounded) and collect what they flushed;
        no host can hold this longer than its stop and transfer deadlines."""
        self._stop.set()  # also stops an evaluation in progress
        if self.round is not None:
            log.warning("stopping: training round for generation %d abandoned",
                        self.round.generation)
            _terminate(self.round.popen)
            if self.round.evaluation is not None:  # its child process stops with _stop
                self.round.evaluation.join(timeout=15)
            self.round = None
        if self.training_nodes is not None:
            self.training_nodes.stop_round(wait=True)
        if observer is not None:
            observer.stop()
        self.fleet.stop_all()
        dist = self.cfg.distributed
        self.fleet.final_collect(timeout_s=max(30.0, 2 * dist.transfer_timeout_s))
        self._observe()
        self._write_status()
        self.fleet.close()
        if self.training_nodes is not None:
            self.training_nodes.close()

    def _summary(self, t0: float) -> CoachSummary:
        summary = CoachSummary(
            generations=self.generations_done, games=self._total_games(),
            batches=len(self.collector.ingested_entries()),
            rejected=sum(t.rejected for t in self.collector.tally.values()),
            last_generation=self.generation, seconds=time.monotonic() - t0)
        log.info("coach finished: generations=%d games=%d batches=%d rejected=%d gen=%d "
                 "seconds=%.0f", summary.generations, summary.games, summary.batches,
                 summary.rejected, summary.last_generation, summary.seconds)
        return summary

    def _done(self) -> bool:
        n = self.cfg.run.iterations
        return n > 0 and self.generations_done >= n and self.round is None

    def _start_fleet(self) -> None:
        self._push(self.generation)
        self.fleet.start(self.collector)

    def _step(self) -> None:
        """One pass of the loop; operational failures are logged and retried next pass.
        Nothing here waits on a host: supervisors and jobs do that in their threads."""
        try:
            self._handle_requests()
            self._poll_config()
            if self._config_changed.is_set():
                self._reload_config()
            self.fleet.watchdog()
            self._observe()
            self._set_quotas()
            self._advance_training()
        except Exception:  # noqa: BLE001 - the loop boundary: log, carry on next pass
            log.exception("coach loop pass failed; retrying")
        try:
            self._write_status()  # whatever failed above, status.txt stays current
            self._progress()
        except Exception:  # noqa: BLE001 - the loop boundary: log, carry on next pass
            log.exception("writing the status failed; retrying")

    # ------------------------------------------------------------------ workers

    def _observe(self) -> None:
        """Each worker's state from what its supervisor last saw, aged by this clock."""
        now = time.monotonic()
        over = getattr(self.collector, "over_budget", {}) if self.collector else {}
        members = self.fleet.members
        for name in [n for n in self.states if n not in members]:
            self.states.pop(name, None)
            self.ages.pop(name, None)
            self.tracker.forget(name)
        for name, m in list(members.items()):
            hb = m.heartbeat
            state, age = self.tracker.observe(name, hb, now)
            if hb is not None and self._hb_seen.get(name) != hb.time:
                self._hb_seen[name] = hb.time
                if not hb.paused and hb.games_per_s > 0:  # a paused worker is not slow
                    m.speed = balance.smoothed_speed(m.speed, hb.games_per_s)
            if m.running is False:
                state = WorkerState.OFFLINE  # a dead or stopped daemon, whatever it last said
            if m.fault or over.get(name):
                state = WorkerState.ERROR
            self.states[name], self.ages[name] = state, age
        self._check_sync_done()

    def _active(self) -> list[str]:
        return [n for n, st in self.states.items()
                if st in (WorkerState.ACTIVE, WorkerState.SYNCING) and n in self.fleet.members]

    def weights(self) -> dict[str, float]:
        """Each worker's load-balancing weight (config, else measured games/s, else 1)."""
        dist = self.cfg.distributed
        members = self.fleet.members
        return balance.weights(self.fleet.names(), dist.worker_weights, dist.load_balancing,
                               {n: m.speed for n, m in members.items()})

    def generation_target(self) -> int:
        """New games needed for the next training round."""
        return balance.generation_target(self.cfg.self_play.games_per_worker,
                                         len(self._active()))

    def quotas(self) -> dict[str, int | None]:
        """Games each active worker may still deliver before the others catch up (None = no
        cap); see `training.balance.quotas`."""
        dist = self.cfg.distributed
        capped = balance.capped(dist.load_balancing, dist.worker_weights)
        members = self.fleet.members
        return balance.quotas(
            self.fleet.names(), self._active(), self.weights() if capped else None,
            {n: m.generation_games for n, m in members.items()}, self.generation_target())

    def _set_quotas(self) -> None:
        """Hand each supervisor its quota (a worker at 0 keeps its batches in its outbox)."""
        for name, quota in self.quotas().items():
            m = self.fleet.members.get(name)
            if m is not None:
                m.quota = quota

    def _handle_requests(self) -> None:
        from distributed.restart_requests import take_requests

        for action, name in take_requests(self.requests_dir):
            if action == "restart" and name in self.fleet.names():
                log.info("restart of %s requested from the command line", name)
                self.fleet.request_restart(name)  # its supervisor restarts it
                if hasattr(self.collector, "resume"):
                    self.collector.resume(name)  # a fresh rejection budget after the fix
            else:
                log.warning("request %s %s ignored: no such worker", action, name)

    def _watch_config(self) -> Any:
        """A watchdog observer on the config file, or None: then `_poll_config` compares its
        modification time every pass (no watchdog, or no inotify instance left)."""
        self._config_mtime = self._mtime(self.config_path)
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            return None
        target = self.config_path.resolve()
        flag = self._config_changed

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                if event.event_type not in _WRITE_EVENTS:
                    return  # reading the file (our own reload) must not trigger a reload
                for p in (event.src_path, getattr(event, "dest_path", "")):
                    if p and Path(p).resolve() == target:
                        flag.set()

        try:
            observer = Observer()
            observer.daemon = True
            observer.schedule(_Handler(), str(target.parent), recursive=False)
            observer.start()
        except OSError as e:  # e.g. "inotify instance limit reached"
            log.warning("cannot watch %s (%s); checking its modification time every poll "
                        "instead", target, e)
            return None
        self._watching = True
        return observer

    @staticmethod
    def _mtime(path: Path | None) -> int | None:
        try:
            return path.stat().st_mtime_ns if path is not None else None
        except OSError:
            return None

    def _poll_config(self) -> None:
        """Without an observer: a changed modification time means the config was edited."""
        if not self.watch_config or self._watching:
            return
        mtime = self._mtime(self.config_path)
        if mtime != self._config_mtime:
            self._config_mtime = mtime
            self._config_changed.set()

    def _reload_config(self) -> None:
        self._config_changed.clear()
        try:
            new = load_config(self.config_path)
            if self.overrides:
                new = override_config(new, self.overrides)
        except ConfigError as e:
            log.error("config change ignored: %s", e)
            return
        new = override_config(new, {"run.dir": str(self.run_dir)})
        self.cfg = new
        write_atomic(self.run_config_path, f"# git commit: {_git_commit()}\n" + dump_config(new))
        self.tracker.offline_after_s = new.distributed.offline_after_s
        added, removed = self.fleet.set_workers(new)  # added ones start in their supervisors
        log.info("config reloaded: workers added %s, removed %s", added or "-", removed or "-")

    # ------------------------------------------------------------------ training

    def _total_games(self) -> int:
        if self.collector is None:
            return 0
        return sum(t.games for t in list(self.collector.tally.values()))

    def _new_games(self) -> int:
        return self._total_games() - self._games_at_gen

    def _advance_training(self) -> None:
        if self._node_start is not None:
            self._launch_when_nodes_ready()
            return
        if self.round is not None:
            rnd = self.round
            if rnd.evaluation is None:
                code = rnd.popen.poll()
                if code is None and self._round_nodes:
                    for name in self.training_nodes.check():
                        log.warning("training node %s: its trainer died; the round fails "
                                    "within training.timeout_s=%s", name,
                                    self.cfg.training.timeout_s)
                if code is not None:
                    self._finish_training(code)
            elif not rnd.evaluation.is_alive():
                self._conclude_round()
            return
        if self._done() or (self.cfg.run.iterations and
                            self.generations_done >= self.cfg.run.iterations):
            return
        if self._new_games() < self.generation_target():
            return
        if time.monotonic() < self._retry_round_at:
            return
        new_positions = sum(int(e.get("positions", 0))
                            for e in self.collector.ingested_entries()
                            if int(e.get("coach_generation", -1)) >= self.generation)
        if new_positions < self.cfg.training.min_new_positions:
            return
        self._start_round()

    def _trainer_command(self, generation: int, nodes: int = 0,
                         master_addr: str = "") -> list[str]:
        """The trainer re-launches itself under torchrun when several GPUs/nodes train;
        with `nodes` extra training nodes it is node rank 0 of nodes + 1."""
        if self.trainer_cmd:
            cmd = list(self.trainer_cmd) + ["--generation", str(generation)]
        else:
            cmd = [sys.executable, "-m", "training.trainer", "--config",
                   str(self.run_config_path), "--run-dir", str(self.run_dir), "--generation",
                   str(generation), "--no-progress"]
        if nodes:
            cmd += ["--nodes", str(nodes + 1), "--node-rank", "0", "--master-addr",
                    master_addr, "--master-port", str(self.cfg.training.master_port)]
        return cmd

    def _next_generation(self) -> int:
        """One past the newest trained model (a model refused by gating keeps its number)."""
        return max([self.generation, *model_store.list_models(self.models_dir)]) + 1

    def _sync_training_nodes(self) -> None:
        """Match `self.training_nodes` to distributed.training_nodes of the current config.

        Called at start and before each round: nodes added to or removed from the watched
        config file take part from the next round on (a running round keeps its nodes)."""
        specs = list(self.cfg.distributed.training_nodes) if self.distributed else []
        current = self.training_nodes
        if current is not None and list(current.cfg.distributed.training_nodes) == specs:
            return
        if current is not None:
            current.close()
            log.info("training nodes changed: %s -> %s", ",".join(current.names()) or "-",
                     ",".join(s.name for s in specs) or "-")
        self.training_nodes = None
        if specs:
            from training.remote_training import TrainingNodes

            self.training_nodes = TrainingNodes(self.cfg, str(self.run_config_path))

    def _start_round(self) -> None:
        """Start the next training round: at once without training nodes; with them, their
        start runs as a job (network work) and `_advance_training` launches the round when
        it is done."""
        self._sync_training_nodes()
        gen = self._next_generation()
        if self.training_nodes is None:
            self._launch_round(gen, 0, "")
            return
        nodes, d = self.training_nodes, self.cfg.distributed
        deadline = (d.retries + 1) * (d.connect_timeout_s + 4 * max(d.command_timeout_s, 300.0))
        self._node_start = Job(f"start-nodes-{gen}", lambda: (gen, *nodes.start_round(
            gen, self.cfg.training.master_port)), deadline)

    def _launch_when_nodes_ready(self) -> None:
        from training.remote_training import NodeStartError

        job = self._node_start
        if job.overdue():
            self._node_start = None
            log.warning("training nodes did not start within %.0fs; their connections are "
                        "closed and the round is retried", job.deadline_s)
            self.training_nodes.abort()
            self._retry_round_at = time.monotonic() + self.cfg.distributed.backoff_max_s
            return
        if not job.done():
            return
        self._node_start = None
        try:
            gen, nodes, addr = job.result()
        except (NodeStartError, OSError) as e:
            log.warning("training round not started: %s; retrying next pass", e)
            return
        self._round_nodes = list(self.training_nodes.in_round)
        if not nodes and self.training_nodes.names():
            log.warning("training generation %d on the main node only (training nodes "
                        "benched: %s)", gen, ", ".join(self.training_nodes.names()))
        self._launch_round(gen, nodes, addr)

    def _launch_round(self, gen: int, nodes: int, addr: str) -> None:
        log_path = Path(self.cfg.logging.dir) / f"trainer_{gen:06d}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = self._trainer_command(gen, nodes, addr)
        log.info("training generation %d on %d games (%d new): %s", gen, self._total_games(),
                 self._new_games(), " ".join(cmd))
        out = open(log_path, "ab")
        try:
            popen = subprocess.Popen(cmd, cwd=str(REPO), stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        finally:
            out.close()
        self.round = _Round(gen, popen, time.monotonic(), log_path, self._total_games())
        # games that arrive while it trains count for the next round (workers never wait)
        self._games_at_gen = self._total_games()
        for m in self.fleet.members.values():
            m.games_baseline = m.games_collected

    def _finish_training(self, code: int) -> None:
        """The trainer exited: on success start the evaluation (a thread), else retry."""
        rnd = self.round
        rnd.train_s = time.monotonic() - rnd.started
        text = rnd.log_path.read_text(errors="replace") if rnd.log_path.exists() else ""
        pt = self.models_dir / f"{model_store.model_stem(rnd.generation)}.pt"
        if self._round_nodes:
            self.training_nodes.finish_round(code == 0 and pt.exists())
            self._round_nodes = []
        if code != 0 or not pt.exists():
            self.round = None
            tail = "\n".join(text.splitlines()[-15:])
            log.error("training round for generation %d failed (exit %s, %.0fs); retrying "
                      "next pass. Trainer log %s ends:\n%s", rnd.generation, code,
                      rnd.train_s, rnd.log_path, tail)
            self._games_at_gen = rnd.games_at_start
            self._retry_round_at = time.monotonic() + self.cfg.distributed.backoff_max_s
            return
        self.last_loss = _trainer_loss(text, self.last_loss)
        log.info("trained generation %d in %.1fs: loss=%s", rnd.generation, rnd.train_s,
                 self.last_loss)
        if self.cfg.evaluation.gating == "none":  # the arena only rates: workers need not wait
            self._publish(rnd.generation)
            self._push(rnd.generation)
            rnd.published = True
        rnd.evaluation = threading.Thread(
            target=lambda: rnd.promote.append(self._evaluate(rnd.generation)),
            name=f"evaluate-{rnd.generation}", daemon=True)
        rnd.evaluation.start()

    def _conclude_round(self) -> None:
        """Evaluation done: publish and push a promoted model, record the metrics."""
        rnd, self.round = self.round, None
        promote = rnd.promote[0] if rnd.promote else True
        self.generations_done += 1
        log.info("generation %d %s", rnd.generation,
                 "promoted" if promote else "not promoted (gating); workers keep "
                 f"generation {self.generation}")
        if promote and not rnd.published:
            self._publish(rnd.generation)
            self._push(rnd.generation)
        self._record_progress(rnd.generation, rnd.train_s)

    def _evaluate(self, generation: int) -> bool:
        """Optional arena and gating; True when the new model is promoted."""
        ev = self.cfg.evaluation
        if ev.gating == "none" and ev.games == 0 and ev.gnugo_games == 0:
            return True
        try:
            from training import arena
        except ImportError:
            log.info("arena not available; promoting generation %d without evaluation",
                     generation)
            return True
        from training.child_process import ChildFailed, ChildStopped, run_in_child

        try:  # in a child process: stopped at once when the coach stops (see child_process)
            result = run_in_child(arena.evaluate_generation, self.cfg, self.run_dir,
                                  generation, stop=self._stop)
        except ChildStopped:
            return False
        except ChildFailed as e:  # evaluation must never stop training
            log.error("evaluation of generation %d failed; promoting it: %s", generation, e)
            return True
        self.elo = getattr(result, "elo", self.elo)
        return bool(getattr(result, "promote", True))

    def _manifest(self, generation: int) -> model_store.Manifest:
        return model_store.read_manifest(
            self.models_dir / f"{model_store.model_stem(generation)}.json")

    def _publish(self, generation: int) -> None:
        model_store.publish_model(self.models_dir, generation,
                                  self.cfg.distributed.compression_level)
        self.generation = generation
        log.info("published generation %d", generation)

    def _push(self, generation: int) -> None:
        """Every worker's supervisor pushes this model to it (and retries until it has it)."""
        self._push_started[generation] = time.monotonic()
        self.fleet.publish(generation, self.models_dir, self._manifest(generation))

    def _check_sync_done(self) -> None:
        """Model sync time: from the push until every active worker runs the new model."""
        t0 = self._push_started.get(self.generation)
        if t0 is None:
            return
        active = self._active()
        members = self.fleet.members
        if active and all(members[n].heartbeat is not None
                          and members[n].heartbeat.generation >= self.generation
                          for n in active):
            self.model_sync_s = time.monotonic() - t0
            del self._push_started[self.generation]
            log.info("model_sync_s=%.2f generation=%d workers=%d", self.model_sync_s,
                     self.generation, len(active))

    # ------------------------------------------------------------------ status and progress

    def window(self) -> tuple[int, int, float | None]:
        """(games, positions, mean generation) of the replay window (newest batches)."""
        from training.replay_buffer import window_size

        r = self.cfg.replay
        entries = sorted(self.collector.ingested_entries(), key=lambda e: e.get("time", 0))
        total = sum(int(e.get("positions", 0)) for e in entries)
        size = window_size(total, r.min_positions, r.max_positions, r.growth)
        games = positions = 0
        gen_sum = 0.0
        for e in reversed(entries):
            if positions >= size:
                break
            games += int(e.get("games", 0))
            positions += int(e.get("positions", 0))
            gen_sum += float(e.get("generation_mean", e.get("generation", 0))) * int(
                e.get("games", 0))
        return games, positions, (gen_sum / games if games else None)

    def snapshot(self) -> StatusSnapshot:
        weights = self.weights()
        members = dict(self.fleet.members)
        shares = balance.shares({n: m.generation_games for n, m in members.items()})
        over = getattr(self.collector, "over_budget", {})
        rows = []
        for name, m in members.items():
            hb = m.heartbeat
            state = self.states.get(name, WorkerState.OFFLINE)
            error = (over.get(name) or m.fault or (hb.last_error if hb and hb.last_error
                                                   else "")
                     or (m.error if state != WorkerState.ACTIVE else ""))
            if hb is not None and hb.paused:
                error = (f"outbox full ({hb.outbox_backlog}), paused; " + error).rstrip("; ")
            tally = self.collector.tally.get(name)
            if tally is not None and tally.rejected:
                error = (f"{tally.rejected} batches rejected (quarantine/); " + error).rstrip("; ")
            rows.append(WorkerRow(
                name=name, host=m.host, state=state, gpu=m.gpu,
                generation=hb.generation if hb and hb.generation >= 0 else None,
                games=tally.games if tally else 0,
                played=hb.games_done if hb else None,
                games_per_s=hb.games_per_s if hb and state != WorkerState.OFFLINE else 0.0,
                weight=weights.get(name, 1.0),
                share=shares[name],
                heartbeat_age_s=self.ages.get(name),
                restarts=m.restarts,
                last_error=printable(error)))
        active = [r for r in rows if r.state in (WorkerState.ACTIVE, WorkerState.SYNCING)]
        games, positions, mean_gen = self.window()
        return StatusSnapshot(
            games_per_s=sum(r.games_per_s for r in rows),
            workers_active=len(active), workers_total=len(rows),
            model_sync_s=self.model_sync_s if self.model_sync_s is not None
            else self.stats.last_push_s,
            network_mb_per_min=self.stats.net_mb_per_min(),
            generation=self.generation if self.generation >= 0 else None,
            window_games=games, window_positions=positions,
            staleness_generations=(self.generation - mean_gen) if mean_gen is not None
            else None,
            last_loss=self.last_loss, elo=self.elo, workers=rows,
            training_nodes=self.training_nodes.describe() if self.training_nodes else "")

    def _write_status(self) -> None:
        snap = self.snapshot()
        self.status_path.parent.mkdir(parents=True, exist_ok=True)
        write_status(self.status_path, snap)
        self._snap = snap

    def _progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress < 10.0:
            return
        self._last_progress = now
        snap = getattr(self, "_snap", None) or self.snapshot()
        training = f" training={self.round.generation}" if self.round else ""
        line = (f"gen={self.generation} games={self._total_games()} "
                f"next_round={self._new_games()}/{self.generation_target()} "
                f"games_per_s={snap.games_per_s:.2f} workers_active={snap.workers_active}/"
                f"{snap.workers_total} window_positions={snap.window_positions} "
                f"model_sync_s={_fmt(snap.model_sync_s)} "
                f"net_mb_per_min={snap.network_mb_per_min:.2f} loss={_fmt(self.last_loss)}"
                f"{training}")
        log.info("progress %s", line)

    def _record_progress(self, generation: int, train_s: float) -> None:
        """The coach's columns of the generation's metrics row, and the plot."""
        from training import metrics

        snap = self.snapshot()
        try:
            metrics.record_metrics(
                self.run_dir, generation, games_total=self._total_games(),
                games_per_s=snap.games_per_s, window_games=snap.window_games,
                window_positions=snap.window_positions, train_s=train_s,
                staleness=snap.staleness_generations, workers_active=snap.workers_active,
                model_sync_s=snap.model_sync_s, net_mb_per_min=snap.network_mb_per_min,
                elapsed_s=time.monotonic() - self._started,
                **({"elo": self.elo} if self.elo is not None else {}))
            metrics.plot_progress(self.run_dir)
        except Exception:  # noqa: BLE001 - metrics and plots must never stop training
            log.exception("metrics or plot for generation %d failed", generation)


def _trainer_loss(text: str, default: float | None) -> float | None:
    """The loss in the trainer's JSON summary (its last stdout line)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and '"loss"' in line:
            try:
                value = json.loads(line).get("loss")
            except json.JSONDecodeError:
                continue
            return float(value) if isinstance(value, (int, float)) else default
    return default


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _terminate(popen: subprocess.Popen, grace_s: float = 10.0) -> None:
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=str(REPO), capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"
