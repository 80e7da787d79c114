"""The replay window: the most recent self-play positions on disk -> (planes, policy, value).

Owns the training data view of `runs/<run>/replay/*.npz.zst` (the batches the coach ingested):

- **Sidecar**: per batch file, compact arrays built once by replaying its games
  (`records.load_batch`, which validates too) and kept in `<cache_dir>/<batch stem>/` as
  `.npy` files, so a restart reuses them. An array file of at most `IN_MEMORY_BYTES` (a batch
  of a few games) is read into memory, a larger one mapped, at most `open_maps_capacity` of
  them at once in a process (the least recently used closed first): a large window never
  has to sit in memory, and the descriptors and maps it holds stay bounded however many
  batch files it holds (each map holds a descriptor). A missing or outdated sidecar is
  rebuilt; it is written to a temporary folder and renamed, so concurrent builders (DDP
  ranks) never see half of one.
      boards   int8 [M, N*N]    the board before each move (M positions = moves of the file)
      visits   uint16 [M, P]    the policy target (visit counts or a quantised improved
                                policy, `training.go.records`), normalised when sampled
      full_search bool [M]      the move's policy target is valid (a full search); the
                                policy row of a fast search's move is sampled as all zeros
                                (no policy target), and so is its opponent_policy
      surprise float16 [M]      KL of the move's policy target from the net's prior (0 for a
                                fast search or an older batch; a sidecar written before
                                this array reads as zeros)
      games    int64 [G, 4]     per game: first position, end position, model generation,
                                result (+1 black won); black moves at even offsets in a game
      ownership int8 [G, N*N]   per game: the owner of every point of the final position
                                (`features.area_ownership`, black's view; 0 if resigned)
      scores   float32 [G]      per game: the area score, black's view, komi included (the
                                batch's `score`, checked by the replay); NaN if resigned
      info.json                 name, meta generation, created, board size, counts, version
  Ownership is recomputed here from the replayed final position rather than stored in the
  batch file: a worker cannot forge it, and batches need no new array.
- **Window**: files ordered by (generation, ingest time, name), oldest first, where the
  ingest time is the file's modification time in `replay/`, which the coach sets as it
  ingests (a worker's own clock never orders the window); games are taken
  newest first until the window holds `size` positions, where (KataGo's growing window)
  size = min_positions * (total / min_positions) ** growth, clamped to
  [min_positions, max_positions] and to the positions on disk. With `share_slack`, one
  worker's games fill at most `share_fractions` of the rows the window holds (its weight's
  share among the workers with games on disk, times the slack; `select_newest`), so a
  worker that sends more than its share cannot own the window: when the others have fewer
  games, the window holds less of its. Given `files` are taken in
  their order (the rank that chose them sends them oldest first). With
  `replay.policy_surprise_weight` > 0 (KataGo's policy surprise weighting) or
  `replay.fast_search_weight` other than 1, a sample index maps to a position through
  `sample_rows`, which repeats the positions whose search surprised the net and keeps that
  share of the fast searches' positions (every rank builds the same rows).
- **Validation split**: a game is held out when a stable hash of (batch name, game index) falls
  below `validation_fraction`, so the split is the same on every rank and after a restart.
- **Samples**: `w[i] -> (planes float32 [C, N, N], policy float32 [P], value float32)`, and
  `w.batch(indices)` / `w.__getitems__` for a whole batch at once (about 10x faster per
  sample). Planes are `training.go.features.planes` of the position (C = 2 * history + 1: the
  stones of the side to move, then the opponent's, for the last `history` boards, most
  recent first; then ones if black is to move), rebuilt here from the sidecar's boards with
  one vectorised gather. Policy sums to 1 (pass last); value is the result from the side to
  move's view, in {-1, 0, 1}. `w.samples(indices)` adds the auxiliary targets as a dict
  (`TARGETS`): ownership float32 [B, A] and score float32 [B] (margin / N) from the side to
  move's view, and opponent_policy float32 [B, P] (the next move's policy target), each with
  a float32 [B] mask (`<name>_mask`: 0 for a resigned game, or for the last move of a game).
  One of the 8 symmetries of `training.go.features` is applied per sample (planes, policies and
  ownership alike), drawn from a hash of (seed, epoch, index): deterministic, the same in
  every DataLoader worker, and different each epoch (`set_epoch`).

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
import json
import logging
import math
import os
import secrets
import shutil
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Iterable, Mapping, Sequence

import numpy as np

from configs import ReplayConfig
from distributed.transfer import write_json_atomic
from training.go import features
from training.go.fastgo import neighbor_table
from training.go.records import (
    BATCH_SUFFIX,
    DEFAULT_MAX_BYTES,
    Batch,
    BatchError,
    batch_names_among,
    load_batch,
    parse_batch_name,
)

log = logging.getLogger(__name__)

SIDECAR_VERSION = 4
CACHE_DIR_NAME = ".window"
INDEX_NAME = "index.jsonl"
"""One JSON line per sidecar built (name, generation, positions, games, board size, version),
appended in the cache folder: the window reads it instead of opening every batch's sidecar."""
_NOT_THE_BATCH = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS,
                            errno.EAGAIN, errno.EINTR})
