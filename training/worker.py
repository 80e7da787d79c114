"""The self-play worker daemon: newest model -> self-play -> outbox batches + heartbeat.

A `Worker` owns one worker folder (`runs/main/workers/<name>` in local mode, `RunDir.worker`;
`<remote_dir>/workers/<name>` on a host, `distributed.remote.WorkerPaths.worker_dir`):

    models/model_<gen>.pt.zst + model_<gen>.json   pushed by the coach (manifest written last)
    cache/model_<gen>.pt                           the verified, decompressed model in use
    outbox/<name>_<gen:06d>_<seq:08d>.npz.zst      finished game batches, written atomically
    status.json                                    heartbeat (distributed.status), a thread
    worker_state.json                              next batch sequence number (survives crashes)
    worker.lock                                    flock held by the daemon using the folder

One daemon per folder: the constructor takes an exclusive `fcntl.flock` on `worker.lock` (the
kernel drops it when the process dies, so a crash leaves no stale lock); a second daemon on the
same folder (`--restart --direct` racing the coach's supervision) raises WorkerFolderBusy
naming the holder's pid, and `start_worker.py` / `python -m training.worker` exit with code 3
and that message, before either could reserve a sequence number.

Loop: wait for a model (state Syncing) -> play `self_play.parallel_games` games at once ->
every `distributed.batch_size` finished games write one batch to outbox/ (or fewer, once the
oldest of them has waited `distributed.batch_max_wait_s`). Newer models load in a thread while
the games go on (the "model-loader": a watchdog observer of the model folder wakes it; every
`distributed.sync_interval` finished games a slow rescan backs it up): it verifies,
decompresses and builds the new evaluator (inference form and warm-up included), then offers it
to the games, which take it in at their next network call (`SelfPlay.offer_evaluator`), in the
middle of a move's search if need be; the heartbeat's `switch` says how long each phase of the
last switch took. (The loading is `training.model_loader.ModelLoading`, a base class of
`Worker`.) A model whose size or sha256 disagrees with its manifest, or that does not load, is
refused: the worker keeps the model it has, reports Error with the reason in its heartbeat, and
carries on. When `distributed.max_outbox_batches` batches wait uncollected it pauses (heartbeat
`paused: true`).

Stopping: SIGTERM/SIGINT (or `stop()`) ends the loop after the current step; the finished
games not yet in a batch are written as a last, smaller batch, the unfinished ones are
discarded and counted (heartbeat `discarded_games`). After a crash a new daemon finds its
outbox untouched and continues the sequence numbers from `worker_state.json` (a number is
reserved before its batch is written, so a name is never used twice; the coach treats a batch
name as its idempotency key).

Extension point (the user guide's custom workers): subclass `Worker` and override
`load_evaluator`, `make_selfplay` or `write_batch`; name the class with `start_worker.py
--worker-class module:Class` (or the config's `self_play.worker_class` when it exists).

It must not: talk to the coach or any network (the coach pulls files over SFTP or reads them
locally), train, or delete anything in outbox/ (only the coach deletes collected batches).
"""

from __future__ import annotations

import argparse
import collections
import errno
import fcntl
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from configs import Config, ConfigError, load_config
from distributed.status import HEARTBEAT_NAME, Heartbeat, WorkerState
from distributed.transfer import write_json_atomic
from training.go.records import batch_name, batch_name_or_none, outbox_batches
from training.model_loader import POLL_MODELS_S, ModelLoading
from training.run.limits import raise_open_files_limit
from training.run.logsetup import configure_logging
from training.run.run_dir import RunDir
from training.run.signals import on_stop_signals

log = logging.getLogger(__name__)

STATE_NAME = "worker_state.json"
LOCK_NAME = "worker.lock"
EXIT_FOLDER_BUSY = 3
# Space kept aside on the worker's disk so that a full disk can still be reported: on ENOSPC
# the heartbeat (whichever thread writes it) switches to Error, gives this file up and writes
# the Error state in its place; no batch is written while the reserve cannot be re-made, so
# the space it frees is never eaten by batches before the Error is on disk.
RESERVE_NAME = ".disk_reserve"
RESERVE_BYTES = 64 * 1024


class WorkerFolderBusy(RuntimeError):
    """Another live daemon holds this worker folder's lock; the message names its pid."""


@dataclass
class WorkerSummary:
    """What one `run()` did."""

    games: int
    batches: int
    discarded_games: int
    generation: int


