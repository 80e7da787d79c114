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

Behaviour: backend NCCL with CUDA, Gloo otherwise (one device on MPS); the total
batch `training.batch_size` is split across ranks; LR scaled linearly / by sqrt from
`lr_reference_batch`, with linear warmup; DistributedSampler with `set_epoch` and `drop_last`;
losses reduced across ranks; a process-group timeout (`training.timeout_s`); a rank that fails
makes the others exit (the collective raises, the launcher ends the group); an out-of-memory
micro-batch halves the micro-batch and accumulates twice as many. Checkpoints hold the model,
optimizer, schedule, step, generation, data position and every rank's RNG state, are written
atomically and resume exactly (the next step's loss is the same).

Losses: policy cross-entropy + value MSE, plus the net's training-only heads where it has them
(KataGo's auxiliary targets, `TARGETS`): ownership (cross-entropy per point, mean), score
(Huber on margin / N) and the opponent's reply (cross-entropy), each masked per sample and
weighted by `training.ownership_weight`, `score_weight`, `opponent_policy_weight`. `loss` in
results and metrics stays policy + value, so that runs with and without the heads compare.

Files (rank 0, then a barrier): checkpoints/checkpoint_<gen:06d>.pt, models/model_<gen:06d>.pt
(net.save_model) and one metrics row (training.metrics).

Must not: play games, read game batch files itself (the replay window does), or talk to workers.
Only this module touches torch.distributed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from configs import Config, ConfigError, load_config, override, to_dict
from training import metrics
from training.logsetup import configure_logging
from training.model_store import model_stem
from training.net import (
    ModelError,
    load_payload,
    model_payload,
    net_from_config,
    net_from_payload,
    save_bytes,
    save_model,
    write_file_atomic,
)
from training.signals import die_with_parent

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "azgo-checkpoint"
CHECKPOINT_VERSION = 1
MAX_VALIDATION_SAMPLES = 4096
_NAME_RE = re.compile(r"^(model|checkpoint)_(\d{6,})\.pt$")


class TrainingError(Exception):
    """A round that cannot start or finish: no data, a bad checkpoint, a bad option."""


class SampleDataset(Protocol):
    """What the trainer reads: replay_buffer.ReplayWindow, or SampleArrays below."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray, float]: ...


# --------------------------------------------------------------------------------- data


TARGETS = ("ownership", "score", "opponent_policy")
"""Auxiliary targets (replay_buffer.TARGETS), each with a float32 [S] `<name>_mask`; the
matching net heads are trained only where the mask is 1."""
_TARGET_KEYS = tuple(k for t in TARGETS for k in (t, f"{t}_mask"))


class SampleArrays:
    """A map-style dataset over in-memory arrays (an .npz of planes, policy, value).

    Used for training from a fixed sample file (`--samples FILE.npz`), benchmarks and tests.
    planes float32 [S, C, N, N], policy float32 [S, N*N+1], value float32 [S]; optionally
    the auxiliary `TARGETS` (ownership [S, N*N], score [S] as margin / N, opponent_policy
    [S, N*N+1], side to move's view) with their masks [S]. Without them those heads are not
    trained (their masks are 0).
    """

    def __init__(self, planes: np.ndarray, policy: np.ndarray, value: np.ndarray,
                 validation: "SampleArrays | None" = None,
                 targets: dict[str, np.ndarray] | None = None):
        assert len(planes) == len(policy) == len(value), "planes, policy, value lengths differ"
        self.planes = np.ascontiguousarray(planes, dtype=np.float32)
        self.policy = np.ascontiguousarray(policy, dtype=np.float32)
        self.value = np.ascontiguousarray(value, dtype=np.float32)
        self.validation = validation
        self.targets = {k: np.ascontiguousarray(v, dtype=np.float32)
                        for k, v in (targets or {}).items()}
        assert set(self.targets) <= set(_TARGET_KEYS), sorted(self.targets)
        assert all(len(v) == len(planes) for v in self.targets.values()), "target lengths"

    @classmethod
    def load(cls, path: str | os.PathLike, validation_fraction: float = 0.0) -> SampleArrays:
        """Read an .npz with arrays planes, policy, value and optionally the auxiliary
        targets with their masks (no pickles)."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                planes, policy, value = data["planes"], data["policy"], data["value"]
                targets = {k: data[k] for k in _TARGET_KEYS if k in data.files}
        except (OSError, ValueError, KeyError) as e:
            raise TrainingError(
                f"{path}: cannot read samples ({e}); expected an .npz with arrays "
                "planes [S,C,N,N], policy [S,N*N+1], value [S]"
            ) from e
        if not (len(planes) == len(policy) == len(value)) or planes.ndim != 4:
            raise TrainingError(f"{path}: planes, policy and value must have the same length")
        for key, arr in targets.items():
            if len(arr) != len(planes):
                raise TrainingError(f"{path}: {key} has {len(arr)} rows, planes {len(planes)}")
        for name in TARGETS:
            if (name in targets) != (f"{name}_mask" in targets):
                raise TrainingError(f"{path}: {name} and {name}_mask go together")
        held = int(len(planes) * validation_fraction)
        validation = cls(planes[:held], policy[:held], value[:held],
                         targets={k: v[:held] for k, v in targets.items()}) if held else None
        return cls(planes[held:], policy[held:], value[held:], validation,
                   {k: v[held:] for k, v in targets.items()})

    def save(self, path: str | os.PathLike) -> None:
        buf = _npz_bytes(planes=self.planes, policy=self.policy, value=self.value,
                         **self.targets)
        write_file_atomic(path, buf)

    def samples(self, idx: Sequence[int]) -> dict[str, np.ndarray]:
        """A batch as a dict: planes, policy, value and the auxiliary targets present."""
        idx = np.asarray(idx)
        out = {"planes": self.planes[idx], "policy": self.policy[idx], "value": self.value[idx]}
        out.update({k: v[idx] for k, v in self.targets.items()})
        return out

    def __len__(self) -> int:
        return len(self.planes)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray, float]:
        return self.planes[i], self.policy[i], float(self.value[i])

    def __getitems__(self, idx: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        idx = np.asarray(idx)
        return self.planes[idx], self.policy[idx], self.value[idx]


def synthetic_samples(count: int, board_size: int, history: int, seed: int = 0) -> SampleArrays:
    """Random positions with learnable targets, for benchmarks and smoke tests.

    The policy target is the first stone of the side to move (row-major), or pass on an
    empty plane; the value is tanh of the stone difference between the two newest planes.
    Auxiliary targets: ownership is the stones of the newest planes (+1 own, -1 the
    opponent's), score their difference / N, the opponent's policy its first stone.
    """
    rng = np.random.default_rng(seed)
    n = board_size
    planes = (rng.random((count, 2 * history + 1, n, n)) < 0.3).astype(np.float32)
    planes[:, -1] = rng.integers(0, 2, (count, 1, 1))
    policy = np.zeros((count, n * n + 1), np.float32)
    own = planes[:, 0].reshape(count, -1)
    first = np.where(own.any(axis=1), own.argmax(axis=1), n * n)
    policy[np.arange(count), first] = 1.0
    theirs = planes[:, 1].reshape(count, -1)
    value = np.tanh(own.sum(axis=1) - theirs.sum(axis=1))
    opponent = np.zeros_like(policy)
    first = np.where(theirs.any(axis=1), theirs.argmax(axis=1), n * n)
    opponent[np.arange(count), first] = 1.0
    ones = np.ones(count, np.float32)
    targets = {
        "ownership": own - theirs, "ownership_mask": ones,
        "score": (own.sum(axis=1) - theirs.sum(axis=1)) / n, "score_mask": ones,
        "opponent_policy": opponent, "opponent_policy_mask": ones,
    }
    return SampleArrays(planes, policy, value.astype(np.float32), targets=targets)


def _npz_bytes(**arrays: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _fetch(dataset: SampleDataset, idx: Sequence[int]) -> dict[str, torch.Tensor]:
    """One batch as float32 tensors: planes [B,C,N,N], policy [B,M], value [B], and the
    auxiliary TARGETS with their masks where the dataset has them (its `samples`)."""
    samples = getattr(dataset, "samples", None)
    if samples is not None:
        got = samples(list(idx))
        return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
                for k, v in got.items()}
    getitems = getattr(dataset, "__getitems__", None)
    if getitems is not None:
        got = getitems(list(idx))
        if isinstance(got, tuple) and len(got) == 3 and isinstance(got[0], np.ndarray):
            planes, policy, value = got
        else:  # a list of samples
            planes, policy, value = zip(*got)
            planes, policy, value = np.stack(planes), np.stack(policy), np.asarray(value)
    else:
        samples = [dataset[i] for i in idx]
        planes = np.stack([s[0] for s in samples])
        policy = np.stack([s[1] for s in samples])
        value = np.asarray([s[2] for s in samples])
    return {
        "planes": torch.from_numpy(np.ascontiguousarray(planes, dtype=np.float32)),
        "policy": torch.from_numpy(np.ascontiguousarray(policy, dtype=np.float32)),
        "value": torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)).reshape(-1),
    }


def open_replay_window(cfg: Config, run_dir: Path, ctx: "DistContext",
                       cache_dir: Path | None = None) -> SampleDataset:
    """replay_buffer.ReplayWindow over run_dir/replay, the same on every rank.

    Rank 0 builds the window (and any missing sidecars) first; the others then open exactly
    the batch files rank 0 chose, so batches that arrive meanwhile cannot make them differ.
    A rank given `cache_dir` (a training node without rank 0's run folder) opens its window
    over cache_dir/replay instead, after rank 0 sent it the chosen files it lacks there.
    """
    from training.replay_buffer import ReplayWindow

    replay_dir = run_dir / "replay" if cache_dir is None else cache_dir / "replay"

    def _open(files: list[str] | None) -> SampleDataset:
        return ReplayWindow(replay_dir, cfg.replay, cfg.net.history, cfg.go.board_size,
                            seed=cfg.run.seed, files=files)

    window = _open(None) if ctx.is_main else None
    names = [window.names() if window is not None else None]
    if ctx.is_distributed:
        names = [_broadcast_json(names[0], ctx)]
        if _any_receiver(ctx, cache_dir):
            replay_dir.mkdir(parents=True, exist_ok=True)
            _relay_files(ctx, run_dir / "replay", names[0],
                         replay_dir if cache_dir is not None else None)
            if cache_dir is not None and ctx.local_rank == 0:
                _prune_cache(replay_dir, names[0])
        if window is None:
            window = _open(names[0])
    assert window is not None
    if len(window) == 0:
        raise TrainingError(
            f"{replay_dir}: the replay window holds no positions; self-play batches must be "
            "ingested first (or pass --samples FILE.npz)"
        )
    return window


# ------------------------------------------------------- training nodes without shared files
#
# A rank started with a cache folder (`--cache-dir`, the coach's extra training nodes) does not
# see rank 0's run folder. Rank 0 then sends it, over the process group itself, the batch files
# of the window and the file the round starts from; nothing else crosses, and a round whose
# ranks all share run_dir sends nothing.
#
# Ranks exchange tensors only, never pickles: what rank 0 sends is JSON in a uint8 tensor
# (`_broadcast_json`), what it gathers from the others is numbers or bounded JSON
# (`_all_gather_json`); a receiver asks for files by setting bits over rank 0's own list of
# names, so a peer cannot name a file rank 0 would read (`../../secret.txt` is not in it).

JSON_EXCHANGE_MAX_BYTES = 64 << 20


def _broadcast_json(obj: Any, ctx: "DistContext") -> Any:
    """Rank 0's `obj` (JSON-able) on every rank, as a uint8 tensor: nobody unpickles."""
    data = json.dumps(obj).encode() if ctx.is_main else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=ctx.device)
    dist.broadcast(size, src=0)
    n = int(size.item())
    if ctx.is_main:
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(ctx.device) if n else \
            torch.empty(0, dtype=torch.uint8, device=ctx.device)
    else:
        t = torch.empty(n, dtype=torch.uint8, device=ctx.device)
    if n:
        dist.broadcast(t, src=0)
    return obj if ctx.is_main else json.loads(t.cpu().numpy().tobytes().decode())


