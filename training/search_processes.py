"""Self-play in several search processes through one net server (`self_play.net_server`).

    python -m training.search_processes --shm NAME --layout ... --signals ... --slot K
                                        --seed S --out-fd FD < CONFIG_YAML

Owns:
- `SearchProcesses`: the self-play engine a worker daemon uses when its net is served
  (`training.serve.ServerProcess`): `processes` search processes, each a `SelfPlay` of
  `self_play.parallel_games` games whose `evaluate` is a `NetClient` on its own slot. It
  has SelfPlay's interface for the worker (`step() -> [GameRecord]`, `generation`,
  `set_evaluator`, `offer_evaluator`, `take_offered`, `discard_unfinished`) and `close()`.
  `step()` waits up to `STEP_WAIT_S` for finished games, restarts a search process that
  died (with backoff; its games in progress are lost and counted) and a server that died
  (its clients' requests wait in their slots, so the other searches go on).
- the search process's main: the config's YAML on stdin, games out on `--out-fd` as frames
  (one kind byte and a 4-byte length: b"R" finished games as the uncompressed .npz of
  `training.go.records.encode_batch`, b"S" counters as JSON). A model switch happens in the
  server; a search process notices it from the generation its results carry and gives the
  new generation to the games it starts.

The processes import no torch: a search process is numpy, numba and its slot.

It must not: write batch files or talk to the coach (the worker daemon does both).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import select
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from training.go.records import BatchMeta, GameRecord, encode_batch

log = logging.getLogger(__name__)

FRAME = struct.Struct(">cI")
MAX_FRAME_BYTES = 256 << 20
"""The largest frame a search process may send (a few hundred finished games)."""
STEP_WAIT_S = 0.5
"""`step()` returns after this long without finished games (the worker's loop goes on)."""
STATS_EVERY_S = 1.0
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
STOP_GRACE_S = 30.0
"""How long a search process may take to end its step and report when asked to stop."""
CALL_TIMEOUT_S = 300.0
"""A search process whose net server does not answer this long exits (and is restarted)."""


class SearchProcessError(RuntimeError):
    """A search process sent something that is not a frame of this protocol."""


# ------------------------------------------------------------------------ the frames


def _write_frame(fd: int, kind: bytes, body: bytes) -> None:
    data = FRAME.pack(kind, len(body)) + body
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def encode_records(records: Sequence[GameRecord]) -> bytes:
    return encode_batch(records, BatchMeta.from_records("search", records))


def decode_records(body: bytes) -> list[GameRecord]:
    """The records of an `encode_records` frame (from our own child: checked for shape,
    not replayed; the coach validates every batch it collects)."""
    with np.load(io.BytesIO(body), allow_pickle=False) as z:
        a = {k: z[k] for k in z.files}
    offsets = a["offsets"]
    out = []
    for g in range(len(offsets) - 1):
        lo, hi = int(offsets[g]), int(offsets[g + 1])
        out.append(GameRecord(
            board_size=int(a["board_size"][g]), komi=float(a["komi"][g]),
            moves=a["moves"][lo:hi], visits=a["visits"][lo:hi], result=int(a["result"][g]),
            score=float(a["score"][g]), resigned=bool(a["resigned"][g]),
            resign_disabled=bool(a["resign_disabled"][g]),
            would_resign_as=int(a["would_resign_as"][g]), generation=int(a["generation"][g]),
            seed=int(a["seed"][g]), simulations=int(a["simulations"][g]),
            values=a["values"][lo:hi], full_search=a["full_search"][lo:hi],
            surprise=a["surprise"][lo:hi]))
    return out


# ------------------------------------------------------------------- the search process


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="one search process of a served worker")
    p.add_argument("--shm", required=True)
    p.add_argument("--layout", required=True)
    p.add_argument("--signals", required=True)
    p.add_argument("--slot", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out-fd", type=int, required=True)
    p.add_argument("--call-timeout-s", type=float, default=CALL_TIMEOUT_S)
    return p.parse_args(argv)


def search_main(argv: Sequence[str] | None = None) -> int:
    """Play until SIGTERM (or the parent's death); finished games and counters out."""
    from configs import load_config_text
    from training.run.signals import die_with_parent, on_stop_signals
    from training.search.net_server import (
        C_GENERATION, NetClient, SharedSlots, Signals, SlotLayout,
    )
    from training.search.selfplay import SelfPlay

    die_with_parent()
    args = parse_args(argv)
    parent = os.getppid()
    cfg = load_config_text(sys.stdin.read(), "<worker config>")
    stopping = []
    on_stop_signals(lambda: stopping.append(True))
    slots = SharedSlots.attach(args.shm, SlotLayout.from_text(args.layout))
    client = NetClient(slots, args.slot, Signals.from_text(args.signals),
                       call_timeout_s=args.call_timeout_s, score=cfg.mcts.wants_score)
    sp = SelfPlay(client.evaluate, cfg.go, cfg.mcts, cfg.self_play, history=cfg.net.history,
                  generation=max(0, slots.ctl[C_GENERATION]), seed=args.seed,
                  liberties=cfg.net.liberties, planes_dtype=np.uint8)
    out = args.out_fd
    started = last_stats = time.monotonic()

    def stats(**extra: Any) -> None:
        body = {"moves": sp.moves_played, "games": sp.games_finished, "calls": client.calls,
                "positions": client.positions, "generation": sp.generation,
                "seconds": time.monotonic() - started, **extra}
        _write_frame(out, b"S", json.dumps(body).encode())

    try:
        while not stopping and os.getppid() == parent:
            records = sp.step()
            if client.generation >= 0 and client.generation != sp.generation:
                sp.set_evaluator(client.evaluate, client.generation)
            if records:
                _write_frame(out, b"R", encode_records(records))
            if time.monotonic() - last_stats >= STATS_EVERY_S:
                stats()
                last_stats = time.monotonic()
        stats(discarded=sp.discard_unfinished(), final=True)
    except BrokenPipeError:  # the worker is gone
        return 0
    finally:
        client.detach()
        slots.close()
    return 0


# ------------------------------------------------------------------------- the engine


@dataclass
class _Child:
    slot: int
    proc: subprocess.Popen | None = None
    fd: int = -1
    buffer: bytearray = field(default_factory=bytearray)
    stats: dict = field(default_factory=dict)
    done_moves: int = 0  # moves of earlier processes of this slot
    starts: int = 0
    failures: int = 0
    next_start: float = 0.0


class SearchProcesses:
    """`processes` search processes through `server`: a self-play engine for the worker.

    Args:
        cfg: the worker's config (sent to each search process as YAML).
        server: the net server (`training.serve.ServerProcess`) with at least `processes`
            slots, already serving.
        seed: base seed; process k's games draw from their own seeds.
        stderr_path: where the search processes' stderr goes (appended; None: inherit).
    """

    def __init__(self, cfg: Any, server: Any, *, processes: int, seed: int,
                 stderr_path: str | os.PathLike | None = None, nice: int = 0):
        from configs import dump_config

        if processes > server.layout.n_slots:
            raise ValueError(f"{processes} search processes need as many net server slots, "
                             f"the server has {server.layout.n_slots}")
        self.server = server
        self.seed = seed
        self.nice = nice
        self.stderr_path = Path(stderr_path) if stderr_path else None
        self._config = dump_config(cfg).encode()
        self._children = [_Child(k) for k in range(processes)]
        self._poll = select.poll()
        self.discarded = 0
        self.restarts = 0
        self._late: list[GameRecord] = []
        for child in self._children:
            self._spawn(child)

    # -------------------------------------------------------------- SelfPlay's interface

    @property
    def generation(self) -> int:
        return self.server.generation

    def set_evaluator(self, evaluate: Any, generation: int) -> None:
        """The server has switched already (`ServerProcess.load_model`): nothing to do."""

    offer_evaluator = set_evaluator

    def take_offered(self) -> None:
        pass

    @property
    def moves_played(self) -> int:
        return sum(c.done_moves + int(c.stats.get("moves", 0)) for c in self._children)

    def step(self) -> list[GameRecord]:
        """Finished games of any search process, waiting up to `STEP_WAIT_S` for some;
        dead search processes and a dead server are restarted here."""
        records = self._read(STEP_WAIT_S)
        self.server.restart_if_dead()
        for child in self._children:
            if child.proc is not None and child.proc.poll() is not None:
                records += self._reap(child)
            if child.proc is None and time.monotonic() >= child.next_start:
                self._spawn(child)
        return records

    def discard_unfinished(self) -> int:
        """Stop every search process (each ends its step, sends its finished games and
        counts the unfinished ones); returns the games in progress that were dropped."""
        for child in self._children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while any(c.proc is not None for c in self._children):
            self._late += self._read(0.1)
            for child in self._children:
                if child.proc is None:
                    continue
                if child.proc.poll() is None and time.monotonic() > deadline:
                    child.proc.kill()
                if child.proc.poll() is not None:
                    self._late += self._reap(child, restart=False)
        dropped, self.discarded = self.discarded, 0
        return dropped

    def close(self) -> list[GameRecord]:
        """Stop the search processes and the server; the games that finished meanwhile."""
        self.discard_unfinished()
        self.server.stop()
        late, self._late = self._late, []
        return late

    # -------------------------------------------------------------- the processes

    def _spawn(self, child: _Child) -> None:
        read_fd, write_fd = os.pipe()
        seed = (self.seed * 1_000_003 + child.slot * 7919 + child.starts * 104_729) % (2**31 - 1)
        cmd = [sys.executable, "-m", "training.search_processes",
               *self.server.client_args(child.slot), "--seed", str(seed),
               "--out-fd", str(write_fd)]
        err = open(self.stderr_path, "ab") if self.stderr_path else None
        try:
            child.proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
                pass_fds=(*self.server.client_fds(child.slot), write_fd),
                cwd=str(Path(__file__).resolve().parents[1]),
                preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None)
        finally:
            os.close(write_fd)
            if err is not None:
                err.close()
        try:
            child.proc.stdin.write(self._config)  # type: ignore[union-attr]
            child.proc.stdin.close()  # type: ignore[union-attr]
        except BrokenPipeError:  # it died at once: reaped by the next step
            pass
        os.set_blocking(read_fd, False)
        child.fd = read_fd
        child.buffer.clear()
        child.stats = {}
        child.starts += 1
        self._poll.register(read_fd, select.POLLIN)
        log.info("search process %d started (pid %d)", child.slot, child.proc.pid)

    def _reap(self, child: _Child, restart: bool = True) -> list[GameRecord]:
        """A search process that exited: its last frames, its games in progress counted
        (from its final report, else unknown: not counted), a restart planned."""
        proc = child.proc
        assert proc is not None
        records = self._drain(child)
        self._poll.unregister(child.fd)
        os.close(child.fd)
        child.fd = -1
        code = proc.returncode
        child.done_moves += int(child.stats.get("moves", 0))
        self.discarded += int(child.stats.get("discarded", 0))
        final = bool(child.stats.get("final"))
        child.proc = None
        if restart:
            wait = 0.0 if final and code == 0 else RESTART_BACKOFF_S[
                min(child.failures, len(RESTART_BACKOFF_S) - 1)]
            child.failures = 0 if final else child.failures + 1
            child.next_start = time.monotonic() + wait
            self.restarts += 1
            log.warning("search process %d (pid %d) exited with code %s; restarting in %.0fs",
                        child.slot, proc.pid, code, wait)
        return records

    def _read(self, timeout_s: float) -> list[GameRecord]:
        """Frames that arrived within `timeout_s` (at once when some are there)."""
        by_fd = {c.fd: c for c in self._children if c.fd >= 0}
        records: list[GameRecord] = []
        for fd, _ in self._poll.poll(int(timeout_s * 1000)):
            child = by_fd.get(fd)
            if child is not None:
                records += self._drain(child)
        return records

    def _drain(self, child: _Child) -> list[GameRecord]:
        """Read what child's pipe holds now; the records of its complete frames."""
        while True:
            try:
                data = os.read(child.fd, 1 << 20)
            except BlockingIOError:
                break
            if not data:
                break
            child.buffer += data
            if len(child.buffer) > MAX_FRAME_BYTES + FRAME.size:
                break
        records: list[GameRecord] = []
        buf = child.buffer
        while len(buf) >= FRAME.size:
            kind, size = FRAME.unpack_from(buf)
            if size > MAX_FRAME_BYTES or kind not in (b"R", b"S"):
                raise SearchProcessError(f"search process {child.slot}: a frame of kind "
                                         f"{kind!r} and {size} bytes is not ours")
            if len(buf) < FRAME.size + size:
                break
            body = bytes(buf[FRAME.size : FRAME.size + size])
            del buf[: FRAME.size + size]
            if kind == b"R":
                records += decode_records(body)
            else:
                child.stats = json.loads(body)
        return records

    def child_stats(self) -> list[dict]:
        """Each search process's last counters (moves, games, calls, positions, seconds)."""
        return [dict(c.stats) for c in self._children]

    def pids(self) -> list[int]:
        return [c.proc.pid if c.proc is not None else 0 for c in self._children]


if __name__ == "__main__":
    sys.exit(search_main())
