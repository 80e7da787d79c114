"""The process group of a training round: where this rank stands and what ranks exchange.

Owns `DistContext` (rank, local_rank, world_size, device, backend), joining the group that
torchrun describes in the environment (`init_distributed`, with a timeout) and leaving it
(`shutdown`), and the collectives the round is made of: sums (`all_reduce_sum`), gathers of
floats and of JSON, rank 0's JSON on every rank (`broadcast_json`) and a barrier. Alone
(world_size 1) the sums, maxima, gathers and the barrier return this process's own values;
`broadcast_json` needs a group. Vocabulary is torchrun's: `rank`, `local_rank`, `world_size`;
rank 0 is the main process.

Ranks exchange tensors only, never pickles: what rank 0 sends is JSON in a uint8 tensor
(`broadcast_json`), what it gathers from the others is numbers or bounded JSON
(`all_gather_json`), so a peer cannot make another rank run code.

Behaviour: NCCL with CUDA (one GPU per local rank), Gloo otherwise (one device on MPS); a
collective that waits longer than the group's timeout raises, and `is_peer_failure` tells
that apart from this rank's own errors.

It must not: know what a round trains, read or write files, or unpickle anything a rank sends.
Only this module calls torch.distributed's process group (the trainer only wraps its net in
DDP and its main in elastic's `record`; node_relay moves files with `broadcast_`).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from training.learn.training_error import TrainingError

log = logging.getLogger(__name__)

JSON_EXCHANGE_MAX_BYTES = 64 << 20


# ---------------------------------------------------------------------------- process group


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


def cpu_threads(n_cpus: int, selfplay_cores: int, local_ranks: int) -> int:
    """torch threads for each CPU rank on this node: the cores that local self-play does not
    hold, shared by the node's ranks, at least 1."""
    return max(1, (n_cpus - selfplay_cores) // max(1, local_ranks))


def set_cpu_threads(ctx: DistContext, selfplay_cores: int, who: str) -> None:
    """On a CPU rank, torch's threads := `cpu_threads` (unless OMP_NUM_THREADS says), logged
    by rank 0 as `who`. torch's default, a thread per core, beside self-play workers that hold
    those cores, leaves its threads waiting on each other in every step: on 2 busy cores a
    step of the default net took 2 to 10 times as long with 2 threads as with 1."""
    if ctx.device != "cpu" or "OMP_NUM_THREADS" in os.environ:
        return
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))
    n = cpu_threads(os.cpu_count() or 1, selfplay_cores, local_ranks)
    torch.set_num_threads(n)
    if ctx.is_main:
        log.info("%s: %d torch thread(s) per rank on the CPU (%d cores, %d of them held by "
                 "local self-play)", who, n, os.cpu_count() or 1, selfplay_cores)


def under_torchrun() -> bool:
    """True in a process started by torchrun / torch.distributed.run."""
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ
    )


def pick_device_and_backend(local_rank: int, world_size: int, backend: str = "auto"
                            ) -> tuple[str, str]:
    """NCCL on CUDA (one GPU per local rank), MPS alone, Gloo on CPU otherwise; `backend`
    (training.backend) "gloo" keeps the GPUs with Gloo, "nccl" needs CUDA (ValueError)."""
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("training.backend nccl needs CUDA GPUs, and none is visible; use "
                         "gloo (or auto)")
    if torch.cuda.is_available():
        return (f"cuda:{local_rank % torch.cuda.device_count()}",
                "gloo" if backend == "gloo" else "nccl")
    has_mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if has_mps:
        if world_size == 1:
            return "mps", "gloo"
        log.warning("MPS is one device: DDP over %d processes runs on CPU with Gloo", world_size)
    return "cpu", "gloo"


def init_distributed(timeout_s: float, backend: str = "auto") -> DistContext:
    """Join the process group torchrun describes in the environment (or run alone)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device, backend = pick_device_and_backend(local_rank, world_size, backend)
    if world_size == 1:
        return DistContext(device=device)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    timeout = timedelta(seconds=timeout_s)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # After an elastic restart the agent's store still holds the dead group's addresses;
        # prefixing keys with the attempt keeps them apart.
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


def shutdown(ctx: DistContext) -> None:
    """Leave the process group `init_distributed` joined (nothing to do alone)."""
    if ctx.is_distributed and dist.is_initialized():
        dist.destroy_process_group()


# ------------------------------------------------------------------------------ collectives


def all_reduce_sum(values: list[float], ctx: DistContext) -> list[float]:
    """The sum over ranks of each of `values` (same length on each), as float64."""
    if not ctx.is_distributed:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_reduce_max_(t: torch.Tensor, ctx: DistContext) -> None:
    """`t` becomes the element-wise maximum over ranks, in place."""
    if ctx.is_distributed:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)


def broadcast_(t: torch.Tensor, ctx: DistContext) -> None:
    """`t` becomes rank 0's `t` on every rank, in place (same shape and dtype on each)."""
    if ctx.is_distributed:
        dist.broadcast(t, src=0)


def barrier(ctx: DistContext) -> None:
    """Wait until every rank is here."""
    if ctx.is_distributed:
        dist.barrier()


def broadcast_json(obj: Any, ctx: DistContext) -> Any:
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


def all_gather_json(obj: Any, ctx: DistContext) -> list[Any]:
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


def all_gather_floats(values: list[float], ctx: DistContext) -> list[list[float]]:
    """Every rank's `values` (same length on each), as float64 tensors."""
    if not ctx.is_distributed:
        return [list(values)]
    mine = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    out = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]


def is_peer_failure(err: BaseException) -> bool:
    """A collective that failed because of another rank (gloo/NCCL wording varies)."""
    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    text = str(err).lower()
    return any(w in text for w in ("timeout", "timed out", "pair closure", "connection reset",
                                   "connection closed", "broken pipe", "nccl"))