"""Errors reading a batch that are this process's (no descriptor or memory left), not the
batch's: raised, never a reason to skip a good batch for good."""
_ARRAYS = ("boards", "visits", "games", "ownership", "scores", "full_search")
_OPTIONAL = {"surprise": np.float16}
"""Sidecar arrays that sidecars written before them lack (read as zeros: no rebuild)."""
TARGETS = ("ownership", "score", "opponent_policy")
"""Auxiliary targets of `WindowView.samples`, each with a `<name>_mask`."""


def window_size(total: int, min_positions: int, max_positions: int, growth: float) -> int:
    """Positions in the window for `total` positions on disk (KataGo's growing window)."""
    if total <= min_positions:
        return int(total)
    size = min_positions * (total / min_positions) ** growth
    return int(min(total, max_positions, max(min_positions, math.floor(size))))


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


WINDOW_SHARE_SLACK = 1.5
"""A worker's games may fill up to 1.5 times its weight's share of the window held (2 equal
workers: 75% each; 4: 37.5%)."""


RECENT_GENERATIONS = 10
"""Kept for callers of earlier versions: shares no longer lapse with age (a worker whose newest
games are old keeps its share of the older games it holds, `share_fractions`)."""

_SOLVE_ROUNDS = 40


def share_fractions(owners: Sequence[str], weights: Mapping[str, float],
                    slack: float | None) -> dict[str, float]:
    """Most of the window each worker's games may hold, as a fraction of the rows held: its
    weight's share (`distributed.worker_weights`, 1.0 when unlisted) among every worker with
    games in `owners`, times `slack`, at most 1. 1.0 for everyone without `slack` or with a
    single worker. A worker whose newest games are old still counts: a flood from another
    cannot push its older games out of their share, and a worker alone among the recent ones
    never holds more than its share while others have games in the window."""
    names = sorted(set(owners))
    if slack is None or len(names) < 2:
        return {n: 1.0 for n in names}
    w = {n: max(float(weights.get(n, 1.0)), 0.0) for n in names}
    total = sum(w.values()) or 1.0
    return {n: min(1.0, slack * w[n] / total) for n in names}


def share_caps(owners: Sequence[str], weights: Mapping[str, float], slack: float | None,
               target: int, generations: Sequence[int] | None = None) -> dict[str, float]:
    """`share_fractions` times `target`: the most positions each worker may hold in a window
    of `target` positions when every worker has its share to give (infinity with no cap).
    The window itself measures shares on what it holds (`select_newest`); `generations` is
    accepted for earlier callers and unused."""
    return {n: math.inf if f >= 1.0 else f * target
            for n, f in share_fractions(owners, weights, slack).items()}


