"""The phases of training, shared by a round and the long-lived trainer.

A round is `plan` -> `start_net` -> `restore` -> `run_steps` -> `finish`; the long-lived
trainer (`training.train.continuous`) runs the first three once and then `run_steps` and
`finish` for as long as the run lasts, each `finish` publishing one generation. The last three
take one `Session`: what a trainer holds while it trains (the config, the process group, the
plan, the trainee, the data and the order it is read in, the fault hooks, the totals since the
last `finish`).

- `plan(tcfg, ctx) -> Plan`: the batch arithmetic (per rank, total, micro-batches).
- `start_net(cfg, ctx, plan, payload, ...) -> Trainee`: the net (from the starting model or
  fresh, seeded by run.seed so every rank starts equal), DDP around it, autocast, the LR
  schedule and the optimizer: everything a step changes, kept in memory.
- `restore(session, ckpt, source)`: a checkpoint back into the trainee
  (`train_state.restore_checkpoint`, beside `save_checkpoint`), or this rank's seed for a
  fresh start; returns the data position.
- `run_steps(session, n)`: n optimizer steps, summed into `session.totals` (their losses
  read from the device every `SYNC_EVERY_STEPS` steps, one wait for them all).
- `finish(session, run_dir, generation)`: the totals reduced over ranks, the non-finite
  check, validation, and on rank 0 the generation's files (checkpoint, model, metrics row,
  rounds/round_<gen>.json) before a barrier; the totals start again. Returns the
  `RoundResult`.

Vocabulary as in `training.train.round` (rank, world_size, round, micro-batch). It must not:
choose the data (the window is opened by the caller), parse the command line, or decide when
a generation is due.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from configs import Config
from training.learn.net import ModelError, finite_weights, net_from_config, net_from_payload
from training.learn.net import save_model
from training.learn.samples import SampleDataset, fetch_batch
from training.learn.training_error import TrainingError
from training.run import metrics
from training.run.run_dir import RunDir
from training.train import round_result
from training.train.ddp import DistContext, all_gather_json, all_reduce_sum, barrier
from training.train.round_result import RoundResult
from training.train.steps import (AUX_LOSSES, FaultHooks, IndexBatches, StepStats, Trainee,
                                  autocast_dtype, is_oom, loss_weights, maybe_inject_fault,
                                  one_step, step_sums, update_ema, validate,
                                  weights_checksums)
from training.train.train_state import (WarmupSchedule, drop_multiplier, restore_checkpoint,
                                        rng_from_json, rng_json, rng_state, save_checkpoint,
                                        scaled_lr, seed_everything)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """The batch arithmetic of this group: `per_rank` samples per rank and step, `total` over
    all ranks, `accumulation` micro-batches of `micro` samples each."""

    per_rank: int
    total: int
    accumulation: int
    micro: int


@dataclass
class Totals:
    """What steps since the last `finish` added up to on this rank."""

    sums: np.ndarray = field(default_factory=lambda: np.zeros(4 + len(AUX_LOSSES)))
    """policy loss * n, value loss * n, correct, n, then each AUX_LOSSES loss * n."""
    step_losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def steps(self) -> int:
        return len(self.step_losses)


@dataclass
class Session:
    """What a trainer holds while it trains, handed to each phase after `start_net`."""

    cfg: Config
    ctx: DistContext
    plan: Plan
    trainee: Trainee
    dataset: SampleDataset  # the replay window (or given samples)
    hooks: FaultHooks
    batches: IndexBatches | None = None  # the order `dataset` is read in (after `restore`)
    totals: Totals = field(default_factory=Totals)  # since the last `finish`


def plan(tcfg: Any, ctx: DistContext) -> Plan:
    """The batch per rank from training.batch_size (or batch_size_per_gpu), and its
    micro-batches (training.grad_accumulation)."""
    if tcfg.batch_size_per_gpu > 0:
        per_rank = tcfg.batch_size_per_gpu
        log.info("batch %d per rank x %d ranks = %d total (training.batch_size_per_gpu)",
                 per_rank, ctx.world_size, per_rank * ctx.world_size)
    else:
        per_rank = tcfg.batch_size // ctx.world_size
    if per_rank < 1:
        raise TrainingError(
            f"training.batch_size {tcfg.batch_size} is smaller than the {ctx.world_size} ranks"
        )
    if not tcfg.batch_size_per_gpu and per_rank * ctx.world_size != tcfg.batch_size:
        log.warning("batch_size %d does not split over %d ranks; using %d total",
                    tcfg.batch_size, ctx.world_size, per_rank * ctx.world_size)
    accumulation = min(tcfg.grad_accumulation, per_rank)
    return Plan(per_rank, per_rank * ctx.world_size, accumulation, per_rank // accumulation)


def time_factor(cfg: Config, run_hours: float | None) -> float | None:
    """The LR multiplier of training.lr_schedule_by_time at `run_hours` (None: by step)."""
    tcfg = cfg.training
    if cfg.run.hours > 0 and tcfg.lr_schedule_by_time and run_hours is not None:
        return drop_multiplier(tcfg.lr_schedule_by_time, run_hours / cfg.run.hours)
    return None


def start_net(cfg: Config, ctx: DistContext, p: Plan, payload: dict | None, source: Any,
              run_hours: float | None) -> Trainee:
    """The net from `payload` (a model or checkpoint's, named by `source`) or fresh, on this
    rank's device, in DDP when there are several ranks, with its optimizer and schedule."""
    tcfg = cfg.training
    # Same initial weights everywhere (DDP also broadcasts rank 0's at construction).
    seed_everything(cfg.run.seed)
    if payload is not None:
        try:
            net = net_from_payload(payload, source)
        except ModelError as e:
            raise TrainingError(str(e)) from e
        if net.liberties != cfg.net.liberties:
            raise TrainingError(
                f"the starting model {'reads' if net.liberties else 'does not read'} the "
                f"liberty planes, and the config says net.liberties: {cfg.net.liberties}; "
                "the input features of a run cannot change: start a new run (another "
                "run.dir, or --fresh)")
        if net.config != net_from_config(cfg.net, cfg.go.board_size).config:
            log.warning("the starting model's net %s differs from the config's net section; "
                        "continuing with the model's", net.config)
    else:
        net = net_from_config(cfg.net, cfg.go.board_size)
    net.to(ctx.device).train()
    model: torch.nn.Module = net
    if ctx.is_distributed:
        on_gpu = ctx.device.startswith("cuda")
        model = DDP(net, device_ids=[torch.device(ctx.device).index] if on_gpu else None)
    autocast, use_scaler = autocast_dtype(ctx, tcfg.mixed_precision, tcfg.amp_dtype)
    scaler = torch.amp.GradScaler("cuda") if use_scaler else None
    peak = scaled_lr(tcfg.lr, p.total, tcfg.lr_reference_batch, tcfg.lr_scaling)
    schedule = WarmupSchedule(peak, tcfg.warmup_steps, drops=tcfg.lr_schedule,
                              time_factor=time_factor(cfg, run_hours))
    optimizer = torch.optim.SGD(net.parameters(), lr=schedule.lr(), momentum=tcfg.momentum,
                                weight_decay=tcfg.weight_decay)
    ema = None
    if tcfg.ema_decay > 0:  # the average starts at the starting weights (`restore`: saved one)
        ema = copy.deepcopy(net).requires_grad_(False)
    return Trainee(net, model, optimizer, schedule, scaler, autocast, p.micro, peak,
                   loss_weights(tcfg), ema=ema, ema_decay=tcfg.ema_decay)


def restore(s: Session, ckpt: dict | None, source: str) -> tuple[int, int]:
    """The checkpoint `ckpt` (or None: a fresh start, this rank's seed) into the trainee;
    returns the data position (epoch, offset) over the session's dataset."""
    cfg, ctx, trainee = s.cfg, s.ctx, s.trainee
    if ckpt is None:
        seed_everything(cfg.run.seed + 1000 * ctx.rank)
        return 0, 0
    if trainee.ema is not None:
        if ckpt.get("ema") is not None:
            try:
                saved = net_from_payload(ckpt["ema"], f"{source} (its weight average)")
                trainee.ema.load_state_dict(saved.state_dict())
            except (ModelError, RuntimeError) as e:
                raise TrainingError(f"{source}: its weight average does not fit this net ({e});"
                                    " set training.ema_decay: 0, or start afresh") from e
        else:
            log.info("%s has no weight average: training.ema_decay starts one at its weights",
                     source)
    return restore_checkpoint(ckpt, source, trainee.optimizer, trainee.schedule,
                              length=len(s.dataset), per_rank=s.plan.per_rank, rank=ctx.rank,
                              world_size=ctx.world_size, seed=cfg.run.seed)


SYNC_EVERY_STEPS = 16
"""`run_steps` reads the steps' losses from the device (one wait, one all-reduce) this
often, and at its end."""
STEPS_READ_ALONE = 3
"""... and after each of its first this many steps, whose seconds (warming up: cuDNN's
choices, the allocator) are then their own, not shared with the steps after them."""


def run_steps(s: Session, n: int, bar: Any = None) -> None:
    """`n` optimizer steps over the session's batches, added to its totals; an out-of-memory
    micro-batch is halved (down to 1) and the step taken again. The device is waited for
    after each of the first `STEPS_READ_ALONE` steps and then every `SYNC_EVERY_STEPS`,
    when their losses are read: a step's seconds are those of its group, shared equally."""
    t0 = time.perf_counter()
    trainee, batches, dataset, totals = s.trainee, s.batches, s.dataset, s.totals
    ctx, p, hooks = s.ctx, s.plan, s.hooks
    schedule, optimizer = trainee.schedule, trainee.optimizer
    pending: list[StepStats] = []
    group_t0 = time.perf_counter()
    first = totals.steps
    for step in range(first, first + n):
        maybe_inject_fault(hooks, ctx.rank, step)
        batch = fetch_batch(dataset, batches.next())
        for g in optimizer.param_groups:
            g["lr"] = schedule.lr()
        while True:
            try:
                stats = one_step(trainee, batch, ctx, hooks)
                break
            except RuntimeError as e:
                if not is_oom(e) or trainee.micro == 1:
                    raise
                optimizer.zero_grad(set_to_none=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                trainee.micro = max(1, trainee.micro // 2)
                log.warning("rank %d: out of memory at step %d; micro-batch halved to %d "
                            "(%d micro-batches per step)", ctx.rank, schedule.step,
                            trainee.micro, math.ceil(p.per_rank / trainee.micro))
        schedule.step += 1
        update_ema(trainee)
        pending.append(stats)
        if (len(pending) >= SYNC_EVERY_STEPS or step == first + n - 1
                or step < first + STEPS_READ_ALONE):
            _read_steps(totals, pending, group_t0, ctx)
            pending, group_t0 = [], time.perf_counter()
            if bar is not None:
                bar.set_postfix(loss=f"{totals.step_losses[-1]:.3f}", lr=f"{schedule.lr():.3g}")
        if bar is not None:
            bar.update(1)
    totals.seconds += time.perf_counter() - t0


def _read_steps(totals: Totals, pending: list[StepStats], t0: float, ctx: DistContext) -> None:
    """The pending steps' sums into `totals`: each step's loss over every rank (one
    all-reduce for them all) and its share of the group's seconds."""
    sums = step_sums(pending)  # waits for the device
    seconds = (time.perf_counter() - t0) / len(pending)
    totals.sums += sums.sum(axis=0)
    k = len(pending)
    reduced = all_reduce_sum([*(sums[:, 0] + sums[:, 1]), *sums[:, 3]], ctx)
    totals.step_losses += [loss / rows for loss, rows in zip(reduced[:k], reduced[k:])]
    totals.step_seconds += [seconds] * k


def finish(s: Session, run_dir: Path, generation: int,
           extra_data: dict[str, int] | None = None) -> RoundResult:
    """Reduce the session's totals, check them, validate, and write `generation`'s files
    (rank 0: the checkpoint with the data position and `extra_data`, the model, the metrics
    row, the round result); every rank waits at a barrier until they are written, and the
    totals start again. Collective."""
    cfg, ctx, trainee, p, dataset, batches, totals = (s.cfg, s.ctx, s.trainee, s.plan,
                                                       s.dataset, s.batches, s.totals)
    net, schedule = trainee.net, trainee.schedule
    steps = totals.steps
    p_sum, v_sum, correct, n, *aux_sums = (float(v) for v in
                                           all_reduce_sum(list(totals.sums), ctx))
    n = max(n, 1.0)
    aux_losses = {f"{k}_loss": a / n for k, a in zip(AUX_LOSSES, aux_sums)}
    losses = [p_sum / n, v_sum / n, *aux_losses.values()]
    bad = not all(math.isfinite(v) for v in losses) or not finite_weights(net, buffers=False) \
        or not finite_weights(trainee.published, buffers=False)
    # The same on every rank: sums are reduced and DDP keeps the parameters equal (buffers
    # may differ by rank; the coach checks the saved file's).
    if bad:
        raise TrainingError(
            f"generation {generation}: a non-finite loss or weight after {steps} steps "
            f"(policy {p_sum / n:.4g}, value {v_sum / n:.4g}); nothing is written, the round "
            "fails and the last model stays in use (lower training.lr, check the data)")
    checksums = weights_checksums(net, ctx)
    # RNG states before validation, so that a resumed run continues as an unbroken one would
    rng_states = [rng_from_json(r) for r in all_gather_json(rng_json(rng_state()), ctx)]
    val_loss = validate(trainee.model if trainee.ema is None else trainee.ema,
                        dataset.validation, p.per_rank, ctx, trainee.autocast)

    paths = RunDir(run_dir)
    model_file, ckpt_file = paths.model(generation), paths.checkpoint(generation)
    elapsed = totals.seconds
    result = RoundResult(
        generation=generation, steps=steps, global_step=schedule.step,
        samples=int(n), seconds=elapsed, samples_per_s=n / max(elapsed, 1e-9),
        loss=(p_sum + v_sum) / n, policy_loss=p_sum / n, value_loss=v_sum / n,
        policy_accuracy=correct / n, val_loss=val_loss, lr=schedule.lr(),
        world_size=ctx.world_size, micro_batch=trainee.micro,
        accumulation=math.ceil(p.per_rank / trainee.micro),
        model_path=str(model_file), checkpoint_path=str(ckpt_file),
        step_losses=totals.step_losses, step_seconds=totals.step_seconds,
        rank_checksums=checksums,
        **aux_losses,
    )
    if ctx.is_main:
        meta = {"global_step": schedule.step, "loss": result.loss, "samples": result.samples}
        save_model(model_file, trainee.published, generation, meta)
        position = {"length": len(dataset), "per_rank": p.per_rank,
                    "world_size": ctx.world_size, "epoch": batches.epoch,
                    "offset": batches.offset, **(extra_data or {})}
        save_checkpoint(ckpt_file, cfg, net, generation, meta, trainee.optimizer, schedule,
                        position, rng_states, ema=trainee.ema)
        metrics.record_metrics(
            run_dir, generation, loss=result.loss, policy_loss=result.policy_loss,
            value_loss=result.value_loss, policy_accuracy=result.policy_accuracy,
            val_loss=val_loss, train_samples_per_s=result.samples_per_s, **aux_losses,
            train_steps=steps, global_step=schedule.step, lr=result.lr,
            world_size=ctx.world_size, time=time.time(),
        )
        round_result.write(paths.round_result(generation), result)
    barrier(ctx)  # nobody reads the new files before they are all written
    s.totals = Totals()
    return result
