"""Finished self-play games: `GameRecord` and game batch files (SGF: `training.go.sgf`).

Vocabulary (see `training.go.coords`): N is the board size, A = N*N points, a move is a flat index
``row * N + col`` (row 0 = top) or PASS = ``A``; a policy vector has P = A + 1 entries, pass
last. A *game batch* is one file of finished games from one worker (docs/DESIGN.md, "Game
batch"), named ``<worker>_<gen:06d>_<seq:08d>.npz.zst``; the name is the coach's idempotency
key.

Batch file layout: a zstd-compressed ``.npz`` (written with ``np.savez``; read with
``allow_pickle=False`` only) holding, for G games with T_g moves each and M = sum(T_g):

    meta            0-d unicode   JSON of `BatchMeta`
    offsets         int64 [G+1]   game g's moves are rows offsets[g]:offsets[g+1]
    moves           int16 [M]     flat index or PASS
    visits          uint16 [M, P] the policy target per move: root visit counts (PUCT), or
                                  the improved policy in units of 1/POLICY_SCALE (Gumbel)
    values          float16 [M]   root value, side to move's view, in [-1, 1]
    full_search     bool [M]      the move got a full search, so its `visits` row is a policy
                                  target (playout cap randomization; false: a fast search,
                                  value target only). Optional: missing (older batches) = true
    surprise        float16 [M]   KL divergence (nats) of the policy target from the net's
                                  root prior, in [0, MAX_SURPRISE]; 0 for a fast search.
                                  Optional: missing (older batches) = 0
    result          int8 [G]      +1 black won, -1 white won, 0 draw
    score           float32 [G]   Tromp-Taylor score, black's view, komi included; NaN if resigned
    resigned, resign_disabled     bool [G]
    would_resign_as int8 [G]      0, or the colour that would have resigned (resign disabled)
    board_size      int16 [G],  komi float32 [G],  generation int32 [G],  seed int64 [G],
    simulations     int32 [G]

`read_batch`/`load_batch` trust nothing in a file: they bound the decompressed size, refuse
pickles, check every array's dtype and shape and every value's range, and replay every game
through the reference rules (`training.go.rules.Position`, the check of record). Each failure is a
`BatchError` naming the file, the game and the reason, with a short `kind` per failure. Given
`BatchRules` (the run's config: `training.fleet.validation.batch_rules`), a batch is also held
to the run's move cap, simulations, games per batch and passes, within a CPU budget.

Why one module of about 800 lines: the batch format and every check of it are one contract,
read together (a field added to the writer without its check, or a check without its field,
is the bug this layout prevents); the rest is small (`random_record` for tests and
benchmarks). The data classes (`GameRecord`, `BatchMeta`, `Batch`, `BatchRules`,
`BatchError`) are `training.go.batch_types`, imported here; the command-line tool over batch
files (summary, SGF export, the validation benchmark) is `training.go.batch_tool`.

This module must not import torch, and never writes a file other processes read except through
`distributed.transfer.write_atomic` (temp name, then rename).
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import time
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from distributed.transfer import (
    DecompressionLimitError,
    TransferError,
    compress_bytes,
    decompress_bytes,
    write_atomic,
)
from configs.schema import WORKER_NAME_PATTERN
from training.go.batch_types import (BATCH_SUFFIX, DEFAULT_MAX_BYTES, FORMAT_VERSION,
                                     FUTURE_SLACK_S, RULES, Batch, BatchError, BatchMeta,
                                     BatchName, BatchRules, GameRecord)
from training.go.coords import EMPTY, MAX_SIZE, MIN_SIZE, to_gtp
from training.go.rules import IllegalMove, Position, neighbors

log = logging.getLogger(__name__)

_BATCH_NAME_RE = re.compile(  # the worker part is the config's name rule: one rule for both
    rf"^(?P<worker>{WORKER_NAME_PATTERN})_(?P<gen>\d{{6,9}})_(?P<seq>\d{{8,12}})"
    + re.escape(BATCH_SUFFIX) + "$")


# ------------------------------------------------------------------------------------ names


def batch_name(worker: str, generation: int, seq: int) -> str:
    """The file name of a batch: "<worker>_<gen:06d>_<seq:08d>.npz.zst"."""
    name = f"{worker}_{generation:06d}_{seq:08d}{BATCH_SUFFIX}"
    parse_batch_name(name)  # one rule for what a valid name is
    return name


class OutboxOverflow(ValueError):
    """An outbox holds more entries than its reader's cap (`outbox_batches(max_entries=)`)."""


