"""What a round resumes from and leaves behind: LR schedule, RNG states, checkpoints.

Owns the learning-rate rules (`scaled_lr`, `WarmupSchedule`), this process's RNG states
(torch, numpy, python, CUDA: `rng_state`, `set_rng_state`, and `rng_json` / `rng_from_json`
to send them between ranks as JSON), the checkpoint format (`save_checkpoint`,
`load_checkpoint`), and the file a round starts from: the given checkpoint, else the newest
checkpoint, else the newest model, else a fresh net (`start_file`, `load_start`), and the
restore beside the save (`save_checkpoint`, `restore_checkpoint`). Generation 0's model, a
random net seeded by run.seed, is written in one place: `write_initial_model`. Paths come from run_dir.RunDir:
checkpoints/checkpoint_<gen:06d>.pt and models/model_<gen:06d>.pt.

A checkpoint holds the model (net.model_payload), the optimizer, the schedule, the global step,
the generation, the data position and every rank's RNG state, so that a resumed round takes
the same next step an unbroken one would, and with training.ema_decay the average of the
weights (`ema`, a model payload; None without it).

It must not: touch torch.distributed, train, or decide which rank writes (the round does).
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from configs import Config, to_dict
from distributed.transfer import write_atomic
from training.learn.net import (
    ModelError,
    load_payload,
    model_payload,
    net_from_config,
    save_bytes,
    save_model,
)
from training.learn.training_error import TrainingError
from training.run.run_dir import RunDir

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "azgo-checkpoint"
CHECKPOINT_VERSION = 1
_NAME_RE = re.compile(r"^(model|checkpoint)_(\d{6,})\.pt$")


# ----------------------------------------------------------------------------- schedule


@dataclass
class WarmupSchedule:
    """LR = peak * min(1, (step + 1) / warmup_steps) * the multiplier of the last drop reached:
    `drops` are (global step, multiplier) pairs, steps ascending (training.lr_schedule); peak
    is scaled from the reference batch. `time_factor`, when set, is the multiplier instead
    (a run with a time limit: `drop_multiplier` of the share of its hours)."""

    peak_lr: float
    warmup_steps: int
    step: int = 0
    drops: tuple[tuple[float, float], ...] = ()
    time_factor: float | None = None

    def lr(self) -> float:
        factor = self.time_factor
        if factor is None:
            factor = drop_multiplier(self.drops, self.step)
        warm = 1.0 if self.warmup_steps <= 0 else min(1.0, (self.step + 1) / self.warmup_steps)
        return self.peak_lr * factor * warm

    def state_dict(self) -> dict[str, Any]:
        return {"name": "linear_warmup_piecewise_constant", **asdict(self)}


def drop_multiplier(drops: Sequence[Sequence[float]], where: float) -> float:
    """The multiplier of the last (from, multiplier) pair of `drops` that `where` has
    reached, 1 before the first: a global step for training.lr_schedule, the share of
    run.hours already run for training.lr_schedule_by_time."""
    factor = 1.0
    for at, multiplier in drops:
        if where >= at:
            factor = multiplier
    return factor


def scaled_lr(lr: float, total_batch: int, reference_batch: int, scaling: str) -> float:
    """The guides' scaling rules: linear, sqrt or none (lr applies at reference_batch)."""
    ratio = total_batch / reference_batch
    if scaling == "linear":
        return lr * ratio
    if scaling == "sqrt":
        return lr * math.sqrt(ratio)
    return lr


# ---------------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    """This process's RNG states: torch, numpy's global, python's and every CUDA device's."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def rng_json(state: dict[str, Any]) -> dict[str, Any]:
    """`rng_state()` as plain JSON (bytes as hex), to cross between ranks without pickle."""
    return {
        "torch": state["torch"].numpy().tobytes().hex(),
        "numpy": {**state["numpy"], "keys": state["numpy"]["keys"].tolist()},
        "python": state["python"],
        "cuda": [t.numpy().tobytes().hex() for t in state["cuda"]],
    }


