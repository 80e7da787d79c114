"""One training round: replay window -> new generation's model and checkpoint, alone or DDP.

Owns `train_round(cfg, run_dir, ...)` and its command line. The same code runs
- alone:                    python -m training.trainer --config FILE --run-dir DIR
- under torchrun:           torchrun --nproc_per_node=N -m training.trainer ...
- multi-node:               torchrun --nnodes M --node_rank R --master_addr A --master_port P ...
- relaunched by itself:     python -m training.trainer --gpus N [--nodes M --node-rank R ...]
                            (re-executes itself through torch.distributed.run)
- from the coach, as a subprocess of one of the above; the last stdout line is a JSON summary.

Vocabulary (torchrun's): `rank`, `local_rank`, `world_size`; rank 0 is the main process, the
only one that logs progress and writes files. A **round** trains `training.steps_per_generation`
optimizer steps (or `training.epochs` passes) and produces generation G+1 from generation G.
A **micro-batch** is one forward/backward; `accumulation` micro-batches make one optimizer step
(gradients are all-reduced only on the last, `no_sync` before).

Behaviour: the total batch `training.batch_size` is split across ranks; LR scaled linearly / by
sqrt from `lr_reference_batch`, with linear warmup; DistributedSampler with `set_epoch` and
`drop_last`; losses reduced across ranks; a process-group timeout (`training.timeout_s`); a
rank that fails makes the others exit (the collective raises, the launcher ends the group); an
out-of-memory micro-batch halves the micro-batch and accumulates twice as many. A checkpoint
resumes exactly (the next step's loss is the same).

Losses: policy cross-entropy + value MSE, plus the net's training-only heads where it has them
(KataGo's auxiliary targets, `TARGETS`): ownership (cross-entropy per point, mean), score
(Huber on margin / N) and the opponent's reply (cross-entropy), each masked per sample and
weighted by `training.ownership_weight`, `score_weight`, `opponent_policy_weight`. `loss` in
results and metrics stays policy + value, so that runs with and without the heads compare.

Files (rank 0, then a barrier), where run_dir.RunDir puts them:
checkpoints/checkpoint_<gen:06d>.pt (train_state), models/model_<gen:06d>.pt (net.save_model),
one metrics row (training.run.metrics) and rounds/round_<gen:06d>.json (round_result: what the
coach reads; the same as the JSON summary line).

A round is made of: samples (sample arrays, batches as tensors), ddp (the process group and its
collectives), node_relay (the window and the starting file for nodes without the run folder)
and train_state (LR schedule, RNG states, checkpoints, the file a round starts from).

It must not: play games, read game batch files itself (the replay window does), or talk to
workers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from configs import Config, ConfigError, load_config, override
from configs.flags import add_flags, overrides
from training.learn import round_result
from training.run import metrics
from training.learn.ddp import (
    DistContext,
    all_gather_floats,
    all_gather_json,
    all_reduce_sum,
    barrier,
    init_distributed,
    is_peer_failure,
    shutdown,
    under_torchrun,
)
from training.learn.net import (ModelError, finite_weights, net_from_config, net_from_payload,
                                save_model)
from training.learn.node_relay import open_replay_window, resolve_start_shared
from training.learn.round_result import RoundResult
from training.learn.samples import TARGETS, SampleArrays, SampleDataset, fetch_batch

AUX_LOSSES = (*TARGETS, "soft_policy")
"""The auxiliary losses a round reports: the sample targets' heads, and the soft policy's
(its target comes from the policy target)."""
from training.run.logsetup import configure_logging
from training.run.run_dir import RunDir
from training.run.signals import die_with_parent
from training.learn.train_state import (
    WarmupSchedule,
    drop_multiplier,
    rng_from_json,
    rng_json,
    rng_state,
    save_checkpoint,
    scaled_lr,
    seed_everything,
    set_rng_state,
)
from training.learn.training_error import TrainingError

log = logging.getLogger(__name__)

MAX_VALIDATION_SAMPLES = 4096


# ------------------------------------------------------------------------------ the round


@dataclass
class FaultHooks:
    """Fault injection for the tests (real processes, fake faults that cannot occur here)."""

    fake_oom_at_micro_batch: int | None = None
    """Raise an out-of-memory error for any micro-batch of at least this many samples."""
    kill_rank_at_step: tuple[int, int] | None = None
    """(rank, step): that rank SIGKILLs itself before that optimizer step (first attempt only,
    so that torchrun --max-restarts can show the group recovering)."""
    hang_rank_at_step: tuple[int, int] | None = None
    """(rank, step): that rank sleeps forever before that optimizer step."""


# What running out of GPU memory looks like: PyTorch's own error, and the libraries' own
# failures to allocate their workspaces (a nearly full GPU can fail in cuBLAS or cuDNN first).
_OOM_TEXTS = ("out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed")


def _is_oom(err: BaseException) -> bool:
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(err, oom_type):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and any(t in text for t in _OOM_TEXTS)


def loss_weights(tcfg: Any) -> dict[str, float]:
    """The weight of each auxiliary target's loss, from the `training` config section."""
    return {"ownership": tcfg.ownership_weight, "score": tcfg.score_weight,
            "opponent_policy": tcfg.opponent_policy_weight,
            "soft_policy": tcfg.soft_policy_weight}


