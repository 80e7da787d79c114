"""The coach's side of training.mode continuous: one long-lived trainer for the whole run.

`LongLivedTrainer` is the other trainer driver beside `training.rounds.Rounds`: the coach
drives it the same way (`advance(counts)` returns the same events), and each generation its
trainer publishes goes through the run's `Generations` (`take`: the model check, the round
result, the arena and gating, publishing, `RoundConcluded` for the metrics row and the plot).
Each pass:

  1. admit: every batch the collector ingested into replay/ since the last pass
     (`Counts.ingested`) and not yet admitted gets one line in the admission log
     (`training.train.admissions`), in the ledger's order;
  2. keep the trainer running: `python -m training.trainer --continuous`, its output appended
     to `logs/trainer_continuous.log` (moved to `.1` past `LOG_ROTATE_BYTES`). A trainer that
     exits is started again after a backoff (1, 2, 4 ... s up to `distributed.backoff_max_s`),
     logged with its exit code, the log's tail and what the new one resumes from;
  3. take in the newest generation the trainer published since the last one taken (its
     `rounds/round_<gen>.json` appears after its model and checkpoint); older ones still
     waiting (an arena was gating, or two were published between passes) are skipped, said
     in the log.

Stopping ends the trainer with SIGTERM; the next one resumes from its newest checkpoint. The
contract between coach and trainer (the admission log, the ratio, publishing, the resume rule,
the clock) is docs/DESIGN.md's "Two trainer modes".

It must not: read batch files, decide what is admitted beyond what the collector ingested,
or import torch (the trainer runs in its own process).
"""

from __future__ import annotations

import collections
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from configs import Config
from training.generations import Counts, Event, Generations, RoundStarted
from training.run.child_process import launch_logged, log_tail, terminate
from training.run.run_dir import RunDir, round_result_generations
from training.train.admissions import AdmissionLog, TrainerState
from training.train.command import run_hours_flag, trainer_command

log = logging.getLogger(__name__)

LOG_NAME = "trainer_continuous.log"
LOG_ROTATE_BYTES = 64 << 20
"""The trainer's log is moved to `<log>.1` (replacing the one before) when a trainer starts
and it has grown past this."""


