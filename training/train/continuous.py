"""The long-lived trainer (training.mode: continuous): one training process for the whole run.

`train_continuously(cfg, run_dir, ...)` runs in every rank of the group (alone, under torchrun
with DDP across the node's GPUs, or Gloo ranks on the CPU) until it is stopped (SIGTERM or
SIGINT; `stop`). It keeps the net, the optimizer and the replay window in memory, in one
`phases.Session`, and on each pass of its loop rank 0 decides and every rank follows:

  1. take in the batches the coach admitted: rank 0 reads the new lines of the admission log
     (`training.train.admissions`), adds their files to its window (building their sidecars)
     and broadcasts them; every other rank adds the same files, in the same order;
  2. publish a generation every `training.steps_per_generation` steps, or after
     `training.publish_interval_s` seconds with at least one step (0 = by steps only), by
     writing exactly what a round writes (`phases.finish`);
  3. else train up to `CHUNK_STEPS` steps within the ratio's budget
     (`training.samples_per_new_sample`), or wait `POLL_S` for data with the budget spent
     or while the window holds fewer than `training.min_window_positions` training
     positions (the budget builds up meanwhile).

The contract with the coach (the admission log, the ratio, publishing, the resume rule from
a checkpoint's `admitted_seq`, `new_samples` and `trained_samples`, the clock) is
docs/DESIGN.md's "Two trainer modes". A checkpoint of a round (a run that changed mode) has
no `admitted_seq`: the admissions in the log when the trainer starts are then its window, not
new data.

Threads: on the CPU each rank takes the cores the local self-play workers leave it, at least
one (`ddp.cpu_threads`, from the count the trainer's command works out; a round's trainer
does the same; an OMP_NUM_THREADS in the environment wins): two OpenMP threads beside two
workers on two cores made a third of its steps 2 to 15 times slower, halving both its steps
and the workers' games.

rank 0 writes trainer.json (`admissions.TrainerState`) when its counters change.

It must not: validate or choose batches (the coach admits them), read the ledger, or talk to
workers.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from configs import Config
from training.learn.training_error import TrainingError
from training.run.run_dir import RunDir
from training.train import phases
from training.train.admissions import Admission, AdmissionReader, TrainerState
from training.train.ddp import DistContext, broadcast_json, set_cpu_threads
from training.train.node_relay import build_window, resolve_start_shared
from training.train.steps import FaultHooks, IndexBatches, Trainee
from training.train.train_state import start_file

if TYPE_CHECKING:
    from training.learn.replay_buffer import ReplayWindow

log = logging.getLogger(__name__)

POLL_S = 0.5
"""How often a waiting trainer reads the admission log again."""
CHUNK_STEPS = 10
"""Steps between two reads of the admission log while there is budget."""


def _admit(window: ReplayWindow, replay: Path, names: list[str]) -> None:
    """Add the admitted files to the window, in order, reselecting it once (a file gone from
    replay/ is left out and logged by the window)."""
    if names:
        window.add_files([replay / name for name in names])


class _Counters:
    """The ratio's counters and the admissions taken in (saved in each checkpoint)."""

    def __init__(self, data: dict[str, Any]):
        self.admitted_seq = int(data.get("admitted_seq", 0))
        self.new_samples = int(data.get("new_samples", 0))
        self.trained_samples = int(data.get("trained_samples", 0))

    def as_dict(self) -> dict[str, int]:
        return {"admitted_seq": self.admitted_seq, "new_samples": self.new_samples,
                "trained_samples": self.trained_samples}