def _aux_loss(name: str, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-sample loss [B] of one auxiliary head."""
    if name == "ownership":  # pred is pre-tanh: tanh(x) = 2 sigmoid(2x) - 1, KataGo's loss
        return F.binary_cross_entropy_with_logits(
            2.0 * pred, (target + 1.0) / 2.0, reduction="none").mean(dim=1)
    if name == "score":  # margin / N; Huber with delta 1 (N points)
        return F.smooth_l1_loss(pred, target, beta=1.0, reduction="none")
    assert name == "opponent_policy", name
    return -(target * F.log_softmax(pred, dim=1)).sum(dim=1)


def _losses(net: torch.nn.Module, batch: dict[str, torch.Tensor],
            autocast: torch.dtype | None, device: str
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(policy cross-entropy, value MSE, correct top-1 count, {target: loss}) for one
    micro-batch (means). An auxiliary loss is masked per sample and averaged over the whole
    micro-batch; a head without targets in the batch gets a zero loss that still reaches its
    weights (DDP expects a gradient for every parameter)."""
    planes, policy, value = batch["planes"], batch["policy"], batch["value"]
    if autocast is not None:
        with torch.autocast(device_type=torch.device(device).type, dtype=autocast):
            out = net(planes, heads=True)
        out = {k: t.float() for k, t in out.items()}
    else:
        out = net(planes, heads=True)
    logits, v = out["policy"], out["value"]
    # A row of zeros has no policy target (a fast search's move, playout cap randomization):
    # the policy loss and accuracy are means over the rows that have one (accuracy scaled so
    # that correct / rows stays that mean).
    has_policy = policy.sum(dim=1) > 0
    targets = has_policy.sum().clamp(min=1)
    p_loss = -(policy * F.log_softmax(logits, dim=1)).sum(dim=1).sum() / targets
    v_loss = F.mse_loss(v, value)
    hits = ((logits.argmax(dim=1) == policy.argmax(dim=1)) & has_policy).sum()
    correct = hits * (policy.shape[0] / targets)
    aux = {}
    if "soft_policy" in out:  # KataGo's soft target: the policy target raised to 1/4
        soft = policy.clamp(min=0) ** 0.25
        soft = soft / soft.sum(dim=1, keepdim=True).clamp(min=1e-12)
        aux["soft_policy"] = -(soft * F.log_softmax(out["soft_policy"], dim=1)).sum(
            dim=1).sum() / targets
    for name in TARGETS:
        if name not in out:
            continue
        if name in batch:
            aux[name] = (_aux_loss(name, out[name], batch[name]) * batch[f"{name}_mask"]).mean()
        else:
            aux[name] = out[name].sum() * 0.0
    return p_loss, v_loss, correct, aux


class _Batches:
    """Index batches of one rank: DistributedSampler(set_epoch, drop_last), resumable."""

    def __init__(self, dataset: SampleDataset, per_rank: int, ctx: DistContext, seed: int,
                 epoch: int = 0, offset: int = 0):
        length = len(dataset)
        self.dataset = dataset
        self.sampler = DistributedSampler(
            range(length), num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True,
            seed=seed, drop_last=True,
        )
        self.per_rank = per_rank
        self.epoch, self.offset = epoch, offset
        self.per_epoch = len(self.sampler) // per_rank
        if self.per_epoch == 0:
            raise TrainingError(
                f"the window holds {length} positions, fewer than one batch of "
                f"{per_rank} x {ctx.world_size} ranks; lower --batch-size or play more games"
            )
        self._indices: list[int] | None = None

    def next(self) -> list[int]:
        if self.offset >= self.per_epoch:
            self.epoch, self.offset, self._indices = self.epoch + 1, 0, None
        if self._indices is None:
            self.sampler.set_epoch(self.epoch)
            if hasattr(self.dataset, "set_epoch"):  # the window's symmetries change per epoch
                self.dataset.set_epoch(self.epoch)
            self._indices = list(self.sampler)
        lo = self.offset * self.per_rank
        self.offset += 1
        return self._indices[lo : lo + self.per_rank]


def _autocast_dtype(ctx: DistContext, mixed_precision: bool,
                    amp_dtype: str = "auto") -> tuple[torch.dtype | None, bool]:
    """(autocast dtype, use a GradScaler): `amp_dtype` bf16 or fp16 (with a scaler), or auto:
    bf16 where supported, fp16 + scaler otherwise. On the CPU, bf16 autocast (what CPUs
    support well; fp16 asked for on a CPU is bf16 there, said in the log)."""
    if not mixed_precision:
        return None, False
    if ctx.device == "cpu":
        if amp_dtype == "fp16":
            log.info("training.amp_dtype fp16 is for GPUs: bf16 autocast on the CPU instead")
        return torch.bfloat16, False
    if not ctx.device.startswith("cuda"):
        log.info("mixed precision is for GPUs and CPUs; training in float32 on %s", ctx.device)
        return None, False
    if amp_dtype == "bf16" or (amp_dtype == "auto" and torch.cuda.is_bf16_supported()):
        return torch.bfloat16, False
    return torch.float16, True



def train_round(
    cfg: Config,
    run_dir: str | os.PathLike,
    *,
    dataset: SampleDataset | None = None,
    checkpoint: str | os.PathLike | None = None,
    steps: int | None = None,
    generation: int | None = None,
    progress: bool = True,
    hooks: FaultHooks | None = None,
    cache_dir: str | os.PathLike | None = None,
    run_hours: float | None = None,
) -> RoundResult:
    """Train one round and write the next generation's model and checkpoint.

    Must be called in every process of the group (alone, it is a group of one). Starts from
    `checkpoint`, else the newest checkpoint in run_dir/checkpoints, else the newest model in
    run_dir/models, else a fresh net; "none" forces a fresh start. `dataset` defaults to the
    replay window over run_dir/replay. `steps` overrides the config's round length.
    `cache_dir`: this rank's node does not share rank 0's run folder; rank 0 sends the window's
    batch files and the starting checkpoint there, and run_dir is never read.
    `run_hours`: the hours the run had run when the round started (the coach's), which place
    the LR drops of a run with run.hours (training.lr_schedule_by_time).
    """
    run_dir = Path(run_dir)
    hooks = hooks or FaultHooks()
    tcfg = cfg.training
    try:
        ctx = init_distributed(tcfg.timeout_s, tcfg.backend)
    except ValueError as e:
        raise TrainingError(str(e)) from e
    try:
        return _train(cfg, run_dir, ctx, dataset, checkpoint, steps, generation, progress, hooks,
                      None if cache_dir is None else Path(cache_dir), run_hours)
    finally:
        shutdown(ctx)


def _train(cfg: Config, run_dir: Path, ctx: DistContext, dataset: SampleDataset | None,
           checkpoint: str | os.PathLike | None, steps: int | None, generation: int | None,
           progress: bool, hooks: FaultHooks, cache_dir: Path | None = None,
           run_hours: float | None = None) -> RoundResult:
    tcfg = cfg.training
    if cache_dir is not None and ctx.is_main:
        raise TrainingError("--cache-dir is for the other training nodes; rank 0 reads run_dir")
    if dataset is None:
        dataset = open_replay_window(cfg, run_dir, ctx, cache_dir)
    ckpt, start_payload, base_gen = resolve_start_shared(run_dir, checkpoint, ctx, cache_dir)
    new_gen = generation if generation is not None else base_gen + 1

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
    total_batch = per_rank * ctx.world_size
    accumulation = min(tcfg.grad_accumulation, per_rank)
    micro = per_rank // accumulation

    # Same initial weights everywhere (DDP also broadcasts rank 0's at construction).
    seed_everything(cfg.run.seed)
    if start_payload is not None:
        try:
            net = net_from_payload(start_payload, checkpoint or run_dir)
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
    autocast, use_scaler = _autocast_dtype(ctx, tcfg.mixed_precision, tcfg.amp_dtype)
    scaler = torch.amp.GradScaler("cuda") if use_scaler else None

    peak = scaled_lr(tcfg.lr, total_batch, tcfg.lr_reference_batch, tcfg.lr_scaling)
    time_factor = None
    if cfg.run.hours > 0 and tcfg.lr_schedule_by_time and run_hours is not None:
        time_factor = drop_multiplier(tcfg.lr_schedule_by_time, run_hours / cfg.run.hours)
    schedule = WarmupSchedule(peak, tcfg.warmup_steps, drops=tcfg.lr_schedule,
                              time_factor=time_factor)
    optimizer = torch.optim.SGD(net.parameters(), lr=schedule.lr(), momentum=tcfg.momentum,
                                weight_decay=tcfg.weight_decay)
    epoch = offset = 0
    if ckpt is not None:
        try:
            optimizer.load_state_dict(ckpt["optimizer"])
        except (ValueError, KeyError) as e:
            raise TrainingError(
                f"{checkpoint or 'the newest checkpoint'}: its optimizer state does not fit "
                f"this net ({e}); pass --checkpoint none to start afresh"
            ) from e
        schedule.step = int(ckpt["schedule"]["step"])
        data = ckpt.get("data", {})
        if (data.get("length"), data.get("per_rank"), data.get("world_size")) == (
            len(dataset), per_rank, ctx.world_size
        ):
            epoch, offset = int(data["epoch"]), int(data["offset"])
        else:
            epoch = int(data.get("epoch", -1)) + 1  # the window changed: a new pass
        rng = ckpt.get("rng") or []
        if len(rng) == ctx.world_size:
            set_rng_state(rng[ctx.rank])
        else:
            log.warning("checkpoint has RNG states for %d ranks, this run has %d; reseeding",
                        len(rng), ctx.world_size)
            seed_everything(cfg.run.seed + 1000 * ctx.rank + schedule.step)
    else:
        seed_everything(cfg.run.seed + 1000 * ctx.rank)
    batches = _Batches(dataset, per_rank, ctx, cfg.run.seed, epoch, offset)
    if steps is None:
        steps = tcfg.epochs * batches.per_epoch if tcfg.epochs > 0 else tcfg.steps_per_generation

    if ctx.is_main:
        log.info(
            "training generation %d from %s: steps=%d world_size=%d total_batch=%d "
            "micro_batch=%d accumulation=%d lr=%.4g device=%s backend=%s window=%d",
            new_gen, f"generation {base_gen}" if start_payload is not None else "a fresh net",
            steps, ctx.world_size, total_batch, micro, accumulation, peak, ctx.device,
            ctx.backend or "none", len(dataset),
        )
    bar = _progress_bar(steps, new_gen, enabled=progress and ctx.is_main)
    weights = loss_weights(tcfg)
    # policy loss * n, value loss * n, correct, n, then each AUX_LOSSES loss * n  (this rank)
    sums = np.zeros(4 + len(AUX_LOSSES))
    step_losses: list[float] = []
    step_seconds: list[float] = []
    t0 = time.perf_counter()
    for step in range(steps):
        t_step = time.perf_counter()
        _maybe_inject_fault(hooks, ctx.rank, step)
        idx = batches.next()
        batch = fetch_batch(dataset, idx)
        for g in optimizer.param_groups:
            g["lr"] = schedule.lr()
        while True:
            try:
                step_sums = _step(model, optimizer, scaler, batch, micro, autocast, ctx, hooks,
                                  weights)
                break
            except RuntimeError as e:
                if not _is_oom(e) or micro == 1:
                    raise
                optimizer.zero_grad(set_to_none=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                micro = max(1, micro // 2)
                log.warning("rank %d: out of memory at step %d; micro-batch halved to %d "
                            "(%d micro-batches per step)", ctx.rank, schedule.step, micro,
                            math.ceil(per_rank / micro))
        schedule.step += 1
        sums += step_sums
        reduced = all_reduce_sum([step_sums[0] + step_sums[1], step_sums[3]], ctx)
        step_losses.append(reduced[0] / reduced[1])
        step_seconds.append(time.perf_counter() - t_step)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{step_losses[-1]:.3f}", lr=f"{schedule.lr():.3g}")
    elapsed = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    p_sum, v_sum, correct, n, *aux_sums = (float(v) for v in all_reduce_sum(list(sums), ctx))
    n = max(n, 1.0)
    aux_losses = {f"{k}_loss": a / n for k, a in zip(AUX_LOSSES, aux_sums)}
    losses = [p_sum / n, v_sum / n, *aux_losses.values()]
    bad = not all(math.isfinite(v) for v in losses) or not finite_weights(net, buffers=False)
    # The same on every rank: sums are reduced and DDP keeps the parameters equal (buffers
    # may differ by rank; the coach checks the saved file's).
    if bad:
        raise TrainingError(
            f"generation {new_gen}: a non-finite loss or weight after {steps} steps "
            f"(policy {p_sum / n:.4g}, value {v_sum / n:.4g}); nothing is written, the round "
            "fails and the last model stays in use (lower training.lr, check the data)")
    checksums = _weights_checksums(net, ctx)
    # RNG states before validation, so that a resumed run continues as an unbroken one would
    rng_states = [rng_from_json(r) for r in all_gather_json(rng_json(rng_state()), ctx)]
    val_loss = _validate(model, getattr(dataset, "validation", None), per_rank, ctx, autocast)

    paths = RunDir(run_dir)
    model_file, ckpt_file = paths.model(new_gen), paths.checkpoint(new_gen)
    result = RoundResult(
        generation=new_gen, steps=steps, global_step=schedule.step,
        samples=int(n), seconds=elapsed, samples_per_s=n / max(elapsed, 1e-9),
        loss=(p_sum + v_sum) / n, policy_loss=p_sum / n, value_loss=v_sum / n,
        policy_accuracy=correct / n, val_loss=val_loss, lr=schedule.lr(),
        world_size=ctx.world_size, micro_batch=micro,
        accumulation=math.ceil(per_rank / micro),
        model_path=str(model_file), checkpoint_path=str(ckpt_file), step_losses=step_losses,
        step_seconds=step_seconds,
        rank_checksums=checksums,
        **aux_losses,
    )
    if ctx.is_main:
        meta = {"global_step": schedule.step, "loss": result.loss, "samples": result.samples}
        save_model(model_file, net, new_gen, meta)
        position = {"length": len(dataset), "per_rank": per_rank, "world_size": ctx.world_size,
                    "epoch": batches.epoch, "offset": batches.offset}
        save_checkpoint(ckpt_file, cfg, net, new_gen, meta, optimizer, schedule, position,
                        rng_states)
        metrics.record_metrics(
            run_dir, new_gen, loss=result.loss, policy_loss=result.policy_loss,
            value_loss=result.value_loss, policy_accuracy=result.policy_accuracy,
            val_loss=val_loss, train_samples_per_s=result.samples_per_s, **aux_losses,
            train_steps=steps, global_step=schedule.step, lr=result.lr,
            world_size=ctx.world_size, time=time.time(),
        )
        round_result.write(paths.round_result(new_gen), result)
    barrier(ctx)  # nobody reads the new files before they are all written
    return result


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          scaler: torch.amp.GradScaler | None, batch: dict[str, torch.Tensor], micro: int,
          autocast: torch.dtype | None, ctx: DistContext, hooks: FaultHooks,
          weights: dict[str, float]) -> np.ndarray:
    """One optimizer step over this rank's batch in micro-batches (no_sync on all but last).

    Returns the sums [policy loss * n, value loss * n, correct, n, then each of AUX_LOSSES'
    loss * n]. The objective is policy + value + the weighted auxiliary losses."""
    optimizer.zero_grad(set_to_none=True)
    rows = batch["planes"].shape[0]
    chunks = [(lo, min(rows, lo + micro)) for lo in range(0, rows, micro)]
    out = np.zeros(4 + len(AUX_LOSSES))
    for i, (lo, hi) in enumerate(chunks):
        if hooks.fake_oom_at_micro_batch is not None and hi - lo >= hooks.fake_oom_at_micro_batch:
            raise RuntimeError(f"CUDA out of memory (fake, micro-batch {hi - lo})")
        is_last = i == len(chunks) - 1
        defer_sync = isinstance(model, DDP) and not is_last  # all-reduce once, on the last
        sync = model.no_sync() if defer_sync else contextlib.nullcontext()
        with sync:
            part = {k: t[lo:hi].to(ctx.device, non_blocking=True) for k, t in batch.items()}
            p_loss, v_loss, correct, aux = _losses(model, part, autocast, ctx.device)
            share = (hi - lo) / rows  # the step's loss is the mean over the whole rank batch
            loss = (p_loss + v_loss + sum(weights[k] * t for k, t in aux.items())) * share
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        out += [p_loss.item() * (hi - lo), v_loss.item() * (hi - lo), correct.item(), hi - lo,
                *(aux[k].item() * (hi - lo) if k in aux else 0.0 for k in AUX_LOSSES)]
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return out


@torch.no_grad()
def _validate(model: torch.nn.Module, validation: SampleDataset | None, per_rank: int,
              ctx: DistContext, autocast: torch.dtype | None) -> float | None:
    """Mean policy + value loss on (up to MAX_VALIDATION_SAMPLES of) the held-out samples."""
    size = 0 if validation is None else min(len(validation), MAX_VALIDATION_SAMPLES)
    if size < ctx.world_size:
        return None
    net = model.module if isinstance(model, DDP) else model
    net.eval()
    mine = list(range(ctx.rank, size - size % ctx.world_size, ctx.world_size))
    total = np.zeros(2)
    for lo in range(0, len(mine), per_rank):
        batch = {k: t.to(ctx.device) for k, t in fetch_batch(validation, mine[lo : lo + per_rank])
                 .items()}
        p_loss, v_loss, _, _ = _losses(net, batch, autocast, ctx.device)
        rows = batch["planes"].shape[0]
        total += [(p_loss.item() + v_loss.item()) * rows, rows]
    net.train()
    loss_sum, rows = all_reduce_sum(list(total), ctx)
    return loss_sum / rows if rows else None


def _weights_checksums(net: torch.nn.Module, ctx: DistContext) -> list[float]:
    """A position-weighted sum of every parameter, gathered from every rank.

    Parameters only: BatchNorm running statistics legitimately differ after the last step
    (each rank saw its own batch; DDP broadcasts rank 0's at the next forward, and rank 0's
    are the ones saved).
    """
    total = torch.zeros((), dtype=torch.float64)
    for i, t in enumerate(net.parameters()):
        if t.is_floating_point():
            flat = t.detach().to("cpu", torch.float64).flatten()
            weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64) / flat.numel()
            total += (flat * weights).sum() * (i + 1)
    sums = [v[0] for v in all_gather_floats([float(total)], ctx)]
    assert all(s == sums[0] for s in sums), f"weights differ across ranks: {sums}"
    return sums


def _maybe_inject_fault(hooks: FaultHooks, rank: int, step: int) -> None:
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if hooks.kill_rank_at_step == (rank, step) and first_attempt:
        log.error("test hook: rank %d kills itself at step %d", rank, step)
        os.kill(os.getpid(), 9)
    if hooks.hang_rank_at_step == (rank, step):
        log.error("test hook: rank %d hangs at step %d", rank, step)
        while True:
            time.sleep(60)


def _progress_bar(total: int, generation: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"train gen {generation}", unit="step", file=sys.stderr,
                mininterval=1.0, dynamic_ncols=True)


# ------------------------------------------------------------------------------ command line


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m training.trainer",
        description="Train one generation from the replay window (alone, DDP or multi-node).",
    )
    ap.add_argument("--config", default=None, help="config file (default configs/config.yaml)")
    add_flags(ap, "--run-dir", "--gpus", "--nodes")
    ap.add_argument("--node-rank", type=int, default=0, help="this node's rank (0 = master)")
    ap.add_argument("--master-addr", default="127.0.0.1", help="address of node 0")
    add_flags(ap, "--master-port", "--batch-size", "--batch-size-per-gpu", "--backend",
              "--mixed-precision", "--epochs", "--lr", "--learning-rate")
    ap.add_argument("--world-size", type=int, default=None,
                    help="total training processes: alone, --nodes 1 runs this many here; "
                         "with --rank, this process is one of them, started by hand")
    ap.add_argument("--rank", type=int, default=None,
                    help="this process's global rank when each is started by hand (with "
                         "--world-size, --master-addr and --master-port)")
    ap.add_argument("--local-rank", "--local_rank", type=int, default=None,
                    help="set by python -m torch.distributed.launch (torchrun sets LOCAL_RANK)")
    ap.add_argument("--num-workers", type=int, default=None, metavar="N",
                    help="the 000 guide's data-loader workers: accepted and logged, and it "
                         "changes nothing (samples are batched in memory from the window's "
                         "arrays; there is no data loader)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps this round")
    ap.add_argument("--checkpoint", default=None,
                    help="resume from this checkpoint ('none' = fresh net; default newest)")
    ap.add_argument("--generation", type=int, default=None, help="number the new model so")
    ap.add_argument("--samples", default=None,
                    help="train from this .npz (planes, policy, value) instead of the window")
    ap.add_argument("--cache-dir", default=None,
                    help="this node does not see rank 0's run folder: receive the window and "
                         "the starting checkpoint from rank 0 into this folder")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--run-hours", type=float, default=None,
                    help="hours the run has run (the coach's): with run.hours, places the LR "
                         "drops of training.lr_schedule_by_time")
    ap.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (default config)")
    # Fault injection for tests/test_ddp.py and tests/test_trainer.py.
    ap.add_argument("--test-fake-oom-at", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--test-kill-rank-at", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--test-hang-rank-at", default=None, help=argparse.SUPPRESS)
    return ap