class LongLivedTrainer:
    """A run's long-lived trainer and the generations it publishes (module docstring).

    `generations` takes them in (and holds the config); `trainer_cmd`, when set, replaces
    `python -m training.trainer` (tests); `run_hours`, the run's hours so far."""

    training_nodes = None  # continuous mode trains on the main node (the config says so)

    def __init__(self, generations: Generations, *, trainer_cmd: Sequence[str] | None = None,
                 run_hours: Callable[[], float] | None = None):
        self.generations = generations
        self.trainer_cmd = list(trainer_cmd) if trainer_cmd else None
        self.run_hours = run_hours
        self.admissions: AdmissionLog | None = None
        self.unadmitted: collections.deque[tuple[str, int]] = collections.deque()
        """Ingested batches handed over and not admitted yet (an admission that failed, say on
        a full disk, is tried again on the next pass, and those after it)."""
        self.trainer: subprocess.Popen | None = None
        self.trainer_started = 0.0
        self.failures = 0  # trainer exits in a row
        self.restart_at = 0.0  # time.monotonic() before which no trainer is started
        self.taken: int | None = None  # the newest generation taken in (the first pass: the
        # newest published one; those trained after it are taken in from there)
        self.last_taken_at = time.monotonic()
        self.games_at_gen = 0  # games collected when the last generation was taken in

    @property
    def cfg(self) -> Config:
        return self.generations.cfg

    @property
    def paths(self) -> RunDir:
        return self.generations.paths

    @property
    def log_path(self) -> Path:
        return Path(self.cfg.logging.dir) / LOG_NAME

    def new_games(self, total_games: int) -> int:
        """Games collected since the last generation was taken in."""
        return total_games - self.games_at_gen

    def pace(self, total_games: int, target: int) -> str:
        """The progress line's words on the games since the last generation (no round)."""
        return f"since_generation={self.new_games(total_games)} "

    def in_hand(self) -> int | None:
        """The generation being evaluated, if any."""
        taken = self.generations.evaluating
        return taken.generation if taken is not None else None

    def sync_training_nodes(self) -> None:
        """Nothing to match: continuous mode has no training nodes."""

    # ------------------------------------------------------------------ the loop

    def advance(self, counts: Counts) -> list[Event]:
        """One pass: admit, take in what the trainer published, keep it running; returns
        what happened."""
        gens = self.generations
        if self.taken is None:
            self.taken = gens.generation
        self._admit(counts)
        events = gens.poll()  # a rating or an evaluation that ended
        iterations = self.cfg.run.iterations
        done = bool(iterations) and gens.concluded >= iterations
        if gens.evaluating is None and not done:
            events += self._take_newest(counts)
        if not done:
            self._keep_trainer()
        return events

    def _admit(self, counts: Counts) -> None:
        """One admission log line per ingested batch not yet admitted (ledger order)."""
        self.unadmitted.extend(counts.ingested)
        if self.admissions is None:
            self.admissions = AdmissionLog(self.paths.admissions)
            log.info("admission log %s: %d batches admitted before", self.paths.admissions,
                     self.admissions.seq)
        admitted = 0
        while self.unadmitted:
            name, positions = self.unadmitted[0]
            if name not in self.admissions.names:
                self.admissions.admit(name, positions)
                admitted += 1
            self.unadmitted.popleft()
        if admitted:
            log.debug("admitted %d batches (through seq %d)", admitted, self.admissions.seq)

    def _take_newest(self, counts: Counts) -> list[Event]:
        """The newest generation the trainer wrote since the last one taken, through
        `Generations.take` (skipping older ones not taken yet)."""
        newest = max((g for g in round_result_generations(self.paths.rounds)
                      if g > self.taken), default=None)
        if newest is None:
            return []
        if newest > self.taken + 1:
            log.info("generations %d..%d were trained since generation %d was taken in: "
                     "taking in the newest, %d (the others stay on disk, unpublished)",
                     self.taken + 1, newest - 1, self.taken, newest)
        self.generations.clear_failures()  # it trains: errors are history
        now = time.monotonic()
        events = self.generations.take(newest, now - self.last_taken_at, self.log_path)
        # taken only now: a take that raises (publishing on a full disk) is tried again
        self.taken, self.last_taken_at = newest, now
        self.games_at_gen = counts.total_games  # the next generation's games count from here
        return [RoundStarted(newest + 1), *(events or [])]

    def _keep_trainer(self) -> None:
        """Start the trainer, or start it again after it exited (with backoff)."""
        if self.trainer is not None:
            code = self.trainer.poll()
            if code is None:
                if time.monotonic() - self.trainer_started > 60:
                    self.failures = 0  # it has run a while: the next exit starts afresh
                return
            self.trainer = None
            self.failures += 1
            backoff = min(float(2 ** (self.failures - 1)),
                          max(1.0, self.cfg.distributed.backoff_max_s))
            self.restart_at = time.monotonic() + backoff
            tail = log_tail(self.log_path)
            log.error("the continuous trainer exited (code %s after %.0fs); starting it again "
                      "in %.0fs. %s ends:\n%s", code, time.monotonic() - self.trainer_started,
                      backoff, self.log_path, tail)
            self.generations.trainer_failed("continuous", f"exit {code}", self.log_path, tail)
            return
        if time.monotonic() < self.restart_at:
            return
        self._launch_trainer()

    def trainer_command(self) -> list[str]:
        """`python -m training.trainer --continuous` (or the coach's trainer command) with the
        run's hours so far; it relaunches itself under torchrun across the node's GPUs."""
        hours = None if self.run_hours is None or self.cfg.run.hours <= 0 else self.run_hours()
        if self.trainer_cmd:
            return [*self.trainer_cmd, "--continuous", *run_hours_flag(hours)]
        return trainer_command(sys.executable, str(self.paths.config), str(self.paths.root),
                               continuous=True, run_hours=hours)

    def _launch_trainer(self) -> None:
        from training.train.train_state import latest  # torch: not at the coach's import

        cmd = self.trainer_command()
        found = latest(self.paths.checkpoints, "checkpoint")
        last = TrainerState.read(self.paths.trainer_state)
        if found is None:
            origin = f"model generation {self.generations.generation} (no checkpoint yet)"
        else:
            origin = f"{found[1].name}"
        lost = ""
        if last is not None and found is not None and last.generation >= found[0]:
            lost = (f"; the last trainer had trained {last.trained_samples} samples "
                    f"through admission {last.admitted_seq}: its steps after "
                    f"{found[1].name} are lost and trained again within the ratio")
        log.info("starting the continuous trainer: it resumes from %s, %d batches admitted%s: "
                 "%s", origin, self.admissions.seq if self.admissions else 0, lost,
                 " ".join(cmd))
        _rotate(self.log_path)
        self.trainer = launch_logged(cmd, self.log_path)
        self.trainer_started = time.monotonic()

    # ------------------------------------------------------------------ stopping

    def abandon(self) -> None:
        """The coach stops: the trainer (SIGTERM; it saves nothing, the next one resumes from
        its newest checkpoint) and the generations' evaluation."""
        if self.trainer is not None:
            log.info("stopping the continuous trainer (it resumes from its newest checkpoint "
                     "next time)")
            terminate(self.trainer)
            self.trainer = None
        self.generations.abandon()

    def close(self) -> None:
        """Nothing held beyond the trainer (`abandon` stops it)."""


def _rotate(path: Path) -> None:
    """Move a log past `LOG_ROTATE_BYTES` to `<path>.1`, so that it never grows without end."""
    try:
        if path.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))
    except OSError:
        pass