def _all_gather_json(obj: Any, ctx: "DistContext") -> list[Any]:
    """Every rank's `obj` (JSON-able), gathered as uint8 tensors and parsed as JSON (never
    unpickled); a rank sending more than JSON_EXCHANGE_MAX_BYTES or bad JSON is an error."""
    if not ctx.is_distributed:
        return [obj]
    data = json.dumps(obj).encode()
    sizes = [torch.zeros(1, dtype=torch.int64, device=ctx.device)
             for _ in range(ctx.world_size)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=ctx.device))
    lengths = [int(t.item()) for t in sizes]
    if max(lengths) > JSON_EXCHANGE_MAX_BYTES or min(lengths) < 0:
        raise TrainingError(f"rank {ctx.rank}: a rank sent {max(lengths)} bytes, more than "
                            f"{JSON_EXCHANGE_MAX_BYTES}; refusing")
    width = max(lengths)
    mine = torch.zeros(width, dtype=torch.uint8, device=ctx.device)
    if data:
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    bufs = [torch.empty(width, dtype=torch.uint8, device=ctx.device)
            for _ in range(ctx.world_size)]
    dist.all_gather(bufs, mine)
    out = []
    for rank, (buf, n) in enumerate(zip(bufs, lengths)):
        try:
            out.append(json.loads(buf[:n].cpu().numpy().tobytes().decode()))
        except (ValueError, RecursionError) as e:
            raise TrainingError(f"rank {ctx.rank}: unreadable data from rank {rank}: "
                                f"{type(e).__name__}") from e
    return out


