"""What a training round reports to the coach: `rounds/round_<gen>.json` in the run folder.

The trainer's rank 0 writes it (atomically) when the round's model and checkpoint are on disk;
the coach reads it when the trainer process has exited, and takes the round's numbers from it,
never from the trainer's log. Every field is a number, a string or a list of numbers, so the
file is JSON both ways. The file holds rank 0's view (its step times, every rank's checksum).

It must not: import torch or the trainer (the coach reads this file without either).
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
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
    rank_checksums: list[float] = field(default_factory=list)
    """One weights checksum per rank; DDP keeps them equal (checked at the end of a round)."""
    ownership_loss: float = 0.0
    """Mean ownership cross-entropy (0 without the head or targets); not part of `loss`."""
    score_loss: float = 0.0
    """Mean Huber loss of the score head (margin / N); not part of `loss`."""
    opponent_policy_loss: float = 0.0
    """Mean cross-entropy of the opponent's-reply policy; not part of `loss`."""
    soft_policy_loss: float = 0.0
    """Mean cross-entropy of the soft policy head (0 without it); not part of `loss`."""


def _required() -> set[str]:
    """The fields without a default: every result file has them."""
    return {f.name for f in fields(RoundResult)
            if f.default is MISSING and f.default_factory is MISSING}


def write(path: str | os.PathLike, result: RoundResult) -> None:
    """Write `result` to `path` atomically, making its folder (rounds/) where missing."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
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
    if not isinstance(obj, dict) or not _required() <= obj.keys():
        raise RoundResultError(f"{path}: not a round result (fields missing)")
    result = RoundResult(**{k: v for k, v in obj.items() if k in names})
    if not isinstance(result.loss, (int, float)) or isinstance(result.loss, bool):
        raise RoundResultError(f"{path}: loss is {result.loss!r}, not a number")
    return result