def take_newest(units: Sequence[tuple[str, int]], target: int,
                caps: Mapping[str, float], rows: Sequence[float] | None = None) -> list[int]:
    """The window's greedy pass: of `units` (owner, positions), ordered oldest first, the
    indices taken newest first until `target` positions are held, skipping an owner once it
    holds its cap, counted in `rows` (the sampled rows of each unit; its positions without
    them); returned oldest first. `select_newest` chooses the caps."""
    chosen: list[int] = []
    held = 0
    held_by: dict[str, float] = {}
    for i in range(len(units) - 1, -1, -1):
        if held >= target:
            break
        owner, n = units[i]
        if held_by.get(owner, 0) >= caps.get(owner, math.inf):
            continue
        chosen.append(i)
        held += n
        held_by[owner] = held_by.get(owner, 0) + (n if rows is None else rows[i])
    chosen.reverse()
    return chosen


def select_newest(units: Sequence[tuple[str, int]], target: int,
                  weights: Mapping[str, float], slack: float | None,
                  rows: Sequence[float] | None = None,
                  owners: Collection[str] | None = None) -> list[int]:
    """The window's rule, shared by the trainer (units = games) and status.txt (units =
    batches, `training.coach`): of `units` (owner, positions), ordered oldest first, the
    newest up to `target` positions, where no owner holds more than its `share_fractions`
    of the rows held (`rows[i]`: the sampled rows of unit i, `sample_rows`' expectation; its
    positions without them). Returned oldest first.

    Shares are measured on what is held, not on the target: an owner whose share is f holds
    at most f * R rows, where R is the largest total the others can match (R <= the rows
    held). Found by a few greedy passes (`take_newest`), each with R from the last one's
    counts (the owners at their cap hold f * R, the others what they had).

    `owners`: the set of every unit's owner, where the caller keeps it (the coach's collector
    does), so that a window over a million units costs what it takes, not a pass over all."""
    fractions = share_fractions(list(owners) if owners is not None else
                                [o for o, _ in units], weights, slack)
    if all(f >= 1.0 for f in fractions.values()):
        return take_newest(units, target, {}, rows)
    bound = math.inf
    chosen: list[int] = []
    for _ in range(_SOLVE_ROUNDS):
        caps = {o: f * bound for o, f in fractions.items()}
        chosen = take_newest(units, target, caps, rows)
        held_by: dict[str, float] = {}
        for i in chosen:
            held_by[units[i][0]] = held_by.get(units[i][0], 0.0) + (
                units[i][1] if rows is None else rows[i])
        held = sum(held_by.values())
        if held <= 0 or held >= bound * (1 - 1e-9):
            break  # every owner holds at most f * bound <= f * held
        capped = {o for o, h in held_by.items() if h >= caps[o]}
        free = held - sum(held_by[o] for o in capped)
        share = sum(fractions[o] for o in capped)
        root = free / (1.0 - share) if share < 1.0 else held
        bound = min(held, root) if root > 0 else held * 0.5
    return chosen