def config_from_args(args: argparse.Namespace) -> Config:
    """load_config + the flags (configs.flags), validated again by the config's dataclasses."""
    cfg = load_config(args.config)
    changes = overrides(args)
    return override(cfg, changes) if changes else cfg


def apply_world_size(args: argparse.Namespace, cfg: Config) -> Config:
    """The 000 guide's `--world-size N [--rank R]`: alone, N processes over `--nodes` nodes
    (training.gpus = N / nodes, launched through torch.distributed.run); with `--rank`, this
    process is rank R of N started by hand: the environment torchrun would set is set here
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). ConfigError when they cannot
    mean anything."""
    if args.rank is not None and args.world_size is None:
        raise ConfigError("command line: --rank needs --world-size (the total processes)")
    if args.world_size is None:
        return cfg
    n, nodes = args.world_size, cfg.training.nodes
    if n < 1 or n % nodes:
        raise ConfigError(f"command line: --world-size {n} must be a positive multiple of "
                          f"--nodes {nodes}")
    if under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != n:
            raise ConfigError(f"command line: --world-size {n}, but the launcher started "
                              f"{os.environ['WORLD_SIZE']} processes")
        return cfg
    if args.rank is not None:
        if not 0 <= args.rank < n:
            raise ConfigError(f"command line: --rank {args.rank} outside 0..{n - 1}")
        local = args.local_rank if args.local_rank is not None else args.rank % (n // nodes)
        os.environ.update(RANK=str(args.rank), WORLD_SIZE=str(n), LOCAL_RANK=str(local),
                          MASTER_ADDR=args.master_addr,
                          MASTER_PORT=str(cfg.training.master_port))
        return cfg
    return override(cfg, {"training.gpus": n // nodes})


def _rank_step(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    rank, step = text.split(":")
    return int(rank), int(step)


def relaunch_command(args: argparse.Namespace, argv: list[str], cfg: Config) -> list[str] | None:
    """The torch.distributed.run command that re-executes this trainer, or None to run here."""
    if under_torchrun():
        return None
    nproc = cfg.training.gpus
    if nproc == 0:
        nproc = torch.cuda.device_count() or 1
    nodes = cfg.training.nodes
    if nproc * nodes <= 1:
        return None
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    if nodes == 1 and args.master_port is None:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={nodes}", f"--node_rank={args.node_rank}",
                f"--master_addr={args.master_addr}",
                f"--master_port={cfg.training.master_port}"]
    return cmd + ["-m", "training.trainer", *argv]


@record
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.num_workers is not None and args.num_workers < 0:
        parser.error(f"--num-workers must be >= 0, got {args.num_workers}")
    if args.local_rank is not None and "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = str(args.local_rank)  # torch.distributed.launch's way
    try:
        cfg = config_from_args(args)
        cfg = apply_world_size(args, cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", "0"))
    if under_torchrun():
        die_with_parent()  # the launcher's death ends this rank
    level = args.log_level or cfg.logging.level
    configure_logging(None, level if rank == 0 else "WARNING")  # other ranks: problems only
    if args.num_workers is not None:
        log.info("--num-workers %d: noted; samples are batched in memory from the replay "
                 "window's arrays (no data loader), so there are no loader workers to start",
                 args.num_workers)
    cmd = relaunch_command(args, argv, cfg)
    if cmd is not None:
        log.info("relaunching through torch.distributed.run: %s", " ".join(cmd))
        return subprocess.call(cmd, preexec_fn=die_with_parent)
    run_dir = Path(cfg.run.dir)
    hooks = FaultHooks(
        fake_oom_at_micro_batch=args.test_fake_oom_at,
        kill_rank_at_step=_rank_step(args.test_kill_rank_at),
        hang_rank_at_step=_rank_step(args.test_hang_rank_at),
    )
    try:
        dataset = None
        if args.samples:
            dataset = SampleArrays.load(args.samples, cfg.replay.validation_fraction)
        result = train_round(cfg, run_dir, dataset=dataset, checkpoint=args.checkpoint,
                             steps=args.steps, generation=args.generation,
                             progress=not args.no_progress, hooks=hooks,
                             cache_dir=args.cache_dir, run_hours=args.run_hours)
    except (TrainingError, ConfigError) as e:
        log.error("%s", e)
        return 1
    except RuntimeError as e:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and is_peer_failure(e):
            log.error(
                "rank %d: training stopped: another rank failed or a collective timed out "
                "(training.timeout_s=%s): %s", rank, cfg.training.timeout_s,
                str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__,
            )
            return 1
        raise
    if rank == 0:
        print(json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    if code is None:  # @record turns SystemExit(0) (--help under a launcher) into None
        code = 0
    if under_torchrun():
        # HACK: a finished rank's interpreter teardown can abort in C++ ("terminate called
        # without an active exception", seen on a training node), which torchrun reports as a
        # failed rank while the other node's agent waits out its 300 s exit barrier. The round
        # is done and written by now, so leave without the teardown.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