def outbox_batches(outbox: str | os.PathLike, *, max_entries: int | None = None) -> list[str]:
    """Names of complete batch files in an outbox (temporary and partial names skipped).

    With `max_entries`, OutboxOverflow once the folder lists more entries of any kind (the
    listing stops there: a flood of junk costs bounded time and memory)."""
    names = []
    try:
        with os.scandir(outbox) as it:
            for count, entry in enumerate(it, 1):
                if max_entries is not None and count > max_entries:
                    raise OutboxOverflow(f"{outbox}: more than {max_entries} entries")
                names.append(entry.name)
    except FileNotFoundError:
        return []
    return batch_names_among(names)


def batch_names_among(names: Sequence[str]) -> list[str]:
    """The complete batch file names among `names`, sorted (temporary and dot names out)."""
    return sorted(n for n in names if not n.startswith(".") and n.endswith(BATCH_SUFFIX))


def parse_batch_name(name: str) -> BatchName:
    """Split a batch file name into (worker, generation, seq); ValueError for anything else."""
    if not isinstance(name, str) or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"{name!r} is not a bare batch file name (no folders allowed)")
    m = _BATCH_NAME_RE.match(name)
    if m is None:
        raise ValueError(
            f"{name!r} is not a batch file name: expected <worker>_<gen:06d>_<seq:08d>"
            f"{BATCH_SUFFIX}, worker made of letters, digits, '_' and '-' (at most 64)"
        )
    return BatchName(m["worker"], int(m["gen"]), int(m["seq"]))


def batch_name_or_none(name: str) -> BatchName | None:
    """(worker, generation, seq) of a batch file name, or None for anything else."""
    try:
        return parse_batch_name(name)
    except ValueError:
        return None


# ------------------------------------------------------------------------------------ write

_GAME_DTYPES = {
    "result": np.int8,
    "score": np.float32,
    "resigned": np.bool_,
    "resign_disabled": np.bool_,
    "would_resign_as": np.int8,
    "board_size": np.int16,
    "komi": np.float32,
    "generation": np.int32,
    "seed": np.int64,
    "simulations": np.int32,
}
_MOVE_DTYPES = {
    "moves": np.int16, "visits": np.uint16, "values": np.float16, "full_search": np.bool_,
    "surprise": np.float16,
}
_ARRAYS = {"meta", "offsets", *_GAME_DTYPES, *_MOVE_DTYPES}
_OPTIONAL_ARRAYS = {"full_search": True, "surprise": 0.0}
"""Per-move arrays that older batches lack, and the value `_load_npz` fills them with (and
`encode_batch` writes for a record without them)."""
MAX_SURPRISE = 30.0
"""The largest surprise a batch may carry (nats; a prior floored at 1e-9 bounds it at 21)."""
POLICY_SCALE = 10_000
"""A Gumbel search's improved policy is stored in `visits` as round(p * POLICY_SCALE)."""
MAX_META_CHARS = 4096
"""The longest `meta` JSON a batch may hold (ours is about 200 characters); checked from the
array's header before it is decoded."""
_NPZ_SLACK_BYTES = 1 << 20
"""Room for the archive's and the arrays' headers and the meta, beside the arrays' data."""


def decompressed_bound(rules: "BatchRules", board_size: int) -> int:
    """The most bytes a batch that `rules` allow on this board can decompress to (its arrays
    at `max_games` games of `move_cap` moves, with room for headers), or `DEFAULT_MAX_BYTES`
    where the rules leave the counts open: the cap the zstd layer is decompressed under."""
    if rules.max_games is None or rules.move_cap is None:
        return DEFAULT_MAX_BYTES
    per_move = sum(np.dtype(t).itemsize for t in _MOVE_DTYPES.values())
    per_move += (board_size * board_size) * np.dtype(_MOVE_DTYPES["visits"]).itemsize
    per_game = sum(np.dtype(t).itemsize for t in _GAME_DTYPES.values()) + 8  # + an offset
    games = rules.max_games
    return min(DEFAULT_MAX_BYTES, games * (per_game + rules.move_cap * per_move)
               + _NPZ_SLACK_BYTES)


