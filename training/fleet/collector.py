"""Exactly-once ingestion of game batches from worker outboxes into the run's replay folder.

Vocabulary:
  - batch name: `<worker>_<gen:06d>_<seq:08d>.npz.zst`, unique per worker; it is the
    idempotency key. A worker *owns* the batch names that carry its own name; only those are
    ever collected for it. A name is *known* once it is in `replay/` (ingested), in
    `quarantine/` (rejected) or in the ledger under its owner.
  - source: where a worker's outbox lives; a `BatchSource` lists, fetches and deletes
    batch files (a local folder in local mode, SFTP in distributed mode). A source fetches
    regular files only, capped while reading and within a deadline; a file it refuses as
    such raises `BatchRefused`, one too slow to read `FetchTooSlow`.
  - ledger: `run_dir/ledger.jsonl` (`RunDir.ledger`), one JSON line per ingested or
    rejected batch (name, worker, generation, games, positions, sha256, status, time).
  - foreign name: anything a worker lists that is not a batch name it owns (another worker's
    batch name, junk, a name with a folder part). It is rejected under the LISTING worker's
    name and ledger key `foreign:<worker>:<repr(name)>`, its bytes (if any are kept) go to
    `quarantine/foreign/<worker>/<sha256 of the name>.bin`, so it can never shadow the
    owner's real batch of that name.
  - rejection budget: a worker may have `max_rejected` files rejected while this collector
    lives (`distributed.max_rejected_batches`); at that count its collection stops and
    `over_budget[worker]` (and `CollectResult.over_budget`) says why. `resume(worker)`
    gives it a fresh budget.

The steps for one batch, in this order, each safe to repeat after a crash:
  1. known name?  -> only delete the worker's copy (a coach that died after step 4 ends here);
  2. fetch to `incoming/<name>.partial` (regular file, capped, deadline, fsynced), rename to
     `incoming/<name>`;
  3. validate by replay (`training.fleet.validation`; `records.read_batch`: every game through
     the rules) and check the board size and komi against the run's config; a bad batch, or ANY
     failure while validating (deep JSON, a huge shape, an unknown zip method, a bomb), goes to
     `quarantine/` with `<name>.reason.txt` and is counted against its worker; a game whose
     moves repeat a game ingested before (or one earlier in the batch) is dropped from the file
     and counted (`repeats` in the ledger, the tally and status.txt), the rest ingested; a
     batch of nothing but repeats, or the same bytes under a new name, is rejected;
  4. `os.replace` into `replay/<name>`, fsync the folder (the replay window sees all or
     nothing);
  5. append the ledger line (fsync);
  6. delete the worker's copy.
On start, files in `replay/` or `quarantine/` missing from the ledger (a crash between 4 and 5)
get their ledger line, a torn last ledger line is closed with a newline (so it never fuses
with the next), and `incoming/` leftovers are removed: nothing is lost or counted twice.

Bounds: at most `names_per_pass` names are handled per `collect` call (the rest wait for the
next pass); after a partial batch (fewer than `full_batch_games` games, or fewer than
`full_batch_positions` positions: full batches of minimal games) a worker's next batch
is taken no sooner than `partial_interval_s` later (`distributed.partial_batch_interval_s`:
a worker sending one-game batches as fast as it can gets one in per interval, the rest wait in
its outbox, counted in `deferred` and status.txt); at most `max_parallel_validations`
batches are validated at once (memory), and
rejected files' bytes are kept in `quarantine/` only while it holds less than
`quarantine_max_bytes` (the reason file is always kept).

Paths: the run folder's `replay/`, `incoming/`, `quarantine/` and `ledger.jsonl` are spelled by
`training.run.run_dir.RunDir`.

Threads: `collect` may be called concurrently for different workers (one supervisor thread
each). Download and validation run outside the lock; the ledger append and the renames into
`replay/` and `quarantine/` run under one lock; calls for one worker are serialized.

It must not: train, talk SSH itself (a source does), or trust a batch before replaying it.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from distributed.transfer import fsync_dir
from training.go.records import (BATCH_SUFFIX, DEFAULT_MAX_BYTES, BatchName, OutboxOverflow,
                                 batch_name_or_none, outbox_batches)
from training.fleet.game_index import GameIndex
from training.fleet.ledger import LedgerEntry
from training.fleet.listed_names import is_bare_name, name_digest, safe_worker
from training.fleet.validation import BatchInfo, BatchRejected
from training.run.run_dir import RunDir

log = logging.getLogger(__name__)

MAX_BATCH_BYTES = DEFAULT_MAX_BYTES
"""The largest batch file a source fetches (compressed; 100 19x19 games are ~3 MB): the cap on
a batch's decompressed size (`records.DEFAULT_MAX_BYTES`), which its compressed file stays
below."""
FETCH_TIMEOUT_S = 120.0
"""A local fetch's deadline (SFTP fetches use `distributed.transfer_timeout_s`)."""
DEFAULT_MAX_REJECTED = 20
DEFAULT_NAMES_PER_PASS = 64
DEFAULT_QUARANTINE_MAX_BYTES = 256 << 20
"""Bytes of rejected files kept in `quarantine/` (a disk budget, not a file size)."""
MAX_LISTED = 10_000
"""Entries of any kind an outbox listing may hold (an honest one holds at most
`distributed.max_outbox_batches` batches and a few temporary files)."""
SLOW_FETCH_TRIES = 3
"""A name whose fetch overran its deadline this many times is rejected (a trickle)."""
_REASON_MAX_CHARS = 2000