def _all_gather_floats(values: list[float], ctx: "DistContext") -> list[list[float]]:
    """Every rank's `values` (same length on each), as float64 tensors."""
    if not ctx.is_distributed:
        return [list(values)]
    mine = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    out = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]


RELAY_CHUNK_BYTES = 32 << 20


def _any_receiver(ctx: "DistContext", cache_dir: Path | None) -> bool:
    """True when some rank has a cache folder (collective: every rank must call it)."""
    flags = _all_reduce_sum([1.0 if cache_dir is not None else 0.0], ctx)
    return flags[0] > 0


def _relay_files(ctx: "DistContext", src_dir: Path, names: list[str],
                 dest_dir: Path | None) -> int:
    """Rank 0 broadcasts the files of `names` (from src_dir) that some receiver lacks; every
    rank with a dest_dir writes them there (atomically, sha256 checked). Returns bytes sent.

    Collective: every rank calls it with the same names (dest_dir None = not a receiver).
    """
    import hashlib

    from distributed.transfer import write_atomic

    # A receiver sets bit i for names[i] it lacks; the union is a MAX all-reduce. Rank 0 then
    # sends only files of ITS OWN list: nothing a peer sends can name another file.
    if not names:  # the same list on every rank (rank 0's, broadcast)
        return 0
    missing = [] if dest_dir is None else [n for n in names if not (dest_dir / n).exists()]
    mask = torch.zeros(len(names), dtype=torch.int32, device=ctx.device)
    if missing:
        wanted_set = set(missing)
        mask[[i for i, n in enumerate(names) if n in wanted_set]] = 1
    dist.all_reduce(mask, op=dist.ReduceOp.MAX)
    wanted = [names[i] for i in mask.nonzero().flatten().tolist()]
    for name in wanted:
        if not _is_plain_file_name(name):
            raise TrainingError(f"rank {ctx.rank}: {name!r} is not a plain file name; refusing "
                                "to relay it")
    if not wanted:
        return 0
    total = 0
    for name in wanted:
        data = None
        meta = None  # (size, sha256) from rank 0, which reads each file once
        if ctx.is_main:
            data = (src_dir / name).read_bytes()
            meta = (len(data), hashlib.sha256(data).hexdigest())
        size, digest = _broadcast_json(meta, ctx)
        buf = bytearray() if not ctx.is_main else None
        for lo in range(0, size, RELAY_CHUNK_BYTES):
            n = min(RELAY_CHUNK_BYTES, size - lo)
            if ctx.is_main:
                t = torch.frombuffer(bytearray(data[lo:lo + n]), dtype=torch.uint8)
                t = t.to(ctx.device)
            else:
                t = torch.empty(n, dtype=torch.uint8, device=ctx.device)
            dist.broadcast(t, src=0)
            if buf is not None:
                buf += t.cpu().numpy().tobytes()
        total += size
        if dest_dir is not None and name in missing:
            got = bytes(buf)
            if hashlib.sha256(got).hexdigest() != digest:
                raise TrainingError(f"rank {ctx.rank}: {name} arrived damaged from rank 0 "
                                    "(sha256 differs); run the round again")
            write_atomic(dest_dir / name, got)
    if ctx.is_main:
        log.info("relay: sent %d files, %.1f MB to the training nodes", len(wanted),
                 total / 1e6)
    return total


