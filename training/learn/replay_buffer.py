"""The replay window: the most recent self-play positions on disk -> (planes, policy, value).

Owns the training data view of `runs/<run>/replay/*.npz.zst` (the batches the coach ingested):

- **Sidecar**: per batch file, compact arrays built once by replaying its games and kept in
  the cache folder (`training.learn.sidecars`: the arrays, the index, the open maps).
- **Window**: files ordered by (generation, ingest time, name), oldest first, where the
  ingest time is the file's modification time in `replay/`, which the coach sets as it
  ingests (a worker's own clock never orders the window); games are taken
  newest first until the window holds `size` positions, where (KataGo's growing window)
  size = min_positions * (total / min_positions) ** growth, clamped to
  [min_positions, max_positions] and to the positions on disk. With `share_slack`, one
  worker's games fill at most `share_fractions` of the rows the window holds (its weight's
  share among the workers with games on disk, times the slack; `select_newest`, in
  `training.learn.window_shares`), so a
  worker that sends more than its share cannot own the window: when the others have fewer
  games, the window holds less of its. Given `files` are taken in
  their order (the rank that chose them sends them oldest first). With
  `replay.policy_surprise_weight` > 0 (KataGo's policy surprise weighting) or
  `replay.fast_search_weight` other than 1, a sample index maps to a position through
  `sample_rows`, which repeats the positions whose search surprised the net and keeps that
  share of the fast searches' positions (every rank builds the same rows).
- **Validation split**: a game is held out when a stable hash of (batch name, game index) falls
  below `validation_fraction` (`sidecars.is_validation_game`), so the split is the same on every
  rank and after a restart.
- **Samples**: `w[i] -> (planes float32 [C, N, N], policy float32 [P], value float32)`, and
  `w.batch(indices)` / `w.__getitems__` for a whole batch at once (about 10x faster per sample).
  Planes are `training.go.features.planes` of the position (C = 2 * history + 1: the stones of
  the side to move, then the opponent's, for the last `history` boards, most recent first; then
  ones if black is to move), rebuilt here from the sidecar's boards with one vectorised gather.
  Policy sums to 1 (pass last); value is the result from the side to move's view, in {-1, 0, 1},
  or with `replay.search_value_weight` w > 0 (training view only; validation keeps the result)
  (1 - w) * result + w * the search's root value there. `w.samples(indices)` adds the auxiliary
  targets as a dict (`TARGETS`): ownership float32 [B, A] and score float32 [B] (margin / N)
  from the side to move's view, and opponent_policy float32 [B, P] (the next move's policy
  target), each with a float32 [B] mask (`<name>_mask`: 0 for a resigned game, or for the last
  move of a game). One of the 8 symmetries of `training.go.features` is applied per sample
  (planes, policies and ownership alike), drawn from a hash of (seed, epoch, index):
  deterministic, the same in every DataLoader worker, and different each epoch (`set_epoch`).

Vocabulary as in `training.go.coords` (N, A = N*N, PASS = A, P = A + 1). This module must not
import torch (the trainer wraps the window), must not write into the replay folder itself
(only into its cache folder), and must not load every game into memory (only the arrays of
the window's small batch files).
"""

from __future__ import annotations

import bisect
import errno
import functools
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from configs import ReplayConfig
from training.go import features
from training.go.fastgo import neighbor_table
from training.go.records import DEFAULT_MAX_BYTES, BatchError, batch_names_among, parse_batch_name
from training.learn.sidecars import (INDEX_NAME, Sidecar, append_index, build_sidecar,
                                     index_entry, read_info, sidecar_dir, stem)
from training.learn.window_shares import select_newest, window_size

# re-exported for the collector (write_sidecar), the node relay (CACHE_DIR_NAME), and the
# coach, the node relay and the long-lived trainer (WINDOW_SHARE_SLACK)
from training.learn.sidecars import CACHE_DIR_NAME, write_sidecar  # noqa: F401
from training.learn.window_shares import WINDOW_SHARE_SLACK  # noqa: F401