def encode_batch(records: Sequence[GameRecord], meta: BatchMeta) -> bytes:
    """The uncompressed .npz bytes of a batch (see the module docstring for the layout)."""
    p = meta.board_size**2 + 1
    lengths = [r.num_moves for r in records]
    offsets = np.zeros(len(records) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    arrays: dict[str, np.ndarray] = {
        "meta": np.array(json.dumps(asdict(meta), sort_keys=True)),
        "offsets": offsets,
    }
    for key, dtype in _MOVE_DTYPES.items():
        parts = [np.full(r.num_moves, _OPTIONAL_ARRAYS.get(key), dtype)
                 if getattr(r, key) is None else np.asarray(getattr(r, key)) for r in records]
        empty = np.zeros((0, p) if key == "visits" else (0,), dtype)
        arrays[key] = np.concatenate([empty, *[a.astype(dtype, copy=False) for a in parts]])
    for key, dtype in _GAME_DTYPES.items():
        arrays[key] = np.array([getattr(r, key) for r in records], dtype=dtype)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def write_batch(
    path: str | Path, records: Sequence[GameRecord], meta: BatchMeta, *, level: int = 3
) -> int:
    """Write a batch file atomically (temp name, then rename); returns its size in bytes."""
    data = compress_bytes(encode_batch(records, meta), level=level)
    write_atomic(path, data)
    log.debug("wrote %s games=%d bytes=%d", path, len(records), len(data))
    return len(data)


# ------------------------------------------------------------------------------------- read


def read_batch(
    path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES, max_generation: int | None = None,
    rules: BatchRules | None = None,
) -> tuple[BatchMeta, list[GameRecord]]:
    """Read and fully validate a batch file; BatchError names the file, game and reason."""
    batch = load_batch(path, max_bytes=max_bytes, max_generation=max_generation, rules=rules)
    return batch.meta, batch.records


def load_batch(
    path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES, max_generation: int | None = None,
    rules: BatchRules | None = None,
) -> Batch:
    """`read_batch`, also keeping each game's replayed boards (for the replay window)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise BatchError(path, f"cannot read the file: {e.strerror}", kind="unreadable") from e
    return decode_batch(raw, path, max_bytes=max_bytes, max_generation=max_generation,
                        rules=rules)


def decode_batch(
    raw: bytes,
    path: str | Path = "<bytes>",
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_generation: int | None = None,
    rules: BatchRules | None = None,
) -> Batch:
    """Validate the compressed bytes of a batch file; `path` is used in error messages.

    With `rules` (the run's config), the batch is held to them instead of its own meta."""
    rules = rules or BatchRules()
    started = time.thread_time()
    try:
        data = decompress_bytes(raw, max_bytes)
    except DecompressionLimitError as e:
        raise BatchError(
            path,
            f"decompresses to more than {max_bytes} bytes (a corrupt file or a decompression "
            "bomb); rejected",
            kind="too_large",
        ) from e
    except TransferError as e:
        raise BatchError(
            path, f"not a valid zstd file (truncated or corrupt): {e}", kind="corrupt_zstd"
        ) from e
    arrays = _load_npz(data, path, max_bytes, rules)
    meta = _parse_meta(arrays.pop("meta"), path)
    _check_name(path, meta)
    if max_generation is not None and meta.generation > max_generation:
        raise BatchError(
            path,
            f"generation {meta.generation} is newer than the newest published model "
            f"({max_generation}); the batch is not from this run",
            kind="generation_too_new",
        )
    _check_rules(meta, rules, path)
    offsets = _check_arrays(arrays, meta, path)
    if rules.max_games is not None and len(offsets) - 1 > rules.max_games:
        raise BatchError(path, f"{len(offsets) - 1} games, more than this run's batches hold "
                         f"({rules.max_games})", kind="too_many_games")
    _check_values(arrays, meta, path, max_generation, rules.max_simulations)
    records, boards = [], []
    for g in range(len(offsets) - 1):
        if rules.cpu_budget_s is not None and time.thread_time() - started > rules.cpu_budget_s:
            raise BatchError(path, f"validation used more than its {rules.cpu_budget_s:g} CPU "
                             f"seconds (at game {g} of {len(offsets) - 1})", kind="too_slow")
        a, b = int(offsets[g]), int(offsets[g + 1])
        rec = GameRecord(
            board_size=int(arrays["board_size"][g]),
            komi=float(arrays["komi"][g]),
            moves=arrays["moves"][a:b],
            visits=arrays["visits"][a:b],
            result=int(arrays["result"][g]),
            score=float(arrays["score"][g]),
            resigned=bool(arrays["resigned"][g]),
            resign_disabled=bool(arrays["resign_disabled"][g]),
            would_resign_as=int(arrays["would_resign_as"][g]),
            generation=int(arrays["generation"][g]),
            seed=int(arrays["seed"][g]),
            simulations=int(arrays["simulations"][g]),
            values=arrays["values"][a:b],
            full_search=arrays["full_search"][a:b],
            surprise=arrays["surprise"][a:b],
        )
        boards.append(_replay_checked(rec, meta.move_cap, path, g,
                                      early_pass=rules.early_pass))
        records.append(rec)
    return Batch(meta, records, boards)


def _check_counts(zf: zipfile.ZipFile, path: str | Path, rules: BatchRules) -> None:
    """The meta's length, and the run's games-per-batch and move cap, checked on the arrays'
    headers before any array is decoded: a batch of too many games or moves, or a meta of
    megabytes, costs no more than its headers."""
    header = _npy_header(zf, "meta.npy", path)
    if header is not None:
        shape, dtype = header
        if shape != () or dtype.kind != "U":
            raise BatchError(path, "meta must be a 0-d unicode array of JSON", kind="bad_meta")
        if dtype.itemsize > 4 * MAX_META_CHARS:
            raise BatchError(path, f"meta of {dtype.itemsize // 4} characters, more than "
                             f"{MAX_META_CHARS}", kind="bad_meta")
    if rules.max_games is None:
        return
    limits = {"offsets.npy": rules.max_games + 1}
    if rules.move_cap is not None:
        for key in _MOVE_DTYPES:
            limits[f"{key}.npy"] = rules.max_games * rules.move_cap
    for member, most in limits.items():
        header = _npy_header(zf, member, path)
        if header is None:
            continue  # a missing array is named by the full read
        shape = header[0]
        count = shape[0] if isinstance(shape, tuple) and shape else 0
        if isinstance(count, int) and count > most:
            what = (f"{count - 1} games, more than this run's batches hold ({rules.max_games})"
                    if member == "offsets.npy" else
                    f"{count} moves in {member[:-4]}, more than {rules.max_games} games of "
                    f"at most {rules.move_cap} moves")
            raise BatchError(path, what, kind="too_many_games")


def _npy_header(zf: zipfile.ZipFile, member: str, path: str | Path
                ) -> tuple[Any, np.dtype] | None:
    """(shape, dtype) from the header of the archive's `member`, or None if it has none."""
    try:
        with zf.open(member) as f:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0,
                    (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read is None:
                raise ValueError(f"npy format version {version} (1.0 and 2.0 are read)")
            shape, _, dtype = read(f)
            return shape, dtype
    except KeyError:
        return None
    except (ValueError, OSError, EOFError, SyntaxError, zipfile.BadZipFile,
            NotImplementedError, TypeError) as e:
        raise BatchError(path, f"unreadable npz archive: {member}: {e}", kind="not_npz") from e


def _load_npz(data: bytes, path: str | Path, max_bytes: int,
              rules: BatchRules | None = None) -> dict[str, np.ndarray]:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        if data[:1] == b"\x80":  # pickle protocol 2+ opcode
            raise BatchError(
                path, "holds a pickle, not an npz archive; pickles are never loaded",
                kind="pickle",
            ) from None
        raise BatchError(path, "the decompressed data is not an npz archive", kind="not_npz") \
            from None
    with zf:
        declared = sum(i.file_size for i in zf.infolist())
        if rules is not None and declared <= max_bytes:
            _check_counts(zf, path, rules)
    if declared > max_bytes:  # members compressed inside the zip: a second bomb layer
        raise BatchError(
            path,
            f"npz members declare {declared} bytes, more than the limit of {max_bytes}",
            kind="too_large",
        )
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            names = set(npz.files)
            missing = sorted(_ARRAYS - set(_OPTIONAL_ARRAYS) - names)
            extra = sorted(names - _ARRAYS)
            if missing:
                raise BatchError(
                    path, f"missing arrays {', '.join(missing)}", kind="missing_array"
                )
            if extra:
                raise BatchError(
                    path, f"unexpected arrays {', '.join(extra)}", kind="unexpected_array"
                )
            for key in sorted(names):
                arrays[key] = npz[key]
    except BatchError:
        raise
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise BatchError(
                path,
                "an array holds Python objects (a pickle); pickles are never loaded",
                kind="pickle",
            ) from e
        raise BatchError(path, f"unreadable npz archive: {e}", kind="not_npz") from e
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise BatchError(path, f"unreadable npz archive: {e}", kind="not_npz") from e
    moves = arrays["moves"]
    for key, fill in _OPTIONAL_ARRAYS.items():  # an older batch: full searches, no surprise
        if key not in arrays:
            arrays[key] = np.full(len(moves) if moves.ndim == 1 else 0, fill, _MOVE_DTYPES[key])
    return arrays


def _parse_meta(arr: np.ndarray, path: str | Path) -> BatchMeta:
    if arr.shape != () or arr.dtype.kind != "U":
        raise BatchError(path, "meta must be a 0-d unicode array of JSON", kind="bad_meta")
    try:
        raw = json.loads(str(arr))
    except json.JSONDecodeError as e:
        raise BatchError(path, f"meta is not valid JSON: {e}", kind="bad_meta") from e
    if not isinstance(raw, dict):
        raise BatchError(path, "meta must be a JSON object", kind="bad_meta")
    types = {
        "worker": str, "generation": int, "board_size": int, "komi": (int, float),
        "simulations": int, "max_moves": int, "rules": str, "created": (int, float),
        "version": int,
    }
    if set(raw) != set(types):
        raise BatchError(
            path,
            f"meta keys {sorted(raw)} differ from the expected {sorted(types)}",
            kind="bad_meta",
        )
    for key, tp in types.items():
        if not isinstance(raw[key], tp) or isinstance(raw[key], bool):
            raise BatchError(path, f"meta.{key} has the wrong type: {raw[key]!r}", kind="bad_meta")
    meta = BatchMeta(**raw)
    problems = []
    if meta.version != FORMAT_VERSION:
        problems.append(f"format version {meta.version} (this reader knows {FORMAT_VERSION})")
    if meta.rules != RULES:
        problems.append(f"rules {meta.rules!r} (expected {RULES!r})")
    if not MIN_SIZE <= meta.board_size <= MAX_SIZE:
        problems.append(f"board size {meta.board_size} outside {MIN_SIZE}..{MAX_SIZE}")
    if not (math.isfinite(meta.komi) and abs(meta.komi) <= 1000 and meta.komi * 2 % 1 == 0):
        problems.append(f"komi {meta.komi} is not a multiple of 0.5")
    if meta.generation < 0 or meta.simulations < 1 or meta.max_moves < 0:
        problems.append("negative generation, max_moves or simulations < 1")
    if not _plausible_time(meta.created):
        problems.append(f"created {meta.created!r} is not a time up to a day from now")
    if problems:
        raise BatchError(path, "bad meta: " + "; ".join(problems), kind="bad_meta")
    return meta


def _plausible_time(t: float) -> bool:
    """A Unix time from 1970 up to FUTURE_SLACK_S from now (a huge int is not one)."""
    try:
        return math.isfinite(t) and 0 <= t <= time.time() + FUTURE_SLACK_S
    except OverflowError:
        return False


def _check_rules(meta: BatchMeta, rules: BatchRules, path: str | Path) -> None:
    """The run's rules against what the batch says of itself."""
    if rules.move_cap is not None and meta.move_cap != rules.move_cap:
        raise BatchError(path, f"played under a move cap of {meta.move_cap}, this run's is "
                         f"{rules.move_cap} (go.max_moves); check the worker's config",
                         kind="move_cap_mismatch")
    if rules.max_simulations is not None and meta.simulations > rules.max_simulations:
        raise BatchError(path, f"claims {meta.simulations} simulations, more than this run "
                         f"allows ({rules.max_simulations})", kind="bad_simulations")


def _check_name(path: str | Path, meta: BatchMeta) -> None:
    """If the file has a batch name, it must agree with the meta inside."""
    try:
        name = parse_batch_name(Path(path).name)
    except ValueError:
        return  # a partial download or a test file: nothing to compare
    if name.worker != meta.worker or name.generation != meta.generation:
        raise BatchError(
            path,
            f"file name says worker {name.worker!r} generation {name.generation}, "
            f"the meta inside says worker {meta.worker!r} generation {meta.generation}",
            kind="name_mismatch",
        )


def _check_arrays(arrays: dict[str, np.ndarray], meta: BatchMeta, path) -> np.ndarray:
    """Dtypes and shapes of every array; returns the offsets."""
    p = meta.board_size**2 + 1
    offsets = arrays["offsets"]
    if offsets.dtype != np.int64 or offsets.ndim != 1 or len(offsets) < 1:
        raise BatchError(path, f"offsets must be int64 [G+1], got {offsets.dtype} "
                         f"{list(offsets.shape)}", kind="dtype")
    n_games = len(offsets) - 1
    if arrays["moves"].ndim != 1:
        raise BatchError(path, f"array moves has shape {list(arrays['moves'].shape)}, expected "
                         "[M] (the moves of every game, concatenated)", kind="shape")
    n_moves = len(arrays["moves"])
    if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != n_moves:
        raise BatchError(
            path,
            f"offsets must rise from 0 to the number of moves ({n_moves})",
            kind="offsets",
        )
    _check_visit_values(arrays["visits"], offsets, path)
    expected = {key: (dt, (n_moves,)) for key, dt in _MOVE_DTYPES.items()}
    expected["visits"] = (np.uint16, (n_moves, p))
    expected.update({key: (dt, (n_games,)) for key, dt in _GAME_DTYPES.items()})
    for key, (dtype, shape) in expected.items():
        arr = arrays[key]
        if arr.dtype != dtype:
            raise BatchError(
                path, f"array {key} has dtype {arr.dtype}, expected {np.dtype(dtype)}",
                kind="dtype",
            )
        if arr.shape != shape:
            raise BatchError(
                path,
                f"array {key} has shape {list(arr.shape)}, expected {list(shape)} "
                f"({n_games} games, {n_moves} moves, board {meta.board_size})",
                kind="shape",
            )
    return offsets


def _game_of(offsets: np.ndarray, row: int) -> int:
    return int(np.searchsorted(offsets, row, side="right") - 1)


def _check_visit_values(visits: np.ndarray, offsets: np.ndarray, path) -> None:
    """NaN, negative, fractional and overflowing visit counts, before the dtype check."""
    if visits.dtype.kind not in "uif":
        raise BatchError(path, f"visits has dtype {visits.dtype}, expected uint16", kind="dtype")
    if visits.ndim != 2:
        return  # the shape check names it
    checks = []
    if visits.dtype.kind == "f":
        checks.append((~np.isfinite(visits), "NaN or infinite visit count", "visits_nan"))
    if visits.dtype.kind in "if":
        checks.append((visits < 0, "negative visit count", "visits_negative"))
    if visits.dtype.kind == "f":
        checks.append((visits != np.floor(visits), "fractional visit count", "visits_fraction"))
    if visits.dtype.itemsize > 2 or visits.dtype.kind == "f":
        checks.append((visits > 65535, "visit count over 65535 (uint16 overflow)",
                       "visits_overflow"))
    for bad, what, kind in checks:
        with np.errstate(invalid="ignore"):
            rows = np.flatnonzero(bad.any(axis=1))
        if len(rows):
            g = _game_of(offsets, int(rows[0]))
            t = int(rows[0] - offsets[g]) if 0 <= g < len(offsets) else int(rows[0])
            raise BatchError(path, f"{what} at move {t}", kind=kind, game=g)


def _check_values(arrays, meta: BatchMeta, path, max_generation: int | None,
                  max_simulations: int | None = None) -> None:
    """Ranges of per-move and per-game values (vectorised over the whole batch)."""
    offsets = arrays["offsets"]
    p = meta.board_size**2 + 1

    def first(bad: np.ndarray, per_move: bool) -> tuple[int, str]:
        i = int(np.flatnonzero(bad)[0])
        if per_move:
            g = _game_of(offsets, i)
            return g, f" at move {i - int(offsets[g])}"
        return i, ""

    moves, visits, values = arrays["moves"], arrays["visits"], arrays["values"]
    games = {k: arrays[k] for k in _GAME_DTYPES}
    per_move = [
        ((moves < 0) | (moves >= p), f"move outside 0..{p - 1} (PASS = {p - 1})", "move_range"),
        (visits.sum(axis=1, dtype=np.int64) == 0, "policy with no visits (sums to 0)",
         "empty_policy"),
        (visits[np.arange(len(moves)), np.clip(moves, 0, p - 1)] == 0,
         "the move played has no visits (the policy target disagrees with the move)",
         "unvisited_move"),
        (~np.isfinite(values) | (np.abs(values) > 1), "root value not finite or outside [-1, 1]",
         "bad_value"),
        (~np.isfinite(arrays["surprise"]) | (arrays["surprise"] < 0)
         | (arrays["surprise"] > MAX_SURPRISE),
         f"surprise not finite or outside [0, {MAX_SURPRISE:g}]", "bad_surprise"),
        ((arrays["surprise"] != 0) & ~arrays["full_search"],
         "a fast search carries a surprise (it has no policy target)", "bad_surprise"),
    ]
    per_game = [
        (games["board_size"] != meta.board_size,
         f"board size differs from the batch's {meta.board_size}", "board_size_mismatch"),
        (games["komi"] != np.float32(meta.komi), f"komi differs from the batch's {meta.komi}",
         "komi_mismatch"),
        (~np.isin(games["result"], (-1, 0, 1)), "result must be -1, 0 or +1", "bad_result"),
        (games["generation"] < 0, "negative generation", "bad_generation"),
        (games["simulations"] < 1, "simulations < 1", "bad_simulations"),
        (~np.isin(games["would_resign_as"], (-1, 0, 1))
         | ((games["would_resign_as"] != 0) & ~games["resign_disabled"])
         | (games["resigned"] & games["resign_disabled"]),
         "inconsistent resignation flags (resigned with resignation disabled, or "
         "would_resign_as set while resignation was enabled)", "resign_flags"),
        (games["resigned"] & (games["result"] == 0), "a resigned game cannot be a draw",
         "bad_result"),
        (games["resigned"] != np.isnan(games["score"]),
         "score must be NaN exactly when the game was resigned", "bad_score"),
        (np.diff(offsets) > meta.move_cap, f"more moves than the move cap {meta.move_cap}",
         "after_end"),
    ]
    if max_simulations is not None:
        per_game.append((games["simulations"] > max_simulations,
                         f"more simulations than this run allows ({max_simulations})",
                         "bad_simulations"))
    if max_generation is not None:
        per_game.insert(0, (games["generation"] > max_generation,
                            f"generation newer than the newest model {max_generation}",
                            "generation_too_new"))
    for bad, what, kind, is_move in [(*c, True) for c in per_move] + [
        (*c, False) for c in per_game
    ]:
        if bad.any():
            g, where = first(bad, is_move)
            raise BatchError(path, what + where, kind=kind, game=g)


def _replay_checked(rec: GameRecord, move_cap: int, path, g: int, *,
                    early_pass: bool = True) -> np.ndarray:
    """Replay one game through the reference rules; boards int8 [T+1, N*N]. `early_pass`
    False: a first pass while a real move is left is refused (`BatchRules.early_pass`)."""
    n = rec.board_size
    pos = Position(n, rec.komi, max_moves=move_cap)
    for t, move in enumerate(rec.moves.tolist()):
        if pos.is_over():
            raise BatchError(
                path, f"move {t} is played after the game ended ({_end_reason(pos)})",
                kind="after_end", game=g,
            )
        if not early_pass and move == pos.pass_move and pos.passes == 0:
            real = _real_move(pos)
            if real is not None:
                raise BatchError(
                    path, f"move {t} passes first while {to_gtp(real, n)} was left; this run's "
                    "self-play never does (self_play.early_pass: false)", kind="early_pass",
                    game=g,
                )
        try:
            pos.play(move)
        except IllegalMove as e:
            raise BatchError(path, f"move {t}: {e}", kind="illegal_move", game=g) from e
    boards = np.array(pos.boards, dtype=np.int8)
    # the policy target may only put visits on empty points (or pass)
    occupied = boards[:-1] != 0
    if np.any(rec.visits[:, :-1][occupied]):
        t = int(np.flatnonzero((rec.visits[:, :-1] * occupied).any(axis=1))[0])
        raise BatchError(path, f"visits on an occupied point at move {t}",
                         kind="visits_on_occupied", game=g)
    if rec.resigned:
        if pos.is_over():
            raise BatchError(path, f"resigned after the game had ended ({_end_reason(pos)})",
                             kind="after_end", game=g)
        if rec.result != -pos.to_play:  # the side to move is the one that resigns
            raise BatchError(path, f"result {rec.result:+d} of a resignation: the side to move "
                             f"({pos.to_play:+d}) resigned, so {-pos.to_play:+d} won",
                             kind="result_mismatch", game=g)
        return boards
    if not pos.is_over():
        raise BatchError(
            path, f"the game stops after {len(rec.moves)} moves without two passes, the move "
            f"cap ({move_cap}) or a resignation", kind="unfinished", game=g,
        )
    score = pos.score()
    if not math.isclose(rec.score, score, abs_tol=1e-3):
        raise BatchError(path, f"score {rec.score:g} disagrees with the replayed Tromp-Taylor "
                         f"score {score:g}", kind="score_mismatch", game=g)
    expected = (score > 0) - (score < 0)
    if rec.result != expected:
        raise BatchError(path, f"result {rec.result:+d} disagrees with the replayed score "
                         f"{score:g}", kind="result_mismatch", game=g)
    return boards


def _real_move(pos: Position) -> int | None:
    """A legal move of the side to move that does not fill one of its own single-point
    eyes, or None: the moves after which self-play may pass first (`Mcts(early_pass=False)`)."""
    n, board, me = pos.size, pos.board, pos.to_play
    around = neighbors(n)
    for p in range(n * n):
        if board[p] != EMPTY:
            continue
        if all(board[q] == me for q in around[p]):
            continue  # an own eye
        if pos.is_legal(p):
            return p
    return None


def _end_reason(pos: Position) -> str:
    return "two passes" if pos.passes >= 2 else f"move cap {pos.max_moves}"


def replay_boards(record: GameRecord, max_moves: int | None = None) -> np.ndarray:
    """The board before each move and after the last, int8 [T+1, N*N]; IllegalMove if bad."""
    pos = Position(record.board_size, record.komi, max_moves=max_moves)
    for move in record.moves.tolist():
        pos.play(move)
    return np.array(pos.boards, dtype=np.int8)


def random_record(
    board_size: int,
    komi: float,
    rng: np.random.Generator,
    *,
    max_moves: int | None = None,
    pass_prob: float = 0.02,
    generation: int = 0,
    simulations: int = 16,
    seed: int = 0,
    honest_passes: bool = False,
) -> GameRecord:
    """A random legal finished game with plausible visit counts (tests and stand-ins).

    Moves are random empty points that the rules accept, passes with `pass_prob` (always once
    no tried point is legal); visits go to the move played and a few other empty points.
    `honest_passes`: as the run's self-play plays (`BatchRules.early_pass` false): moves are
    random points that do not fill an own single-point eye, and a side passes only when no
    such move is legal, or in reply to a pass.
    """
    n = board_size
    p = n * n + 1
    pos = Position(n, komi, max_moves=max_moves)
    visits_rows = []
    while not pos.is_over():
        board = np.array(pos.board, dtype=np.int8)
        empty = np.flatnonzero(board == 0)
        move = n * n
        if honest_passes:
            if pos.passes == 0:
                around = neighbors(n)
                for q in rng.permutation(empty).tolist():
                    if not all(pos.board[r] == pos.to_play for r in around[q]) \
                            and pos.is_legal(q):
                        move = q
                        break
        elif rng.random() >= pass_prob:
            for q in rng.permutation(empty)[:8].tolist():
                if pos.is_legal(q):
                    move = q
                    break
        row = np.zeros(p, np.uint16)
        extra = rng.choice(np.append(empty, n * n), size=min(3, len(empty) + 1), replace=False)
        row[extra] = rng.integers(1, simulations, size=len(extra), dtype=np.uint16)
        row[move] += simulations
        visits_rows.append(row)
        pos.play(move)
    score = pos.score()
    t = len(pos.moves)
    return GameRecord(
        board_size=n,
        komi=float(komi),
        moves=np.array(pos.moves, dtype=np.int16),
        visits=np.array(visits_rows, dtype=np.uint16).reshape(t, p),
        result=int((score > 0) - (score < 0)),
        score=float(score),
        resigned=False,
        resign_disabled=False,
        would_resign_as=0,
        generation=generation,
        seed=seed,
        simulations=simulations,
        values=rng.uniform(-1, 1, size=t).astype(np.float16),
    )
