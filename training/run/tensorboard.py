"""TensorBoard scalars of a run: each generation's metrics row as events in <run>/tensorboard.

Written by the coach when `logging.tensorboard` is on, after the row is complete (the
trainer's losses, the arena's Elo, the coach's throughput): one scalar per numeric column,
at step = generation, so `tensorboard --logdir runs/main/tensorboard` shows the same curves
as progress.png. The `tensorboard` package is optional: `check_available` says what to
install, once, before a run starts.

It must not: write anything outside `RunDir.tensorboard`, or stop training when writing fails
(the caller logs the error).
"""

from __future__ import annotations

import math
import os
from typing import Any

from training.run.run_dir import RunDir

SKIPPED = {"generation", "time"}


def check_available() -> str | None:
    """None when TensorBoard event files can be written here, else what to do."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as e:
        return (f"logging.tensorboard is on but TensorBoard cannot be imported ({e}): "
                "pip install tensorboard, or set logging.tensorboard: false")
    return None


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The row's finite numbers, by column name (generation and time left out)."""
    out = {}
    for key, value in row.items():
        if key in SKIPPED or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def write_row(run_dir: str | os.PathLike, row: dict[str, Any]) -> int:
    """Add one generation's row as scalars (step = its generation); returns how many."""
    from torch.utils.tensorboard import SummaryWriter

    values = scalars(row)
    writer = SummaryWriter(log_dir=str(RunDir(run_dir).tensorboard))
    try:
        step = int(row["generation"])
        wall = float(row.get("time") or 0) or None
        for key, value in values.items():
            writer.add_scalar(key, value, global_step=step, walltime=wall)
    finally:
        writer.close()
    return len(values)
