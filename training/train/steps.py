"""What one optimizer step is: the losses, a step over micro-batches, validation, checks.

Owns the losses (policy cross-entropy + value MSE, plus the net's training-only heads,
`AUX_LOSSES`, each weighted by `loss_weights`), `one_step` (an optimizer step over this rank's
batch in micro-batches, `no_sync` on all but the last; the out-of-memory test `is_oom` lets the
caller halve the micro-batch), `validate` (the held-out loss), `weights_checksums` (equal on
every rank under DDP), `IndexBatches` (DistributedSampler with `set_epoch` and `drop_last`,
resumable at (epoch, offset)), the autocast choice and the fault hooks of the tests, and the
`Trainee` a step changes (the net, DDP around it, the optimizer, the schedule, autocast).
A step does not wait for the device: its losses stay there (`StepStats`) until the caller
reads many steps' at once (`step_sums`), so on a GPU the next batch is fetched and its
kernels queued while the last step computes.

Vocabulary as in `training.train.phases`. It must not: write files, choose what to train on or
for how long (the phases do), or touch the process group but through `training.train.ddp`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from training.learn.samples import TARGETS, SampleDataset, fetch_batch
from training.learn.training_error import TrainingError
from training.train.ddp import DistContext, all_gather_floats, all_reduce_sum
from training.train.train_state import WarmupSchedule

log = logging.getLogger(__name__)

AUX_LOSSES = (*TARGETS, "soft_policy")
"""The auxiliary losses a round reports: the sample targets' heads, and the soft policy's
(its target comes from the policy target)."""

MAX_VALIDATION_SAMPLES = 4096


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


def is_oom(err: BaseException) -> bool:
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


def losses(net: torch.nn.Module, batch: dict[str, torch.Tensor],
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


class IndexBatches:
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


def autocast_dtype(ctx: DistContext, mixed_precision: bool,
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


@dataclass
class Trainee:
    """The net and everything a step changes, in memory for as long as training lasts."""

    net: torch.nn.Module
    model: torch.nn.Module  # the net, or DDP around it
    optimizer: torch.optim.Optimizer
    schedule: WarmupSchedule
    scaler: torch.amp.GradScaler | None
    autocast: torch.dtype | None
    micro: int  # halved after an out-of-memory micro-batch
    peak_lr: float
    weights: dict[str, float]
    ema: torch.nn.Module | None = None  # the average of the weights (training.ema_decay)
    ema_decay: float = 0.0

    @property
    def published(self) -> torch.nn.Module:
        """The net a generation's model file holds: the average when there is one."""
        return self.ema if self.ema is not None else self.net


def ema_decay_at(decay: float, step: int) -> float:
    """The decay of the weight average after global step `step`: training.ema_decay, but at
    most (1 + step) / (10 + step) early in a run (TensorFlow's num_updates rule), so that the
    first generations average over about the last ninth of their steps instead of holding on
    to the random starting weights."""
    return min(decay, (1.0 + step) / (10.0 + step))


@torch.no_grad()
def update_ema(trainee: Trainee) -> None:
    """ema := decay x ema + (1 - decay) x weights, parameter by parameter, with the decay of
    the global step just taken (`ema_decay_at`); the buffers (batch norm statistics, already
    running averages) copied."""
    ema = trainee.ema
    if ema is None:
        return
    decay = ema_decay_at(trainee.ema_decay, trainee.schedule.step)
    torch._foreach_lerp_(list(ema.parameters()), list(trainee.net.parameters()), 1.0 - decay)
    torch._foreach_copy_(list(ema.buffers()), list(trainee.net.buffers()))


@dataclass
class StepStats:
    """What one step's micro-batches measured, still on the device (reading it waits for
    the step: `step_sums` reads many steps' at once). `values` [micro-batches, 3 +
    len(AUX_LOSSES)]: policy loss, value loss, correct, then each of AUX_LOSSES' loss (0
    where the net has no such head); `rows`: each micro-batch's samples."""

    values: torch.Tensor
    rows: list[int]


