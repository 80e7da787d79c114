"""Where local self-play workers run: `plan_workers` spreads worker processes over devices.

Local mode (no --distributed) starts `self_play.workers` worker processes on the main node.
This module decides, as a pure function of the request and the machine, which device each one
uses: ``"cuda:<i>"`` for GPU i or ``"cpu"``. Rules (as in the user guide's local parallel
self-play):

- GPUs present and not `cpu_only`: workers are spread evenly, worker k on GPU k mod n_gpus,
  so every GPU gets the same number of workers. A count that is not a multiple of the GPU
  count is lowered to the nearest multiple (9 workers on 2 GPUs run as 8, 4 per GPU); fewer
  workers than GPUs leaves GPUs idle; no GPU gets more than `workers_per_gpu`.
- CPU-only (asked for, or no GPU): every worker is ``"cpu"``, at most one per core.
- Automatic mode (the guide's default): `workers` 0 picks the count from the machine: one
  per CPU core without GPUs; with GPUs, `workers_per_gpu` per GPU, or with that automatic
  too, 2 to 4 per GPU (the cores per GPU, at least 2). `workers_per_gpu` 0 caps nothing: an
  asked count is only lowered to a multiple of the GPU count.

Every adjustment comes back as a message saying what was asked, what runs and why; the caller
logs or prints them. This module imports neither torch nor os: the caller passes
``torch.cuda.device_count()`` and ``os.cpu_count()``.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def plan_workers(
    n_workers: int,
    workers_per_gpu: int,
    cpu_only: bool,
    n_gpus: int,
    n_cpus: int | None = None,
) -> tuple[list[str], list[str]]:
    """Devices for local self-play workers, and messages about any adjustment.

    Args:
        n_workers: worker processes asked for (--workers), >= 1; 0 = automatic.
        workers_per_gpu: the most workers one GPU may take (--workers-per-gpu), >= 1; 0 =
            no cap.
        cpu_only: run every worker on the CPU even when GPUs are present.
        n_gpus: visible GPUs (torch.cuda.device_count()).
        n_cpus: CPU cores (os.cpu_count()); None means no cap on CPU workers.

    Returns:
        (devices, messages): one device string per worker that will run ("cuda:0", "cpu"),
        and human-readable lines for every change to the request.
    """
    if n_workers < 0:
        raise ValueError(f"self_play.workers must be >= 0 (0: automatic), got {n_workers}")
    if workers_per_gpu < 0:
        raise ValueError(f"self_play.workers_per_gpu must be >= 0 (0: automatic), got "
                         f"{workers_per_gpu}")
    if n_gpus < 0 or (n_cpus is not None and n_cpus < 1):
        raise ValueError(f"n_gpus must be >= 0 and n_cpus >= 1, got {n_gpus} and {n_cpus}")
    messages: list[str] = []
    gpus = 0 if cpu_only else n_gpus
    if n_workers == 0:
        if gpus:
            per_gpu = workers_per_gpu or max(2, min(4, (n_cpus or 2) // gpus))
            n_workers = per_gpu * gpus
            messages.append(f"automatic: {n_workers} self-play workers, {per_gpu} on each of "
                            f"the {gpus} GPUs (set --workers to choose)")
        else:
            n_workers = n_cpus or 1
            messages.append(f"automatic: {n_workers} self-play workers on the CPU, one per "
                            "core (set --workers to choose)")
    if workers_per_gpu == 0:
        workers_per_gpu = max(1, n_workers)  # no cap: only the even spread
    if cpu_only or n_gpus == 0:
        if not cpu_only:
            messages.append("no GPU found: self-play workers run on the CPU")
        count = n_workers
        if n_cpus is not None and n_workers > n_cpus:
            count = n_cpus
            messages.append(
                f"asked for {n_workers} CPU self-play workers, running {count}: this machine "
                f"has {n_cpus} CPU cores and more workers than cores only slow each other down"
            )
        return ["cpu"] * count, messages

    capacity = n_gpus * workers_per_gpu
    count = n_workers
    if count > capacity:
        count = capacity
        messages.append(
            f"asked for {n_workers} self-play workers, running {count}: {n_gpus} GPU(s) x "
            f"{workers_per_gpu} worker(s) per GPU (raise --workers-per-gpu for more)"
        )
    elif count >= n_gpus and count % n_gpus:
        count -= count % n_gpus
        messages.append(
            f"asked for {n_workers} self-play workers, running {count} ({count // n_gpus} per "
            f"GPU): the count is lowered to a multiple of the {n_gpus} GPUs so that every GPU "
            "gets the same number of workers"
        )
    elif count < n_gpus:
        messages.append(
            f"{n_workers} self-play worker(s) on {n_gpus} GPUs: {n_gpus - count} GPU(s) run no "
            "self-play (ask for --workers of at least the GPU count to use them all)"
        )
    devices = [f"cuda:{k % n_gpus}" for k in range(count)]
    return devices, messages