class SourceError(Exception):
    """A worker's outbox could not be listed, fetched or cleaned (network, disk)."""


class BatchRefused(SourceError):
    """The source refused the file itself: not a regular file (a symlink, FIFO, device), over
    the size cap, or it grew while read. Never retried: the name is rejected."""


class ListingTooLong(SourceError):
    """The outbox lists more than `MAX_LISTED` entries: no honest worker writes that many
    (it pauses at `distributed.max_outbox_batches`). Collection from it stops (Error)."""


class FetchTooSlow(SourceError):
    """The fetch ran past its deadline (a trickle or a huge file); retried on a later pass,
    rejected after `SLOW_FETCH_TRIES`."""


class BatchSource(Protocol):
    """A worker's outbox as the collector sees it."""

    def list_batches(self) -> list[str]: ...

    def fetch(self, name: str, dest: Path) -> int:
        """Copy the batch to `dest` atomically (via a partial name, fsynced): regular files
        only, capped while reading, within a deadline; returns bytes moved. Raises
        BatchRefused, FetchTooSlow or SourceError."""

    def delete(self, name: str) -> None: ...


@dataclass
class WorkerTally:
    """Per-worker ingestion counts (rebuilt from the ledger on restart)."""

    batches: int = 0
    games: int = 0
    positions: int = 0
    rejected: int = 0
    bytes: int = 0
    repeats: int = 0  # games dropped from its ingested batches as repeats


@dataclass
class CollectResult:
    ingested: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    duplicates: int = 0  # known names whose worker copy was only deleted
    games: int = 0
    positions: int = 0
    bytes: int = 0
    repeats: int = 0  # games dropped from ingested batches: they repeat games ingested before
    deferred: int = 0  # names left for a later pass (names_per_pass reached, or paced)
    paced: int = 0  # of those, the worker's batches waiting for its partial-batch pace
    over_budget: str = ""  # non-empty: this worker's collection is stopped, and why


