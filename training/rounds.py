"""The coach's training rounds: one trainer subprocess per generation.

`Rounds` runs one round at a time. It holds the run's `Generations` (what follows a trained
generation: the model check, the round result, the arena and gating, publishing) and receives
what else it needs (the trainer command, whether training nodes take part); on each call of
`advance(counts)` with what the coach counted this pass (`Counts`), it returns what happened
as events: `RoundStarted`, and those of `Generations` (`ModelPublished`, `RoundConcluded`,
`Rated`). The coach reacts to them (load balancing's baselines, the push to the workers, the
metrics row, the plot again once the arena has rated a concluded round); nothing here touches
the fleet, the collector or the coach, and nothing waits:

  1. due: once the generation's new games (`Counts.target`, see `training.fleet.balance`)
     and `training.min_new_positions` new positions have arrived, and no failed round is
     backing off (`distributed.backoff_max_s`), and the last generation is evaluated;
  2. start: without training nodes at once; with them (`distributed.training_nodes`) their
     start runs as a `Job` (network work, off the loop) and the round launches when it is done;
  3. train: `python -m training.trainer` (or the coach's trainer command) as a subprocess, its
     output in `logs/trainer_<gen>.log`; games that arrive meanwhile count for the next round;
  4. finish: the trainer exited. A non-zero exit fails the round, and so does a model that
     `Generations.take` does not take (none written, or refused): the round is retried after
     the backoff. Otherwise the generation is `take`n: evaluated, published, concluded.

It must not: talk to a host from the coach's loop (the training nodes' start is a Job, model
pushes are the coach's), play games, decide load balancing (`training.fleet.balance`), read
the coach's state, or import torch (the trainer and the arena run in other processes).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from configs import Config
from training.fleet.fleet import Job
from training.generations import Counts, Event, Generations, RoundStarted
from training.run import model_store
from training.run.child_process import launch_logged, terminate
from training.run.run_dir import RunDir
from training.train.command import run_hours_flag, trainer_command

log = logging.getLogger(__name__)

@dataclass
class Round:
    """A training round running as a subprocess."""

    generation: int  # the generation it produces
    popen: subprocess.Popen
    started: float
    log_path: Path
    games_at_start: int


class Rounds:
    """A run's training rounds (see the module docstring).

    `generations` takes in what each round trained (and holds the config, `cfg`);
    `trainer_cmd`, when set, replaces `python -m training.trainer` (tests); `distributed`:
    training nodes take part; `run_hours`, the run's hours so far, read once a round."""

    def __init__(self, generations: Generations, *, trainer_cmd: Sequence[str] | None = None,
                 distributed: bool = False, run_hours: Callable[[], float] | None = None):
        self.generations = generations
        self.trainer_cmd = list(trainer_cmd) if trainer_cmd else None
        self.distributed = distributed
        self.run_hours = run_hours
        self.round_hours: float | None = None  # what this round's ranks all get
        self.current: Round | None = None  # the round whose trainer runs
        self.training_nodes: Any = None  # remote_training.TrainingNodes when configured
        self.node_start: Job | None = None  # the training nodes being started for a round
        self.round_nodes: list[str] = []  # extra nodes of the running round
        self.games_at_gen = 0  # games collected when the current generation's count began
        self.retry_at = 0.0  # time.monotonic() before which a failed round is not retried
        self._events: list[Event] = []

    @property
    def cfg(self) -> Config:
        return self.generations.cfg

    @property
    def paths(self) -> RunDir:
        return self.generations.paths

    def new_games(self, total_games: int) -> int:
        """Games collected since the current generation's count began."""
        return total_games - self.games_at_gen

    def pace(self, total_games: int, target: int) -> str:
        """The progress line's words on when the next generation is trained."""
        return f"next_round={self.new_games(total_games)}/{target} "

    def in_hand(self) -> int | None:
        """The generation being trained or evaluated, if any."""
        if self.current is not None:
            return self.current.generation
        taken = self.generations.evaluating
        return taken.generation if taken is not None else None

    # ------------------------------------------------------------------ the round

    def advance(self, counts: Counts) -> list[Event]:
        """One pass: drive the running round a step, or start one when it is due; returns
        what happened."""
        self._advance(counts)
        events, self._events = self._events, []
        return events

    def _advance(self, counts: Counts) -> None:
        gens = self.generations
        evaluating = gens.evaluating is not None
        self._events += gens.poll()  # a rating or an evaluation that ended
        if self.node_start is not None:
            self._launch_when_nodes_ready(counts)
            return
        rnd = self.current
        if rnd is not None:
            code = rnd.popen.poll()
            if code is None and self.round_nodes:
                for name in self.training_nodes.check():
                    log.warning("training node %s: its trainer died; the round fails "
                                "within training.timeout_s=%s", name,
                                self.cfg.training.timeout_s)
            if code is not None:
                self._finish_training(code)
            return
        if evaluating:  # it concluded this pass at the earliest: the next round comes after
            return
        iterations = self.cfg.run.iterations
        if iterations and gens.concluded >= iterations:
            return
        if self.new_games(counts.total_games) < counts.target:
            return
        if time.monotonic() < self.retry_at:
            return
        if counts.new_positions < self.cfg.training.min_new_positions:
            return
        self._start(counts)

    def start(self, counts: Counts) -> list[Event]:
        """Start the next round now, due or not; returns what happened."""
        self._start(counts)
        events, self._events = self._events, []
        return events

    def trainer_command(self, generation: int, nodes: int = 0,
                        master_addr: str = "") -> list[str]:
        """The trainer re-launches itself under torchrun when several GPUs/nodes train;
        with `nodes` extra training nodes it is node rank 0 of nodes + 1."""
        hours = self.round_hours
        if self.trainer_cmd:
            return [*self.trainer_cmd, "--generation", str(generation),
                    *run_hours_flag(hours)]
        return trainer_command(sys.executable, str(self.paths.config), str(self.paths.root),
                               generation, nodes=nodes + 1, master_addr=master_addr,
                               master_port=self.cfg.training.master_port, run_hours=hours)

    def _hours(self) -> float | None:
        """The run's hours so far when it has a time limit (run.hours), else None."""
        if self.run_hours is None or self.cfg.run.hours <= 0:
            return None
        return self.run_hours()

    def next_generation(self) -> int:
        """One past the newest trained model (a model refused by gating keeps its number)."""
        trained = model_store.list_models(self.paths.models)
        return max([self.generations.generation, *trained]) + 1

    def sync_training_nodes(self) -> None:
        """Match `training_nodes` to distributed.training_nodes of the current config.

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
            from training.fleet.remote_training import TrainingNodes

            self.training_nodes = TrainingNodes(self.cfg, str(self.paths.config))

    def _start(self, counts: Counts) -> None:
        """Start the next training round: at once without training nodes; with them, their
        start runs as a job (network work) and `advance` launches the round when it is done."""
        self.sync_training_nodes()
        gen = self.next_generation()
        self.round_hours = hours = self._hours()  # one value for every rank of the round
        if self.training_nodes is None:
            self._launch(gen, 0, "", counts)
            return
        nodes, d = self.training_nodes, self.cfg.distributed
        deadline = (d.retries + 1) * (d.connect_timeout_s + 4 * max(d.command_timeout_s, 300.0))
        self.node_start = Job(f"start-nodes-{gen}", lambda: (gen, *nodes.start_round(
            gen, self.cfg.training.master_port, hours)), deadline)

    def _launch_when_nodes_ready(self, counts: Counts) -> None:
        from training.fleet.remote_training import NodeStartError

        job = self.node_start
        if job.overdue():
            self.node_start = None
            log.warning("training nodes did not start within %.0fs; their connections are "
                        "closed and the round is retried", job.deadline_s)
            self.training_nodes.abort()
            self.retry_at = time.monotonic() + self.cfg.distributed.backoff_max_s
            return
        if not job.done():
            return
        self.node_start = None
        try:
            gen, nodes, addr = job.result()
        except (NodeStartError, OSError) as e:
            log.warning("training round not started: %s; retrying next pass", e)
            return
        self.round_nodes = list(self.training_nodes.in_round)
        if not nodes and self.training_nodes.names():
            log.warning("training generation %d on the main node only (training nodes "
                        "benched: %s)", gen, ", ".join(self.training_nodes.names()))
        self._launch(gen, nodes, addr, counts)

    def _launch(self, gen: int, nodes: int, addr: str, counts: Counts) -> None:
        log_path = Path(self.cfg.logging.dir) / f"trainer_{gen:06d}.log"
        # a result left by an earlier attempt at this generation must not pass for this one's
        self.paths.round_result(gen).unlink(missing_ok=True)
        cmd = self.trainer_command(gen, nodes, addr)
        total = counts.total_games
        log.info("training generation %d on %d games (%d new): %s", gen, total,
                 self.new_games(total), " ".join(cmd))
        self.current = Round(gen, launch_logged(cmd, log_path), time.monotonic(), log_path,
                             total)
        # games that arrive while it trains count for the next round (workers never wait)
        self.games_at_gen = total
        self._events.append(RoundStarted(gen))

    def _finish_training(self, code: int) -> None:
        """The trainer exited: on success the generation is taken in, else retried. The
        round stays current until then (a take that raises, say on a full disk, is tried
        again on the next pass)."""
        rnd = self.current
        train_s = time.monotonic() - rnd.started
        if self.round_nodes:
            self.training_nodes.finish_round(code == 0
                                             and self.paths.model(rnd.generation).exists())
            self.round_nodes = []
        if code != 0:
            self.generations.round_failed(rnd.generation, code, train_s, rnd.log_path,
                                          f"exit {code}")
            events = None
        else:
            events = self.generations.take(rnd.generation, train_s, rnd.log_path)
        self.current = None
        if events is None:
            self.games_at_gen = rnd.games_at_start
            self.retry_at = time.monotonic() + self.cfg.distributed.backoff_max_s
            return
        self._events += events

    # ------------------------------------------------------------------ stopping

    def abandon(self) -> None:
        """The coach stops: end a running round (its trainer, its evaluation) and the
        training nodes' part of it."""
        rnd, self.current = self.current, None
        if (busy := rnd or self.generations.evaluating) is not None:
            log.warning("stopping: training round for generation %d abandoned", busy.generation)
        if rnd is not None:
            terminate(rnd.popen)
        self.generations.abandon()  # an evaluation or rating stops with `stopping`
        if self.training_nodes is not None:
            self.training_nodes.stop_round(wait=True)

    def close(self) -> None:
        if self.training_nodes is not None:
            self.training_nodes.close()