def _mix(seed: int, epoch: int, index: np.ndarray) -> np.ndarray:
    """A splitmix64 hash of (seed, epoch, index): uint64, vectorised."""
    with np.errstate(over="ignore"):
        x = np.asarray(index, dtype=np.uint64) + np.uint64(
            (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + 1) & (2**64 - 1)
        )
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def sample_rows(sidecars: Sequence["_Sidecar"], segments: np.ndarray, surprise_weight: float,
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


def is_validation_game(name: str, game: int, fraction: float) -> bool:
    """True if game `game` of batch `name` is held out (a stable hash, same on every rank)."""
    if fraction <= 0:
        return False
    digest = hashlib.blake2b(f"{name}/{game}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64 < fraction


# ------------------------------------------------------------------------------ sidecars


def _stem(name: str) -> str:
    return name[: -len(BATCH_SUFFIX)]


def sidecar_dir(replay_dir: str | os.PathLike) -> Path:
    """The default cache folder of the sidecars of `replay_dir`."""
    return Path(replay_dir) / CACHE_DIR_NAME


def build_sidecar(batch_path: str | os.PathLike, cache_dir: str | os.PathLike, *,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> Path:
    """Replay a batch file into its sidecar folder (atomically); BatchError if it is bad."""
    batch_path = Path(batch_path)
    batch = load_batch(batch_path, max_bytes=max_bytes)
    return write_sidecar(batch, batch_path.name, cache_dir)


def write_sidecar(batch: Batch, name: str, cache_dir: str | os.PathLike) -> Path:
    """Write the sidecar of an already validated batch named `name` (atomically).

    The coach can validate once with `records.load_batch` and pass the result here, so that
    ingesting a batch replays its games once and the trainer finds the sidecar ready.
    """
    cache_dir = Path(cache_dir)
    parse_batch_name(name)
    n = batch.meta.board_size
    a = n * n
    lengths = [r.num_moves for r in batch.records]
    m = int(sum(lengths))
    boards = np.zeros((m, a), np.int8)
    visits = np.zeros((m, a + 1), np.uint16)
    games = np.zeros((len(lengths), 4), np.int64)
    scores = np.array([np.nan if r.resigned else r.score for r in batch.records], np.float32)
    final = np.zeros((len(lengths), a), np.int8)
    full_search = np.ones(m, np.bool_)
    surprise = np.zeros(m, np.float16)
    start = 0
    for g, (rec, rec_boards) in enumerate(zip(batch.records, batch.boards)):
        t = rec.num_moves
        end = start + t
        boards[start:end] = rec_boards[:-1]
        visits[start:end] = rec.visits
        if rec.full_search is not None:
            full_search[start:end] = rec.full_search
        if rec.surprise is not None:
            surprise[start:end] = rec.surprise
        games[g] = (start, end, rec.generation, rec.result)
        if not rec.resigned:  # a resigned game's last position is not settled
            final[g] = rec_boards[-1]
        start = end
    ownership = features.area_ownership(final, n)
    info = {
        "version": SIDECAR_VERSION,
        "name": name,
        "generation": batch.meta.generation,
        "created": batch.meta.created,
        "board_size": n,
        "positions": m,
        "games": len(lengths),
    }
    final = cache_dir / _stem(name)
    tmp = cache_dir / f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    tmp.mkdir(parents=True)
    try:
        for key, arr in zip((*_ARRAYS, *_OPTIONAL), (boards, visits, games, ownership, scores,
                                                     full_search, surprise)):
            np.save(tmp / f"{key}.npy", arr)
        write_json_atomic(tmp / "info.json", info)
        if final.exists():  # outdated (or another process built it meanwhile): replace
            _remove_tree(final)
        os.rename(tmp, final)
    except OSError:
        if final.exists() and _read_info(final) is not None:
            _remove_tree(tmp)  # another process won the race with an equal sidecar
            return final
        _remove_tree(tmp)
        raise
    _append_index(cache_dir, info)
    return final


_INDEX_KEYS = ("generation", "positions", "games", "board_size")


def _append_index(cache_dir: Path, info: dict) -> None:
    """Add a sidecar's line to the cache folder's index (one short O_APPEND write, so lines
    of processes appending at once never interleave). A failure only costs a later read of
    the sidecar's info.json."""
    line = json.dumps({"name": info["name"], "version": info["version"],
                       **{k: int(info[k]) for k in _INDEX_KEYS}}, sort_keys=True) + "\n"
    try:
        fd = os.open(cache_dir / INDEX_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError as e:
        log.debug("%s: index line not written: %s", cache_dir, e)


def _index_entry(line: bytes) -> dict | None:
    """A parsed index line of the current sidecar version, or None."""
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(entry, dict) or entry.get("version") != SIDECAR_VERSION \
            or not isinstance(entry.get("name"), str):
        return None
    if not all(type(entry.get(k)) is int for k in _INDEX_KEYS):
        return None
    return entry


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _read_info(folder: Path) -> dict | None:
    """The sidecar's info if it is complete and current, else None."""
    try:
        info = json.loads((folder / "info.json").read_text())
    except (OSError, ValueError):
        return None
    if info.get("version") != SIDECAR_VERSION:
        return None
    if not all((folder / f"{key}.npy").exists() for key in _ARRAYS):
        return None
    return info


IN_MEMORY_BYTES = 256 * 1024
"""A sidecar array file up to this size is read into memory (a batch of one or a few games:
boards and visits of a 19x19 game are about 270 KiB together); a larger one is mapped. The
window's memory stays at most its own positions' bytes, and many small batches hold no file
descriptors or maps at all."""
MAX_OPEN_MAPS = 1024
"""The most sidecar arrays mapped at once in a process, and at most an eighth of its
open-files limit (`open_maps_capacity`): each map holds a duplicate of its file's descriptor,
so the least recently used is closed when another is mapped, and the descriptors the window
holds stay bounded whatever the number of batch files. A window of full batches maps two
arrays per file (boards and visits): 68 maps for the default window of 9x9 games."""


def open_maps_capacity(open_files_limit: int) -> int:
    """How many sidecar arrays a process with this soft open-files limit maps at once."""
    return max(16, min(MAX_OPEN_MAPS, open_files_limit // 8))


def _open_files_limit() -> int:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1024
    return MAX_OPEN_MAPS * 8 if soft == resource.RLIM_INFINITY else int(soft)


class _OpenMaps:
    """The process's mapped sidecar arrays, least recently used first (`MAX_OPEN_MAPS`)."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity  # None: from the open-files limit when first used
        self._maps: OrderedDict[Path, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path) -> np.ndarray:
        with self._lock:
            arr = self._maps.get(path)
            if arr is not None:
                self._maps.move_to_end(path)
                return arr
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
        arr = mapped.view(np.ndarray)  # same pages, without np.memmap's per-index overhead
        with self._lock:
            if self.capacity is None:  # read late: the entry point raises the limit first
                self.capacity = open_maps_capacity(_open_files_limit())
            self._maps[path] = arr
            while len(self._maps) > self.capacity:
                # its map (and descriptor) closes once the last view of it is gone: at once
                # here, since samples are gathered into copies
                self._maps.popitem(last=False)
        return arr

    def forget(self, folder: Path) -> None:
        """Close the maps of the arrays in `folder` (a sidecar that left the window)."""
        with self._lock:
            for path in [p for p in self._maps if p.parent == folder]:
                del self._maps[path]

    def __len__(self) -> int:
        return len(self._maps)


_MAPS = _OpenMaps()


class _Sidecar:
    """One batch's sidecar: info read eagerly; on first use, each array read into memory if
    small (`IN_MEMORY_BYTES`), else mapped through the process's `_MAPS`."""

    def __init__(self, folder: Path, info: dict, ingested_ns: int = 0):
        self.folder = folder
        self.info = info
        self.name: str = info["name"]
        self.ingested_ns = ingested_ns  # the batch file's mtime: when the coach ingested it
        self.games = np.load(folder / "games.npy")  # small: [G, 4]
        self._arrays: dict[str, np.ndarray] = {}  # in memory; mapped ones live in _MAPS
        self._mapped: set[str] = set()
        self.worker = parse_batch_name(self.name).worker
        self._units: list[tuple[str, int]] | None = None
        self._rows: list[tuple[int, int, int, int, int, bool]] | None = None
        self._rows_fraction = -1.0

    def units(self) -> list[tuple[str, int]]:
        """(worker, positions) of each game, for `select_newest` (computed once)."""
        if self._units is None:
            self._units = [(self.worker, end - start)
                           for start, end, _, _ in self.games.tolist()]
        return self._units

    def rows(self, validation_fraction: float) -> list[tuple[int, int, int, int, int, bool]]:
        """(first position, end position, generation, result, game, held out) of each game
        (computed once per fraction)."""
        if self._rows is None or self._rows_fraction != validation_fraction:
            self._rows_fraction = validation_fraction
            self._rows = [(start, end, gen, result, g,
                           is_validation_game(self.name, g, validation_fraction))
                          for g, (start, end, gen, result) in enumerate(self.games.tolist())]
        return self._rows

    def array(self, key: str) -> np.ndarray:
        arr = self._arrays.get(key)
        if arr is not None:
            return arr
        path = self.folder / f"{key}.npy"
        if key in self._mapped:
            return _MAPS.get(path)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            if key not in _OPTIONAL:
                raise
            size = -1  # a sidecar from before the array: zeros
        if size < 0:
            arr = np.zeros(int(self.info["positions"]), _OPTIONAL[key])
        elif size <= IN_MEMORY_BYTES:
            arr = np.load(path, allow_pickle=False)  # read whole, the file closed
        else:
            self._mapped.add(key)
            return _MAPS.get(path)
        self._arrays[key] = arr
        return arr

    def close(self) -> None:
        """Drop its arrays and close its maps (it left the window)."""
        self._arrays = {}
        if self._mapped:
            _MAPS.forget(self.folder)
            self._mapped = set()

    def full_counts(self) -> np.ndarray:
        """int64 [G]: the full-search positions of each game (a fast search's position is
        sampled `fast_search_weight` times as often)."""
        counts = self._arrays.get("_full_counts")
        if counts is None:
            full = np.asarray(self.array("full_search"), np.int64)
            counts = np.array([int(full[s:e].sum()) for s, e in self.games[:, :2]], np.int64)
            self._arrays["_full_counts"] = counts
        return counts

    def __getstate__(self) -> dict:
        # DataLoader workers started with spawn get the paths, not copies of the mmaps
        state = dict(self.__dict__)
        state["_arrays"] = {}
        state["_mapped"] = set()
        state["_units"] = state["_rows"] = None
        return state

    @property
    def sort_key(self) -> tuple:
        return (int(self.info["generation"]), self.ingested_ns, self.name)


# ------------------------------------------------------------------------------ samples


class WindowView:
    """A map-style dataset over a list of game segments (the training or validation part)."""

    def __init__(self, sidecars: list[_Sidecar], segments: np.ndarray, *, history: int,
                 board_size: int, seed: int, augment: bool, liberties: bool = False,
                 rows: np.ndarray | None = None):
        self._sidecars = sidecars
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
        order = np.argsort(files, kind="stable")
        cuts = np.flatnonzero(np.diff(files[order])) + 1
        for rows in np.split(order, cuts) if b else []:
            car = self._sidecars[int(files[rows[0]])]
            past[rows] = car.array("boards")[back[rows]]
            visits[rows] = car.array("visits")[pos[rows]]
            full[rows] = car.array("full_search")[pos[rows]]
            if targets:
                game = self._segments[seg[rows], 5]
                next_visits[rows] = car.array("visits")[after[rows]]
                next_full[rows] = car.array("full_search")[after[rows]]
                owner[rows] = car.array("ownership")[game]
                score[rows] = car.array("scores")[game]
        past *= valid[:, :, None]  # zeros before the game's start
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
        self.max_bytes = max_bytes
        self.skipped: dict[str, str] = {}
        """Batch names left out, with the reason (a bad file, another board size)."""
        # given files keep their order (oldest first): ranks whose copies of the files have
        # other modification times still order the window as the rank that chose them
        self._fixed_files = None if files is None else list(dict.fromkeys(files))
        self._fixed_set = set(self._fixed_files or ())
        self.worker_weights = dict(worker_weights or {})
        self.share_slack = share_slack
        self._all: dict[str, _Sidecar] = {}  # sidecars opened (the window's candidates)
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
                         board_size=board_size or 5, seed=seed, augment=augment)
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

    def _open(self, name: str, build: bool) -> _Sidecar | None:
        if name in self._all:
            return self._all[name]
        if name in self.skipped:
            return None
        try:
            parse_batch_name(name)
        except ValueError as e:
            self._skip(name, str(e))
            return None
        folder = self.cache_dir / _stem(name)
        info = _read_info(folder)
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
            info = _read_info(folder)
            assert info is not None, folder
        if not self._same_board(name, info):
            return None
        try:
            ingested_ns = os.stat(self.replay_dir / name).st_mtime_ns
        except OSError:
            ingested_ns = 0  # gone meanwhile: _select leaves it out
        car = _Sidecar(folder, info, ingested_ns)
        self._all[name] = car
        if name not in self._index:  # a sidecar from before the index: found next time
            self._index[name] = info
            _append_index(self.cache_dir, info)
        return car

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
            entry = _index_entry(line)
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
        try:
            worker = parse_batch_name(name).worker
        except ValueError as e:
            self._skip(name, str(e))
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
                            augment=self.augment, liberties=self.liberties, rows=rows)
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
