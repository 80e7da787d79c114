"""The coach: workers -> collect games -> train -> publish the next model -> status.

`Coach(cfg).run()` is the main node's loop, the same for local worker processes
(`training.local_workers.LocalFleet`, the default) and SSH hosts
(`training.ssh_workers.SSHFleet`, `--distributed`). Each pass of the loop (every
`distributed.poll_interval_s`):

  1. supervise: restart dead daemons with backoff; act on `ssh_connector.py --restart`
     requests; apply edits of the watched config file (added workers start, removed stop);
  2. heartbeats -> worker states (Active, Syncing, Error, Offline);
  3. collect: every worker's outbox through the `Collector` (exactly once, validated by
     replay, rejects quarantined), within its load-balancing quota;
  4. train: once `self_play.games_per_worker` x active workers new games have arrived since
     the last round, run one training round as a subprocess (`python -m training.trainer`, or
     `torchrun` for several GPUs) while collecting goes on; then (optional gating) publish
     `models/model_<gen>.pt.zst` + manifest and push it to every worker in parallel;
  5. `distributed/status.txt` (atomic), the metrics row and `progress.png`
     (`training.metrics`), a progress line in the log.

Load balancing (`distributed.load_balancing`, `worker_weights`): a worker's weight is its
share of each generation's games. With weights w_i over the active workers and
G = games_per_worker x active workers, worker i delivers at most ceil(k * G * w_i / sum(w))
games, k = 1, 2, ... rising as soon as every active worker has reached its cap; the coach
simply leaves a worker's surplus batches in its outbox (bounded: the worker pauses at
`max_outbox_batches`) until the others catch up. A weight of 2.0 therefore means "twice the
games of a 1.0 worker in every generation", and a slow heavy worker makes the others wait
for it. Without weights nothing is capped: the generation's G games come from whoever plays
them, so each worker's share equals its share of the measured speed (WEIGHT shows its
games/s) and nobody waits. `load_balancing: false` also collects everything as it comes.
The status file shows each worker's WEIGHT and its actual SHARE of the games collected since
the last training round started.

Resume: everything the loop needs is on disk (published models, checkpoints, the ledger), so
a coach started again on the same run folder (`--resume`, the default when it exists) picks up
where the last one stopped; batches are counted exactly once (see `training.collector`).

It must not: play games, touch paramiko (the SSH fleet goes through `SSHConnector`), or
import torch at module level (the trainer subprocess and `net` do the torch work).
"""

from __future__ import annotations

import json
import logging
import math
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
    Heartbeat,
    StatusSnapshot,
    WorkerRow,
    WorkerState,
    write_status,
)
from distributed.transfer import TransferStats, write_atomic
from training import model_store
from training.collector import Collector, validate_with_records
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