def _known_window(cfg: Config, paths: RunDir, ctx: DistContext, ckpt: dict | None,
                  start_path: Path | None, counters: _Counters, reader: AdmissionReader
                  ) -> tuple[ReplayWindow, list[Admission]]:
    """The window of the checkpoint (the admissions it had taken in), the same on every rank,
    and the admissions after it (rank 0's; new data)."""
    known: list[Admission] = []
    if ctx.is_main:
        while batch := reader.poll():
            known += batch
        if ckpt is not None and "admitted_seq" not in ckpt.get("data", {}):
            # a round's checkpoint (the run trained in rounds before): what was admitted so
            # far is its window, data the rounds have trained on, not new data
            counters.admitted_seq = reader.seq
            log.info("continuous trainer: %s is a round's checkpoint; the %d batches admitted "
                     "so far are its window, not new data", start_path, reader.seq)
        if counters.admitted_seq > reader.seq:
            raise TrainingError(
                f"{paths.admissions}: ends at seq {reader.seq}, but the checkpoint took in "
                f"admissions up to {counters.admitted_seq}; the run folder is not the one "
                "this checkpoint trained in (or the log was cut): start a new run")
    names = [a.name for a in known if a.seq <= counters.admitted_seq]
    if ctx.is_distributed:
        names, counters.admitted_seq = broadcast_json([names, counters.admitted_seq], ctx)
    window = build_window(cfg, paths.replay, names) if ctx.is_main else None
    if ctx.is_distributed:
        broadcast_json(None, ctx)  # rank 0 built the sidecars first
        if window is None:
            window = build_window(cfg, paths.replay, names)
    return window, [a for a in known if a.seq > counters.admitted_seq]


def _log_start(s: phases.Session, ckpt: dict | None, start_path: Path | None,
               generation: int, counters: _Counters, pending: int) -> None:
    tcfg, ctx, ratio = s.cfg.training, s.ctx, s.cfg.training.samples_per_new_sample
    if ckpt is not None:
        log.info(
            "continuous trainer: resumed from %s (generation %d, global step %d, "
            "admissions through seq %d, trained %d samples for %d new x ratio %g); steps "
            "after that checkpoint, if any, were lost and are trained again within the "
            "ratio; %d admissions since are new data",
            start_path, generation, s.trainee.schedule.step, counters.admitted_seq,
            counters.trained_samples, counters.new_samples, ratio, pending)
    else:
        log.info("continuous trainer: started from %s (no checkpoint); %d admissions "
                 "so far are new data", start_path or "a fresh net", pending)
    log.info("continuous trainer: world_size=%d total_batch=%d ratio=%g publish every %d "
             "steps%s device=%s", ctx.world_size, s.plan.total, ratio,
             tcfg.steps_per_generation,
             f" or {tcfg.publish_interval_s:g}s" if tcfg.publish_interval_s > 0 else "",
             ctx.device)


def train_continuously(cfg: Config, run_dir: Path, ctx: DistContext, *,
                       run_hours: float | None = None, hooks: FaultHooks | None = None,
                       stop: threading.Event | None = None, selfplay_cores: int = 0) -> int:
    """Train and publish until `stop` is set; returns the generations published. Collective.
    `selfplay_cores`: the cores local self-play workers hold on this node (a CPU rank takes
    the others)."""
    stop = stop or threading.Event()
    paths = RunDir(run_dir)
    clock = (run_hours, time.monotonic())  # the run's hours at the start, and this clock's
    set_cpu_threads(ctx, selfplay_cores, "continuous trainer")

    _, start_path, _ = start_file(run_dir, None) if ctx.is_main else ("", None, 0)
    ckpt, payload, generation = resolve_start_shared(run_dir, None, ctx, None)
    counters = _Counters(ckpt.get("data", {}) if ckpt is not None else {})
    reader = AdmissionReader(paths.admissions)
    window, pending = _known_window(cfg, paths, ctx, ckpt, start_path, counters, reader)

    p = phases.plan(cfg.training, ctx)
    trainee = phases.start_net(cfg, ctx, p, payload, start_path or run_dir, run_hours)
    s = phases.Session(cfg, ctx, p, trainee, window, hooks or FaultHooks())
    epoch, offset = phases.restore(s, ckpt, str(start_path))
    if len(window) >= _first_window(cfg, p):
        s.batches = IndexBatches(window, p.per_rank, ctx, cfg.run.seed, epoch, offset)
    if ctx.is_main:
        _log_start(s, ckpt, start_path, generation, counters, len(pending))
    generation, published = _loop(s, paths, reader, pending, counters, generation, clock,
                                  stop, epoch)
    if ctx.is_main:
        log.info("continuous trainer stopped: generation %d, %d steps since its checkpoint "
                 "are not saved (trained again within the ratio on resume)", generation,
                 s.totals.steps)
    return published


def _first_window(cfg, p: phases.Plan) -> int:
    """Training positions the window holds before the first step: a total batch, or
    `training.min_window_positions`."""
    return max(p.total, cfg.training.min_window_positions)