def rng_from_json(raw: Any) -> dict[str, Any]:
    """The inverse of `rng_json`, checking every field (it comes from another rank)."""
    try:
        np_raw, py = raw["numpy"], raw["python"]
        keys = [int(k) for k in np_raw["keys"]]
        state = [int(v) for v in py["state"]]
        if len(keys) != 624 or len(state) != 625 or not all(0 <= k < 2**32 for k in keys):
            raise ValueError("wrong numpy or python state size")
        gauss = py["gauss"]
        return {
            "torch": torch.frombuffer(bytearray(bytes.fromhex(raw["torch"])),
                                      dtype=torch.uint8).clone(),
            "numpy": {"keys": torch.tensor(keys, dtype=torch.int64), "pos": int(np_raw["pos"]),
                      "has_gauss": int(np_raw["has_gauss"]),
                      "cached": float(np_raw["cached"])},
            "python": {"version": int(py["version"]), "state": state,
                       "gauss": None if gauss is None else float(gauss)},
            "cuda": [torch.frombuffer(bytearray(bytes.fromhex(h)), dtype=torch.uint8).clone()
                     for h in raw["cuda"]],
        }
    except (KeyError, TypeError, ValueError) as e:
        raise TrainingError(f"a rank sent an unreadable RNG state: {e}") from e


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state()` returned (CUDA states only where CUDA is)."""
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    np.random.set_state((
        "MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
        np_state["has_gauss"], np_state["cached"],
    ))
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    """Seed python's, numpy's global and torch's RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# --------------------------------------------------------------------- checkpoints, models


def latest(folder: Path, kind: str) -> tuple[int, Path] | None:
    """(generation, path) of the newest `kind` ("model"/"checkpoint") file in `folder`."""
    best = None
    if folder.is_dir():
        for p in folder.iterdir():
            m = _NAME_RE.match(p.name)
            if m and m.group(1) == kind and (best is None or int(m.group(2)) > best[0]):
                best = (int(m.group(2)), p)
    return best


def write_initial_model(cfg: Config, run_dir: str | os.PathLike) -> Path:
    """models/model_000000.pt: a freshly initialised net seeded by run.seed (idempotent); the
    one place generation 0 is made (the coach's new run, the tests)."""
    path = RunDir(run_dir).model(0)
    if not path.exists():
        torch.manual_seed(cfg.run.seed)
        save_model(path, net_from_config(cfg.net, cfg.go.board_size), 0, {"random": True})
    return path


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint dict (weights_only load), or TrainingError naming the file."""
    path = Path(path)
    try:
        ckpt = load_payload(path, what="checkpoint")
    except ModelError as e:
        raise TrainingError(str(e)) from e
    if ckpt.get("format") != CHECKPOINT_FORMAT or ckpt.get("version") != CHECKPOINT_VERSION:
        raise TrainingError(
            f"{path}: not a version-{CHECKPOINT_VERSION} checkpoint of this project "
            f"(format {ckpt.get('format')!r}, version {ckpt.get('version')!r}); pass a "
            "checkpoints/checkpoint_<gen>.pt file, or --checkpoint none to start afresh"
        )
    return ckpt


def save_checkpoint(path: Path, cfg: Config, net: torch.nn.Module, generation: int,
                    meta: dict[str, Any], optimizer: torch.optim.Optimizer,
                    schedule: WarmupSchedule, data: dict[str, int],
                    rng_states: list[dict[str, Any]],
                    ema: torch.nn.Module | None = None) -> None:
    """Write a checkpoint atomically: the model with `meta`, the optimizer, the schedule,
    `data` (the window's length, per_rank, world_size, epoch and offset), every rank's RNG
    state, in rank order, and the average of the weights (`ema`, training.ema_decay; the
    model file holds it then, the checkpoint's model the weights as trained)."""
    state = {
        "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
        "generation": generation, "step": schedule.step,
        "model": model_payload(net, generation, meta),
        "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
        "data": data,
        "rng": rng_states, "config": to_dict(cfg),
        "ema": None if ema is None else model_payload(ema, generation, meta),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, save_bytes(state))


def restore_checkpoint(ckpt: dict[str, Any], source: str, optimizer: torch.optim.Optimizer,
                       schedule: WarmupSchedule, *, length: int, per_rank: int, rank: int,
                       world_size: int, seed: int) -> tuple[int, int]:
    """What `save_checkpoint` saved, back into `optimizer`, `schedule` and this rank's RNGs.

    Returns the data position (epoch, offset) to go on from: the saved one when the window
    (`length`), the batch per rank and the ranks are the same, else the start of the next
    pass. RNG states of another number of ranks are replaced by a seed from `seed`, the rank
    and the step (logged). `source` names the checkpoint in errors."""
    try:
        optimizer.load_state_dict(ckpt["optimizer"])
    except (ValueError, KeyError) as e:
        raise TrainingError(
            f"{source}: its optimizer state does not fit this net ({e}); pass --checkpoint "
            "none to start afresh"
        ) from e
    schedule.step = int(ckpt["schedule"]["step"])
    data = ckpt.get("data", {})
    if (data.get("length"), data.get("per_rank"), data.get("world_size")) == (
        length, per_rank, world_size
    ):
        epoch, offset = int(data["epoch"]), int(data["offset"])
    else:
        epoch, offset = int(data.get("epoch", -1)) + 1, 0  # the window changed: a new pass
    rng = ckpt.get("rng") or []
    if len(rng) == world_size:
        set_rng_state(rng[rank])
    else:
        log.warning("checkpoint has RNG states for %d ranks, this run has %d; reseeding",
                    len(rng), world_size)
        seed_everything(seed + 1000 * rank + schedule.step)
    return epoch, offset


# ----------------------------------------------------------------------- where a round starts


def start_file(run_dir: Path, checkpoint: str | os.PathLike | None
               ) -> tuple[str, Path | None, int]:
    """(kind "checkpoint" | "model" | "none", file, base generation) a round starts from."""
    if checkpoint is not None and str(checkpoint).lower() == "none":
        return "none", None, 0
    if checkpoint is not None:
        return "checkpoint", Path(checkpoint), -1
    found = latest(RunDir(run_dir).checkpoints, "checkpoint")
    if found is not None:
        return "checkpoint", found[1], found[0]
    newest = latest(RunDir(run_dir).models, "model")
    if newest is not None:
        return "model", newest[1], newest[0]
    return "none", None, 0


def load_start(kind: str, path: Path | None, base_gen: int
               ) -> tuple[dict | None, dict | None, int]:
    """(checkpoint dict or None, model payload or None, base generation) of what `start_file`
    chose; a model file's generation is `base_gen`, a checkpoint's is inside it."""
    if kind == "checkpoint":
        ckpt = load_checkpoint(path)
        return ckpt, ckpt["model"], int(ckpt["generation"])
    if kind == "model":
        try:
            return None, load_payload(path), base_gen
        except ModelError as e:
            raise TrainingError(str(e)) from e
    return None, None, 0


def resolve_start(run_dir: Path, checkpoint: str | os.PathLike | None
                  ) -> tuple[dict | None, dict | None, int]:
    """(checkpoint dict or None, model payload to start from or None, base generation)."""
    return load_start(*start_file(run_dir, checkpoint))
