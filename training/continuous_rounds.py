"""The coach's side of training.mode continuous: one long-lived trainer for the whole run.

`ContinuousRounds` is `training.rounds.Rounds` with its trainer kept running instead of one
per generation; the coach drives it the same way (`advance(counts)` returns the same events)
and everything after a generation is trained is the rounds' own path, unchanged
(`_finish_training`: the model check, the round result, the arena and gating, publishing,
`RoundConcluded` for the metrics row and the plot). Each pass:

  1. admit: every batch the collector ingested into replay/ (validated, in the ledger, within
     the shares) and not yet admitted gets one line in the admission log
     (`training.learn.admissions`, `RunDir.admissions`), in the ledger's order; the trainer
     reads nothing else;
  2. keep the trainer running: `python -m training.trainer --continuous` (torchrun across the
     main node's GPUs as a round's, Gloo ranks on the CPU), its output appended to
     `logs/trainer_continuous.log`. A trainer that exits is started again after a backoff
     (1, 2, 4 ... s up to `distributed.backoff_max_s`), logged with its exit code, the log's
     tail and what the new one resumes from; until it publishes a generation again,
     `trainer_error` says how many exits in a row and the log's last error line (status.txt);
  3. take in each generation the trainer published (rounds/round_<gen>.json appears after its
     model and checkpoint): the newest one not yet taken goes through the rounds' path; an
     older one still waiting when a newer arrives (an arena was still gating, or the trainer
     published two between passes) is skipped, said in the log, and the trainer goes on
     from its own net either way.

Stopping (Ctrl-C, run.hours, run.iterations) ends the trainer with SIGTERM; it saves nothing
then, and the next one resumes from its newest checkpoint, as after a kill -9 of it or of the
coach (the trainer dies with its parent). The generations a resumed coach finds trained but
not yet published are taken in as above.

It must not: read batch files, decide what is admitted beyond what the collector ingested,
or import torch (the trainer runs in its own process).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from training.learn.admissions import AdmissionLog
from training.learn.command import run_hours_flag
from training.learn.train_state import latest
from training.rounds import (
    REPO,
    Counts,
    Rated,
    Round,
    Rounds,
    RoundStarted,
    _terminate,
    log_tail,
    trainer_failure,
)
from training.run.signals import die_with_parent

log = logging.getLogger(__name__)

LOG_NAME = "trainer_continuous.log"
_ROUND_RE = re.compile(r"^round_(\d{6,})\.json$")


class ContinuousRounds(Rounds):
    """A run's long-lived trainer and the generations it publishes (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.admissions: AdmissionLog | None = None
        self.admitted_upto = 0  # ingested batches (in the ledger's order) looked at so far
        self.trainer: subprocess.Popen | None = None
        self.trainer_started = 0.0
        self.failures = 0  # trainer exits in a row
        self.restart_at = 0.0  # time.monotonic() before which no trainer is started
        self.taken = -1  # the newest generation taken in from the trainer
        self.last_taken_at = time.monotonic()

    @property
    def log_path(self) -> Path:
        return Path(self.cfg.logging.dir) / LOG_NAME

    def ensure_first_model(self) -> None:
        super().ensure_first_model()
        # generations trained after the newest published one are taken in from here
        self.taken = self.generation

    # ------------------------------------------------------------------ the loop

    def _advance(self, counts: Counts) -> None:
        if self.rating is not None and not self.rating.is_alive():
            self.rating = None
            self._events.append(Rated(self.rating_generation))
        self._admit(counts)
        rnd = self.current
        if rnd is not None and rnd.evaluation is not None and not rnd.evaluation.is_alive():
            self._conclude()
        iterations = self.cfg.run.iterations
        done = bool(iterations) and self.concluded >= iterations
        if self.current is None and not done:
            self._take_newest(counts)
        if not done:
            self._keep_trainer(counts)

    def _admit(self, counts: Counts) -> None:
        """One admission log line per ingested batch not yet admitted (ledger order)."""
        if self.admissions is None:
            self.admissions = AdmissionLog(self.paths.admissions)
            log.info("admission log %s: %d batches admitted before", self.paths.admissions,
                     self.admissions.seq)
        admitted = 0
        for name, positions in counts.ingested(self.admitted_upto):  # this pass's new ones
            if name not in self.admissions.names:
                self.admissions.admit(name, positions)
                admitted += 1
            self.admitted_upto += 1
        if admitted:
            log.debug("admitted %d batches (through seq %d)", admitted, self.admissions.seq)

    def _take_newest(self, counts: Counts) -> None:
        """The newest generation the trainer wrote since the last one taken, through the
        rounds' path (skipping older ones not taken yet)."""
        newest = max((g for g in _round_generations(self.paths.rounds) if g > self.taken),
                     default=None)
        if newest is None:
            return
        if newest > self.taken + 1:
            log.info("generations %d..%d were trained since generation %d was taken in: "
                     "taking in the newest, %d (the others stay on disk, unpublished)",
                     self.taken + 1, newest - 1, self.taken, newest)
        self.taken = newest
        self.trainer_failures, self.trainer_error = 0, ""  # it trains: errors are history
        now = time.monotonic()
        self.current = Round(newest, self.trainer, self.last_taken_at, self.log_path,
                             counts.total_games)
        self.last_taken_at = now
        self.games_at_gen = counts.total_games  # the next generation's games count from here
        self._events.append(RoundStarted(newest + 1))
        self._finish_training(0)

    def _keep_trainer(self, counts: Counts) -> None:
        """Start the trainer, or start it again after it exited (with backoff)."""
        if self.trainer is not None:
            code = self.trainer.poll()
            if code is None:
                if time.monotonic() - self.trainer_started > 60:
                    self.failures = 0  # it has run a while: the next exit starts afresh
                return
            self.trainer = None
            self.failures += 1
            backoff = min(float(2 ** (self.failures - 1)), max(1.0, self.cfg.distributed.
                                                               backoff_max_s))
            self.restart_at = time.monotonic() + backoff
            tail = _tail(self.log_path)
            log.error("the continuous trainer exited (code %s after %.0fs); starting it again "
                      "in %.0fs. %s ends:\n%s", code, time.monotonic() - self.trainer_started,
                      backoff, self.log_path, tail)
            self.trainer_failures += 1
            self.trainer_error = trainer_failure("continuous", self.trainer_failures,
                                                 f"exit {code}", self.log_path, tail)
            return
        if time.monotonic() < self.restart_at:
            return
        self._launch_trainer(counts)

    def trainer_command(self, generation: int = 0, nodes: int = 0,
                        master_addr: str = "") -> list[str]:
        """`python -m training.trainer --continuous` (or the coach's trainer command) with the
        run's hours so far; it relaunches itself under torchrun across the node's GPUs."""
        hours = self._hours()
        if self.trainer_cmd:
            return [*self.trainer_cmd, "--continuous", *run_hours_flag(hours)]
        return [sys.executable, "-m", "training.trainer", "--config", str(self.paths.config),
                "--run-dir", str(self.paths.root), "--continuous", "--no-progress",
                *run_hours_flag(hours)]

    def _launch_trainer(self, counts: Counts) -> None:
        cmd = self.trainer_command()
        found = latest(self.paths.checkpoints, "checkpoint")
        last = _read_state(self.paths.trainer_state)
        if found is None:
            origin = f"model generation {self.generation} (no checkpoint yet)"
        else:
            origin = f"{found[1].name}"
        lost = ""
        if last and found is not None and last.get("generation", -1) >= found[0]:
            lost = (f"; the last trainer had trained {last.get('trained_samples')} samples "
                    f"through admission {last.get('admitted_seq')}: its steps after "
                    f"{found[1].name} are lost and trained again within the ratio")
        log.info("starting the continuous trainer: it resumes from %s, %d batches admitted%s: "
                 "%s", origin, self.admissions.seq if self.admissions else 0, lost,
                 " ".join(cmd))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        _rotate(self.log_path)
        out = open(self.log_path, "ab")
        try:
            self.trainer = subprocess.Popen(cmd, cwd=str(REPO), stdout=out,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            preexec_fn=die_with_parent)
        finally:
            out.close()
        self.trainer_started = time.monotonic()

    # ------------------------------------------------------------------ stopping

    def abandon(self) -> None:
        """The coach stops: the trainer (SIGTERM; it saves nothing, the next one resumes from
        its newest checkpoint) and the rounds' evaluation."""
        if self.trainer is not None:
            log.info("stopping the continuous trainer (it resumes from its newest checkpoint "
                     "next time)")
            _terminate(self.trainer)
            self.trainer = None
        rnd, self.current = self.current, None
        if rnd is not None and rnd.evaluation is not None:  # its child stops with `stopping`
            rnd.evaluation.join(timeout=15)
        if self.rating is not None:
            self.rating.join(timeout=15)
            self.rating = None


def _round_generations(folder: Path) -> list[int]:
    """The generations of the round results in rounds/ (a trainer killed between its
    checkpoint and its result leaves a gap: the next one publishes past it)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return [int(m.group(1)) for n in names if (m := _ROUND_RE.match(n))]


TAIL_BYTES = 1 << 16
"""The end of the trainer's log read when it exits (the log itself may be large)."""
LOG_ROTATE_BYTES = 64 << 20
"""The trainer's log is moved to `<log>.1` (replacing the one before) when a trainer starts
and it has grown past this."""


def _tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of `path`, from at most its last `TAIL_BYTES` bytes."""
    return log_tail(path, lines, TAIL_BYTES)


def _rotate(path: Path) -> None:
    """Move a log past `LOG_ROTATE_BYTES` to `<path>.1`, so that it never grows without end."""
    try:
        if path.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))
    except OSError:
        pass


def _read_state(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            obj = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}
