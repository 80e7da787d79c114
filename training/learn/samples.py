"""Training samples in memory: sample arrays (.npz), synthetic samples and batches as tensors.

A **sample** is one position as the trainer sees it: planes float32 [C, N, N], a policy target
float32 [N*N+1] (a row of zeros: no policy target) and a value target in [-1, 1], from the side
to move's view; optionally the auxiliary `TARGETS` with a mask each. A dataset is anything
`SampleDataset` describes: the replay window (replay_buffer.ReplayWindow) or `SampleArrays`,
which holds samples in arrays for `--samples FILE.npz`, benchmarks and tests.
`fetch_batch(dataset, idx)` turns a list of sample indices into float32 tensors.

It must not: read game batch files (the replay window does), touch torch.distributed, or
unpickle (.npz files are read with allow_pickle=False).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np
import torch

from distributed.transfer import write_atomic
from training.learn.training_error import TrainingError

TARGETS = ("ownership", "score", "opponent_policy")
"""Auxiliary targets (replay_buffer.TARGETS), each with a float32 [S] `<name>_mask`; the
matching net heads are trained only where the mask is 1."""
_TARGET_KEYS = tuple(k for t in TARGETS for k in (t, f"{t}_mask"))


class SampleDataset(Protocol):
    """What the trainer reads: replay_buffer.ReplayWindow, or SampleArrays below."""

    validation: SampleDataset | None
    """The held-out samples (validation loss), or None."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray, float]: ...


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
        write_atomic(path, buf)

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


def synthetic_samples(count: int, board_size: int, history: int, seed: int = 0,
                      liberties: bool = False) -> SampleArrays:
    """Random positions with learnable targets, for benchmarks and smoke tests.

    Planes as `num_planes(history, liberties)` gives them (a net with liberty planes reads
    6 more), so that they fit the net the config builds.

    The policy target is the first stone of the side to move (row-major), or pass on an
    empty plane; the value is tanh of the stone difference between the two newest planes.
    Auxiliary targets: ownership is the stones of the newest planes (+1 own, -1 the
    opponent's), score their difference / N, the opponent's policy its first stone.
    """
    from training.go.features import num_planes

    rng = np.random.default_rng(seed)
    n = board_size
    planes = (rng.random((count, num_planes(history, liberties), n, n)) < 0.3).astype(
        np.float32)
    planes[:, 2 * history] = rng.integers(0, 2, (count, 1, 1))  # the side to move
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


def config_samples(cfg: Any, count: int, seed: int = 0) -> SampleArrays:
    """`synthetic_samples` shaped for the net that `cfg` builds (board, history, liberty
    planes)."""
    return synthetic_samples(count, cfg.go.board_size, cfg.net.history, seed,
                             liberties=cfg.net.liberties)


def _npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def fetch_batch(dataset: SampleDataset, idx: Sequence[int]) -> dict[str, torch.Tensor]:
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