log = logging.getLogger(__name__)

_NOT_THE_BATCH = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS,
                            errno.EAGAIN, errno.EINTR})
"""Errors reading a batch that are this process's (no descriptor or memory left), not the
batch's: raised, never a reason to skip a good batch for good."""
TARGETS = ("ownership", "score", "opponent_policy")
"""Auxiliary targets of `WindowView.samples`, each with a `<name>_mask`."""


# ------------------------------------------------------------------------------ symmetries


@functools.lru_cache(maxsize=8)
def symmetry_permutations(n: int) -> np.ndarray:
    """int64 [8, N*N]: for symmetry s, transformed.ravel() == board.ravel()[perm[s]].

    The symmetries are `training.go.features`' (s = 0 the identity), as index permutations so
    that a whole batch is transformed with one gather; the policy's points move alike.
    """
    grid = np.arange(n * n, dtype=np.int64).reshape(n, n)
    perms = np.stack([features.transform_planes(grid, s).ravel()
                      for s in range(features.NUM_SYMMETRIES)])
    perms.setflags(write=False)  # shared by every view (cached)
    return perms


def _mix(seed: int, epoch: int, index: np.ndarray) -> np.ndarray:
    """A splitmix64 hash of (seed, epoch, index): uint64, vectorised."""
    with np.errstate(over="ignore"):
        x = np.asarray(index, dtype=np.uint64) + np.uint64(
            (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + 1) & (2**64 - 1)
        )
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def sample_rows(sidecars: Sequence["Sidecar"], segments: np.ndarray, surprise_weight: float,
                fast_weight: float, seed: int) -> np.ndarray:
    """int64 [R]: the position indices of a view over `segments`, each position repeated by
    its sampling frequency. A full search's position: with policy surprise weighting (KataGo,
    `surprise_weight` > 0), within a game the full-search positions share their count so that
    `1 - surprise_weight` of it is uniform and the rest goes in proportion to their surprise;
    else 1. A fast search's position (a value target only): `fast_weight` (KataGo writes
    none: 0). A frequency f is taken floor(f) times and once more when a stable hash of (seed,
    batch name, position) falls below f - floor(f), the same on every rank."""
    out = []
    offset = 0
    for ci, start, end, _gen, _result, _game in segments.tolist():
        car = sidecars[ci]
        n = end - start
        full = np.asarray(car.array("full_search")[start:end], bool)
        freq = np.where(full, 1.0, fast_weight)
        if surprise_weight > 0 and full.any():
            s = np.asarray(car.array("surprise")[start:end], np.float64)
            mean = float(s[full].mean())
            if mean > 0:
                freq[full] = (1.0 - surprise_weight) + surprise_weight * s[full] / mean
        copies = np.floor(freq).astype(np.int64)
        key = int.from_bytes(hashlib.blake2b(car.name.encode(), digest_size=8).digest(),
                             "little")
        u = (_mix(seed ^ key, 0, np.arange(start, end)) >> np.uint64(11)).astype(
            np.float64) / float(1 << 53)
        copies += u < freq - copies
        out.append(np.repeat(np.arange(offset, offset + n, dtype=np.int64), copies))
        offset += n
    return np.concatenate(out) if out else np.zeros(0, np.int64)




# ------------------------------------------------------------------------------ samples