class Worker(ModelLoading):
    """One self-play daemon; `run()` until stopped (SIGTERM) or `max_games` are played."""

    def __init__(
        self,
        cfg: Config,
        name: str,
        folder: str | os.PathLike,
        *,
        device: str = "cpu",
        seed: int | None = None,
        min_seq: int = 0,
        models_dir: str | os.PathLike | None = None,
    ):
        self.cfg = cfg
        self.name = name
        self.folder = Path(folder)
        self.device = device
        self.models_dir = Path(models_dir) if models_dir else self.folder / "models"
        self.cache_dir = self.folder / "cache"
        self.outbox = self.folder / "outbox"
        self.heartbeat_path = self.folder / HEARTBEAT_NAME
        for d in (self.models_dir, self.cache_dir, self.outbox):
            d.mkdir(parents=True, exist_ok=True)
        self._lock_file: Any = None
        self._lock_folder()  # before anything reads or reserves a sequence number
        self.seed = seed if seed is not None else _derive_seed(cfg.run.seed, name)
        self._stop = threading.Event()
        self._models_changed = threading.Event()
        self._models_changed.set()  # look once at start
        self._lock = threading.Lock()  # guards the fields the heartbeat thread reads
        # Two threads write the heartbeat (the beat every interval, the main loop on a
        # change): one snapshot-and-write at a time, so an older snapshot never lands last.
        self._beat_lock = threading.Lock()
        self.state = WorkerState.SYNCING
        self.generation = -1
        self.games_done = 0
        self.positions_done = 0
        self.batches_written = 0
        self.discarded_games = 0
        self.paused = False
        self.last_error = ""
        self._refused: dict[int, tuple[str, int]] = {}  # gen -> (sha256, size) known bad
        self._rate: collections.deque[tuple[float, int, int]] = collections.deque()
        self._next_seq = self._load_next_seq(min_seq)
        self._selfplay: Any = None
        self._loader: threading.Thread | None = None  # loads newer models while games go on
        self._offered_at: dict[int, float] = {}  # generation -> monotonic time it was ready
        self._ready: tuple[Callable, int] | None = None  # for an engine without offer_evaluator
        self._switch: dict[str, float] = {}  # the last switch's phases (heartbeat "switch")
        self._pending: list[Any] = []  # finished games not yet in a batch
        self._pending_since = 0.0  # monotonic time the oldest of them finished
        self._reserved: int | None = None  # a sequence number reserved, its batch unwritten
        self._heartbeat_failing = False
        self._server: Any = None  # the net server process (self_play.net_server)
        self._make_disk_reserve()

    # ------------------------------------------------------------------ folder lock

    def _lock_folder(self) -> None:
        """Hold `worker.lock` exclusively, or raise WorkerFolderBusy naming the holder."""
        if self._lock_file is not None:
            return
        path = self.folder / LOCK_NAME
        f = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read(64).strip() or "unknown"
            f.close()
            raise WorkerFolderBusy(
                f"{self.folder} is in use by another worker daemon (pid {holder}); stop that "
                "one first (ssh_connector --stop / --restart NAME) or give this one its own "
                "--dir") from None
        try:
            f.seek(0)
            f.truncate()
            f.write(f"{os.getpid()}\n")
            f.flush()
        except OSError:  # a full disk: the lock holds without the pid written
            pass
        self._lock_file = f

    def release_folder(self) -> None:
        """Give up the folder lock (done by `run()` as it ends; a process exit does it too)."""
        f, self._lock_file = self._lock_file, None
        if f is not None:
            f.close()

    # ------------------------------------------------------------------ extension points

    def load_evaluator(self, model_path: Path) -> tuple[Callable, int]:
        """Load a decompressed model file; returns (evaluate, generation). With the net
        server the server process loads it (and swaps it in between two batches)."""
        if self.uses_net_server():
            return self._serve_model(model_path)
        from training.learn.net import load_model, make_evaluator

        net, info = load_model(model_path, self.device)
        return make_evaluator(net, self.device, jit=self.cfg.net.inference,
                              max_batch=self.cfg.self_play.batch_size,
                              dtype=self.cfg.net.inference_dtype,
                              score=self.cfg.mcts.wants_score), (
            info.generation
        )

    def make_selfplay(self, evaluate: Callable, generation: int) -> Any:
        """The self-play engine: `.step() -> [GameRecord]`, `.set_evaluator(fn, gen)`,
        `.discard_unfinished() -> int`. With the net server: `self_play.search_processes`
        search processes through it (`training.search_processes.SearchProcesses`)."""
        if self._server is not None:
            from training.search_processes import SearchProcesses

            return SearchProcesses(self.cfg, self._server,
                                   processes=self.cfg.self_play.search_processes,
                                   seed=self.seed)
        from training.search.selfplay import SelfPlay

        return SelfPlay(evaluate, self.cfg.go, self.cfg.mcts, self.cfg.self_play,
                        history=self.cfg.net.history, generation=generation, seed=self.seed,
                        liberties=self.cfg.net.liberties, planes_dtype="uint8")

    def write_batch(self, records: Sequence[Any], path: Path) -> None:
        """Write finished games as one batch file (atomically: temporary name, rename)."""
        from training.go.records import BatchMeta, write_batch

        meta = BatchMeta.from_records(self.name, records, max_moves=self.cfg.go.max_moves)
        write_batch(path, records, meta, level=self.cfg.distributed.wire_level)

    # ------------------------------------------------------------------ the net server

    def uses_net_server(self) -> bool:
        """`self_play.net_server`: true, false, or auto (on when the device is a GPU)."""
        choice = self.cfg.self_play.net_server
        return self.device.startswith("cuda") if choice == "auto" else bool(choice)

    def server_lanes(self) -> int:
        """`self_play.server_lanes`, or automatic (0): 2 on a GPU, 1 on a CPU."""
        lanes = self.cfg.self_play.server_lanes
        return lanes or (2 if self.device.startswith("cuda") else 1)

    def _serve_model(self, model_path: Path) -> tuple[Callable, int]:
        """Start the net server with this model, or have the running one switch to it."""
        from training.serve import ServerProcess

        if self._server is None:
            from training.go.features import num_planes
            from training.search.net_server import SlotLayout

            cfg = self.cfg
            layout = SlotLayout(cfg.self_play.search_processes, cfg.self_play.batch_size,
                                num_planes(cfg.net.history, cfg.net.liberties),
                                cfg.go.board_size)
            server = ServerProcess(layout, model=model_path, device=self.device,
                                   jit=cfg.net.inference, dtype=cfg.net.inference_dtype,
                                   threads=cfg.self_play.threads_per_worker,
                                   gather_wait_s=cfg.self_play.gather_wait_ms / 1000.0,
                                   lanes=self.server_lanes())
            try:
                server.start()
            except Exception:
                server.stop()
                raise
            self._server = server
            generation = server.generation
        else:
            generation = self._server.load_model(model_path)

        def served(planes: Any, legal: Any) -> Any:
            raise RuntimeError("this model is served by the net server process")

        return served, generation

    # ------------------------------------------------------------------ the daemon

    def stop(self) -> None:
        """Ask `run()` to finish after the current step (safe from signal handlers)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the daemon cleanly (main thread only)."""
        on_stop_signals(self.stop)

    def run(self, max_games: int | None = None) -> WorkerSummary:
        """Play until stopped or `max_games` games are finished; returns a summary."""
        if self._lock_file is None:  # a second run() of this object: lock again, re-read
            self._lock_folder()
            self._next_seq = self._load_next_seq(self._next_seq)
        log.info("worker %s starting in %s on %s (pid %d, seed %d, next batch seq %d)",
                 self.name, self.folder, self.device, os.getpid(), self.seed, self._next_seq)
        observer = self._watch_models()
        # Models that arrived while nothing watched (before this run) are looked at once.
        self._models_changed.set()
        beat = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        beat.start()
        games_since_sync = 0
        last_scan = time.monotonic()
        try:
            while not self._stop.is_set():
                if self._selfplay is None:
                    if not self._sync():
                        self._wait_for_models()
                    continue
                if self._loader is None:
                    self._start_loader()
                self._note_switch()  # also while paused: a model that is ready goes in
                if self._outbox_full() or not self._flush_full_batches():
                    continue
                finished = self._selfplay.step()
                self._note_switch()
                if finished and not self._pending:
                    self._pending_since = time.monotonic()
                for rec in finished:
                    self._pending.append(rec)
                    games_since_sync += 1
                    with self._lock:
                        self.games_done += 1
                        self.positions_done += int(getattr(rec, "num_moves", 0))
                if not self._flush_full_batches():
                    continue
                if max_games is not None and self.games_done >= max_games:
                    break
                due = games_since_sync >= self.cfg.distributed.sync_interval
                if due and time.monotonic() - last_scan > POLL_MODELS_S:
                    self._models_changed.set()  # the loader rescans
                    games_since_sync = 0
                    last_scan = time.monotonic()
        finally:
            self._shutdown(observer)
        return WorkerSummary(self.games_done, self.batches_written, self.discarded_games,
                             self.generation)

    def _shutdown(self, observer: Any) -> None:
        self._stop.set()
        self._models_changed.set()  # wakes the loader, which then ends
        if self._loader is not None:
            self._loader.join(timeout=120)
            self._loader = None
        if self._selfplay is not None:
            n = int(self._selfplay.discard_unfinished() or 0)
            with self._lock:
                self.discarded_games += n
            close = getattr(self._selfplay, "close", None)  # search processes' last games
            for rec in close() if close is not None else ():
                self._pending.append(rec)
                with self._lock:
                    self.games_done += 1
                    self.positions_done += int(getattr(rec, "num_moves", 0))
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._pending and not self._flush(len(self._pending)):
            log.error("the last %d finished games could not be written", len(self._pending))
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)
        self._stop.set()
        with self._lock:
            self.state = WorkerState.OFFLINE
        self._write_heartbeat()
        log.info("worker %s stopped: games=%d batches=%d discarded_unfinished=%d gen=%d",
                 self.name, self.games_done, self.batches_written, self.discarded_games,
                 self.generation)
        self.release_folder()

    # ------------------------------------------------------------------ errors

    def _report_error(self, message: str) -> None:
        """State Error with `message` in the heartbeat (cleared when the cause is gone)."""
        log.error("%s", message)
        with self._lock:
            self.last_error = message
            self.state = WorkerState.ERROR
        self._write_heartbeat()

    def _clear_error(self, prefix: str) -> None:
        with self._lock:
            if self.last_error.startswith(prefix):
                self.last_error = ""
                if self.state == WorkerState.ERROR and self._selfplay is not None:
                    self.state = WorkerState.ACTIVE

    # ------------------------------------------------------------------ outbox

    def _outbox_full(self) -> bool:
        backlog = len(outbox_batches(self.outbox))
        full = backlog >= self.cfg.distributed.max_outbox_batches
        if full != self.paused:
            log.warning("outbox holds %d batches (limit %d): %s", backlog,
                        self.cfg.distributed.max_outbox_batches,
                        "pausing self-play until the coach collects" if full else "resuming")
            with self._lock:
                self.paused = full
            self._write_heartbeat()
        if full:
            self._stop.wait(timeout=self.cfg.distributed.heartbeat_interval_s)
        return full

    def _flush(self, count: int) -> bool:
        """Write the first `count` pending games as one batch; False (state Error, games
        kept) when the disk refuses, e.g. when it is full."""
        records = self._pending[:count]
        generation = min(int(getattr(r, "generation", self.generation)) for r in records)
        if not self._make_disk_reserve():
            self._report_error(f"cannot write a batch to {self.outbox}: no space left on "
                               f"device (not even the {RESERVE_BYTES // 1024} KB reserve); "
                               "retrying")
            return False
        try:
            if self._reserved is None:
                self._reserved = self._reserve_seq()
            path = self.outbox / batch_name(self.name, generation, self._reserved)
            self.write_batch(records, path)
        except OSError as e:
            self._report_error(f"cannot write a batch to {self.outbox}: "
                               f"{e.strerror or e}; retrying")
            return False
        self._reserved = None  # a failed write keeps its number: the name never existed
        self._pending = self._pending[count:]
        with self._lock:
            self.batches_written += 1
        self._clear_error("cannot write")
        self._make_disk_reserve()
        log.info("wrote %s (%d games)", path.name, len(records))
        return True

    def _flush_full_batches(self) -> bool:
        """Write every full batch, and the games that waited `distributed.batch_max_wait_s`
        as a smaller one; on a write failure wait a little and return False (no self-play
        while finished games cannot be saved)."""
        size = self.cfg.distributed.batch_size
        wait_s = self.cfg.distributed.batch_max_wait_s
        while self._pending:
            full = len(self._pending) >= size
            if not full and not (wait_s > 0 and time.monotonic() - self._pending_since >= wait_s):
                return True
            if not self._flush(min(size, len(self._pending))):
                self._stop.wait(min(5.0, self.cfg.distributed.backoff_max_s))
                return False
            self._pending_since = time.monotonic()  # the rest finished no earlier than now
        return True

    def _load_next_seq(self, min_seq: int) -> int:
        seq = min_seq
        path = self.folder / STATE_NAME
        if path.exists():
            try:
                seq = max(seq, int(json.loads(path.read_text())["next_seq"]))
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("%s unreadable (%s); continuing from the outbox", path, e)
        for name in outbox_batches(self.outbox):
            parsed = batch_name_or_none(name)
            if parsed and parsed[0] == self.name:
                seq = max(seq, parsed[2] + 1)
        return seq

    def _reserve_seq(self) -> int:
        """The next sequence number, persisted BEFORE its batch is written (OSError when the
        disk refuses; nothing is consumed then)."""
        seq = self._next_seq
        write_json_atomic(self.folder / STATE_NAME, {"next_seq": seq + 1})
        self._next_seq = seq + 1
        return seq

    # ------------------------------------------------------------------ heartbeat

    def _heartbeat_loop(self) -> None:
        interval = self.cfg.distributed.heartbeat_interval_s
        while not self._stop.is_set():
            self._write_heartbeat()
            self._stop.wait(interval)

    def heartbeat(self) -> Heartbeat:
        """The current heartbeat (what status.json says)."""
        now = time.time()
        with self._lock:
            games_per_s, positions_per_s = self._rates(now)
            return Heartbeat(
                name=self.name,
                state=self.state,
                pid=os.getpid(),
                generation=self.generation,
                games_done=self.games_done,
                games_per_s=games_per_s,
                positions_per_s=positions_per_s,
                outbox_backlog=len(outbox_batches(self.outbox)),
                paused=self.paused,
                last_error=self.last_error,
                time=now,
            )

    def switch_phases(self) -> dict[str, float]:
        """The last model switch: its generation and seconds spent to unpack (verify,
        decompress), build (read, net, inference form, warm-up) and, once it is in use,
        waited (from ready to the step that took it in ended)."""
        with self._lock:
            return {k: round(v, 3) for k, v in self._switch.items()}

    def _rates(self, now: float) -> tuple[float, float]:
        """Games/s and positions/s over the last minute (caller holds the lock)."""
        self._rate.append((now, self.games_done, self.positions_done))
        while len(self._rate) > 2 and self._rate[0][0] < now - 60.0:
            self._rate.popleft()
        t0, g0, p0 = self._rate[0]
        dt = now - t0
        if dt <= 0:
            return 0.0, 0.0
        return (self.games_done - g0) / dt, (self.positions_done - p0) / dt

    def _write_heartbeat_file(self) -> None:
        with self._beat_lock:
            hb = self.heartbeat()
            extra = {"discarded_games": self.discarded_games, "batches_written":
                     self.batches_written, "next_seq": self._next_seq, "device": self.device,
                     "switch": self.switch_phases()}
            write_json_atomic(self.heartbeat_path, {**hb.to_dict(), **extra})

    def _write_heartbeat(self) -> None:
        try:
            try:
                self._write_heartbeat_file()
            except OSError as e:
                reserve = self.folder / RESERVE_NAME
                if e.errno != errno.ENOSPC or not reserve.exists():
                    raise
                # The disk is full. Whatever this thread was about to say, the heartbeat
                # written with the reserve's space says Error: spending it on "Active" would
                # leave nothing to report the full disk with (the main loop writes no batch
                # until the reserve is back).
                with self._lock:
                    if not self.last_error.startswith("cannot write"):
                        self.last_error = (f"cannot write to {self.folder}: no space left on "
                                           "device; retrying")
                    self.state = WorkerState.ERROR
                reserve.unlink(missing_ok=True)
                self._write_heartbeat_file()
        except OSError as e:  # a full disk must not kill the daemon; the next beat retries
            if not self._heartbeat_failing:  # once per streak: the log may be on that disk
                log.warning("heartbeat not written (retrying quietly): %s", e)
            self._heartbeat_failing = True
            return
        if self._heartbeat_failing:
            log.info("heartbeat written again")
        self._heartbeat_failing = False

    def _make_disk_reserve(self) -> bool:
        """(Re)create the reserve file if it is missing; True when it is there."""
        reserve = self.folder / RESERVE_NAME
        if reserve.exists():
            return True
        try:
            with open(reserve, "wb") as f:
                f.write(b"\0" * RESERVE_BYTES)
                f.flush()
                os.fsync(f.fileno())  # tmpfs and others may refuse only at write-back
        except OSError:
            reserve.unlink(missing_ok=True)
            return False
        return True


