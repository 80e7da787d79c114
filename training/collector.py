"""Exactly-once ingestion of game batches from worker outboxes into the run's replay folder.

Vocabulary:
  - batch name: `<worker>_<gen:06d>_<seq:08d>.npz.zst`, unique per worker; it is the
    idempotency key. A name is *known* once it is in `replay/` (ingested), in `quarantine/`
    (rejected) or in the ledger.
  - source: where a worker's outbox lives; a `BatchSource` lists, fetches and deletes
    batch files (a local folder in local mode, SFTP in distributed mode).
  - ledger: `run_dir/ledger.jsonl`, one JSON line per ingested or rejected batch (name,
    worker, generation, games, positions, sha256, status, time).

The steps for one batch, in this order, each safe to repeat after a crash:
  1. known name?  -> only delete the worker's copy (a coach that died after step 4 ends here);
  2. fetch to `incoming/<name>.partial`, check size (+ sha256 on the wire), rename to
     `incoming/<name>`;
  3. validate by replay (`records.read_batch`: every game through the rules) and check the
     board size and komi against the run's config; a bad batch goes to `quarantine/` with
     `<name>.reason.txt` and is counted against its worker;
  4. `os.replace` into `replay/<name>` (atomic: the replay window sees all or nothing);
  5. append the ledger line (fsync);
  6. delete the worker's copy.
On start, files in `replay/` or `quarantine/` missing from the ledger (a crash between 4 and 5)
get their ledger line, and `incoming/` leftovers are removed: nothing is lost or counted twice.

It must not: train, talk SSH itself (a source does), or trust a batch before replaying it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from training.worker import parse_batch_file_name

log = logging.getLogger(__name__)

LEDGER_NAME = "ledger.jsonl"


class BatchRejected(Exception):
    """A batch failed validation; the message names the file and the reason."""


class SourceError(Exception):
    """A worker's outbox could not be listed, fetched or cleaned (network, disk)."""


class BatchSource(Protocol):
    """A worker's outbox as the collector sees it."""

    def list_batches(self) -> list[str]: ...

    def fetch(self, name: str, dest: Path) -> int:
        """Copy the batch to `dest` atomically (via a partial name); returns bytes moved."""

    def delete(self, name: str) -> None: ...


@dataclass(frozen=True)
class BatchInfo:
    """What validation learned about a batch."""

    games: int
    positions: int
    generations: tuple[int, ...]  # model generation of each game


@dataclass
class WorkerTally:
    """Per-worker ingestion counts (rebuilt from the ledger on restart)."""

    batches: int = 0
    games: int = 0
    positions: int = 0
    rejected: int = 0
    bytes: int = 0


@dataclass
class CollectResult:
    ingested: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    duplicates: int = 0  # known names whose worker copy was only deleted
    games: int = 0
    positions: int = 0
    bytes: int = 0


def validate_with_records(board_size: int, komi: float, *,
                          sidecar_dir: str | os.PathLike | None = None,
                          max_generation: Callable[[], int] | None = None
                          ) -> Callable[[Path], BatchInfo]:
    """The coach's validator: replay every game (`records.load_batch`), check the board size,
    komi and that no game claims a model newer than the coach published; then, with
    `sidecar_dir`, write the replay window's sidecar from that one replay."""

    def validate(path: Path) -> BatchInfo:
        from training import records

        limit = max_generation() if max_generation is not None else None
        try:
            batch = records.load_batch(path, max_generation=limit)
        except records.BatchError as e:
            raise BatchRejected(str(e)) from e
        games = batch.records
        if not games:
            raise BatchRejected(f"{path.name}: holds no games")
        for i, g in enumerate(games):
            if g.board_size != board_size or float(g.komi) != float(komi):
                raise BatchRejected(
                    f"{path.name}: game {i} is {g.board_size}x{g.board_size} komi {g.komi}, "
                    f"this run plays {board_size}x{board_size} komi {komi}; check the "
                    "worker's config"
                )
        if sidecar_dir is not None:
            from training.replay_buffer import write_sidecar

            try:
                write_sidecar(batch, path.name, sidecar_dir)
            except OSError as e:  # the trainer rebuilds a missing sidecar itself
                log.warning("%s: sidecar not written: %s", path.name, e)
        return BatchInfo(len(games), sum(g.num_moves for g in games),
                         tuple(int(g.generation) for g in games))

    return validate