def _is_plain_file_name(name: Any) -> bool:
    return (isinstance(name, str) and bool(name) and name not in (".", "..")
            and "/" not in name and "\\" not in name and "\0" not in name)


def _prune_cache(folder: Path, keep: list[str]) -> None:
    """Drop cached batch files (and their sidecars) that left the window."""
    import shutil

    from training.replay_buffer import CACHE_DIR_NAME

    kept = set(keep)
    for p in folder.iterdir():
        if p.is_file() and not p.name.startswith(".") and p.name not in kept:
            p.unlink(missing_ok=True)
    stems = {n.split(".npz")[0] for n in kept}
    cars = folder / CACHE_DIR_NAME
    if cars.is_dir():
        for p in cars.iterdir():
            if p.is_dir() and not p.name.startswith(".") and p.name not in stems:
                shutil.rmtree(p, ignore_errors=True)


def _start_file(run_dir: Path, checkpoint: str | os.PathLike | None
                ) -> tuple[str, Path | None, int]:
    """(kind "checkpoint" | "model" | "none", file, base generation) a round starts from."""
    if checkpoint is not None and str(checkpoint).lower() == "none":
        return "none", None, 0
    if checkpoint is not None:
        return "checkpoint", Path(checkpoint), -1
    found = latest(run_dir / "checkpoints", "checkpoint")
    if found is not None:
        return "checkpoint", found[1], found[0]
    newest = latest(run_dir / "models", "model")
    if newest is not None:
        return "model", newest[1], newest[0]
    return "none", None, 0


