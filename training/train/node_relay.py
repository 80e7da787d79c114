"""Training nodes without shared files: every rank starts from rank 0's window and checkpoint.

A rank started with a cache folder (`--cache-dir`, the coach's extra training nodes) does not
see rank 0's run folder. Rank 0 then sends it, over the process group itself, the batch files
of the window and the file the round starts from; nothing else crosses, and a round whose
ranks all share run_dir sends nothing. Owns `open_replay_window` (the same replay window on
every rank), `resolve_start_shared` (the same starting checkpoint or model on every rank),
and the relay under them: `relay_files`, `any_receiver`, `prune_cache`. `build_window` is the
one place a trainer builds a `ReplayWindow` from the config (a round's, here, and the
long-lived trainer's).

A receiver asks for files by setting bits over rank 0's own list of names, so a peer cannot
name a file rank 0 would read (`../../secret.txt` is not in it); names and sizes travel as
JSON (ddp.broadcast_json), file contents as uint8 tensors checked by sha256. Nothing is
unpickled.

Cache folder layout: <cache_dir>/replay/ (the window's batch files and their sidecars) and
<cache_dir>/start/ (the one file the round starts from); files that left the window are pruned.

It must not: write into rank 0's run folder, send a file that is not in rank 0's own list, or
choose the window or the starting file itself (the replay window and train_state do).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch

from configs import Config
from distributed.transfer import write_atomic
from training.learn.training_error import TrainingError
from training.run.run_dir import RunDir
from training.train.ddp import (DistContext, all_reduce_max_, all_reduce_sum, broadcast_,
                                broadcast_json)
from training.train.train_state import load_start, resolve_start, start_file

if TYPE_CHECKING:
    from training.learn.replay_buffer import ReplayWindow

log = logging.getLogger(__name__)

RELAY_CHUNK_BYTES = 32 << 20


# -------------------------------------------------------------- the same inputs on every rank


def build_window(cfg: Config, replay_dir: Path, files: Sequence[str] | None) -> ReplayWindow:
    """The replay window over `replay_dir` as the config says (the run's seed, worker
    weights, history, board and liberty planes), of `files` when given, else of the newest."""
    from training.learn.replay_buffer import WINDOW_SHARE_SLACK, ReplayWindow

    return ReplayWindow(replay_dir, cfg.replay, cfg.net.history, cfg.go.board_size,
                        seed=cfg.run.seed, files=files,
                        worker_weights=cfg.distributed.worker_weights,
                        share_slack=WINDOW_SHARE_SLACK, liberties=cfg.net.liberties)


def open_replay_window(cfg: Config, run_dir: Path, ctx: DistContext,
                       cache_dir: Path | None = None) -> ReplayWindow:
    """replay_buffer.ReplayWindow over run_dir/replay, the same on every rank.

    Rank 0 builds the window (and any missing sidecars) first; the others then open exactly
    the batch files rank 0 chose, so batches that arrive meanwhile cannot make them differ.
    A rank given `cache_dir` (a training node without rank 0's run folder) opens its window
    over cache_dir/replay instead, after rank 0 sent it the chosen files it lacks there.
    """
    replay_dir = RunDir(run_dir).replay if cache_dir is None else cache_dir / "replay"
    window = build_window(cfg, replay_dir, None) if ctx.is_main else None
    names = [window.names() if window is not None else None]
    if ctx.is_distributed:
        names = [broadcast_json(names[0], ctx)]
        if any_receiver(ctx, cache_dir):
            replay_dir.mkdir(parents=True, exist_ok=True)
            relay_files(ctx, RunDir(run_dir).replay, names[0],
                        replay_dir if cache_dir is not None else None)
            if cache_dir is not None and ctx.local_rank == 0:
                prune_cache(replay_dir, names[0])
        if window is None:
            window = build_window(cfg, replay_dir, names[0])
    assert window is not None
    if len(window) == 0:
        raise TrainingError(
            f"{replay_dir}: the replay window holds no positions; self-play batches must be "
            "ingested first (or pass --samples FILE.npz)"
        )
    return window


def resolve_start_shared(run_dir: Path, checkpoint: str | os.PathLike | None,
                         ctx: DistContext, cache_dir: Path | None
                         ) -> tuple[dict | None, dict | None, int]:
    """train_state.resolve_start, where rank 0 picks the file and sends it to ranks with a
    cache folder (so the optimizer, schedule, data position and RNG states resume the same
    everywhere). Collective: every rank calls it."""
    if not ctx.is_distributed or not any_receiver(ctx, cache_dir):
        return resolve_start(run_dir, checkpoint)
    choice: Any = None
    if ctx.is_main:
        kind, path, gen = start_file(run_dir, checkpoint)
        choice = (kind, None if path is None else str(path), gen)
    kind, path, gen = broadcast_json(choice, ctx)
    src = Path(path) if path is not None else None
    dest = None if cache_dir is None else cache_dir / "start"
    if dest is not None:
        dest.mkdir(parents=True, exist_ok=True)
    if src is not None:
        relay_files(ctx, src.parent, [src.name], dest)
        if dest is not None:
            if ctx.local_rank == 0:
                prune_cache(dest, [src.name])
            src = dest / src.name
    if cache_dir is None and not ctx.is_main:
        return resolve_start(run_dir, checkpoint)
    return load_start(kind, src, gen)


# ------------------------------------------------------------------------------- the relay


def any_receiver(ctx: DistContext, cache_dir: Path | None) -> bool:
    """True when some rank has a cache folder (collective: every rank must call it)."""
    flags = all_reduce_sum([1.0 if cache_dir is not None else 0.0], ctx)
    return flags[0] > 0


def relay_files(ctx: DistContext, src_dir: Path, names: list[str],
                dest_dir: Path | None) -> int:
    """Rank 0 broadcasts the files of `names` (from src_dir) that some receiver lacks; every
    rank with a dest_dir writes them there (atomically, sha256 checked). Returns bytes sent.

    Collective: every rank calls it with the same names (dest_dir None = not a receiver).
    """
    # A receiver sets bit i for names[i] it lacks; the union is a MAX all-reduce. Rank 0 then
    # sends only files of ITS OWN list: nothing a peer sends can name another file.
    if not names:  # the same list on every rank (rank 0's, broadcast)
        return 0
    missing = [] if dest_dir is None else [n for n in names if not (dest_dir / n).exists()]
    mask = torch.zeros(len(names), dtype=torch.int32, device=ctx.device)
    if missing:
        wanted_set = set(missing)
        mask[[i for i, n in enumerate(names) if n in wanted_set]] = 1
    all_reduce_max_(mask, ctx)
    wanted = [names[i] for i in mask.nonzero().flatten().tolist()]
    for name in wanted:
        if not _is_plain_file_name(name):
            raise TrainingError(f"rank {ctx.rank}: {name!r} is not a plain file name; refusing "
                                "to relay it")
    if not wanted:
        return 0
    total = 0
    for name in wanted:
        data = None
        meta = None  # (size, sha256) from rank 0, which reads each file once
        if ctx.is_main:
            data = (src_dir / name).read_bytes()
            meta = (len(data), hashlib.sha256(data).hexdigest())
        size, digest = broadcast_json(meta, ctx)
        buf = bytearray() if not ctx.is_main else None
        for lo in range(0, size, RELAY_CHUNK_BYTES):
            n = min(RELAY_CHUNK_BYTES, size - lo)
            if ctx.is_main:
                t = torch.frombuffer(bytearray(data[lo:lo + n]), dtype=torch.uint8)
                t = t.to(ctx.device)
            else:
                t = torch.empty(n, dtype=torch.uint8, device=ctx.device)
            broadcast_(t, ctx)
            if buf is not None:
                buf += t.cpu().numpy().tobytes()
        total += size
        if dest_dir is not None and name in missing:
            got = bytes(buf)
            if hashlib.sha256(got).hexdigest() != digest:
                raise TrainingError(f"rank {ctx.rank}: {name} arrived damaged from rank 0 "
                                    "(sha256 differs); run the round again")
            write_atomic(dest_dir / name, got)
    if ctx.is_main:
        log.info("relay: sent %d files, %.1f MB to the training nodes", len(wanted),
                 total / 1e6)
    return total


def _is_plain_file_name(name: Any) -> bool:
    return (isinstance(name, str) and bool(name) and name not in (".", "..")
            and "/" not in name and "\\" not in name and "\0" not in name)


def prune_cache(folder: Path, keep: list[str]) -> None:
    """Drop cached batch files (and their sidecars) that left the window."""
    from training.learn.replay_buffer import CACHE_DIR_NAME

    kept = set(keep)
    for p in folder.iterdir():
        if p.is_file() and not p.name.startswith(".") and p.name not in kept:
            p.unlink(missing_ok=True)
    stems = {n.split(".npz")[0] for n in kept}
    cars = folder / CACHE_DIR_NAME
    if cars.is_dir():
        for p in cars.iterdir():
            if p.is_dir() and not p.name.startswith(".") and p.name not in stems:
                shutil.rmtree(p, ignore_errors=True)