class WindowView:
    """A map-style dataset over a list of game segments (the training or validation part)."""

    def __init__(self, sidecars: list[Sidecar], segments: np.ndarray, *, history: int,
                 board_size: int, seed: int, augment: bool, liberties: bool = False,
                 rows: np.ndarray | None = None, search_value_weight: float = 0.0):
        self._sidecars = sidecars
        # the value target: (1 - w) * the game's result + w * the search's root value there
        # (`replay.search_value_weight`); a position without a root value keeps the result
        self.search_value_weight = float(search_value_weight)
        # rows: sample index -> position index (`sample_rows` repeats or skips some);
        # None: sample i is position i
        self._rows = rows
        self.liberties = liberties  # the six liberty planes after the colour plane
        # segments: int64 [S, 6], one game per row: (sidecar index, first position, end
        # position, generation, result, game index in the sidecar)
        self._segments = segments
        lengths = segments[:, 2] - segments[:, 1] if len(segments) else np.zeros(0, np.int64)
        self._cum = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.history = history
        self.board_size = board_size
        self.seed = seed
        self.augment = augment
        self.epoch = 0
        self._perms = symmetry_permutations(board_size)

    def __len__(self) -> int:
        return int(self._cum[-1]) if self._rows is None else len(self._rows)

    @property
    def num_positions(self) -> int:
        """Distinct positions in the view (samples may repeat or skip some: `sample_rows`)."""
        return int(self._cum[-1])

    def set_epoch(self, epoch: int) -> None:
        """Draw different symmetries in each epoch (call it with DistributedSampler's)."""
        self.epoch = int(epoch)

    @property
    def num_games(self) -> int:
        return len(self._segments)

    def symmetries(self, indices: np.ndarray) -> np.ndarray:
        """The symmetry (0..7) applied to each sample index in this epoch."""
        indices = np.asarray(indices)
        if not self.augment:
            return np.zeros(indices.shape, np.int64)
        return (_mix(self.seed, self.epoch, indices) & np.uint64(7)).astype(np.int64)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray, np.float32]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} out of range for a window of {len(self)}")
        i = i % len(self)
        planes, policy, value = self.batch(np.array([i]))
        return planes[0], policy[0], value[0]

    def _locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._rows is not None:
            indices = self._rows[indices]
        seg = np.searchsorted(self._cum, indices, side="right") - 1
        pos = self._segments[seg, 1] + (indices - self._cum[seg])
        return seg, self._segments[seg, 0], pos

    def __getitems__(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A batch as three arrays (see `batch`); the trainer's fetch uses it when present."""
        return self.batch(indices)

    def generation_of(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """int64: the generation of the model that played each sample's position."""
        seg, _, _ = self._locate(np.asarray(indices, dtype=np.int64))
        return self._segments[seg, 3]

    def batch(
        self, indices: Sequence[int] | np.ndarray, symmetries: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Samples at `indices`: planes float32 [B, C, N, N], policy float32 [B, P],
        value float32 [B]. `symmetries` ([B] ints 0..7) overrides the epoch's draw."""
        s = self._samples(indices, symmetries, targets=False)
        return s["planes"], s["policy"], s["value"]

    def samples(
        self, indices: Sequence[int] | np.ndarray, symmetries: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """`batch` as a dict (planes, policy, value) plus the auxiliary targets (`TARGETS`)
        and their masks; what the trainer fetches."""
        return self._samples(indices, symmetries, targets=True)

    def _samples(self, indices: Sequence[int] | np.ndarray, symmetries: np.ndarray | None,
                 targets: bool) -> dict[str, np.ndarray]:
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"sample index out of range for a window of {len(self)}")
        syms = self.symmetries(indices) if symmetries is None else np.asarray(symmetries)
        n, h = self.board_size, self.history
        a = n * n
        b = len(indices)
        seg, files, pos = self._locate(indices)
        game_start = self._segments[seg, 1]  # a segment is one whole game
        to_play = np.where((pos - game_start) % 2 == 0, 1, -1).astype(np.int8)
        value = (self._segments[seg, 4] * to_play).astype(np.float32)
        back = pos[:, None] - np.arange(h)[None, :]  # [B, h] positions k moves ago
        valid = back >= game_start[:, None]
        back = np.where(valid, back, pos[:, None])
        past = np.empty((b, h, a), np.int8)
        visits = np.empty((b, a + 1), np.uint16)
        full = np.empty(b, np.bool_)
        if targets:
            game_end = self._segments[seg, 2]
            has_next = pos + 1 < game_end  # the opponent's reply is in the same game
            after = np.where(has_next, pos + 1, pos)
            next_visits = np.empty((b, a + 1), np.uint16)
            next_full = np.empty(b, np.bool_)
            owner = np.empty((b, a), np.int8)
            score = np.empty(b, np.float32)
        mix = self.search_value_weight > 0
        if mix:
            root_value = np.empty(b, np.float32)
        order = np.argsort(files, kind="stable")
        cuts = np.flatnonzero(np.diff(files[order])) + 1
        for rows in np.split(order, cuts) if b else []:
            car = self._sidecars[int(files[rows[0]])]
            past[rows] = car.array("boards")[back[rows]]
            visits[rows] = car.array("visits")[pos[rows]]
            full[rows] = car.array("full_search")[pos[rows]]
            if mix:
                root_value[rows] = car.array("values")[pos[rows]]
            if targets:
                game = self._segments[seg[rows], 5]
                next_visits[rows] = car.array("visits")[after[rows]]
                next_full[rows] = car.array("full_search")[after[rows]]
                owner[rows] = car.array("ownership")[game]
                score[rows] = car.array("scores")[game]
        past *= valid[:, :, None]  # zeros before the game's start
        if mix:
            w = self.search_value_weight
            value = np.where(np.isfinite(root_value), (1 - w) * value + w * root_value,
                             value).astype(np.float32)
        policy = _normalised(visits)
        policy[~full] = 0.0  # a fast search's move: no policy target (the trainer skips it)
        perm = self._perms[syms]  # [B, A]
        past = np.take_along_axis(past, perm[:, None, :], axis=2)
        policy[:, :a] = np.take_along_axis(policy[:, :a], perm, axis=1)
        c = features.num_planes(h, self.liberties)
        planes = np.zeros((b, c, a), np.float32)
        color = to_play[:, None, None]
        planes[:, 0 : 2 * h : 2] = past == color
        planes[:, 1 : 2 * h : 2] = past == -color
        planes[:, 2 * h] = (to_play == 1)[:, None]
        planes = planes.reshape(b, c, n, n)
        if self.liberties:  # of the current board, as transformed (liberties do not change)
            features.liberty_planes(np.ascontiguousarray(past[:, 0]), to_play,
                                    neighbor_table(n), planes[:, 2 * h + 1:])
        out = {"planes": planes, "policy": policy, "value": value}
        if targets:
            settled = np.isfinite(score)  # resigned games have no final position or score
            owner = np.take_along_axis(owner, perm, axis=1) * to_play[:, None]
            opponent = _normalised(next_visits)
            opponent[:, :a] = np.take_along_axis(opponent[:, :a], perm, axis=1)
            has_next &= next_full  # the reply's target is valid only after a full search
            opponent[~has_next] = 0.0
            out.update(
                ownership=owner.astype(np.float32),
                ownership_mask=settled.astype(np.float32),
                score=np.where(settled, score * to_play / n, 0.0).astype(np.float32),
                score_mask=settled.astype(np.float32),
                opponent_policy=opponent,
                opponent_policy_mask=has_next.astype(np.float32),
            )
        return out


def _normalised(visits: np.ndarray) -> np.ndarray:
    """float32 rows of `visits` [B, P] scaled to sum to 1."""
    policy = visits.astype(np.float32)
    policy /= policy.sum(axis=1, keepdims=True)
    return policy


# ------------------------------------------------------------------------------ the window


@dataclass(frozen=True)
class WindowStats:
    files: int
    games: int
    positions: int
    """Positions in the window (training + validation)."""
    train_positions: int
    validation_positions: int
    total_positions: int
    """Positions in every batch on disk."""
    generation_min: int
    generation_max: int
    staleness_mean: float
    """Mean over window positions of (newest generation - the generation that played it)."""
    staleness_max: int
    skipped_files: int

    def as_text(self) -> str:
        return " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in self.__dict__.items())


class ReplayWindow(WindowView):
    """The training part of the window over `replay_dir`; `.validation` is the held-out part.

    Construction scans the folder, builds missing sidecars (the only expensive part, once per
    batch file) and selects the window; with all sidecars present it reads only each batch's
    info.json and games.npy, so every DDP rank can afford to build the same index. For a
    consistent index across ranks, pass the same `files` (batch names) to each, or have rank 0
    construct first (building sidecars) and the others after a barrier.
    """

    def __init__(
        self,
        replay_dir: str | os.PathLike,
        replay_cfg,
        history: int = 8,
        board_size: int | None = None,
        *,
        seed: int = 0,
        cache_dir: str | os.PathLike | None = None,
        augment: bool = True,
        files: Iterable[str] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        worker_weights: Mapping[str, float] | None = None,
        share_slack: float | None = None,
        liberties: bool = False,
    ):
        self.replay_dir = Path(replay_dir)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else sidecar_dir(replay_dir)
        self.cfg = replay_cfg
        schema = ReplayConfig()  # a partial config falls back on the schema's defaults
        self.min_positions = int(getattr(replay_cfg, "min_positions", schema.min_positions))
        self.max_positions = int(getattr(replay_cfg, "max_positions", schema.max_positions))
        self.growth = float(getattr(replay_cfg, "growth", schema.growth))
        self.validation_fraction = float(getattr(replay_cfg, "validation_fraction",
                                                 schema.validation_fraction))
        self.surprise_weight = float(getattr(replay_cfg, "policy_surprise_weight",
                                             schema.policy_surprise_weight))
        self.fast_weight = float(getattr(replay_cfg, "fast_search_weight",
                                         schema.fast_search_weight))
        search_value_weight = float(getattr(replay_cfg, "search_value_weight",
                                            schema.search_value_weight))
        self.max_bytes = max_bytes
        self.skipped: dict[str, str] = {}
        """Batch names left out, with the reason (a bad file, another board size)."""
        # given files keep their order (oldest first): ranks whose copies of the files have
        # other modification times still order the window as the rank that chose them
        self._fixed_files = None if files is None else list(dict.fromkeys(files))
        self._fixed_set = set(self._fixed_files or ())
        self.worker_weights = dict(worker_weights or {})
        self.share_slack = share_slack
        self._all: dict[str, Sidecar] = {}  # sidecars opened (the window's candidates)
        self._known: dict[str, tuple[int, int, int, str]] = {}
        """Every batch seen: (generation, ingest time ns, positions, worker), from the
        cache folder's index (or a sidecar's info.json), without opening its arrays."""
        self._index: dict[str, dict] = {}
        self._index_at = 0  # bytes of the index read so far
        self._names: list[str] = []  # the known batches in window order, oldest first
        self._by_worker: dict[str, list[int]] = {}  # indices into _names, per worker
        self._cum_by_worker: dict[str, list[int]] = {}  # the running sum of their positions
        self._pending: list[str] = []  # pinned files taken in since the last selection
        self._rebuild = True  # the next selection orders every name again
        self._board_size = board_size
        super().__init__([], np.zeros((0, 6), np.int64), history=history, liberties=liberties,
                         board_size=board_size or 5, seed=seed, augment=augment,
                         search_value_weight=search_value_weight)
        self.validation = WindowView([], np.zeros((0, 6), np.int64), history=history,
                                     liberties=liberties,
                                     board_size=board_size or 5, seed=seed, augment=False)
        self.total_positions = 0
        self.refresh()

    # -- files ------------------------------------------------------------------------

    def _batch_names(self) -> list[str]:
        if self._fixed_files is not None:
            return self._fixed_files
        try:
            names = os.listdir(self.replay_dir)
        except FileNotFoundError:
            return []
        return batch_names_among(names)

    def _open(self, name: str, build: bool) -> Sidecar | None:
        if name in self._all:
            return self._all[name]
        if name in self.skipped:
            return None
        worker = self._worker(name)
        if worker is None:
            return None
        folder = self.cache_dir / stem(name)
        info = read_info(folder)
        if info is None or info.get("name") != name:
            if not build:
                return None
            try:
                build_sidecar(self.replay_dir / name, self.cache_dir, max_bytes=self.max_bytes)
            except BatchError as e:
                cause = e.__cause__
                if isinstance(cause, OSError) and cause.errno in _NOT_THE_BATCH:
                    raise cause from None  # this process's trouble: the batch is good
                self._skip(name, str(e))
                return None
            info = read_info(folder)
            assert info is not None, folder
        if not self._same_board(name, info):
            return None
        try:
            ingested_ns = os.stat(self.replay_dir / name).st_mtime_ns
        except OSError:
            ingested_ns = 0  # gone meanwhile: _select leaves it out
        car = Sidecar(folder, info, worker, ingested_ns)
        self._all[name] = car
        if name not in self._index:  # a sidecar from before the index: found next time
            self._index[name] = info
            append_index(self.cache_dir, info)
        return car

    def _worker(self, name: str) -> str | None:
        """The worker that wrote batch `name`, its name parsed once in the window's life (a
        batch already known or opened is not parsed again); None, and skipped, if `name` is
        no batch name."""
        meta = self._known.get(name)
        if meta is not None:
            return meta[3]
        car = self._all.get(name)
        if car is not None:
            return car.worker
        try:
            return parse_batch_name(name).worker
        except ValueError as e:
            self._skip(name, str(e))
            return None

    def _same_board(self, name: str, info: dict) -> bool:
        """Whether batch `name` is of the window's board (the first batch sets it); a batch of
        another board is skipped."""
        if self._board_size is None:
            self._board_size = int(info["board_size"])
        if int(info["board_size"]) != self._board_size:
            self._skip(name, f"board size {info['board_size']}, the window is "
                       f"{self._board_size}x{self._board_size}")
            return False
        return True

    def _read_index(self) -> None:
        """Take in the index lines appended since the last read (complete lines only)."""
        try:
            with open(self.cache_dir / INDEX_NAME, "rb") as f:
                f.seek(self._index_at)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self._index_at += end
        for line in data[:end].splitlines():
            entry = index_entry(line)
            if entry is not None:
                self._index[entry["name"]] = entry

    def _meta(self, name: str, build: bool) -> tuple[int, int, int, str] | None:
        """(generation, ingest time ns, positions, worker) of batch `name`: from the index,
        else from its sidecar (built if missing and `build`); None if it is skipped."""
        meta = self._known.get(name)
        if meta is not None or name in self.skipped:
            return meta
        info = self._index.get(name)
        if info is None or name in self._all:
            car = self._open(name, build)
            if car is None:
                return None
            info = car.info
        worker = self._worker(name)
        if worker is None:
            return None
        if not self._same_board(name, info):
            return None
        car = self._all.get(name)
        if car is not None:
            ingested_ns = car.ingested_ns
        else:
            try:
                ingested_ns = os.stat(self.replay_dir / name).st_mtime_ns
            except OSError:
                ingested_ns = 0
        meta = (int(info["generation"]), ingested_ns, int(info["positions"]), worker)
        self._known[name] = meta
        return meta

    def _skip(self, name: str, reason: str) -> None:
        log.warning("replay window skips %s: %s", name, reason)
        self.skipped[name] = reason

    def add_file(self, path: str | os.PathLike) -> bool:
        """Take in one newly ingested batch (build its sidecar) and reselect the window.

        Returns False if the file was skipped (see `skipped`)."""
        ok = self._take_in(Path(path))
        self._select()
        return ok

    def add_files(self, paths: Sequence[str | os.PathLike]) -> list[bool]:
        """`add_file` for several batches in order, the window reselected once. A batch gone
        or bad is skipped with its reason (`skipped`); one that this process cannot read now
        (an OSError such as no descriptor or memory left) is logged and left out (False), not
        skipped for good: given again, it comes in.

        With pinned `files` each costs the window's size, not every batch taken in before
        (the long-lived trainer's admissions over a run of millions of batches)."""
        oks = []
        for path in map(Path, paths):
            try:
                oks.append(self._take_in(path))
            except OSError as e:
                log.warning("batch %s cannot be read (%s); left out of the window", path.name, e)
                oks.append(False)
        self._select()
        return oks

    def _take_in(self, path: Path) -> bool:
        if path.parent != self.replay_dir and path.parent.resolve() != self.replay_dir.resolve():
            raise ValueError(f"{path}: not in the replay folder {self.replay_dir}")
        if self._fixed_files is not None:
            if path.name in self._fixed_set:
                self._rebuild = True  # taken in again (it failed before): its old place
            else:
                self._fixed_set.add(path.name)
                self._fixed_files.append(path.name)
                self._pending.append(path.name)
        return self._open(path.name, build=True) is not None and \
            self._meta(path.name, build=True) is not None

    def refresh(self) -> int:
        """Scan the replay folder, build missing sidecars, reselect; returns new files seen.

        A batch already indexed is not opened: only the window's candidates are (each
        worker's newest batches up to the window's size), so a round's start-up grows with
        the window, not with every batch ever ingested."""
        before = len(self._known)
        self._read_index()
        for name in self._batch_names():
            self._meta(name, build=True)
        self._rebuild = True
        self._select()
        return len(self._known) - before

    # -- selection ----------------------------------------------------------------------

    def _select(self) -> None:
        """Choose the window from the known batches. Pinned files taken in since the last
        selection are appended to the order, so that the long-lived trainer's admission
        costs the window's size, not every batch ever admitted; a refresh (or a folder
        scanned, not pinned) orders every name again."""
        known = self._known
        if self._rebuild or self._fixed_files is None:
            listed = self._batch_names()  # a batch deleted from the folder leaves the window
            if self._fixed_files is not None:
                names = [n for n in listed if n in known]
            else:
                names = sorted((n for n in set(listed) if n in known),
                               key=lambda n: (known[n][0], known[n][1], n))
            self._names, self._by_worker, self._cum_by_worker = [], {}, {}
            self.total_positions = 0
            self._rebuild = False
        else:
            # a pinned file that failed to come in is known only after a refresh
            names = [n for n in self._pending if n in known]
        self._pending = []
        for n in names:
            worker, positions = known[n][3], known[n][2]
            self._by_worker.setdefault(worker, []).append(len(self._names))
            cum = self._cum_by_worker.setdefault(worker, [])
            cum.append((cum[-1] if cum else 0) + positions)
            self._names.append(n)
            self.total_positions += positions
        names = self._names
        target = window_size(self.total_positions, self.min_positions, self.max_positions,
                             self.growth)
        # the candidates: each worker's newest batches until they hold `target` positions
        # (no worker's games can fill more of the window); only these are opened. A batch
        # is one while the worker's newer ones hold less than `target`: cum[i] > cum[-1] -
        # target, with cum the running sum of the worker's positions, oldest first
        picked: list[int] = []
        for worker, rows in self._by_worker.items():
            cum = self._cum_by_worker[worker]
            picked += rows[bisect.bisect_right(cum, cum[-1] - target):]
        if len(self._by_worker) > 1:
            picked.sort()
        opened = self._all
        cars = [car for i in picked
                if (car := opened.get(names[i]) or self._open(names[i], build=True))
                is not None]
        chosen = {c.name: c for c in cars}
        for name in opened.keys() - chosen.keys():
            opened[name].close()  # a batch that left the candidates: its arrays and maps go
        self._all = chosen
        units: list[tuple[str, int]] = []
        refs: list[tuple] = []  # (first, end, generation, result, game, held out), as units
        sidecar_of: list[int] = []  # the index in `cars` of each
        for ci, car in enumerate(cars):
            units += car.units()
            refs += car.rows(self.validation_fraction)
            sidecar_of += [ci] * len(car.games)
        rows = None
        if self.fast_weight != 1.0:  # shares count the rows sampled, not the positions
            counts = [int(c) for car in cars for c in car.full_counts()]
            rows = [self.fast_weight * n + (1.0 - self.fast_weight) * full
                    for (_, n), full in zip(units, counts)]
        train, val = [], []
        for i in select_newest(units, target, self.worker_weights, self.share_slack, rows,
                               owners={car.worker for car in cars}):
            start, end, gen, result, g, held_out = refs[i]
            if end == start:
                continue
            (val if held_out else train).append((sidecar_of[i], start, end, gen, result, g))
        n = self._board_size or 5
        epoch = self.epoch
        segments = np.array(train, np.int64).reshape(-1, 6)
        rows = (sample_rows(cars, segments, self.surprise_weight, self.fast_weight, self.seed)
                if self.surprise_weight > 0 or self.fast_weight != 1.0 else None)
        WindowView.__init__(self, cars, segments,
                            history=self.history, board_size=n, seed=self.seed,
                            augment=self.augment, liberties=self.liberties, rows=rows,
                            search_value_weight=self.search_value_weight)
        self.epoch = epoch
        self.validation = WindowView(cars, np.array(val, np.int64).reshape(-1, 6),
                                     history=self.history, board_size=n, seed=self.seed,
                                     augment=False, liberties=self.liberties)
        log.debug("replay window: %s", self.stats().as_text())

    def names(self) -> list[str]:
        """Batch names the window currently knows, oldest first (pass as `files` to match)."""
        return list(self._names)

    def stats(self, current_generation: int | None = None) -> WindowStats:
        """Games, positions and the generations in the window; staleness is measured from
        `current_generation` (default: the newest generation in the window)."""
        segs = np.concatenate([self._segments, self.validation._segments])
        lengths = segs[:, 2] - segs[:, 1]
        gens = segs[:, 3]
        positions = int(lengths.sum())
        if positions:
            newest = int(gens.max()) if current_generation is None else current_generation
            stale = newest - gens
            mean, worst = float((stale * lengths).sum() / positions), int(stale.max())
            gmin, gmax = int(gens.min()), int(gens.max())
        else:
            mean, worst, gmin, gmax = 0.0, 0, -1, -1
        return WindowStats(
            files=len({int(c) for c in segs[:, 0]}),
            games=len(segs),
            positions=positions,
            train_positions=self.num_positions,
            validation_positions=self.validation.num_positions,
            total_positions=self.total_positions,
            generation_min=gmin,
            generation_max=gmax,
            staleness_mean=mean,
            staleness_max=worst,
            skipped_files=len(self.skipped),
        )


def main(argv: list[str] | None = None) -> int:
    """`python -m training.learn.replay_buffer RUN/replay`: build missing sidecars, print the
    window."""
    import argparse
    import sys

    from configs import load_config

    parser = argparse.ArgumentParser(prog="python -m training.learn.replay_buffer",
                                     description="Summarise the replay window of a run.")
    parser.add_argument("replay_dir", type=Path, help="a run's replay folder (runs/main/replay)")
    parser.add_argument("--config", type=Path, help="config file (default configs/config.yaml)")
    args = parser.parse_args(argv)
    if not args.replay_dir.is_dir():
        print(f"{args.replay_dir}: no such folder", file=sys.stderr)
        return 1
    cfg = load_config(args.config)
    window = ReplayWindow(args.replay_dir, cfg.replay, cfg.net.history)
    print(window.stats().as_text())
    for name, reason in window.skipped.items():
        print(f"skipped {name}: {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