def _loop(s: phases.Session, paths: RunDir, reader: AdmissionReader, pending: list[Admission],
          counters: _Counters, generation: int, clock: tuple[float | None, float],
          stop: threading.Event, epoch: int) -> tuple[int, int]:
    """The trainer's loop until `stop` (see the module docstring); returns the last
    generation and the generations published. `clock`: the run's hours when the trainer
    started (None: the run has no time limit) and `time.monotonic()` then."""
    cfg, ctx, p, window = s.cfg, s.ctx, s.plan, s.dataset
    tcfg, ratio = cfg.training, cfg.training.samples_per_new_sample
    run_hours, t_start = clock
    last_publish = time.monotonic()
    published = 0
    reported: tuple[TrainerState | None, float] = (None, 0.0)
    while True:
        # rank 0 decides, every rank follows: the same admissions, clock and stop everywhere
        msg = None
        if ctx.is_main:
            fresh = pending + reader.poll()
            pending = []
            _admit(window, paths.replay, [a.name for a in fresh])
            now = time.monotonic()
            msg = {"new": [[a.seq, a.name, a.positions] for a in fresh],
                   "hours": None if run_hours is None else run_hours + (now - t_start) / 3600,
                   "time_due": tcfg.publish_interval_s > 0
                   and now - last_publish >= tcfg.publish_interval_s,
                   "stop": stop.is_set()}
        if ctx.is_distributed:
            msg = broadcast_json(msg, ctx)
            if not ctx.is_main:
                _admit(window, paths.replay, [name for _, name, _ in msg["new"]])
        if msg["stop"]:
            break
        if msg["new"]:
            counters.admitted_seq = msg["new"][-1][0]
            counters.new_samples += sum(n for _, _, n in msg["new"])
            if len(window) >= _first_window(cfg, p):  # a new pass over the new window
                epoch = s.batches.epoch + 1 if s.batches is not None else epoch
                s.batches = IndexBatches(window, p.per_rank, ctx, cfg.run.seed, epoch, 0)
        s.trainee.schedule.time_factor = phases.time_factor(cfg, msg["hours"])

        steps = s.totals.steps
        if steps >= tcfg.steps_per_generation or (msg["time_due"] and steps):
            generation += 1
            result = phases.finish(s, paths.root, generation, counters.as_dict())
            published += 1
            if ctx.is_main:
                log.info("published generation %d: steps=%d global_step=%d loss=%.4f "
                         "trained_samples=%d new_samples=%d samples_per_new_sample=%.2f",
                         generation, result.steps, result.global_step, result.loss,
                         counters.trained_samples, counters.new_samples,
                         counters.trained_samples / max(counters.new_samples, 1))
            last_publish = time.monotonic()
            continue
        budget = math.floor((ratio * counters.new_samples - counters.trained_samples) / p.total)
        n = 0 if s.batches is None else min(budget, CHUNK_STEPS,
                                            tcfg.steps_per_generation - steps)
        if ctx.is_main:
            reported = _report(paths, reported, generation, s.trainee, counters, ratio, n <= 0)
        if n <= 0:
            stop.wait(POLL_S)  # every rank waits alike; rank 0's stop reaches them next pass
            continue
        phases.run_steps(s, n)
        counters.trained_samples += n * p.total
    if ctx.is_main:
        _report(paths, reported, generation, s.trainee, counters, ratio, False, stopped=True)
    return generation, published


def _report(paths: RunDir, last: tuple[TrainerState | None, float], generation: int,
            trainee: Trainee, counters: _Counters, ratio: float, waiting: bool,
            stopped: bool = False) -> tuple[TrainerState | None, float]:
    """trainer.json when something in it changed (the step alone: at most once a second,
    since a GPU takes many a second); returns what it holds and when it was written."""
    state = TrainerState(generation, trainee.schedule.step, counters.admitted_seq,
                         counters.new_samples, counters.trained_samples, ratio, waiting,
                         stopped)
    before, at = last
    now = time.monotonic()
    moved = {f.name for f in fields(TrainerState)
             if before is None or getattr(state, f.name) != getattr(before, f.name)}
    if moved - {"global_step", "trained_samples"} or (moved and now - at >= 1):
        state.write(paths.trainer_state)
        return state, now
    return last
