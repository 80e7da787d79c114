"""The coach: workers -> collect games -> train -> publish the next model -> status.

`Coach(cfg).run()` is the main node's loop, the same for local worker processes
(`training.fleet.local_workers.LocalFleet`, the default) and SSH hosts
(`training.fleet.ssh_workers.SSHFleet`, `--distributed`). Every worker has its own supervisor
thread (`training.fleet.fleet`) that brings it up, reads its heartbeat, restarts its daemon, pushes
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
     numbers, is `training.fleet.balance`);
  4. train (`training.rounds`): once `self_play.games_per_worker` x active workers new games
     have arrived since the last round, run one training round as a subprocess
     (`python -m training.trainer`, or `torchrun` for several GPUs) while collecting goes
     on (training.mode continuous: one long-lived trainer, `training.long_lived_trainer`);
     each trained generation goes through `training.generations`: (optional gating)
     publish `models/model_<gen>.pt.zst` + manifest, which every supervisor pushes to its
     worker;
  5. `distributed/status.txt` (atomic), the metrics row and `progress.png`
     (`training.run.metrics`), a progress line in the log.

The run folder's paths are `training.run.run_dir.RunDir`'s. One coach per run folder:
`run_dir/coach.lock` is held (fcntl) while it runs, and a second coach on the same folder is
refused with the first one's pid (`RunFolderBusy`).

Load balancing (`distributed.load_balancing`, `worker_weights`; the rule is spelled out in
`training.fleet.balance`): a worker's weight is its share of each generation's games. With weights,
a worker that reached its share is simply not collected from (its surplus batches wait in its
outbox, bounded: the worker pauses at `max_outbox_batches`) until the others catch up; a
weight of 2.0 means "twice the games of a 1.0 worker in every generation". Without weights
nothing is capped: each worker's share equals its share of the measured speed (WEIGHT shows
its games/s) and nobody waits; `load_balancing: false` also collects everything as it comes.
The status file shows each worker's WEIGHT and its actual SHARE of the games collected since
the last training round started.

Resume: everything the loop needs is on disk (published models, checkpoints, the ledger), so
a coach started again on the same run folder (`--resume`, the default when it exists) picks up
where the last one stopped; batches are counted exactly once (see `training.fleet.collector`).
A run keeps the board and net (`go.*`, `net.*` but net.inference[_dtype]) it was started with: a
resumed run whose config says otherwise, or a config edit while it runs, changes its other
keys only, and the log names what was kept.

It must not: play games, talk to a host from its loop (supervisors and jobs do), age
heartbeats other than through `HeartbeatTracker`, touch paramiko (the SSH fleet goes through
`SSHConnector`), or import torch at module level (the trainer subprocess and `net` do the
torch work).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

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
from distributed.status_page import StatusServer, render_html
from distributed.transfer import TransferStats, write_atomic
from training.fleet import balance
from training.fleet.collector import Collector
from training.fleet.validation import (batch_rules, full_batch_positions, partial_batch_pace,
                                       validate_with_records)
from training.fleet.fleet import Fleet
from training.generations import (Counts, Driver, Generations, ModelPublished, Rated,
                                  RoundConcluded, RoundStarted)
from training.long_lived_trainer import LongLivedTrainer
from training.rounds import Rounds
from training.run.child_process import REPO
from training.run.run_dir import STRENGTH_GAMES, RunDir, absolute_paths
from training.run.run_lock import RunLock
from training.run.signals import on_stop_signals
from training.run.watch import watch

log = logging.getLogger(__name__)

PAGE_GAMES = 10
"""SGF links on the run page: the newest evaluation's last games."""


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
        serve_status: int | None = None,
        status_hosts: tuple[str, ...] = (),
        initial_model: str | os.PathLike | None = None,
    ):
        # a relative run.dir and logging.dir: the folder the coach runs in, for the workers and
        # the trainer too (they run in the repository)
        self.cfg = cfg = absolute_paths(cfg)
        self.config_path = Path(config_path) if config_path else None
        self.overrides = dict(overrides or {})
        self.distributed = cfg.distributed.enabled if distributed is None else distributed
        self.run_dir = Path(cfg.run.dir)
        self.paths = RunDir(self.run_dir)
        self.status_path = Path(status_path) if status_path else DEFAULT_STATUS_PATH
        self.serve_status = serve_status  # a loopback port for the run page, JSON, /metrics
        self.status_hosts = tuple(status_hosts)  # Host names it answers beside loopback's
        self.initial_model = initial_model  # generation 0 of a new run (--checkpoint)
        self._status_server: StatusServer | None = None
        self.requests_dir = Path(requests_dir) if requests_dir else DEFAULT_REQUESTS_DIR
        self.worker_class = worker_class
        if worker_class and self.distributed:  # it travels in the workers' config
            self.overrides["self_play.worker_class"] = worker_class
            self.cfg = cfg = override_config(cfg, {"self_play.worker_class": worker_class})
        self.watch_config = watch_config and self.config_path is not None
        self.models_dir = self.paths.models
        self.stats = TransferStats()
        self._stop = threading.Event()
        self._stop_reason = ""  # why the loop stops: the limit reached, a signal, a request
        self._finished = ""  # UTC time the run finished, and why (status.txt, the run page)
        self._finished_after = ""
        self._config_changed = threading.Event()
        self.tracker = HeartbeatTracker(cfg.distributed.offline_after_s)
        self.states: dict[str, WorkerState] = {}  # each worker's state at the last pass
        self.ages: dict[str, float | None] = {}  # seconds since its heartbeat last changed
        self._hb_seen: dict[str, float] = {}  # heartbeat time last used for its speed
        self._last_progress = 0.0
        self._snap: StatusSnapshot | None = None  # the snapshot status.txt last showed
        self._window_figure: tuple | None = None  # (ledger size and settings, window())
        self.fleet: Fleet | None = None
        self.collector: Collector | None = None
        # trained generations and published models, and the trainer's driver: a round per
        # generation, or (training.mode continuous, fixed for the coach) one long-lived
        # trainer; the coach reacts to their events
        self.generations = Generations(self.cfg, self.paths, self._stop,
                                       initial_model=initial_model)
        self.rounds: Driver
        if cfg.training.mode == "continuous":
            self.rounds = LongLivedTrainer(self.generations, trainer_cmd=trainer_cmd,
                                           run_hours=self.run_hours)
        else:
            self.rounds = Rounds(self.generations, trainer_cmd=trainer_cmd,
                                 distributed=self.distributed, run_hours=self.run_hours)
        self._ingested_upto = 0  # the collector's ingested batches handed to the driver
        self.model_sync_s: float | None = None  # push to every active worker running it
        self._push_started: dict[int, float] = {}
        self._started = time.monotonic()
        self._run_before_s = 0.0  # the run's seconds before this coach (`setup`)
        self._lock: RunLock | None = None
        self._watching = False  # a watchdog observer watches the config file
        self._config_mtime: int | None = None

    # ------------------------------------------------------------------ setup

    def _prepare_run_dir(self) -> None:
        if self._lock is None:
            self._lock = RunLock(self.paths.root).acquire()  # RunDir.lock, made with its folder
        self.paths.create()
        self._keep_the_runs_net()
        commit = _git_commit()
        write_atomic(self.run_config_path, f"# git commit: {commit}\n" + dump_config(self.cfg))

    def _keep_the_runs_net(self) -> None:
        """A run resumed with another board or net in its config (a new default, an edit)
        keeps the ones it was started with: its models, games and window depend on them. The
        config's other keys apply; the log names what was kept."""
        from training.run.model_store import list_models

        if not self.paths.config.exists() or not list_models(self.paths.models):
            return
        try:
            started = load_config(self.paths.config)
        except ConfigError as e:
            log.warning("%s: not read (%s); resuming with the config as it is",
                        self.paths.config, e)
            return
        kept = _fixed_key_changes(started, self.cfg)
        if kept:
            log.warning("this run keeps the board and net it was started with, not the "
                        "config's: %s (for the config's, start a new run: --fresh or another "
                        "run.dir)", "; ".join(f"{k} {a!r} (the config says {b!r})"
                                              for k, a, b in kept))
            self.cfg = self.generations.cfg = _with_fixed_keys(self.cfg, started)

    @property
    def run_config_path(self) -> Path:
        return self.paths.config

    def _make_fleet(self) -> Fleet:
        if self.distributed:
            from training.fleet.ssh_workers import SSHFleet

            return SSHFleet(self.cfg, self.run_dir, self.run_config_path, stats=self.stats,
                            next_seq=self.collector.next_seq)
        from training.fleet.local_workers import LocalFleet

        return LocalFleet(self.cfg, self.run_dir, self.run_config_path,
                          next_seq=self.collector.next_seq, worker_class=self.worker_class,
                          stats=self.stats)

    # ------------------------------------------------------------------ the loop

    def stop(self, reason: str = "a stop request") -> None:
        """Finish the loop soon (signal-safe); `reason` is what status.txt says it finished
        after."""
        if not self._stop_reason:
            self._stop_reason = reason
        self._stop.set()

    def install_signal_handlers(self) -> None:
        on_stop_signals(self._on_signal, with_signal=True)

    def _on_signal(self, signum: int) -> None:
        self.stop("Ctrl-C (SIGINT)" if signum == signal.SIGINT
                  else signal.Signals(signum).name)

    def setup(self) -> None:
        """Run folder, collector, generation 0, the fleet and the training nodes: everything
        `run` needs before it starts workers (no process is started, no host contacted)."""
        self._prepare_run_dir()
        self._run_before_s = self._seconds_before()
        from training.learn.replay_buffer import sidecar_dir

        self.collector = Collector(self.run_dir, validate_with_records(
            self.cfg.go.board_size, self.cfg.go.komi,
            sidecar_dir=sidecar_dir(self.paths.replay),
            max_generation=lambda: self.generations.generation,
            rules=lambda: batch_rules(self.cfg)),
            max_rejected=self.cfg.distributed.max_rejected_batches)
        self._pace_collector()
        self.generations.ensure_first_model()
        self.rounds.games_at_gen = self.total_games()
        self.fleet = self._make_fleet()
        self.rounds.sync_training_nodes()

    def _pace_collector(self) -> None:
        """The collector's pace for partial batches, from the config (`partial_batch_pace`)."""
        self.collector.partial_interval_s = partial_batch_pace(self.cfg)
        self.collector.full_batch_games = self.cfg.distributed.batch_size
        self.collector.full_batch_positions = full_batch_positions(self.cfg)

    def run(self) -> CoachSummary:
        """Run until `run.iterations` new generations are published, the run has run
        `run.hours`, or until stopped."""
        t0 = time.monotonic()
        observer = None
        try:
            self.setup()
            if self.serve_status is not None:
                self._status_server = StatusServer(self.run_dir, self.serve_status,
                                                   lambda: self._snap, hosts=self.status_hosts)
                log.info("run page, status.json and /metrics on http://127.0.0.1:%d/",
                         self._status_server.port)
            observer = self._watch_config() if self.watch_config else None
            log.info("coach: run folder %s, %s mode, workers %s, target %s generations",
                     self.run_dir, "distributed" if self.distributed else "local",
                     ",".join(self.fleet.names()) or "(none)",
                     self.cfg.run.iterations or "endless")
            if self.cfg.run.hours > 0:
                log.info("coach: the run stops at %g hours; %.2f run before this start",
                         self.cfg.run.hours, self._run_before_s / 3600)
            self._start_fleet()
            while not self._stop.is_set():
                self._step()
                if self._done():
                    break
                self._stop.wait(self.cfg.distributed.poll_interval_s)
        finally:
            self._finished = _utc_now()
            self._finished_after = self._stop_reason or (
                f"an error (see {Path(self.cfg.logging.dir) / 'distributed_training.log'})")
            if self.fleet is not None:
                self._shut_down(observer)
            if self._status_server is not None:
                self._status_server.stop()
                self._status_server = None
            if self._lock is not None:
                self._lock.release()
                self._lock = None
        return self._summary(t0)

    def _shut_down(self, observer: Any) -> None:
        """Stop the round, the workers (in parallel, bounded) and collect what they flushed;
        no host can hold this longer than its stop and transfer deadlines."""
        self._stop.set()  # also stops an evaluation in progress
        self.rounds.abandon()
        if observer is not None:
            observer.stop()
        self.fleet.stop_all()
        dist = self.cfg.distributed
        self.fleet.final_collect(timeout_s=max(30.0, 2 * dist.transfer_timeout_s))
        self._observe()
        self._write_status()
        self.fleet.close()
        self.rounds.close()

    def _summary(self, t0: float) -> CoachSummary:
        summary = CoachSummary(
            generations=self.generations.concluded, games=self.total_games(),
            batches=len(self.collector.ingested_entries()),
            rejected=sum(t.rejected for t in self.collector.tally.values()),
            last_generation=self.generations.generation, seconds=time.monotonic() - t0)
        log.info("coach finished: generations=%d games=%d batches=%d rejected=%d gen=%d "
                 "seconds=%.0f", summary.generations, summary.games, summary.batches,
                 summary.rejected, summary.last_generation, summary.seconds)
        return summary

    def _done(self) -> bool:
        limit = self.cfg.run.hours
        if limit > 0 and self.run_hours() >= limit:
            log.info("run.hours reached: the run has run %.2f hours (limit %g); stopping",
                     self.run_hours(), limit)
            self._stop_reason = self._stop_reason or f"the hours limit (run.hours {limit:g})"
            return True
        n = self.cfg.run.iterations
        if (n > 0 and self.generations.concluded >= n and self.rounds.in_hand() is None
                and self.generations.rating is None):
            self._stop_reason = self._stop_reason or f"{n} iterations (run.iterations)"
            return True
        return False

    def run_hours(self) -> float:
        """The hours the run has run: this coach's and, for a resumed run (or one that goes
        on from another with --from-run), those before it (`metrics.run_seconds`)."""
        return (self._run_before_s + time.monotonic() - self._started) / 3600

    def _seconds_before(self) -> float:
        from training.run import metrics

        try:
            return metrics.run_seconds(metrics.read_metrics(self.paths.root))
        except metrics.MetricsError as e:
            log.warning("the run's earlier hours are not known (%s): run.hours counts from "
                        "this start", e)
            return 0.0

    def _start_fleet(self) -> None:
        self._push(self.generations.generation)
        self.fleet.start(self.collector)

    def _step(self) -> None:
        """One pass of the loop; each stage's failure is logged and retried next pass, and
        never keeps the later stages from running (status.txt stays current whatever fails).
        Nothing here waits on a host: supervisors and jobs do that in their threads."""
        for stage in (self._handle_requests, self._poll_config, self._reload_if_changed,
                      self.fleet.watchdog, self._observe, self._set_quotas,
                      self._advance_training, self._write_status, self._progress):
            try:
                stage()
            except Exception:  # noqa: BLE001 - the stage boundary: log, carry on
                log.exception("coach loop: %s failed; retrying next pass",
                              stage.__name__.lstrip("_").replace("_", " "))

    def _reload_if_changed(self) -> None:
        if self._config_changed.is_set():
            self._reload_config()

    # ------------------------------------------------------------------ workers

    def _observe(self) -> None:
        """Each worker's state from what its supervisor last saw, aged by this clock."""
        now = time.monotonic()
        over = self.collector.over_budget if self.collector else {}
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
        self._check_sync_done(self._active())

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
        cap); see `training.fleet.balance.quotas`."""
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
                self.collector.resume(name)  # a fresh rejection budget after the fix
            else:
                log.warning("request %s %s ignored: no such worker", action, name)

    def _watch_config(self) -> Any:
        """A watchdog observer on the config file, or None: then `_poll_config` compares its
        modification time every pass (no inotify instance left)."""
        self._config_mtime = self._mtime(self.config_path)
        target = self.config_path.resolve()
        observer = watch(target.parent, lambda p: Path(p).resolve() == target,
                         self._config_changed)
        self._watching = observer is not None
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
        new = absolute_paths(override_config(new, {"run.dir": str(self.run_dir)}))
        fixed = _fixed_key_changes(self.cfg, new)
        if fixed:
            log.error("config change of the board or the net ignored: %s; the board and the "
                      "net of a run are fixed (start a new run with another run.dir, or "
                      "--fresh); its other keys apply",
                      "; ".join(f"{k} {a!r} -> {b!r}" for k, a, b in fixed))
            new = _with_fixed_keys(new, self.cfg)
        self.cfg = self.generations.cfg = new
        if self.collector is not None:
            self._pace_collector()
        write_atomic(self.run_config_path, f"# git commit: {_git_commit()}\n" + dump_config(new))
        self.tracker.offline_after_s = new.distributed.offline_after_s
        added, removed = self.fleet.set_workers(new)  # added ones start in their supervisors
        log.info("config reloaded: workers added %s, removed %s", added or "-", removed or "-")

    # ------------------------------------------------------------------ training

    def total_games(self) -> int:
        """Games collected in this run folder (the ledger's count)."""
        if self.collector is None:
            return 0
        return sum(t.games for t in list(self.collector.tally.values()))

    def counts(self) -> Counts:
        """What the driver needs to know of the games this pass: the batches ingested since
        the last pass (on the first, all of the ledger's) among them."""
        ingested = self.collector.ingested_since(self._ingested_upto)
        self._ingested_upto += len(ingested)
        return Counts(self.total_games(), self.generation_target(),
                      self.collector.new_positions(self.generations.generation),
                      tuple(ingested))

    def _advance_training(self) -> None:
        for event in self.rounds.advance(self.counts()):
            self.on_round_event(event)

    def start_round(self) -> None:
        """Start a training round now, due or not (what `_advance_training` does when it is;
        training.mode rounds)."""
        for event in self.rounds.start(self.counts()):
            self.on_round_event(event)

    def on_round_event(self, event: RoundStarted | ModelPublished | RoundConcluded | Rated
                       ) -> None:
        """The coach's part of a round: load balancing's baselines when one starts, the push
        of a published model, the metrics row when one concludes, the plot again when the
        arena has rated it after."""
        if isinstance(event, RoundStarted):
            for m in self.fleet.members.values():
                m.games_baseline = m.games_collected
        elif isinstance(event, ModelPublished):
            self._push(event.generation)
        elif isinstance(event, RoundConcluded):
            self._record_progress(event)
        elif isinstance(event, Rated):
            self._record_rating(event.generation)

    def _push(self, generation: int) -> None:
        """Every worker's supervisor pushes this model to it (and retries until it has it)."""
        self._push_started[generation] = time.monotonic()
        self.fleet.publish(generation, self.paths.models, self.generations.manifest(generation))

    def _check_sync_done(self, active: list[str]) -> None:
        """Model sync time: from the push until every active worker runs the new model."""
        gen = self.generations.generation
        t0 = self._push_started.get(gen)
        if t0 is None:
            return
        members = self.fleet.members
        if active and all(members[n].heartbeat is not None
                          and members[n].heartbeat.generation >= gen for n in active):
            self.model_sync_s = time.monotonic() - t0
            del self._push_started[gen]
            log.info("model_sync_s=%.2f generation=%d workers=%d", self.model_sync_s, gen,
                     len(active))

    def _record_progress(self, event: RoundConcluded) -> None:
        """The coach's columns of the generation's metrics row, and the plot."""
        from training.run import metrics

        snap = self.snapshot()
        try:
            row = metrics.record_metrics(
                self.paths.root, event.generation, games_total=self.total_games(),
                games_per_s=snap.games_per_s, window_games=snap.window_games,
                window_positions=snap.window_positions, train_s=event.train_s,
                staleness=snap.staleness_generations, workers_active=snap.workers_active,
                model_sync_s=snap.model_sync_s, net_mb_per_min=snap.network_mb_per_min,
                elapsed_s=time.monotonic() - self._started,
                run_s=self.run_hours() * 3600,
                **({"elo": event.elo} if event.elo is not None else {}))
            self._plot()
            if self.cfg.logging.tensorboard:
                from training.run import tensorboard

                tensorboard.write_row(self.paths.root, row)
        except Exception:  # noqa: BLE001 - metrics and plots must never stop training
            log.exception("metrics or plot for generation %d failed", event.generation)

    def _record_rating(self, generation: int) -> None:
        """The arena wrote its columns of `generation`'s row after the coach wrote its own:
        the plot again, and those columns to TensorBoard."""
        from training.run import metrics

        self._plot()
        if not self.cfg.logging.tensorboard:
            return
        try:
            row = next((r for r in metrics.read_metrics(self.paths.root)
                        if r["generation"] == generation), None)
            if row is not None:
                from training.run import tensorboard

                tensorboard.write_row(self.paths.root, {
                    k: v for k, v in row.items()
                    if k in ("generation", "time") or k.startswith(("arena_", "elo", "gnugo_"))})
        except Exception:  # noqa: BLE001 - metrics must never stop training
            log.exception("TensorBoard rating of generation %d failed", generation)

    def _plot(self) -> None:
        from training.run import metrics

        try:
            metrics.plot_progress(self.paths.root)
        except Exception:  # noqa: BLE001 - a plot must never stop training
            log.exception("progress.png failed")

    # ------------------------------------------------------------------ status and progress

    def window(self) -> tuple[int, int, float | None]:
        """(games, positions, mean generation) of the replay window: the trainer's rule
        (`window_shares.select_newest`, the same order, size and shares) over whole batches."""
        from training.learn.replay_buffer import WINDOW_SHARE_SLACK, select_newest, window_size

        r = self.cfg.replay
        weights = self.cfg.distributed.worker_weights
        key = (self.collector.positions_ingested, sum(t.batches for t in
                                                      list(self.collector.tally.values())),
               r, tuple(sorted(weights.items())))
        if self._window_figure is not None and self._window_figure[0] == key:
            return self._window_figure[1]  # nothing ingested since the last pass

        def choose(units: Sequence[tuple[str, int]], positions: int,
                   owners: Sequence[str]) -> list[int]:
            size = window_size(positions, r.min_positions, r.max_positions, r.growth)
            return select_newest(units, size, weights, WINDOW_SHARE_SLACK, owners=owners)

        chosen = self.collector.window_choice(choose)  # kept in the window's order
        games = sum(e.games for e in chosen)
        gen_sum = sum((e.generation if e.generation_mean is None else e.generation_mean)
                      * e.games for e in chosen)
        figure = games, sum(e.positions for e in chosen), (gen_sum / games if games else None)
        self._window_figure = (key, figure)
        return figure

    def snapshot(self) -> StatusSnapshot:
        weights = self.weights()
        members = dict(self.fleet.members)
        shares = balance.shares({n: m.generation_games for n, m in members.items()})
        over = self.collector.over_budget
        rows = []
        for name, m in members.items():
            hb = m.heartbeat
            state = self.states.get(name, WorkerState.OFFLINE)
            error = (over.get(name) or m.fault or (hb.last_error if hb and hb.last_error
                                                   else "")
                     or (m.error if state != WorkerState.ACTIVE else ""))
            if hb is not None and hb.paused:
                error = (f"outbox full ({hb.outbox_backlog}), paused; " + error).rstrip("; ")
            waiting = self.collector.deferred.get(name, 0)
            if waiting:
                error = (f"{waiting} batches deferred; " + error).rstrip("; ")
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
            generation=gen if (gen := self.generations.generation) >= 0 else None,
            window_games=games, window_positions=positions,
            staleness_generations=(gen - mean_gen) if mean_gen is not None
            else None,
            last_loss=self.generations.last_loss, elo=self.generations.elo, workers=rows,
            training_nodes=nodes.describe() if (nodes := self.rounds.training_nodes) else "",
            run_hours=self.run_hours(), hours_limit=self.cfg.run.hours, updated=_utc_now(),
            finished=self._finished, finished_after=self._finished_after,
            batches_deferred=sum(self.collector.deferred.get(n, 0) for n in members),
            games_repeated=sum(t.repeats for t in list(self.collector.tally.values())),
            trainer_error=self.generations.trainer_error)

    def _write_status(self) -> None:
        snap = self.snapshot()
        self.status_path.parent.mkdir(parents=True, exist_ok=True)
        write_status(self.status_path, snap)
        self._snap = snap
        try:
            self._write_page(snap)
        except OSError as e:  # the page is a view: a failure to write it stops nothing
            log.warning("cannot write %s: %s", self.paths.page, e)

    def _write_page(self, snap: StatusSnapshot) -> None:
        """index.html in the run folder: the status, the plots, the last games' SGF."""
        images = [p.name for p in (self.paths.progress_png, self.paths.strength_png)
                  if p.is_file()]
        games: list[str] = []
        root = self.paths.root / STRENGTH_GAMES
        if root.is_dir():
            stamps = sorted(p for p in root.iterdir() if p.is_dir())
            if stamps:
                newest = sorted(stamps[-1].glob("*.sgf"))[-PAGE_GAMES:]
                games = [f"{STRENGTH_GAMES}/{stamps[-1].name}/{g.name}" for g in newest]
        write_atomic(self.paths.page, render_html(snap, images, games).encode())

    def _progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress < 10.0:
            return
        self._last_progress = now
        snap = self._snap or self.snapshot()
        gen, total = self.rounds.in_hand(), self.total_games()
        training = f" training={gen}" if gen is not None else ""
        pace = self.rounds.pace(total, self.generation_target())
        line = (f"gen={self.generations.generation} games={total} {pace}"
                f"games_per_s={snap.games_per_s:.2f} workers_active={snap.workers_active}/"
                f"{snap.workers_total} window_positions={snap.window_positions} "
                f"model_sync_s={_fmt(snap.model_sync_s)} "
                f"net_mb_per_min={snap.network_mb_per_min:.2f} "
                f"loss={_fmt(self.generations.last_loss)}{training}")
        log.info("progress %s", line)


def _utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=str(REPO), capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _with_fixed_keys(cfg: Config, run: Config) -> Config:
    """`cfg` with the board and net of `run` (net.inference and net.inference_dtype stay
    `cfg`'s)."""
    return dataclasses.replace(cfg, go=run.go, net=dataclasses.replace(
        run.net, inference=cfg.net.inference, inference_dtype=cfg.net.inference_dtype))


def _fixed_key_changes(old: Config, new: Config) -> list[tuple[str, Any, Any]]:
    """(key, old value, new value) of the go.* and net.* keys that differ: a running run keeps
    them (every model, batch and window of the run depends on them). net.inference and
    net.inference_dtype are not: they say how searches run the same model."""
    changed = []
    for section in ("go", "net"):
        a, b = getattr(old, section), getattr(new, section)
        for f in dataclasses.fields(a):
            if (section, f.name) not in (("net", "inference"), ("net", "inference_dtype")) and \
                    getattr(a, f.name) != getattr(b, f.name):
                changed.append((f"{section}.{f.name}", getattr(a, f.name), getattr(b, f.name)))
    return changed