def _load_start(kind: str, path: Path | None, base_gen: int
                ) -> tuple[dict | None, dict | None, int]:
    if kind == "checkpoint":
        ckpt = load_checkpoint(path)
        return ckpt, ckpt["model"], int(ckpt["generation"])
    if kind == "model":
        try:
            return None, load_payload(path), base_gen
        except ModelError as e:
            raise TrainingError(str(e)) from e
    return None, None, 0


def _resolve_start_shared(cfg: Config, run_dir: Path, checkpoint: str | os.PathLike | None,
                          ctx: "DistContext", cache_dir: Path | None
                          ) -> tuple[dict | None, dict | None, int]:
    """_resolve_start, where rank 0 picks the file and sends it to ranks with a cache folder
    (so the optimizer, schedule, data position and RNG states resume the same everywhere)."""
    if not ctx.is_distributed or not _any_receiver(ctx, cache_dir):
        return _resolve_start(cfg, run_dir, checkpoint)
    choice: Any = None
    if ctx.is_main:
        kind, path, gen = _start_file(run_dir, checkpoint)
        choice = (kind, None if path is None else str(path), gen)
    kind, path, gen = _broadcast_json(choice, ctx)
    src = Path(path) if path is not None else None
    dest = None if cache_dir is None else cache_dir / "start"
    if dest is not None:
        dest.mkdir(parents=True, exist_ok=True)
    if src is not None:
        _relay_files(ctx, src.parent, [src.name], dest)
        if dest is not None:
            if ctx.local_rank == 0:
                _prune_cache(dest, [src.name])
            src = dest / src.name
    if cache_dir is None and not ctx.is_main:
        return _resolve_start(cfg, run_dir, checkpoint)
    return _load_start(kind, src, gen)


# ------------------------------------------------------------------------ distributed setup


@dataclass(frozen=True)
class DistContext:
    """Where this process stands: rank, world_size, its device and the backend."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: str = "cpu"
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def under_torchrun() -> bool:
    """True in a process started by torchrun / torch.distributed.run."""
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ
    )


def pick_device_and_backend(local_rank: int, world_size: int) -> tuple[str, str]:
    """NCCL on CUDA (one GPU per local rank), MPS alone, Gloo on CPU otherwise."""
    if torch.cuda.is_available():
        return f"cuda:{local_rank % torch.cuda.device_count()}", "nccl"
    has_mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if has_mps:
        if world_size == 1:
            return "mps", "gloo"
        log.warning("MPS is one device: DDP over %d processes runs on CPU with Gloo", world_size)
    return "cpu", "gloo"


def init_distributed(timeout_s: float) -> DistContext:
    """Join the process group torchrun describes in the environment (or run alone)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device, backend = pick_device_and_backend(local_rank, world_size)
    if world_size == 1:
        return DistContext(device=device)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    timeout = timedelta(seconds=timeout_s)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # After an elastic restart the agent's store still holds the dead group's addresses;
        # prefixing keys with the attempt keeps them apart (measured: shared/tools/README.md).
        base = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
            is_master=False, timeout=timeout,
        )
        store = dist.PrefixStore(f"attempt{attempt}", base)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
    else:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    return DistContext(rank, local_rank, world_size, device, backend)


def _all_reduce_sum(values: list[float], ctx: DistContext) -> list[float]:
    if not ctx.is_distributed:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def _barrier(ctx: DistContext) -> None:
    if ctx.is_distributed:
        dist.barrier()


# ------------------------------------------------------------------------ schedule, RNG


@dataclass
class WarmupSchedule:
    """LR = peak * min(1, (step + 1) / warmup_steps); peak scaled from the reference batch."""

    peak_lr: float
    warmup_steps: int
    step: int = 0

    def lr(self) -> float:
        if self.warmup_steps <= 0:
            return self.peak_lr
        return self.peak_lr * min(1.0, (self.step + 1) / self.warmup_steps)

    def state_dict(self) -> dict[str, Any]:
        return {"name": "linear_warmup_constant", **asdict(self)}