def _derive_seed(base: int, name: str) -> int:
    """A per-worker seed from the run seed and the worker's name (stable across restarts
    would repeat games, so the pid and time are mixed in)."""
    mix = sum((i + 1) * ord(c) for i, c in enumerate(name))
    return (base * 1_000_003 + mix * 7919 + os.getpid() * 31 + int(time.time())) % (2**31 - 1)


def import_worker_class(spec: str) -> type[Worker]:
    """`"package.module:ClassName"` -> the class; it must be a subclass of Worker."""
    import importlib

    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"worker class {spec!r}: expected 'module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"worker class {spec!r}: cannot import {module_name}: {e}") from e
    cls = getattr(module, class_name, None)
    # under `python -m training.worker` this module is __main__: compare with the importable one
    base = importlib.import_module("training.worker").Worker
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"worker class {spec!r}: {class_name} is not a subclass of "
                         "training.worker.Worker")
    return cls


# ----------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="AZ-Go self-play worker daemon")
    p.add_argument("--config", default=None, help="config file (default configs/config.yaml)")
    p.add_argument("--name", default="worker1", help="worker name (batch names, status)")
    p.add_argument("--dir", default=None,
                   help="worker folder with models/ and outbox/ (default runs/main/workers/NAME)")
    p.add_argument("--log-dir", default=None, help="folder of worker_<name>.log (default DIR/logs)")
    p.add_argument("--log-to-stderr-only", action="store_true",
                   help="no log file of its own (stderr is already redirected to one)")
    p.add_argument("--models-dir", default=None,
                   help="folder the coach pushes models to (default DIR/models)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default: cuda:<gpu> when CUDA is present, else cpu)")
    p.add_argument("--gpu-id", type=int, default=None, help="GPU for self-play; -1 for CPU")
    p.add_argument("--seed", type=int, default=None, help="self-play seed (default: derived)")
    p.add_argument("--min-seq", type=int, default=0,
                   help="first batch sequence number (the coach passes the ledger's next one)")
    p.add_argument("--max-games", type=int, default=None, help="stop after this many games")
    p.add_argument("--worker-class", default=None,
                   help="module:Class, a subclass of training.worker.Worker to run")
    p.add_argument("--nice", type=int, default=0,
                   help="lower this daemon's CPU priority by this much (local mode: 10, so that "
                   "training on the same cores goes first)")
    return p.parse_args(argv)


