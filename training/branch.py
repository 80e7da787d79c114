"""A new run folder that goes on from generation N of another run, as that run stood when
generation N was its newest model (`start_main.py --from-run DIR --from-generation N`).

    python start_main.py --from-run runs/main --from-generation 63 --run-dir runs/g63 --lr 0.002

What the new folder holds, from the source:
  - config.yaml (the coach refuses a board or net other than it, as on any resume);
  - every model file of generations 0..N (N must be published: its manifest exists), every
    checkpoint and round result of generations 0..N (the trainer resumes from checkpoint N:
    its weights, optimizer, global step and so the LR schedule);
  - the game batches the run had ingested before generation N+1 went out (the ledger's
    `coach_generation` <= N; a line of an older ledger without it: its batch's generation
    <= N), their sidecars, and their ledger lines: the replay window and the games count as
    they were;
  - the metrics rows of generations 0..N.
Not: other ledger lines, quarantine/, incoming/, the local workers' folders, strength
evaluations, the status page. Files that are never rewritten (models, checkpoints, batches,
sidecars) are hard links where the file system allows, else copies; the rest are written
anew. The folder is built beside the destination under a temporary name and renamed into
place at the end, so a half-built branch never looks like a run. The source is only read,
and may have a coach running on it.

It must not: change the source, or write into a destination that exists.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from distributed.transfer import write_atomic
from training.fleet.ledger import LedgerEntry
from training.go.records import BATCH_SUFFIX, batch_name_or_none
from training.learn.replay_buffer import sidecar_dir
from training.run import metrics, model_store
from training.run.run_dir import RunDir

log = logging.getLogger(__name__)

_GENERATION_RE = re.compile(r"^(?:model|checkpoint|round)_(\d{6,})\.")


class BranchError(ValueError):
    """The branch cannot be made; the message names the folder or the generation."""


@dataclass(frozen=True)
class Branched:
    """What a branch took from its source."""

    generation: int
    models: int  # model files (of generations 0..N)
    checkpoints: int
    batches: int
    games: int
    positions: int
    metrics_rows: int


def branch_run(source: str | os.PathLike, dest: str | os.PathLike,
               generation: int) -> Branched:
    """Make `dest` a run folder that resumes at `generation` of the run in `source`."""
    src, dst = RunDir(source), RunDir(dest)
    if not src.root.is_dir() or not src.config.is_file():
        raise BranchError(f"--from-run {src.root}: not a run folder (no {src.config.name})")
    if dst.root.exists() or dst.root.is_symlink():
        raise BranchError(f"{dst.root} exists; a branch starts a new run folder: name another "
                          "one with --run-dir")
    if dst.root.resolve().is_relative_to(src.root.resolve()):
        raise BranchError(f"{dst.root} is inside the source run folder {src.root}")
    published = model_store.list_manifests(src.models)
    if generation not in published:
        newest = f"the newest is {published[-1]}" if published else "none is"
        raise BranchError(f"--from-generation {generation}: not a published model of "
                          f"{src.root} ({newest})")
    if generation > 0 and not src.checkpoint(generation).is_file():
        raise BranchError(f"--from-generation {generation}: {src.checkpoint(generation)} is "
                          "missing, and training resumes from it; choose a generation whose "
                          "checkpoint exists")

    tmp = dst.root.with_name(f".{dst.root.name}.branch-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    part = RunDir(tmp).create()
    try:
        shutil.copy2(src.config, part.config)
        models = _link_generations(src.models, part.models, generation)
        checkpoints = _link_generations(src.checkpoints, part.checkpoints, generation)
        _link_generations(src.rounds, part.rounds, generation)
        entries = _kept_entries(src, generation)
        cache, part_cache = sidecar_dir(src.replay), sidecar_dir(part.replay)
        for e in entries:
            _link(src.replay / e.name, part.replay / e.name)
            stem = e.name[: -len(BATCH_SUFFIX)]
            if (cache / stem).is_dir():
                (part_cache / stem).mkdir(parents=True)
                for f in (cache / stem).iterdir():
                    if f.is_file() and not f.is_symlink():
                        _link(f, part_cache / stem / f.name)
        write_atomic(part.ledger, "".join(json.dumps(e.to_json(), sort_keys=True) + "\n"
                                          for e in entries))
        try:
            rows = [r for r in metrics.read_metrics(src.root) if r["generation"] <= generation]
        except metrics.MetricsError as e:
            raise BranchError(f"--from-run: {e}") from e
        metrics.write_rows(part.root, rows)
        os.rename(tmp, dst.root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    done = Branched(generation, models, checkpoints, len(entries),
                    sum(e.games for e in entries), sum(e.positions for e in entries),
                    len(rows))
    log.info("branched %s at generation %d into %s: %d model files, %d checkpoints, %d batches "
             "(%d games, %d positions), %d metrics rows", src.root, generation, dst.root,
             done.models, done.checkpoints, done.batches, done.games, done.positions,
             done.metrics_rows)
    return done


def _kept_entries(src: RunDir, generation: int) -> list[LedgerEntry]:
    """The ingested batches of the source's ledger from before generation+1 went out, whose
    file is in its replay folder; torn or unreadable lines are left out (as the collector
    does)."""
    try:
        lines = src.ledger.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []
    kept, seen = [], set()
    for line in lines:
        try:
            e = LedgerEntry.from_json(json.loads(line))
        except (ValueError, TypeError):  # json.JSONDecodeError is a ValueError
            continue
        when = e.coach_generation if e.coach_generation >= 0 else e.generation
        if (e.ingested and 0 <= when <= generation and e.name not in seen
                and batch_name_or_none(e.name) is not None
                and (src.replay / e.name).is_file()):
            kept.append(e)
            seen.add(e.name)
    return kept


def _link_generations(folder: Path, into: Path, generation: int) -> int:
    """Link the files of generations 0..`generation` (by name) from `folder` into `into`."""
    n = 0
    for f in sorted(folder.iterdir()) if folder.is_dir() else []:
        m = _GENERATION_RE.match(f.name)
        if m and int(m.group(1)) <= generation and f.is_file() and not f.is_symlink():
            _link(f, into / f.name)
            n += 1
    return n


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed: a copy
        shutil.copy2(src, dst)
