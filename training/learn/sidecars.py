"""Sidecars: a replay batch's positions as compact arrays, built once, read or mapped on use.

Per batch file, compact arrays built once by replaying its games
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
    values   float16 [M]      the search's root value at each position, its side to move's
                              view, in [-1, 1] (the batch's, checked by `load_batch`); a
                              sidecar written before this array reads as NaN (no value)
    games    int64 [G, 4]     per game: first position, end position, model generation,
                              result (+1 black won); black moves at even offsets in a game
    ownership int8 [G, N*N]   per game: the owner of every point of the final position
                              (`features.area_ownership`, black's view; 0 if resigned)
    scores   float32 [G]      per game: the area score, black's view, komi included (the
                              batch's `score`, checked by the replay); NaN if resigned
    info.json                 name, meta generation, created, board size, counts, version
Ownership is recomputed here from the replayed final position rather than stored in the
batch file: a worker cannot forge it, and batches need no new array.

The cache folder's index (`INDEX_NAME`, one JSON line per sidecar built) lets the window learn
every batch's generation and size without opening its sidecar. The window that reads these is
`training.learn.replay_buffer`. This module must not import torch, and writes only into the
cache folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from distributed.transfer import write_json_atomic
from training.go import features
from training.go.records import BATCH_SUFFIX, DEFAULT_MAX_BYTES, Batch, load_batch, parse_batch_name

log = logging.getLogger(__name__)

SIDECAR_VERSION = 4
CACHE_DIR_NAME = ".window"
INDEX_NAME = "index.jsonl"
"""One JSON line per sidecar built (name, generation, positions, games, board size, version),
appended in the cache folder: the window reads it instead of opening every batch's sidecar."""
_ARRAYS = ("boards", "visits", "games", "ownership", "scores", "full_search")
_OPTIONAL = {"surprise": (np.float16, 0.0), "values": (np.float16, np.nan)}
"""Sidecar arrays that sidecars written before them lack: (dtype, what such a sidecar reads
as), with no rebuild."""


def is_validation_game(name: str, game: int, fraction: float) -> bool:
    """True if game `game` of batch `name` is held out (a stable hash, same on every rank)."""
    if fraction <= 0:
        return False
    digest = hashlib.blake2b(f"{name}/{game}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64 < fraction


def stem(name: str) -> str:
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
    values = np.zeros(m, np.float16)
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
        values[start:end] = rec.values
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
    final = cache_dir / stem(name)
    tmp = cache_dir / f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    tmp.mkdir(parents=True)
    try:
        for key, arr in zip((*_ARRAYS, *_OPTIONAL), (boards, visits, games, ownership, scores,
                                                     full_search, surprise, values)):
            np.save(tmp / f"{key}.npy", arr)
        write_json_atomic(tmp / "info.json", info)
        if final.exists():  # outdated (or another process built it meanwhile): replace
            _remove_tree(final)
        os.rename(tmp, final)
    except OSError:
        if final.exists() and read_info(final) is not None:
            _remove_tree(tmp)  # another process won the race with an equal sidecar
            return final
        _remove_tree(tmp)
        raise
    append_index(cache_dir, info)
    return final


_INDEX_KEYS = ("generation", "positions", "games", "board_size")


def append_index(cache_dir: Path, info: dict) -> None:
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


def index_entry(line: bytes) -> dict | None:
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


def read_info(folder: Path) -> dict | None:
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


class Sidecar:
    """One batch's sidecar: info read eagerly; on first use, each array read into memory if
    small (`IN_MEMORY_BYTES`), else mapped through the process's `_MAPS`."""

    def __init__(self, folder: Path, info: dict, worker: str, ingested_ns: int = 0):
        self.folder = folder
        self.info = info
        self.name: str = info["name"]
        self.ingested_ns = ingested_ns  # the batch file's mtime: when the coach ingested it
        self.games = np.load(folder / "games.npy")  # small: [G, 4]
        self._arrays: dict[str, np.ndarray] = {}  # in memory; mapped ones live in _MAPS
        self._mapped: set[str] = set()
        self.worker = worker  # parsed from the name by the caller, once
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
            size = -1  # a sidecar from before the array: its fill
        if size < 0:
            dtype, fill = _OPTIONAL[key]
            arr = np.full(int(self.info["positions"]), fill, dtype)
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