def lower_priority(nice: int) -> None:
    """Lower this process's CPU priority by `nice`, also where the kernel groups processes by
    session (Linux autogroup: a daemon in its own session competes as a group, and its own
    nice value counts only inside that group, so the group's nice value is set too)."""
    os.nice(nice)
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:  # not Linux, or no autogroup: the process's nice value is what counts
        pass


def _device(args: argparse.Namespace) -> str:
    if args.device:
        return args.device
    if args.gpu_id is not None and args.gpu_id < 0:
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{args.gpu_id or 0}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    folder = Path(args.dir or RunDir(cfg.run.dir).worker(args.name))
    log_dir = Path(args.log_dir) if args.log_dir else folder / "logs"
    log_file = None if args.log_to_stderr_only else log_dir / f"worker_{args.name}.log"
    configure_logging(log_file, cfg.logging.level)
    raise_open_files_limit()  # a worker host may start it under a soft limit of 1,024
    spec = args.worker_class or getattr(cfg.self_play, "worker_class", "") or ""
    try:
        cls = import_worker_class(spec or "training.worker:Worker")
    except ValueError as e:
        logging.getLogger(__name__).error("%s", e)
        return 2
    if args.nice > 0:
        lower_priority(args.nice)
    import torch

    torch.set_num_threads(cfg.self_play.threads_per_worker)
    import importlib

    # under `python -m training.worker` this module is __main__: catch the importable class
    busy = importlib.import_module("training.worker").WorkerFolderBusy
    try:
        worker = cls(cfg, args.name, folder, device=_device(args), seed=args.seed,
                     min_seq=args.min_seq, models_dir=args.models_dir)
    except busy as e:
        log.error("%s", e)  # configure_logging also writes to stderr
        return EXIT_FOLDER_BUSY
    worker.install_signal_handlers()
    log.info("pid %d, class %s.%s", os.getpid(), cls.__module__, cls.__name__)
    worker.run(max_games=args.max_games)
    return 0


if __name__ == "__main__":
    os.umask(0o077)  # run and worker folders, logs and models: the user's alone
    sys.exit(main())