class Collector:
    """Moves batches from worker sources into `run_dir/replay` exactly once."""

    def __init__(self, run_dir: str | os.PathLike, validate: Callable[[Path], BatchInfo]):
        self.run_dir = Path(run_dir)
        self.replay_dir = self.run_dir / "replay"
        self.quarantine_dir = self.run_dir / "quarantine"
        self.incoming_dir = self.run_dir / "incoming"
        self.ledger_path = self.run_dir / LEDGER_NAME
        for d in (self.replay_dir, self.quarantine_dir, self.incoming_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.validate = validate
        self.entries: dict[str, dict] = {}
        self.tally: dict[str, WorkerTally] = {}
        self._recover()

    # ------------------------------------------------------------------ state

    def _recover(self) -> None:
        for line_no, line in enumerate(self._ledger_lines(), 1):
            try:
                entry = json.loads(line)
                self._count(entry)
            except (ValueError, KeyError, TypeError):
                # a line torn by a crash mid-append; the reconcile below re-adds its batch
                log.warning("%s line %d unreadable, skipped", self.ledger_path, line_no)
        for leftover in self.incoming_dir.iterdir():
            leftover.unlink(missing_ok=True)
        for folder, status in ((self.replay_dir, "ingested"), (self.quarantine_dir, "rejected")):
            for name in sorted(os.listdir(folder)):
                if name in self.entries or not name.endswith(".npz.zst"):
                    continue
                log.warning("%s/%s is not in the ledger (coach stopped mid-ingest); adding it",
                            folder.name, name)
                entry = self._entry(name, folder / name, status, None)
                if status == "ingested":
                    try:
                        info = self.validate(folder / name)
                        entry.update(games=info.games, positions=info.positions,
                                     generation_mean=_mean(info.generations))
                    except BatchRejected as e:  # it was validated before; keep but say so
                        log.error("%s no longer validates: %s", name, e)
                self._append(entry)
        if self.entries:
            log.info("ledger: %d batches known (%d games ingested)", len(self.entries),
                     sum(t.games for t in self.tally.values()))

    def _ledger_lines(self) -> list[str]:
        try:
            return [ln for ln in self.ledger_path.read_text().splitlines() if ln.strip()]
        except FileNotFoundError:
            return []

    def _count(self, entry: dict) -> None:
        name = entry["name"]
        if name in self.entries:
            return
        self.entries[name] = entry
        t = self.tally.setdefault(entry["worker"], WorkerTally())
        if entry["status"] == "ingested":
            t.batches += 1
            t.games += int(entry.get("games", 0))
            t.positions += int(entry.get("positions", 0))
            t.bytes += int(entry.get("size", 0))
        else:
            t.rejected += 1

    def _entry(self, name: str, path: Path, status: str, reason: str | None) -> dict:
        from distributed.transfer import sha256_file

        parsed = parse_batch_file_name(name)
        worker, gen, seq = parsed if parsed else ("?", -1, -1)
        entry = {"name": name, "worker": worker, "generation": gen, "seq": seq,
                 "status": status, "time": time.time(), "games": 0, "positions": 0,
                 "size": path.stat().st_size if path.exists() else 0,
                 "sha256": sha256_file(path) if path.exists() else ""}
        if reason:
            entry["reason"] = reason
        return entry

    def _append(self, entry: dict) -> None:
        with open(self.ledger_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._count(entry)

    def is_known(self, name: str) -> bool:
        return (name in self.entries or (self.replay_dir / name).exists()
                or (self.quarantine_dir / name).exists())

    def next_seq(self, worker: str) -> int:
        """One past the highest sequence number seen from `worker` (its restart floor)."""
        seqs = [int(e.get("seq", -1)) for e in self.entries.values() if e["worker"] == worker]
        return max(seqs, default=-1) + 1

    def ingested_entries(self) -> list[dict]:
        return [e for e in self.entries.values() if e["status"] == "ingested"]

    # ------------------------------------------------------------------ collecting

    def collect(self, worker: str, source: BatchSource, *, max_games: int | None = None,
                current_generation: int = 0) -> CollectResult:
        """Ingest the batches waiting in one worker's outbox (oldest first).

        `max_games` stops after that many games were ingested (load balancing leaves the rest
        in the worker's outbox for the next generation). Raises SourceError when the source
        fails; what was ingested before stays ingested.
        """
        result = CollectResult()
        names = sorted(source.list_batches(), key=lambda n: (parse_batch_file_name(n) or
                                                              ("", 0, 0))[2])
        for name in names:
            if max_games is not None and result.games >= max_games:
                break
            if not _is_bare_name(name):
                # A name with a folder part (`../x`, `/tmp/x`) is never joined to a path nor
                # handed back to the source: not fetched, not deleted, counted once.
                self._reject_unsafe_name(worker, name)
                result.rejected.append(name)
                continue
            parsed = parse_batch_file_name(name)
            if self.is_known(name):
                source.delete(name)
                result.duplicates += 1
                log.info("%s already ingested; deleted the worker's copy", name)
                continue
            if parsed is None or parsed[0] != worker:
                self._reject_unfetched(worker, name, source)
                result.rejected.append(name)
                continue
            self._ingest_one(worker, name, source, result, current_generation)
        return result

    def _ingest_one(self, worker: str, name: str, source: BatchSource, result: CollectResult,
                    current_generation: int) -> None:
        incoming = self.incoming_dir / name
        nbytes = source.fetch(name, incoming)
        result.bytes += nbytes
        try:
            info = self.validate(incoming)
        except BatchRejected as e:
            self._quarantine(incoming, name, str(e))
            source.delete(name)
            result.rejected.append(name)
            return
        entry = self._entry(name, incoming, "ingested", None)
        os.replace(incoming, self.replay_dir / name)
        entry.update(games=info.games, positions=info.positions,
                     generation_mean=_mean(info.generations),
                     coach_generation=current_generation)
        self._append(entry)
        source.delete(name)
        result.ingested.append(name)
        result.games += info.games
        result.positions += info.positions
        log.info("ingested %s from %s: games=%d positions=%d bytes=%d", name, worker,
                 info.games, info.positions, nbytes)

    def _quarantine(self, path: Path, name: str, reason: str) -> None:
        entry = self._entry(name, path, "rejected", reason)
        os.replace(path, self.quarantine_dir / name)
        (self.quarantine_dir / f"{name}.reason.txt").write_text(reason + "\n")
        self._append(entry)
        log.error("rejected %s (quarantined): %s", name, reason)

    def _reject_unsafe_name(self, worker: str, name: str) -> None:
        """Count a listed name that is not a bare file name once, touching no file."""
        key = f"unsafe:{worker}:{name!r}"
        if key in self.entries:
            return
        reason = f"{name!r}: not a plain file name (it has a folder part)"
        entry = {"name": key, "worker": worker, "generation": -1, "seq": -1,
                 "status": "rejected", "time": time.time(), "games": 0, "positions": 0,
                 "size": 0, "sha256": "", "reason": reason}
        self._append(entry)
        log.error("rejected a listed name from %s without touching it: %s", worker, reason)

    def _reject_unfetched(self, worker: str, name: str, source: BatchSource) -> None:
        """A file whose name is not this worker's batch name: fetch it into quarantine."""
        target = self.incoming_dir / name
        try:
            source.fetch(name, target)
        except SourceError:
            return
        reason = f"{name}: not a batch name of worker {worker!r}"
        entry = self._entry(name, target, "rejected", reason)
        entry["worker"] = worker
        os.replace(target, self.quarantine_dir / name)
        (self.quarantine_dir / f"{name}.reason.txt").write_text(reason + "\n")
        self._append(entry)
        source.delete(name)
        log.error("rejected %s (quarantined): %s", name, reason)


def _is_bare_name(name: str) -> bool:
    """A plain file name: no folder part, not . or .., no NUL, not too long.

    Odd but plain names (spaces, newlines, `;`) are safe to quarantine: names are never
    handed to a shell, only joined to a folder.
    """
    return (
        bool(name)
        and name not in (".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and len(name.encode("utf-8", "surrogateescape")) <= 255
    )


def _mean(values: Any) -> float:
    values = list(values)
    return float(sum(values) / len(values)) if values else 0.0


class LocalSource:
    """A local worker's outbox folder (local mode)."""

    def __init__(self, outbox: str | os.PathLike):
        self.outbox = Path(outbox)

    def list_batches(self) -> list[str]:
        from training.worker import outbox_batches

        return outbox_batches(self.outbox)

    def fetch(self, name: str, dest: Path) -> int:
        import shutil

        partial = dest.with_name(dest.name + ".partial")
        try:
            shutil.copyfile(self.outbox / name, partial)
            os.replace(partial, dest)
        except OSError as e:
            partial.unlink(missing_ok=True)
            raise SourceError(f"{self.outbox / name}: cannot copy: {e}") from e
        return dest.stat().st_size

    def delete(self, name: str) -> None:
        try:
            (self.outbox / name).unlink(missing_ok=True)
        except OSError as e:
            raise SourceError(f"{self.outbox / name}: cannot delete: {e}") from e