def step_sums(stats: Sequence[StepStats]) -> np.ndarray:
    """[steps, 4 + len(AUX_LOSSES)]: each step's sums [policy loss * n, value loss * n,
    correct, n, then each of AUX_LOSSES' loss * n], in float64; one copy from the device."""
    if not stats:
        return np.zeros((0, 4 + len(AUX_LOSSES)))
    values = torch.cat([st.values for st in stats]).double().cpu().numpy()
    rows = np.array([r for st in stats for r in st.rows], np.float64)
    per_micro = np.concatenate([values[:, :2] * rows[:, None], values[:, 2:3], rows[:, None],
                                values[:, 3:] * rows[:, None]], axis=1)
    ends = np.cumsum([len(st.rows) for st in stats])
    return np.add.reduceat(per_micro, np.concatenate([[0], ends[:-1]]), axis=0)


def one_step(trainee: Trainee, batch: dict[str, torch.Tensor], ctx: DistContext,
             hooks: FaultHooks) -> StepStats:
    """One optimizer step of `trainee` over this rank's batch in micro-batches of
    `trainee.micro` (no_sync on all but the last), without waiting for the device: its
    losses come back as a `StepStats` (`step_sums` reads them). The objective is policy +
    value + the weighted auxiliary losses."""
    model, optimizer, scaler = trainee.model, trainee.optimizer, trainee.scaler
    micro, autocast, weights = trainee.micro, trainee.autocast, trainee.weights
    optimizer.zero_grad(set_to_none=True)
    rows = batch["planes"].shape[0]
    chunks = [(lo, min(rows, lo + micro)) for lo in range(0, rows, micro)]
    measured = []
    for i, (lo, hi) in enumerate(chunks):
        if hooks.fake_oom_at_micro_batch is not None and hi - lo >= hooks.fake_oom_at_micro_batch:
            raise RuntimeError(f"CUDA out of memory (fake, micro-batch {hi - lo})")
        is_last = i == len(chunks) - 1
        defer_sync = isinstance(model, DDP) and not is_last  # all-reduce once, on the last
        sync = model.no_sync() if defer_sync else contextlib.nullcontext()
        with sync:
            part = {k: t[lo:hi].to(ctx.device, non_blocking=True) for k, t in batch.items()}
            p_loss, v_loss, correct, aux = losses(model, part, autocast, ctx.device)
            share = (hi - lo) / rows  # the step's loss is the mean over the whole rank batch
            loss = (p_loss + v_loss + sum(weights[k] * t for k, t in aux.items())) * share
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        zero = p_loss.new_zeros(())
        measured.append(torch.stack([p_loss.detach().float(), v_loss.detach().float(),
                                     correct.detach().float(),
                                     *(aux[k].detach().float() if k in aux else zero
                                       for k in AUX_LOSSES)]))
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return StepStats(torch.stack(measured), [hi - lo for lo, hi in chunks])


@torch.no_grad()
def validate(model: torch.nn.Module, validation: SampleDataset | None, per_rank: int,
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
        p_loss, v_loss, _, _ = losses(net, batch, autocast, ctx.device)
        rows = batch["planes"].shape[0]
        total += [(p_loss.item() + v_loss.item()) * rows, rows]
    net.train()
    loss_sum, rows = all_reduce_sum(list(total), ctx)
    return loss_sum / rows if rows else None


def weights_checksums(net: torch.nn.Module, ctx: DistContext) -> list[float]:
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


def maybe_inject_fault(hooks: FaultHooks, rank: int, step: int) -> None:
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if hooks.kill_rank_at_step == (rank, step) and first_attempt:
        log.error("test hook: rank %d kills itself at step %d", rank, step)
        os.kill(os.getpid(), 9)
    if hooks.hang_rank_at_step == (rank, step):
        log.error("test hook: rank %d hangs at step %d", rank, step)
        while True:
            time.sleep(60)


def progress_bar(total: int, generation: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"train gen {generation}", unit="step", file=sys.stderr,
                mininterval=1.0, dynamic_ncols=True)