@dataclass
class _WorkerView:
    """What the coach knows about one worker between polls."""

    heartbeat: Heartbeat | None = None
    state: WorkerState = WorkerState.OFFLINE
    last_seen: float | None = None  # time.time() of the freshest heartbeat seen
    generation_games: int = 0  # games collected from it for the current generation
    error: str = ""
    speed: float = 0.0  # smoothed games/s


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
        self.views: dict[str, _WorkerView] = {}
        self.generation = -1  # newest published generation
        self.generations_done = 0
        self.round: _Round | None = None
        self.last_loss: float | None = None
        self.elo: float | None = None
        self.model_sync_s: float | None = None
        self._push_started: dict[int, float] = {}
        self._gen_started_games = 0
        self._games_at_gen = 0
        self._last_progress = 0.0
        self._retry_round_at = 0.0
        self._delivered: dict[str, int] = {}  # newest generation pushed to each worker
        self._repush_after: dict[str, float] = {}
        self._started = time.monotonic()
        self.fleet: Any = None
        self.collector: Collector | None = None
        self.training_nodes: Any = None  # remote_training.TrainingNodes when configured
        self._round_nodes: list[str] = []  # extra nodes of the running round

    # ------------------------------------------------------------------ setup

    def _prepare_run_dir(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
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

    def _make_fleet(self) -> Any:
        if self.distributed:
            from training.ssh_workers import SSHFleet

            return SSHFleet(self.cfg, self.run_dir, self.run_config_path, stats=self.stats,
                            next_seq=self.collector.next_seq)
        from training.local_workers import LocalFleet

        return LocalFleet(self.cfg, self.run_dir, self.run_config_path, self._local_devices(),
                          next_seq=self.collector.next_seq, worker_class=self.worker_class)

    def _local_devices(self) -> list[str]:
        sp = self.cfg.self_play
        n_gpus = 0
        if not sp.cpu_only:
            import torch

            n_gpus = torch.cuda.device_count()
        try:
            from training.placement import plan_workers
        except ImportError:  # HACK(coach): until placement.py lands
            return ["cpu"] * sp.workers if n_gpus == 0 else [
                f"cuda:{i % n_gpus}" for i in range(sp.workers)]
        devices, messages = plan_workers(sp.workers, sp.workers_per_gpu, sp.cpu_only, n_gpus)
        for m in messages:
            log.warning("%s", m)
            print(m, file=sys.stderr)
        return list(devices)

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
        self.setup()
        observer = self._watch_config() if self.watch_config else None
        log.info("coach: run folder %s, %s mode, workers %s, target %s generations",
                 self.run_dir, "distributed" if self.distributed else "local",
                 ",".join(self.fleet.names()) or "(none)", self.cfg.run.iterations or "endless")
        try:
            self._start_fleet()
            while not self._stop.is_set():
                self._step()
                if self._done():
                    break
                self._stop.wait(self.cfg.distributed.poll_interval_s)
        finally:
            if self.round is not None:
                log.warning("stopping: training round for generation %d abandoned",
                            self.round.generation)
                _terminate(self.round.popen)
                self.round = None
                if self.training_nodes is not None:
                    self.training_nodes.stop_round()
            if observer is not None:
                observer.stop()
            self.fleet.stop_all()
            self._poll_heartbeats()
            self._collect(everything=True)  # the last batches the stopped workers flushed
            self._write_status()
            if hasattr(self.fleet, "close"):
                self.fleet.close()
            if self.training_nodes is not None:
                self.training_nodes.close()
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
        results = self.fleet.start_all()
        for name, res in results.items():
            if isinstance(res, Exception):
                self._view(name).error = f"{type(res).__name__}: {res}"
        self._push(self.generation)

    def _step(self) -> None:
        """One pass of the loop; operational failures are logged and retried next pass."""
        try:
            self._handle_requests()
            if self._config_changed.is_set():
                self._reload_config()
            self.fleet.supervise()
            self._poll_heartbeats()
            self._repush_missing()
            self._collect()
            self._advance_training()
            self._write_status()
            self._progress()
        except Exception:  # noqa: BLE001 - the loop boundary: log, carry on next pass
            log.exception("coach loop pass failed; retrying")

    # ------------------------------------------------------------------ workers

    def _view(self, name: str) -> _WorkerView:
        return self.views.setdefault(name, _WorkerView())

    def _poll_heartbeats(self) -> None:
        now = time.time()
        beats = self.fleet.heartbeats()
        for name in list(self.views):
            if name not in beats:
                del self.views[name]
        for name, hb in beats.items():
            view = self._view(name)
            if isinstance(hb, Exception):
                view.error = f"{type(hb).__name__}: {hb}"
                hb = None
            if hb is not None:
                if view.heartbeat is None or hb.time != view.heartbeat.time:
                    view.last_seen = now  # our clock, when it last changed
                    if not hb.paused and hb.games_per_s > 0:  # a paused worker is not slow
                        view.speed = (0.7 * view.speed + 0.3 * hb.games_per_s) if view.speed \
                            else hb.games_per_s
                view.heartbeat = hb
                view.error = ""
            fresh = view.last_seen is not None and (
                now - view.last_seen <= self.cfg.distributed.offline_after_s)
            view.state = view.heartbeat.state if fresh else WorkerState.OFFLINE
        self._check_sync_done()

    def _active(self) -> list[str]:
        return [n for n, v in self.views.items()
                if v.state in (WorkerState.ACTIVE, WorkerState.SYNCING)]

    def weights(self) -> dict[str, float]:
        """Each worker's load-balancing weight (config, else measured games/s, else 1)."""
        dist = self.cfg.distributed
        out = {}
        for name in self.fleet.names():
            if name in dist.worker_weights:
                out[name] = dist.worker_weights[name]
            elif dist.load_balancing and not dist.worker_weights:
                out[name] = max(self._view(name).speed, 1e-3)
            else:
                out[name] = 1.0
        if dist.load_balancing and not dist.worker_weights:
            speeds = [v for v in out.values() if v > 1e-3]
            if len(speeds) < len(out):  # not all measured yet: equal shares meanwhile
                out = {n: 1.0 for n in out}
        return out

    def generation_target(self) -> int:
        """New games needed for the next training round."""
        active = max(1, len(self._active()))
        return self.cfg.self_play.games_per_worker * active

    def quotas(self) -> dict[str, int | None]:
        """Games each active worker may still deliver before the others catch up (None = no
        cap). Only configured weights cap: worker i may deliver up to k * G * w_i / sum(w),
        with k the smallest whole number that leaves some active worker under its cap.
        Without weights nothing is capped: each worker's share follows its own speed."""
        names = self.fleet.names()
        dist = self.cfg.distributed
        if not dist.load_balancing or not dist.worker_weights:
            return {n: None for n in names}
        weights = self.weights()
        active = [n for n in self._active() if n in weights]
        if not active:
            return {n: None for n in names}
        total_w = sum(weights[n] for n in active)
        target = self.generation_target()
        per_round = {n: target * weights[n] / total_w for n in active}
        fill = min(self._view(n).generation_games / per_round[n] for n in active)
        k = math.floor(fill) + 1
        out: dict[str, int | None] = {n: None for n in names}  # inactive: whatever is there
        for name in active:
            out[name] = max(0, math.ceil(k * per_round[name]) - self._view(name).generation_games)
        return out

    def _collect(self, *, everything: bool = False) -> None:
        quotas = self.quotas()
        for name in self.fleet.names():
            left = None if everything else quotas.get(name)
            if left == 0:
                continue  # ahead of its share: its batches wait in its outbox
            try:
                res = self.collector.collect(name, self.fleet.source(name), max_games=left,
                                             current_generation=self.generation)
            except Exception as e:  # noqa: BLE001 - source/transfer errors, per worker
                self._view(name).error = f"collect: {type(e).__name__}: {e}"
                log.warning("worker %s: collecting failed, will retry: %s", name, e)
                continue
            self._view(name).generation_games += res.games

    def _handle_requests(self) -> None:
        from distributed.restart_requests import take_requests

        for action, name in take_requests(self.requests_dir):
            if action == "restart" and name in self.fleet.names():
                log.info("restart of %s requested from the command line", name)
                try:
                    self.fleet.restart(name)
                except Exception as e:  # noqa: BLE001 - per-worker outcome
                    log.error("restart of %s failed: %s", name, e)
                    self._view(name).error = f"restart failed: {e}"
            else:
                log.warning("request %s %s ignored: no such worker", action, name)

    def _watch_config(self) -> Any:
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

        observer = Observer()
        observer.daemon = True
        observer.schedule(_Handler(), str(target.parent), recursive=False)
        observer.start()
        return observer

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
        if self.distributed:
            added, removed = self.fleet.set_workers(list(new.distributed.workers), new)
        else:
            self.cfg = new
            self.fleet.cfg = new
            added, removed = self.fleet.set_workers(self._local_devices())
        self.cfg = new
        write_atomic(self.run_config_path, f"# git commit: {_git_commit()}\n" + dump_config(new))
        log.info("config reloaded: workers added %s, removed %s", added or "-", removed or "-")
        for name in removed:
            self.views.pop(name, None)
        for name in added:
            try:
                self.fleet.start(name)
                self._delivered.pop(name, None)
                self._push(self.generation, names=[name])
            except Exception as e:  # noqa: BLE001 - per-worker outcome
                log.error("worker %s: could not start: %s", name, e)
                self._view(name).error = str(e)

    # ------------------------------------------------------------------ training

    def _total_games(self) -> int:
        return sum(t.games for t in self.collector.tally.values()) if self.collector else 0

    def _new_games(self) -> int:
        return self._total_games() - self._games_at_gen

    def _advance_training(self) -> None:
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
        new_positions = sum(int(e.get("positions", 0)) for e in self.collector.entries.values()
                            if e["status"] == "ingested"
                            and int(e.get("coach_generation", -1)) >= self.generation)
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
        self._sync_training_nodes()
        gen = self._next_generation()
        log_path = Path(self.cfg.logging.dir) / f"trainer_{gen:06d}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        nodes, addr = 0, ""
        if self.training_nodes is not None:
            from training.remote_training import NodeStartError

            try:
                nodes, addr = self.training_nodes.start_round(gen,
                                                              self.cfg.training.master_port)
            except NodeStartError as e:
                log.warning("training round for generation %d not started: %s; retrying "
                            "next pass", gen, e)
                return
            self._round_nodes = list(self.training_nodes.in_round)
            if not nodes and self.training_nodes.names():
                log.warning("training generation %d on the main node only (training nodes "
                            "benched: %s)", gen, ", ".join(self.training_nodes.names()))
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
        for view in self.views.values():
            view.generation_games = 0

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
        if promote:
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
        try:
            result = arena.evaluate_generation(self.cfg, self.run_dir, generation)
        except Exception:  # noqa: BLE001 - evaluation must never stop training
            log.exception("evaluation of generation %d failed; promoting it", generation)
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

    def _push(self, generation: int, names: list[str] | None = None) -> None:
        manifest = self._manifest(generation)
        t0 = time.monotonic()
        if names is None:
            self._push_started[generation] = t0
        results = self.fleet.push_model(self.models_dir, manifest, names=names)
        ok = [n for n, r in results.items() if not isinstance(r, Exception)]
        for name in ok:
            self._delivered[name] = max(generation, self._delivered.get(name, -1))
        for name, r in results.items():
            if isinstance(r, Exception):
                self._view(name).error = f"model push failed: {r}"
                self._repush_after[name] = t0 + self.cfg.distributed.backoff_max_s
        log.info("pushed generation %d to %d/%d workers in %.2fs", generation, len(ok),
                 len(results), time.monotonic() - t0)

    def _repush_missing(self) -> None:
        """A worker that missed a push (its host was down) gets the current model again."""
        if self.generation < 0:
            return
        now = time.monotonic()
        missing = [n for n in self.fleet.names()
                   if self._delivered.get(n, -1) < self.generation
                   and self._view(n).state != WorkerState.OFFLINE
                   and now >= self._repush_after.get(n, 0.0)]
        if missing:
            log.info("re-pushing generation %d to %s", self.generation, ",".join(missing))
            self._push(self.generation, names=missing)

    def _check_sync_done(self) -> None:
        """Model sync time: from the push until every active worker runs the new model."""
        t0 = self._push_started.get(self.generation)
        if t0 is None:
            return
        active = self._active()
        if active and all(self.views[n].heartbeat is not None
                          and self.views[n].heartbeat.generation >= self.generation
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
        now = time.time()
        weights = self.weights()
        gen_total = sum(v.generation_games for v in self.views.values()) or 0
        rows = []
        for name in self.fleet.names():
            v = self._view(name)
            hb = v.heartbeat
            error = (hb.last_error if hb and hb.last_error else "") or v.error or (
                self.fleet.last_errors().get(name, "") if v.state != WorkerState.ACTIVE else "")
            if hb is not None and hb.paused:
                error = (f"outbox full ({hb.outbox_backlog}), paused; " + error).rstrip("; ")
            tally = self.collector.tally.get(name)
            if tally is not None and tally.rejected:
                error = (f"{tally.rejected} batches rejected (quarantine/); " + error).rstrip("; ")
            rows.append(WorkerRow(
                name=name, host=self.fleet.hosts.get(name, "-"), state=v.state,
                gpu=self.fleet.gpus.get(name, "-"),
                generation=hb.generation if hb and hb.generation >= 0 else None,
                games=tally.games if tally else 0,
                games_per_s=hb.games_per_s if hb and v.state != WorkerState.OFFLINE else 0.0,
                weight=weights.get(name, 1.0),
                share=(v.generation_games / gen_total) if gen_total else 0.0,
                heartbeat_age_s=(now - v.last_seen) if v.last_seen else None,
                restarts=self.fleet.restarts.get(name, 0),
                last_error=error))
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
