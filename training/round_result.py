"""What a training round reports to the coach: `rounds/round_<gen>.json` in the run folder.

The trainer's rank 0 writes it (atomically) when the round's model and checkpoint are on disk;
the coach reads it when the trainer process has exited. It replaces reading numbers out of the
trainer's log. Every field is a plain number or string, so the file is JSON both ways.

It must not: import torch or the trainer (the coach reads this file without either).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from distributed.transfer import write_json_atomic

MAX_BYTES = 1 << 20  # a round's result is a few KB; step lists of long rounds stay far below


class RoundResultError(Exception):
    """The result file exists but is not a round result; the message names the file."""


@dataclass
class RoundResult:
    """What a round produced (the trainer also prints it as its last stdout line)."""

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


def write(path: str | os.PathLike, result: RoundResult) -> None:
    write_json_atomic(path, asdict(result), indent=None)


def read(path: str | os.PathLike) -> RoundResult | None:
    """The result at `path`, or None when there is none (the round wrote nothing)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_BYTES:
        raise RoundResultError(f"{path}: over {MAX_BYTES} bytes; not a round result")
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RoundResultError(f"{path}: not JSON ({e})") from None
    names = {f.name for f in fields(RoundResult)}
    if not isinstance(obj, dict) or not {n for n in names if n not in
                                         ("step_losses", "step_seconds")} <= obj.keys():
        raise RoundResultError(f"{path}: not a round result (fields missing)")
    result = RoundResult(**{k: v for k, v in obj.items() if k in names})
    if not isinstance(result.loss, (int, float)) or isinstance(result.loss, bool):
        raise RoundResultError(f"{path}: loss is {result.loss!r}, not a number")
    return result