def scaled_lr(lr: float, total_batch: int, reference_batch: int, scaling: str) -> float:
    """The guides' scaling rules: linear, sqrt or none (lr applies at reference_batch)."""
    ratio = total_batch / reference_batch
    if scaling == "linear":
        return lr * ratio
    if scaling == "sqrt":
        return lr * math.sqrt(ratio)
    return lr


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _rng_json(state: dict[str, Any]) -> dict[str, Any]:
    """`_rng_state()` as plain JSON (bytes as hex), to cross between ranks without pickle."""
    return {
        "torch": state["torch"].numpy().tobytes().hex(),
        "numpy": {**state["numpy"], "keys": state["numpy"]["keys"].tolist()},
        "python": state["python"],
        "cuda": [t.numpy().tobytes().hex() for t in state["cuda"]],
    }


def _rng_from_json(raw: Any) -> dict[str, Any]:
    """The inverse of `_rng_json`, checking every field (it comes from another rank)."""
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


def _set_rng_state(state: dict[str, Any]) -> None:
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


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------- files


def model_path(run_dir: Path, generation: int) -> Path:
    return run_dir / "models" / f"{model_stem(generation)}.pt"


def checkpoint_path(run_dir: Path, generation: int) -> Path:
    return run_dir / "checkpoints" / f"checkpoint_{generation:06d}.pt"


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
    """models/model_000000.pt: a freshly initialised net seeded by run.seed (idempotent)."""
    path = model_path(Path(run_dir), 0)
    if not path.exists():
        torch.manual_seed(cfg.run.seed)
        save_model(path, net_from_config(cfg.net, cfg.go.board_size), 0, {"initial": True})
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


# ------------------------------------------------------------------------------ the round


@dataclass
class RoundResult:
    """What a round produced; the CLI prints it as the last stdout line (JSON)."""

    generation: int
    steps: int
    global_step: int
    samples: int
    seconds: float
    samples_per_s: float
    loss: float
    policy_loss: float
    value_loss: float
    policy_accuracy: float
    val_loss: float | None
    lr: float
    world_size: int
    micro_batch: int
    accumulation: int
    model_path: str
    checkpoint_path: str
    step_losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    """Wall time of each optimizer step on this rank (data, forward, backward, all-reduce)."""
    rank_checksums: list[float] = field(default_factory=list)
    """One weights checksum per rank; DDP keeps them equal (checked at the end of a round)."""
    ownership_loss: float = 0.0
    """Mean ownership cross-entropy (0 without the head or targets); not part of `loss`."""
    score_loss: float = 0.0
    """Mean Huber loss of the score head (margin / N); not part of `loss`."""
    opponent_policy_loss: float = 0.0
    """Mean cross-entropy of the opponent's-reply policy; not part of `loss`."""


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


def _is_oom(err: BaseException) -> bool:
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(err, oom_type):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


def loss_weights(tcfg: Any) -> dict[str, float]:
    """The weight of each auxiliary target's loss, from the `training` config section."""
    return {"ownership": tcfg.ownership_weight, "score": tcfg.score_weight,
            "opponent_policy": tcfg.opponent_policy_weight}


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