class Collector:
    """Moves batches from worker sources into `run_dir/replay` exactly once."""

    def __init__(self, run_dir: str | os.PathLike, validate: Callable[[Path], BatchInfo], *,
                 max_rejected: int = DEFAULT_MAX_REJECTED,
                 names_per_pass: int = DEFAULT_NAMES_PER_PASS,
                 quarantine_max_bytes: int = DEFAULT_QUARANTINE_MAX_BYTES,
                 max_parallel_validations: int = 2,
                 partial_interval_s: float = 0.0, full_batch_games: int | None = None,
                 full_batch_positions: int | None = None):
        paths = RunDir(run_dir)
        self.run_dir = paths.root
        self.replay_dir = paths.replay
        self.quarantine_dir = paths.quarantine
        self.incoming_dir = paths.incoming
        self.ledger_path = paths.ledger
        for d in (self.replay_dir, self.quarantine_dir, self.incoming_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.validate = validate
        self.max_rejected = max_rejected
        self.names_per_pass = names_per_pass
        self.quarantine_max_bytes = quarantine_max_bytes
        self.partial_interval_s = partial_interval_s
        """Seconds after a partial batch before a worker's next batch is taken (0: none)."""
        self.full_batch_games = full_batch_games
        """Games of a full batch (`distributed.batch_size`); None: every batch is full."""
        self.full_batch_positions = full_batch_positions
        """Positions a batch must hold not to be paced as partial (`full_batch_positions`):
        a full batch of minimal games is paced like a partial one."""
        self._paced_until: dict[str, float] = {}  # worker -> time.monotonic() of its next take
        self.deferred: dict[str, int] = {}
        """Per worker, the batches its last listing left waiting (pace or names_per_pass)."""
        self.entries: dict[str, LedgerEntry] = {}
        """Every ledger entry by key; changed in place under the lock (read it under the
        lock, or through `ingested_entries` / `window_entries`)."""
        self._window: list[LedgerEntry] = []  # ingested entries, in the window's order
        self._window_keys: list[tuple] = []  # their (generation, time, name), for bisect
        self._window_units: list[tuple[str, int]] = []  # their (worker, positions)
        self._window_owners: dict[str, int] = {}  # worker -> its ingested batches
        self.positions_ingested = 0
        self.tally: dict[str, WorkerTally] = {}
        self.over_budget: dict[str, str] = {}  # worker -> why its collection stopped
        self._contents: dict[str, str] = {}  # sha256 of an ingested file -> its name
        self._games = GameIndex()  # game_key of an ingested game -> its batch name
        self._unindexed: list[tuple[str, tuple[str, ...]]] | None = None
        self._admission_order: list[tuple[str, int]] = []  # (name, positions), ledger order
        self.positions_by_coach_generation: dict[int, int] = {}
        """Positions ingested while each generation was the newest published one."""
        self.rejected_since_start: dict[str, int] = {}
        self._slow: dict[tuple[str, str], int] = {}  # (worker, name) -> deadline overruns
        self._lock = threading.RLock()  # ledger, entries, tallies, renames into the run
        self._worker_locks: dict[str, threading.Lock] = {}
        self._validations = threading.BoundedSemaphore(max(1, max_parallel_validations))
        self._quarantine_bytes = 0
        self._recover()

    # ------------------------------------------------------------------ state

    def _recover(self) -> None:
        self._close_torn_line()
        self._unindexed = []
        for line_no, line in enumerate(self._ledger_lines(), 1):
            try:
                data = json.loads(line)
                keys = data.pop("game_keys", ()) if isinstance(data, dict) else ()
                if not isinstance(keys, list | tuple):
                    raise ValueError("ledger game_keys must be a list")
                self._count(LedgerEntry.from_json(data), tuple(str(k) for k in keys),
                            in_place=True)
            except (ValueError, KeyError, TypeError, RecursionError):
                # a line torn by a crash mid-append; the reconcile below re-adds its batch
                log.warning("%s line %d unreadable, skipped", self.ledger_path, line_no)
        self._games.add_batches(self._unindexed)
        self._unindexed = None
        for leftover in self.incoming_dir.iterdir():
            leftover.unlink(missing_ok=True)
        for folder, status in ((self.replay_dir, "ingested"), (self.quarantine_dir, "rejected")):
            for name in sorted(os.listdir(folder)):
                if name in self.entries or not name.endswith(BATCH_SUFFIX):
                    continue
                log.warning("%s/%s is not in the ledger (coach stopped mid-ingest); adding it",
                            folder.name, name)
                entry = self._entry(name, folder / name, status, None)
                if status == "ingested":
                    try:
                        info = self.validate(folder / name)
                        entry = dataclasses.replace(
                            entry, games=info.games, positions=info.positions,
                            generation_mean=_mean(info.generations), game_keys=info.game_keys)
                    except Exception as e:  # noqa: BLE001 - validated before; keep, say so
                        log.error("%s no longer validates: %s: %s", name, type(e).__name__, e)
                self._append(entry)
        self._quarantine_bytes = _folder_bytes(self.quarantine_dir)
        if self.entries:
            log.info("ledger: %d batches known (%d games ingested)", len(self.entries),
                     sum(t.games for t in self.tally.values()))

    def _close_torn_line(self) -> None:
        """A crash mid-append leaves a last line without its newline: end it, so that the
        next line is never glued to it (the torn line is then skipped as unreadable)."""
        try:
            with open(self.ledger_path, "rb+") as f:
                f.seek(0, os.SEEK_END)
                if f.tell() == 0:
                    return
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
                    f.flush()
                    os.fsync(f.fileno())
                    log.warning("%s: the last line was torn (no newline); closed it",
                                self.ledger_path)
        except FileNotFoundError:
            return

    def _ledger_lines(self) -> list[str]:
        try:
            text = self.ledger_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        return [ln for ln in text.splitlines() if ln.strip()]

    def _count(self, entry: LedgerEntry, game_keys: tuple[str, ...] = (), *,
               in_place: bool = False) -> None:
        """Add a ledger entry (without its `game_keys`, which go to the game index) to
        `entries`, `tally` and the window's order (under the lock, in place: no copy per
        entry). `tally` gains a worker by copy on write (rare), so a thread iterating it (the
        coach's status table) holds a dict that never changes size under it."""
        name = entry.name
        if name in self.entries:
            return
        if game_keys and entry.ingested:
            if self._unindexed is not None:
                self._unindexed.append((name, game_keys))  # the ledger's read at start
            else:
                self._games.add(name, game_keys)
        self.entries[name] = entry
        if entry.ingested:
            self._admission_order.append((name, entry.positions))
            by_gen = self.positions_by_coach_generation
            by_gen[entry.coach_generation] = by_gen.get(entry.coach_generation, 0) \
                + entry.positions
            key = (entry.generation, entry.time, entry.name)
            at = bisect.bisect(self._window_keys, key)
            self._window_keys.insert(at, key)
            self._window.insert(at, entry)
            self._window_units.insert(at, (entry.worker, entry.positions))
            self._window_owners[entry.worker] = self._window_owners.get(entry.worker, 0) + 1
            self.positions_ingested += entry.positions
        if entry.worker not in self.tally:
            new = WorkerTally()
            if in_place:
                self.tally[entry.worker] = new
            else:
                self.tally = {**self.tally, entry.worker: new}
        t = self.tally[entry.worker]
        if entry.ingested:
            if entry.sha256:
                self._contents[entry.sha256] = name
            t.batches += 1
            t.games += entry.games
            t.positions += entry.positions
            t.bytes += entry.size
            t.repeats += entry.repeats
        else:
            t.rejected += 1

    def _entry(self, name: str, path: Path | None, status: str, reason: str | None,
               parsed: BatchName | None = None) -> LedgerEntry:
        """A ledger entry for the file `name` (its parts from `parsed`, or parsed here)."""
        from distributed.transfer import sha256_file

        parsed = parsed or batch_name_or_none(name)
        worker, gen, seq = parsed if parsed else ("?", -1, -1)
        is_file = path is not None and path.is_file()
        return LedgerEntry(name=name, worker=worker, status=status, time=time.time(),
                           generation=gen, seq=seq,
                           size=path.stat().st_size if is_file else 0,
                           sha256=sha256_file(path) if is_file else "", reason=reason or "")

    def _append(self, entry: LedgerEntry) -> None:
        with self._lock:
            line = json.dumps(entry.to_json(), sort_keys=True) + "\n"
            with open(self.ledger_path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            keys = entry.game_keys
            self._count(dataclasses.replace(entry, game_keys=()) if keys else entry, keys)

    def is_known(self, name: str, parsed: BatchName | None = None) -> bool:
        """The batch `name` (its parts `parsed`, or parsed here) was ingested or rejected
        under its owner (its worker's copy may only be deleted)."""
        parsed = parsed or batch_name_or_none(name)
        with self._lock:
            entry = self.entries.get(name)
            if entry is not None and parsed is not None and entry.worker == parsed[0]:
                return True
        return (self.replay_dir / name).exists() or (self.quarantine_dir / name).exists()

    def next_seq(self, worker: str) -> int:
        """One past the highest sequence number seen from `worker` (its restart floor)."""
        with self._lock:
            seqs = [e.seq for e in self.entries.values() if e.worker == worker]
        return max(seqs, default=-1) + 1

    def ingested_entries(self) -> list[LedgerEntry]:
        """The ingested batches' entries, in the replay window's order (oldest first: by
        generation, ingest time, name); a copy of a list kept sorted as batches come in."""
        with self._lock:
            return list(self._window)

    window_entries = ingested_entries

    def window_choice(self, choose: Callable[[Sequence[tuple[str, int]], int, Sequence[str]],
                                             list[int]]) -> list[LedgerEntry]:
        """The ingested entries that `choose(units, positions, owners)` picks (indices), where
        `units` is (worker, positions) of every ingested batch in the window's order,
        `positions` their sum and `owners` the workers among them: computed under the lock on
        what the collector keeps as batches come in, with no copy of a list of all."""
        with self._lock:
            chosen = choose(self._window_units, self.positions_ingested,
                            list(self._window_owners))
            return [self._window[i] for i in chosen]

    def ingested_since(self, start: int) -> list[tuple[str, int]]:
        """(name, positions) of the ingested batches from the `start`-th on, in the ledger's
        order (what the long-lived trainer is admitted from, a pass's new ones at a time)."""
        with self._lock:
            return self._admission_order[start:]

    def new_positions(self, generation: int) -> int:
        """Positions ingested since `generation` was the newest published one."""
        with self._lock:
            return sum(p for g, p in self.positions_by_coach_generation.items()
                       if g >= generation)

    def resume(self, worker: str) -> None:
        """Give a worker stopped over its rejection budget a fresh budget (it was fixed)."""
        with self._lock:
            self.over_budget.pop(worker, None)
            self.rejected_since_start.pop(worker, None)

    def quarantine_path(self, worker: str, name: str) -> Path:
        """Where the bytes of `name`, rejected from `worker`, are kept (`.reason.txt` beside):
        `quarantine/<name>` for the worker's own batch names, else
        `quarantine/foreign/<worker>/<digest>.bin`."""
        parsed = batch_name_or_none(name) if is_bare_name(name) else None
        if parsed is not None and parsed[0] == worker:
            return self.quarantine_dir / name
        return (self.quarantine_dir / "foreign" / safe_worker(worker)
                / f"{name_digest(worker, name)}.bin")

    def _worker_lock(self, worker: str) -> threading.Lock:
        with self._lock:
            return self._worker_locks.setdefault(worker, threading.Lock())

    # ------------------------------------------------------------------ collecting

    def collect(self, worker: str, source: BatchSource, *, max_games: int | None = None,
                current_generation: int = 0, paced: bool = True) -> CollectResult:
        """Ingest the batches waiting in one worker's outbox (oldest first).

        `max_games` stops after that many games were ingested (load balancing leaves the rest
        in the worker's outbox for the next generation). At most `names_per_pass` names are
        handled, and with `paced` a worker's batches wait while its partial-batch pace runs
        (`deferred` and `paced` count the rest; `paced=False` for the last collection of a
        stopped worker). A worker over its rejection budget is not listed at all
        (`over_budget` says why). Raises SourceError when the source fails; what was
        ingested before stays ingested.
        """
        result = CollectResult()
        with self._worker_lock(worker):
            if worker in self.over_budget:
                result.over_budget = self.over_budget[worker]
                return result
            owned: list[tuple[int, str, BatchName]] = []  # parsed once, passed down
            foreign: list[str] = []
            try:
                listed = source.list_batches()
            except ListingTooLong as e:
                self._stop_collecting(worker, f"its outbox is flooded: {e}. Empty the "
                                      "worker's outbox folder, then restart the worker")
                result.over_budget = self.over_budget[worker]
                return result
            for name in listed:
                parsed = batch_name_or_none(name) if is_bare_name(name) else None
                if parsed is not None and parsed.worker == worker:
                    owned.append((parsed.seq, name, parsed))
                else:
                    foreign.append(name)
            owned.sort(key=lambda o: (o[0], o[1]))
            todo = [n for _, n, _ in owned] + foreign
            handled = 0
            for i, name in enumerate(todo):
                if max_games is not None and result.games >= max_games:
                    break
                if handled >= self.names_per_pass or worker in self.over_budget:
                    result.deferred = len(todo) - i
                    break
                if i < len(owned):
                    if result.paced or (paced and time.monotonic()
                                        < self._paced_until.get(worker, 0.0)):
                        result.paced = result.paced or len(owned) - i  # wait in the outbox
                        continue
                    handled += 1
                    before = result.positions
                    games = self._collect_owned(worker, name, owned[i][2], source, result,
                                                current_generation)
                    if games and self._partial(games, result.positions - before):
                        self._paced_until[worker] = time.monotonic() + self.partial_interval_s
                elif self._collect_foreign(worker, name, source, result):
                    handled += 1
            result.deferred = max(result.deferred, result.paced)
            with self._lock:
                self.deferred[worker] = result.deferred
            result.over_budget = self.over_budget.get(worker, "")
        return result

    def _partial(self, games: int, positions: int) -> bool:
        """An ingested batch the pace applies to: fewer games than a full batch, or fewer
        positions than a full batch of honest games holds."""
        if self.partial_interval_s <= 0:
            return False
        return bool(self.full_batch_games and games < self.full_batch_games
                    or self.full_batch_positions and positions < self.full_batch_positions)

    def _collect_owned(self, worker: str, name: str, parsed: BatchName, source: BatchSource,
                       result: CollectResult, current_generation: int) -> int:
        """Fetch, validate and ingest one owned batch; returns its games (0 when it was not
        ingested)."""
        if self.is_known(name, parsed):
            self._collect_known(worker, name, source, result)
            return 0
        incoming = self.incoming_dir / name
        try:
            nbytes = source.fetch(name, incoming)
        except BatchRefused as e:
            self._reject(worker, name, name, None, f"{name}: refused: {e}", source, result)
            return 0
        except FetchTooSlow as e:
            if not self._too_slow(worker, name, e):
                raise
            self._reject(worker, name, name, None, f"{name}: not fetched in "
                         f"{SLOW_FETCH_TRIES} tries: {e}", source, result)
            return 0
        result.bytes += nbytes
        try:
            with self._validations:  # bounds the memory of concurrent replays
                info = self.validate(incoming)
        except BatchRejected as e:
            self._reject(worker, name, name, incoming, str(e), source, result)
            return 0
        except Exception as e:  # noqa: BLE001 - untrusted input: any failure is a rejection
            # RecursionError (nested JSON), MemoryError (a huge declared shape),
            # NotImplementedError (an unknown zip method), OSError, ...: the batch is bad,
            # never a reason to stop collecting or to fetch it again
            log.warning("%s: validation failed with %s", name, type(e).__name__,
                        exc_info=not isinstance(e, (RecursionError, MemoryError)))
            self._reject(worker, name, name, incoming,
                         f"{name}: validation failed: {type(e).__name__}: {e}", source, result)
            return 0
        with self._lock:
            entry = self._entry(name, incoming, "ingested", None, parsed)  # the worker's bytes
            refused, repeats = self._repeats(entry.sha256, info)
            if not refused:
                if repeats:
                    try:
                        info = info.keep([i for i in range(info.games) if i not in repeats])
                    except Exception as e:  # noqa: BLE001 - the batch is kept in quarantine
                        refused = (f"its {len(repeats)} repeated games could not be dropped: "
                                   f"{type(e).__name__}: {e}")
            if not refused:
                os.utime(incoming)  # the window orders batches by the coach's clock
                os.replace(incoming, self.replay_dir / name)
                fsync_dir(self.replay_dir)  # the rename is durable before the ledger says so
                self._append(dataclasses.replace(
                    entry, size=(self.replay_dir / name).stat().st_size, games=info.games,
                    positions=info.positions, generation_mean=_mean(info.generations),
                    coach_generation=current_generation, game_keys=info.game_keys,
                    repeats=len(repeats)))
        if refused:
            self._reject(worker, name, name, incoming, f"{name}: {refused}", source, result)
            return 0
        source.delete(name)
        result.ingested.append(name)
        result.games += info.games
        result.positions += info.positions
        result.repeats += len(repeats)
        if repeats:
            log.warning("%s from %s: dropped %d of its games, which repeat games ingested "
                        "before (%s); ingested the other %d", name, worker, len(repeats),
                        "; ".join(repeats[i] for i in sorted(repeats)[:3]), info.games)
        log.info("ingested %s from %s: games=%d positions=%d bytes=%d", name, worker,
                 info.games, info.positions, nbytes)
        return info.games

    def _collect_known(self, worker: str, name: str, source: BatchSource,
                       result: CollectResult) -> None:
        """A name ingested or rejected before: the worker's copy is deleted when it holds the
        same bytes (a coach that stopped before its delete). Other bytes under a known name
        (a wiped worker host that started its sequence again) are never deleted unread:
        they go to quarantine with the reason, and count against the worker."""
        from distributed.transfer import sha256_file

        entry = self.entries.get(name)
        known = entry.sha256 if entry is not None else ""
        if known:
            local = self.incoming_dir / f"known-{name_digest(worker, name)}"
            try:
                source.fetch(name, local)
                digest = sha256_file(local)
            except BatchRefused as e:
                self._reject(worker, name, f"reused:{worker}:{name}", None,
                             f"{name}: a known name, refused: {e}", source, result,
                             target=self._reused_path(worker, name))
                return
            if digest != known:
                self._reject(worker, name, f"reused:{worker}:{name}:{digest[:16]}", local,
                             f"{name}: this name was collected before with other bytes "
                             f"(sha256 {known[:12]}.., now {digest[:12]}..): the worker's "
                             "batch numbers started again (a wiped worker folder?); "
                             "restart it through the coach, which passes --min-seq",
                             source, result, target=self._reused_path(worker, name))
                return
            local.unlink(missing_ok=True)
        source.delete(name)
        result.duplicates += 1
        log.info("%s already ingested; deleted the worker's copy", name)

    def _reused_path(self, worker: str, name: str) -> Path:
        return (self.quarantine_dir / "reused" / safe_worker(worker)
                / f"{name_digest(worker, name + str(time.time_ns()))}.bin")

    def _collect_foreign(self, worker: str, name: str, source: BatchSource,
                         result: CollectResult) -> bool:
        """A listed name that is not a batch of `worker`: rejected under `worker`, never
        under the name's apparent owner. Returns whether any file operation was done."""
        key = f"foreign:{worker}:{name!r}"
        bare = is_bare_name(name)
        if key in self.entries:
            if not bare:
                return False  # never handed back to the source: nothing to do
            source.delete(name)  # rejected before; the delete had failed
            return True
        if not bare:
            # A name with a folder part (`../x`, `/tmp/x`) is never joined to a path nor
            # handed back to the source: not fetched, not deleted, counted once.
            self._reject(worker, name, key, None,
                         f"{name!r}: not a plain file name (it has a folder part)", None,
                         result)
            return False
        what = ("a batch name of another worker" if batch_name_or_none(name) else
                "not a batch name")
        reason = f"{name!r}: {what}, not a batch name of worker {worker!r}"
        local = self.incoming_dir / f"foreign-{name_digest(worker, name)}"
        try:
            source.fetch(name, local)
        except (BatchRefused, FetchTooSlow) as e:
            reason += f"; refused: {e}"
            local = None
        except SourceError:
            return True  # the listing's file went away, or the link failed: next pass
        self._reject(worker, name, key, local, reason, source, result)
        return True

    def _repeats(self, sha256: str, info: BatchInfo) -> tuple[str, dict[int, str]]:
        """What a validated batch repeats of what was ingested before (under the lock):
        (why it is refused whole, or ""; the games to drop, index -> what each repeats).

        The same file under a new name is refused. A game whose moves are already in the run
        (or earlier in the batch) is dropped: an honest worker plays the same short game twice
        now and then (small boards, forced lines). A batch of nothing but repeats is refused,
        and so is one with repeats whose validator cannot drop games (`BatchInfo.keep`)."""
        if sha256 in self._contents:
            return f"the same bytes as {self._contents[sha256]}, ingested before", {}
        repeats: dict[int, str] = {}
        first: dict[str, int] = {}
        for i, key in enumerate(info.game_keys):
            if (before := self._games.get(key)) is not None:
                repeats[i] = f"game {i} repeats a game of {before}"
            elif key in first:
                repeats[i] = f"game {i} repeats game {first[key]} of the same batch"
            else:
                first[key] = i
        if not repeats:
            return "", {}
        example = repeats[min(repeats)]
        if len(repeats) == len(info.game_keys):
            return (f"every game repeats a game ingested before or of the same batch "
                    f"({example})"), repeats
        if info.keep is None:
            return f"{example} (the same moves)", repeats
        return "", repeats

    def _stop_collecting(self, worker: str, why: str) -> None:
        """Collection from `worker` stops (its state shows Error with `why`) until `resume`."""
        with self._lock:
            if worker not in self.over_budget:
                self.over_budget[worker] = why
                log.error("worker %s: %s", worker, why)

    def _too_slow(self, worker: str, name: str, err: Exception) -> bool:
        """Count one deadline overrun of a name; True once it has used up its tries."""
        with self._lock:
            n = self._slow[(worker, name)] = self._slow.get((worker, name), 0) + 1
        log.warning("%s: fetch of %s overran its deadline (%d/%d): %s", worker, name, n,
                    SLOW_FETCH_TRIES, err)
        return n >= SLOW_FETCH_TRIES

    def _reject(self, worker: str, name: str, key: str, path: Path | None, reason: str,
                source: BatchSource | None, result: CollectResult, *,
                target: Path | None = None) -> None:
        """Count a rejected file against `worker`: its bytes to quarantine (`target`, by
        default `quarantine_path`) while within the budget, its reason file, the ledger
        line, then the worker's copy deleted."""
        reason = _escaped(reason)[:_REASON_MAX_CHARS]
        target = target or self.quarantine_path(worker, name)
        folder, stem = target.parent, target.name
        with self._lock:
            folder.mkdir(parents=True, exist_ok=True)
            entry = dataclasses.replace(self._entry(key, path, "rejected", reason),
                                        worker=worker)
            if key != name:
                entry = dataclasses.replace(entry, generation=-1, seq=-1,
                                            listed_name=name[:300])
            kept = False
            if path is not None and path.is_file():
                size = path.stat().st_size
                if self._quarantine_bytes + size <= self.quarantine_max_bytes:
                    os.replace(path, folder / stem)
                    self._quarantine_bytes += size
                    kept = True
                else:
                    path.unlink(missing_ok=True)
                    reason += (f" [its {size} bytes were not kept: quarantine/ is at its "
                               f"{self.quarantine_max_bytes}-byte budget]")
            (folder / f"{stem}.reason.txt").write_text(reason + "\n", encoding="utf-8")
            self._append(dataclasses.replace(entry, kept=kept))
            self._slow.pop((worker, name), None)
            n = self.rejected_since_start[worker] = self.rejected_since_start.get(worker, 0) + 1
            if n >= self.max_rejected and worker not in self.over_budget:
                self.over_budget[worker] = (
                    f"{n} files rejected from worker {worker} (limit "
                    f"distributed.max_rejected_batches = {self.max_rejected}); collection "
                    f"from it is stopped. Last: {reason[:300]}. Fix or replace the host, "
                    "then restart the worker")
                log.error("worker %s: %s", worker, self.over_budget[worker])
        result.rejected.append(name)
        log.error("rejected %s from %s (%s): %s", ascii(name)[:120], worker,
                  "quarantined" if kept else "reason kept", reason)
        if source is not None:
            source.delete(name)


def _escaped(text: str) -> str:
    """`text` with every non-printable character written as its escape (`\\n`, `\\x1b`).

    Not `distributed.status.printable`, on purpose: a reason goes to the ledger and to
    `<name>.reason.txt`, the record of why a file was refused, so no character of it is
    dropped (an escape sequence stays visible as `\\x1b[...`, a newline as `\\n`); the
    caller caps its length. `printable` is for one cell of `status.txt`: it drops escape
    sequences, shows other control characters as '?' and cuts the text to one short line.
    """
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _mean(values: Any) -> float:
    values = list(values)
    return float(sum(values) / len(values)) if values else 0.0


class LocalSource:
    """A local worker's outbox folder (local mode): regular files only, capped, fsynced."""

    def __init__(self, outbox: str | os.PathLike, *, max_bytes: int = MAX_BATCH_BYTES,
                 timeout_s: float = FETCH_TIMEOUT_S):
        self.outbox = Path(outbox)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    def list_batches(self) -> list[str]:
        try:
            return outbox_batches(self.outbox, max_entries=MAX_LISTED)
        except OutboxOverflow as e:
            raise ListingTooLong(str(e)) from e
        except OSError as e:
            raise SourceError(f"{self.outbox}: cannot list: {e}") from e

    def fetch(self, name: str, dest: Path) -> int:
        from distributed.transfer import DeadlineError, TransferError, VerifyError, copy_file

        src = self.outbox / name
        try:
            return copy_file(src, dest, max_bytes=self.max_bytes,
                             timeout_s=self.timeout_s).size
        except VerifyError as e:
            raise BatchRefused(str(e)) from e
        except DeadlineError as e:
            raise FetchTooSlow(str(e)) from e
        except (TransferError, OSError) as e:
            raise SourceError(f"{src}: cannot copy: {e}") from e

    def delete(self, name: str) -> None:
        try:
            (self.outbox / name).unlink(missing_ok=True)
        except OSError as e:
            raise SourceError(f"{self.outbox / name}: cannot delete: {e}") from e