def _autocast_dtype(ctx: DistContext, mixed_precision: bool) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype, use a GradScaler): bf16 where supported, fp16 + scaler otherwise."""
    if not mixed_precision:
        return None, False
    if not ctx.device.startswith("cuda"):
        log.info("mixed precision is for GPUs; training in float32 on %s", ctx.device)
        return None, False
    if torch.cuda.is_bf16_supported():
        return torch.bfloat16, False
    return torch.float16, True


def _resolve_start(cfg: Config, run_dir: Path, checkpoint: str | os.PathLike | None
                   ) -> tuple[dict | None, dict | None, int]:
    """(checkpoint dict or None, model payload to start from or None, base generation)."""
    return _load_start(*_start_file(run_dir, checkpoint))


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
) -> RoundResult:
    """Train one round and write the next generation's model and checkpoint.

    Must be called in every process of the group (alone, it is a group of one). Starts from
    `checkpoint`, else the newest checkpoint in run_dir/checkpoints, else the newest model in
    run_dir/models, else a fresh net; "none" forces a fresh start. `dataset` defaults to the
    replay window over run_dir/replay. `steps` overrides the config's round length.
    `cache_dir`: this rank's node does not share rank 0's run folder; rank 0 sends the window's
    batch files and the starting checkpoint there, and run_dir is never read.
    """
    run_dir = Path(run_dir)
    hooks = hooks or FaultHooks()
    tcfg = cfg.training
    ctx = init_distributed(tcfg.timeout_s)
    try:
        return _train(cfg, run_dir, ctx, dataset, checkpoint, steps, generation, progress, hooks,
                      None if cache_dir is None else Path(cache_dir))
    finally:
        if ctx.is_distributed and dist.is_initialized():
            dist.destroy_process_group()


def _train(cfg: Config, run_dir: Path, ctx: DistContext, dataset: SampleDataset | None,
           checkpoint: str | os.PathLike | None, steps: int | None, generation: int | None,
           progress: bool, hooks: FaultHooks, cache_dir: Path | None = None) -> RoundResult:
    tcfg = cfg.training
    if cache_dir is not None and ctx.is_main:
        raise TrainingError("--cache-dir is for the other training nodes; rank 0 reads run_dir")
    if dataset is None:
        dataset = open_replay_window(cfg, run_dir, ctx, cache_dir)
    ckpt, start_payload, base_gen = _resolve_start_shared(cfg, run_dir, checkpoint, ctx,
                                                          cache_dir)
    new_gen = generation if generation is not None else base_gen + 1

    per_rank = tcfg.batch_size // ctx.world_size
    if per_rank < 1:
        raise TrainingError(
            f"training.batch_size {tcfg.batch_size} is smaller than the {ctx.world_size} ranks"
        )
    if per_rank * ctx.world_size != tcfg.batch_size:
        log.warning("batch_size %d does not split over %d ranks; using %d total",
                    tcfg.batch_size, ctx.world_size, per_rank * ctx.world_size)
    total_batch = per_rank * ctx.world_size
    accumulation = min(tcfg.grad_accumulation, per_rank)
    micro = per_rank // accumulation

    # Same initial weights everywhere (DDP also broadcasts rank 0's at construction).
    _seed_everything(cfg.run.seed)
    if start_payload is not None:
        try:
            net = net_from_payload(start_payload, checkpoint or run_dir)
        except ModelError as e:
            raise TrainingError(str(e)) from e
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
    autocast, use_scaler = _autocast_dtype(ctx, tcfg.mixed_precision)
    scaler = torch.amp.GradScaler("cuda") if use_scaler else None

    peak = scaled_lr(tcfg.lr, total_batch, tcfg.lr_reference_batch, tcfg.lr_scaling)
    schedule = WarmupSchedule(peak, tcfg.warmup_steps)
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
            _set_rng_state(rng[ctx.rank])
        else:
            log.warning("checkpoint has RNG states for %d ranks, this run has %d; reseeding",
                        len(rng), ctx.world_size)
            _seed_everything(cfg.run.seed + 1000 * ctx.rank + schedule.step)
    else:
        _seed_everything(cfg.run.seed + 1000 * ctx.rank)
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
    # policy loss * n, value loss * n, correct, n, then each TARGETS loss * n   (this rank)
    sums = np.zeros(4 + len(TARGETS))
    step_losses: list[float] = []
    step_seconds: list[float] = []
    t0 = time.perf_counter()
    for step in range(steps):
        t_step = time.perf_counter()
        _maybe_inject_fault(hooks, ctx.rank, step)
        idx = batches.next()
        batch = _fetch(dataset, idx)
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
        reduced = _all_reduce_sum([step_sums[0] + step_sums[1], step_sums[3]], ctx)
        step_losses.append(reduced[0] / reduced[1])
        step_seconds.append(time.perf_counter() - t_step)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{step_losses[-1]:.3f}", lr=f"{schedule.lr():.3g}")
    elapsed = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    p_sum, v_sum, correct, n, *aux_sums = (float(v) for v in _all_reduce_sum(list(sums), ctx))
    n = max(n, 1.0)
    aux_losses = {f"{k}_loss": a / n for k, a in zip(TARGETS, aux_sums)}
    checksums = _weights_checksums(net, ctx)
    # RNG states before validation, so that a resumed run continues as an unbroken one would
    rng_states = [_rng_from_json(r) for r in _all_gather_json(_rng_json(_rng_state()), ctx)]
    val_loss = _validate(model, getattr(dataset, "validation", None), per_rank, ctx, autocast)

    model_file = model_path(run_dir, new_gen)
    ckpt_file = checkpoint_path(run_dir, new_gen)
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
        state = {
            "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
            "generation": new_gen, "step": schedule.step,
            "model": model_payload(net, new_gen, meta),
            "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
            "data": {"length": len(dataset), "per_rank": per_rank,
                     "world_size": ctx.world_size, "epoch": batches.epoch,
                     "offset": batches.offset},
            "rng": rng_states, "config": to_dict(cfg),
        }
        ckpt_file.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(ckpt_file, save_bytes(state))
        metrics.record_metrics(
            run_dir, new_gen, loss=result.loss, policy_loss=result.policy_loss,
            value_loss=result.value_loss, policy_accuracy=result.policy_accuracy,
            val_loss=val_loss, train_samples_per_s=result.samples_per_s, **aux_losses,
            train_steps=steps, global_step=schedule.step, lr=result.lr,
            world_size=ctx.world_size, time=time.time(),
        )
    _barrier(ctx)  # nobody reads the new files before they are all written
    return result


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          scaler: torch.amp.GradScaler | None, batch: dict[str, torch.Tensor], micro: int,
          autocast: torch.dtype | None, ctx: DistContext, hooks: FaultHooks,
          weights: dict[str, float]) -> np.ndarray:
    """One optimizer step over this rank's batch in micro-batches (no_sync on all but last).

    Returns the sums [policy loss * n, value loss * n, correct, n, then each of TARGETS'
    loss * n]. The objective is policy + value + the weighted auxiliary losses."""
    optimizer.zero_grad(set_to_none=True)
    rows = batch["planes"].shape[0]
    chunks = [(lo, min(rows, lo + micro)) for lo in range(0, rows, micro)]
    out = np.zeros(4 + len(TARGETS))
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
                *(aux[k].item() * (hi - lo) if k in aux else 0.0 for k in TARGETS)]
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
        batch = {k: t.to(ctx.device) for k, t in _fetch(validation, mine[lo : lo + per_rank])
                 .items()}
        p_loss, v_loss, _, _ = _losses(net, batch, autocast, ctx.device)
        rows = batch["planes"].shape[0]
        total += [(p_loss.item() + v_loss.item()) * rows, rows]
    net.train()
    loss_sum, rows = _all_reduce_sum(list(total), ctx)
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
    sums = [v[0] for v in _all_gather_floats([float(total)], ctx)]
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
    ap.add_argument("--run-dir", default=None, help="run folder (default run.dir)")
    ap.add_argument("--gpus", type=int, default=None,
                    help="processes per node: one per GPU (CPU processes when no GPU)")
    ap.add_argument("--nodes", type=int, default=None, help="training nodes (multi-node)")
    ap.add_argument("--node-rank", type=int, default=0, help="this node's rank (0 = master)")
    ap.add_argument("--master-addr", default="127.0.0.1", help="address of node 0")
    ap.add_argument("--master-port", type=int, default=None, help="rendezvous port on node 0")
    ap.add_argument("--batch-size", type=int, default=None, help="total batch over all ranks")
    ap.add_argument("--mixed-precision", action="store_true", default=None,
                    help="bf16/fp16 autocast on GPUs")
    ap.add_argument("--epochs", type=int, default=None, help="passes over the window")
    ap.add_argument("--lr", type=float, default=None, help="LR at lr_reference_batch")
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
    ap.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (default config)")
    # Fault injection for tests/test_ddp.py and tests/test_trainer.py.
    ap.add_argument("--test-fake-oom-at", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--test-kill-rank-at", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--test-hang-rank-at", default=None, help=argparse.SUPPRESS)
    return ap


def config_from_args(args: argparse.Namespace) -> Config:
    """load_config + the flags, validated again by the config's dataclasses."""
    cfg = load_config(args.config)
    changes: dict[str, Any] = {}
    for flag, key in (("batch_size", "training.batch_size"), ("epochs", "training.epochs"),
                      ("lr", "training.lr"), ("gpus", "training.gpus"),
                      ("nodes", "training.nodes"), ("master_port", "training.master_port"),
                      ("mixed_precision", "training.mixed_precision")):
        value = getattr(args, flag)
        if value is not None:
            changes[key] = value
    if args.run_dir is not None:
        changes["run.dir"] = str(args.run_dir)
    return override(cfg, changes) if changes else cfg


def _is_peer_failure(err: BaseException) -> bool:
    """A collective that failed because of another rank (gloo/NCCL wording varies)."""
    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    text = str(err).lower()
    return any(w in text for w in ("timeout", "timed out", "pair closure", "connection reset",
                                   "connection closed", "broken pipe", "nccl"))


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
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", "0"))
    if under_torchrun():
        die_with_parent()  # the launcher's death ends this rank
    level = args.log_level or cfg.logging.level
    configure_logging(None, level if rank == 0 else "WARNING")  # other ranks: problems only
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
                             cache_dir=args.cache_dir)
    except (TrainingError, ConfigError) as e:
        log.error("%s", e)
        return 1
    except RuntimeError as e:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and _is_peer_failure(e):
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
