"""One net for several search processes: leaves in shared memory, one batch for all of them.

On a GPU box every search process that builds its own evaluator holds its own CUDA context,
and without MPS the GPU runs one process's call at a time (about 1 ms a call, launch-bound,
whatever the batch). Here one server process owns the net and the search processes send
their leaves to it; the server gathers the ready ones into one batch (up to thousands of
positions), runs the net once and writes the results back (KataGo's net server thread,
across processes).

Owns:
- `SlotLayout`: the shared memory's layout: a control block (the server's pid, epoch and
  beat, the generation in use, counters, a model request) and one *slot* per client:
  a request (uint8 planes [max_batch, C, N, N], bool legal [max_batch, A + 1], its count
  and sequence number) and its results (float32 priors [max_batch, A + 1], values and
  scores [max_batch], the generation that computed them).
- `SharedSlots`: the segment (`multiprocessing.shared_memory`), created by whoever
  supervises (it outlives a server that dies) and attached by the server and the clients.
- `Signals`: eventfds (Linux): one *doorbell* the clients ring and one *done* per slot the
  server rings; created by the supervisor, inherited by the processes (`pass_fds`).
- `NetClient`: `evaluate(planes, legal) -> (priors, values)` (and scores when asked), the
  contract of `training.learn.net.make_evaluator`, so the search does not change.
- `NetServer`: the loop: wait for ready slots, gather them (waiting up to `gather_wait_s`
  for the other live clients), one `evaluate` call, results back, each client's done rung;
  run by one or more *lanes* (threads with their own evaluators: one gathers while
  another's batch is in the net).
- `StandInNet`: a deterministic net in numpy with a set latency per call (sleeping, like
  a GPU whatever the batch; 0 = instant), for tests and benchmarks.

Vocabulary: a *client* is a search process attached to one slot; a *request* is one
`evaluate` call's positions (at most `max_batch`; a larger call is sent in parts); the
*epoch* counts server starts (a restarted server takes over the requests its predecessor
had taken).

Slot states and who writes them: FREE -> IDLE (the client attaches), IDLE -> READY (the
client, its request written first), READY -> TAKEN (the server, gathering), TAKEN -> IDLE
(the server, results written first, then `result_seq`; the client waits for
`result_seq == seq`), IDLE/READY -> FREE (the server, for a client that died; or the client
as it detaches). Each transition has one writer, so no lock is needed; the order of the
stores is kept on x86 (TSO) and the eventfd calls between them are full barriers.

Failures: the server never waits on one slot (a dead client's request is served or dropped,
its slot freed within `CLIENT_CHECK_S`); a client whose server dies keeps its request in its
slot and rings the doorbell again every `RESIGNAL_S`, so a restarted server (which puts the
slots its predecessor had TAKEN back to READY) serves it: the search goes on. A client gives
up with `NetServerUnavailable` after `call_timeout_s` without an answer.

Planes are 0/1 (`training.go.features`), so a uint8 plane carries them exactly (4x fewer
bytes than float32; the server converts to the net's dtype).

It must not: import torch (the server's `evaluate` comes in as a callable, built by
`training.serve`), start processes, or read files.
"""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Callable, Sequence

import numpy as np

BatchEvaluate = Callable[[np.ndarray, np.ndarray], "tuple[np.ndarray, ...]"]

# Slot states
FREE, IDLE, READY, TAKEN = 0, 1, 2, 3

# Control block (int64 fields)
C_SERVER_PID, C_EPOCH, C_BEAT, C_GENERATION, C_BATCHES, C_POSITIONS = range(6)
C_MODEL_REQUEST, C_MODEL_LOADED, C_MODEL_FAILED, C_STOP, C_MAX_BATCH_SEEN = range(6, 11)
CONTROL_FIELDS = 16
TEXT_BYTES = 4096  # the model request's path, and the last model error's message

# Slot header (int64 fields)
S_STATE, S_SEQ, S_PID, S_COUNT, S_RESULT_SEQ, S_GENERATION, S_TAKEN_EPOCH = range(7)
SLOT_FIELDS = 8

RESIGNAL_S = 0.2
"""A waiting client rings the doorbell again this often (a restarted server hears it)."""
CLIENT_CHECK_S = 0.5
"""The server frees the slots of dead clients this often."""
SERVER_TICK_S = 0.05
"""The server's longest sleep without a doorbell (its beat, a model switch, a stop)."""
SPIN_S = 0.0001
"""Both ends look for an answer (a request) this long before they sleep on an eventfd: a
wake-up from a blocking wait costs 5-10 us on bare metal but about 75 us in a virtual
machine (measured here: 150 us an eventfd ping-pong, 1.6 us a spinning one). Each end spins
only while its last wait was short (under `SPIN_WHILE_WAITS_UNDER_S`): a wait for a net
call of milliseconds would only burn the CPU the searches need."""
SPIN_WHILE_WAITS_UNDER_S = 5 * SPIN_S
GATHER_WAIT_S = 0.010
"""How long the server waits, with some requests in, for every other live client's: a
worker's search processes then step together and each batch holds all of them. Measured on
2 cores, 2 search processes and a stand-in net of 3 ms a call (`benchmarks/gpu_ceiling.py`):
10 ms gave 2.0x the mean batch of one process and 1.8x its moves/s; 5 ms 1.9x and 1.7x;
2 ms 1.4x and 1.5x. A client that is slow to send costs the others at most this per call."""


GATHER_LOOK_S = 0.001
"""During its gather wait a lane looks at the slots at least this often."""


class NetServerUnavailable(RuntimeError):
    """No answer from the net server within the client's `call_timeout_s`."""


@dataclass(frozen=True)
class SlotLayout:
    """Sizes of the shared segment: `n_slots` clients of at most `max_batch` positions each,
    planes [C, N, N] (`channels`, `board_size`), A + 1 = board_size**2 + 1 moves."""

    n_slots: int
    max_batch: int
    channels: int
    board_size: int

    def __post_init__(self) -> None:
        if not (1 <= self.n_slots <= 1024 and 1 <= self.max_batch <= 65536):
            raise ValueError(f"net server slots: 1..1024 slots of 1..65536 positions, got "
                             f"{self.n_slots} of {self.max_batch}")

    @property
    def moves(self) -> int:
        return self.board_size * self.board_size + 1

    def _parts(self) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        s, b, n = self.n_slots, self.max_batch, self.board_size
        return [
            ("control", (CONTROL_FIELDS,), np.dtype(np.int64)),
            ("slots", (s, SLOT_FIELDS), np.dtype(np.int64)),
            ("priors", (s, b, self.moves), np.dtype(np.float32)),
            ("values", (s, b), np.dtype(np.float32)),
            ("scores", (s, b), np.dtype(np.float32)),
            ("planes", (s, b, self.channels, n, n), np.dtype(np.uint8)),
            ("legal", (s, b, self.moves), np.dtype(np.bool_)),
            ("model_path", (TEXT_BYTES,), np.dtype(np.uint8)),
            ("model_error", (TEXT_BYTES,), np.dtype(np.uint8)),
        ]

    def offsets(self) -> dict[str, tuple[int, tuple[int, ...], np.dtype]]:
        out, at = {}, 0
        for name, shape, dtype in self._parts():
            at = (at + 63) // 64 * 64  # each array on its own cache line
            out[name] = (at, shape, dtype)
            at += int(np.prod(shape)) * dtype.itemsize
        return out

    @property
    def nbytes(self) -> int:
        at, shape, dtype = list(self.offsets().values())[-1]
        return at + int(np.prod(shape)) * dtype.itemsize

    def to_args(self) -> list[str]:
        """The layout as a command line's words (`from_text` reads them back)."""
        return [f"{self.n_slots},{self.max_batch},{self.channels},{self.board_size}"]

    @classmethod
    def from_text(cls, text: str) -> "SlotLayout":
        try:
            s, b, c, n = (int(x) for x in text.split(","))
        except ValueError:
            raise ValueError(f"net server layout must be SLOTS,MAX_BATCH,CHANNELS,BOARD, "
                             f"got {text!r}") from None
        return cls(s, b, c, n)


class SharedSlots:
    """The shared segment of a `SlotLayout` as numpy views (`control`, `slots`, `planes`,
    `legal`, `priors`, `values`, `scores`). `create` makes one (its owner unlinks it with `close`);
    `attach` maps one by name."""

    def __init__(self, shm: shared_memory.SharedMemory, layout: SlotLayout, owner: bool):
        self.shm = shm
        self.layout = layout
        self.owner = owner
        self.name = shm.name
        for key, (at, shape, dtype) in layout.offsets().items():
            setattr(self, key, np.ndarray(shape, dtype, buffer=shm.buf, offset=at))
        # The same int64 fields as memoryviews: an item costs ~50 ns there, ~300 in numpy,
        # and a call reads and writes a few dozen of them.
        offsets = layout.offsets()
        at = offsets["control"][0]
        self._views = [shm.buf[at : at + CONTROL_FIELDS * 8].cast("q")]
        self.ctl = self._views[0]
        at = offsets["slots"][0]
        self.hdr = []
        for k in range(layout.n_slots):
            lo = at + k * SLOT_FIELDS * 8
            self._views.append(shm.buf[lo : lo + SLOT_FIELDS * 8].cast("q"))
            self.hdr.append(self._views[-1])

    @classmethod
    def create(cls, layout: SlotLayout) -> "SharedSlots":
        shm = shared_memory.SharedMemory(create=True, size=layout.nbytes)
        slots = cls(shm, layout, owner=True)
        slots.control[:] = 0
        slots.control[C_GENERATION] = -1
        slots.slots[:] = 0
        return slots

    @classmethod
    def attach(cls, name: str, layout: SlotLayout) -> "SharedSlots":
        shm = _attach_untracked(name)
        if shm.size < layout.nbytes:
            shm.close()
            raise ValueError(f"shared memory {name}: {shm.size} bytes, the layout needs "
                             f"{layout.nbytes}")
        return cls(shm, layout, owner=False)

    def text(self, key: str) -> str:
        raw = bytes(getattr(self, key))
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    def set_text(self, key: str, value: str) -> None:
        data = value.encode("utf-8")[: TEXT_BYTES - 1]
        area = getattr(self, key)
        area[:] = 0
        area[: len(data)] = np.frombuffer(data, np.uint8)

    def close(self) -> None:
        """Unmap (and, for the owner, unlink) the segment; the views must not be used after."""
        for key in self.layout.offsets():
            setattr(self, key, None)
        self.ctl, self.hdr = None, []  # type: ignore[assignment]
        for view in self._views:
            view.release()
        self._views = []
        try:
            self.shm.close()
        except BufferError:  # a view still held elsewhere: the mapping goes at exit
            self.shm.close = lambda: None  # type: ignore[method-assign]  # quiet __del__
        if self.owner:
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass


def _attach_untracked(name: str) -> shared_memory.SharedMemory:
    """Attach without this process's resource tracker owning the segment: before Python 3.13
    an attaching process registers it, and its tracker unlinks it when the process exits,
    under the creator's feet."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    from multiprocessing import resource_tracker

    shm = shared_memory.SharedMemory(name=name)
    try:
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - best effort: a tracker that never started
        pass
    return shm


@dataclass(frozen=True)
class Signals:
    """The eventfds: `doorbell` (clients -> server), `done[k]` (server -> client k)."""

    doorbell: int
    done: tuple[int, ...]

    @classmethod
    def create(cls, n_slots: int) -> "Signals":
        flags = os.EFD_NONBLOCK
        return cls(os.eventfd(0, flags), tuple(os.eventfd(0, flags) for _ in range(n_slots)))

    def fds(self) -> tuple[int, ...]:
        return (self.doorbell, *self.done)

    def to_args(self) -> list[str]:
        return [f"{self.doorbell}:{','.join(str(fd) for fd in self.done)}"]

    @classmethod
    def from_text(cls, text: str) -> "Signals":
        bell, _, done = text.partition(":")
        return cls(int(bell), tuple(int(fd) for fd in done.split(",") if fd))

    def close(self) -> None:
        for fd in self.fds():
            try:
                os.close(fd)
            except OSError:
                pass


def ring(fd: int) -> None:
    """Add 1 to an eventfd (never blocks: a counter that is near full is already rung)."""
    try:
        os.eventfd_write(fd, 1)
    except BlockingIOError:
        pass


def drain(fd: int) -> None:
    """Reset an eventfd to 0 (nothing to read is fine)."""
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass


def wait_fd(poller: select.poll, timeout_s: float) -> bool:
    """True when the polled fd became readable within `timeout_s`."""
    return bool(poller.poll(max(0, int(timeout_s * 1000 + 0.999))))


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, counts as dead)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


# ------------------------------------------------------------------------------ the client


class NetClient:
    """A search process's end of the net server: `evaluate(planes, legal)` as the search
    calls it (`training.search.mcts.Evaluate`), served through slot `slot`.

    `generation` is the model generation of the last results (-1 before any).
    `calls` and `positions` count what was sent. With `score`, `evaluate` also returns the
    server's scores (the search's score utility; zeros from a server evaluator without them).
    """

    def __init__(self, slots: SharedSlots, slot: int, signals: Signals, *,
                 call_timeout_s: float = 600.0, spin_s: float = SPIN_S, score: bool = False):
        if not 0 <= slot < slots.layout.n_slots:
            raise ValueError(f"slot {slot} outside 0..{slots.layout.n_slots - 1}")
        self.slots = slots
        self.slot = slot
        self.signals = signals
        self.call_timeout_s = call_timeout_s
        self.spin_s = spin_s
        self.score = score
        self._last_wait_s = 0.0
        self.generation = -1
        self.calls = 0
        self.positions = 0
        self._header = slots.hdr[slot]
        self._planes = slots.planes[slot]
        self._legal = slots.legal[slot]
        self._priors = slots.priors[slot]
        self._values = slots.values[slot]
        self._scores = slots.scores[slot]
        self._done = signals.done[slot]
        self._poll = select.poll()
        self._poll.register(self._done, select.POLLIN)
        lay = slots.layout
        self._shape = (lay.channels, lay.board_size, lay.board_size)
        header = self._header
        settle = time.monotonic() + 5.0  # a dead predecessor's request may be in a batch
        while header[S_STATE] == TAKEN and time.monotonic() < settle:
            time.sleep(0.001)
        header[S_PID] = os.getpid()
        header[S_COUNT] = 0
        header[S_RESULT_SEQ] = header[S_SEQ]  # a request of a dead predecessor is dropped
        drain(self._done)
        header[S_STATE] = IDLE

    def evaluate(self, planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, ...]:
        """planes 0/1 [B, C, N, N] (float32 or uint8), legal bool [B, A + 1] -> priors
        float32 [B, A + 1] (softmax over the legal moves), values float32 [B] (and with
        `score` scores float32 [B])."""
        if planes.ndim != 4 or planes.shape[1:] != self._shape:
            raise ValueError(f"planes must be [B, {', '.join(map(str, self._shape))}], got "
                             f"{list(planes.shape)}")
        batch = planes.shape[0]
        moves = self.slots.layout.moves
        if legal.shape != (batch, moves):
            raise ValueError(f"legal must be [{batch}, {moves}], got {list(legal.shape)}")
        priors = np.empty((batch, moves), np.float32)
        values = np.empty(batch, np.float32)
        scores = np.empty(batch, np.float32) if self.score else None
        step = self.slots.layout.max_batch
        for lo in range(0, batch, step):
            hi = min(batch, lo + step)
            self._call(planes[lo:hi], legal[lo:hi], priors[lo:hi], values[lo:hi],
                       None if scores is None else scores[lo:hi])
        return (priors, values) if scores is None else (priors, values, scores)

    __call__ = evaluate

    def _call(self, planes, legal, priors, values, scores) -> None:
        n = planes.shape[0]
        header = self._header
        self._planes[:n] = planes  # 0/1 floats -> uint8, exactly
        self._legal[:n] = legal
        header[S_COUNT] = n
        seq = header[S_SEQ] + 1
        header[S_SEQ] = seq
        header[S_STATE] = READY  # last: the server reads the request after this
        ring(self.signals.doorbell)
        asked = time.perf_counter()
        spin_end = asked + (self.spin_s if self._last_wait_s < SPIN_WHILE_WAITS_UNDER_S else 0)
        while header[S_RESULT_SEQ] != seq and time.perf_counter() < spin_end:
            pass
        waited_since = time.monotonic()
        while header[S_RESULT_SEQ] != seq:
            if wait_fd(self._poll, RESIGNAL_S):
                drain(self._done)
                continue
            if time.monotonic() - waited_since > self.call_timeout_s:
                raise NetServerUnavailable(
                    f"no answer from the net server (pid {self.slots.ctl[C_SERVER_PID]})"
                    f" for slot {self.slot} in {self.call_timeout_s:g} s")
            ring(self.signals.doorbell)  # a restarted server may not have heard the first
        self._last_wait_s = time.perf_counter() - asked
        priors[:] = self._priors[:n]
        values[:] = self._values[:n]
        if scores is not None:
            scores[:] = self._scores[:n]
        self.generation = header[S_GENERATION]
        self.calls += 1
        self.positions += n

    def detach(self) -> None:
        """Give the slot up (a client that dies has it freed by the server instead)."""
        if self._header[S_PID] == os.getpid():
            self._header[S_STATE] = FREE


# ------------------------------------------------------------------------------ the server


class _Lane:
    """One lane's own gather buffers, its poller of the doorbell (a poll object serves one
    thread at a time) and its last wait for a request."""

    def __init__(self, layout: SlotLayout, max_positions: int, doorbell: int):
        self.poll = select.poll()
        self.poll.register(doorbell, select.POLLIN)
        self.planes = np.zeros((max_positions, layout.channels, layout.board_size,
                                layout.board_size), np.uint8)
        self.legal = np.zeros((max_positions, layout.moves), np.bool_)
        self.idle_s = 0.0


class NetServer:
    """The loop of the process that owns the net: gathers the ready slots into one batch.

    Several *lanes* (threads, each with its own evaluator) may serve the same slots: one
    gathers the next batch while another's is in the net, so the net is not idle while the
    server copies and the clients of the next batch do not wait for the last one's answers.
    A lane takes its slots (READY -> TAKEN) under the server's lock; they are its alone
    until it answers.

    Args:
        slots, signals: the shared segment and eventfds (attached in this process).
        spin_s: how long to look for requests before sleeping on the doorbell (`SPIN_S`).
        max_positions: most positions in one batch (default: all slots full).
        gather_wait_s: with some slots ready, how long to wait for the other live clients'
            requests before running what is there (`GATHER_WAIT_S`; 0: run at once). With
            one lane the net is idle while it waits: a bigger batch for that time. With
            several, a lane waits only while another lane's batch is in the net (the wait
            then costs the net nothing), and not for the clients another lane holds.
        lanes: how many lanes will call `serve`.
    """

    def __init__(self, slots: SharedSlots, signals: Signals, *, max_positions: int = 0,
                 gather_wait_s: float = GATHER_WAIT_S, spin_s: float = SPIN_S,
                 lanes: int = 1):
        lay = slots.layout
        self.lanes = lanes
        self.slots = slots
        self.signals = signals
        self.gather_wait_s = gather_wait_s
        self.spin_s = spin_s
        self.max_positions = max_positions or lay.n_slots * lay.max_batch
        if self.max_positions < lay.max_batch:
            raise ValueError(f"max_positions {self.max_positions} is below one slot's "
                             f"{lay.max_batch}")
        self._lock = threading.Lock()  # taking slots and freeing dead clients' slots
        self._count_lock = threading.Lock()
        self._in_net = 0  # lanes with a batch taken and not yet answered
        self._last_check = 0.0
        self.batches = 0
        self.positions = 0

    def start(self, generation: int) -> None:
        """Take the segment over: bump the epoch, put back what a dead predecessor had
        taken, say which generation serves."""
        control = self.slots.ctl
        for h in self.slots.hdr:
            if h[S_STATE] == TAKEN:
                h[S_STATE] = READY
        control[C_SERVER_PID] = os.getpid()
        control[C_EPOCH] += 1
        control[C_GENERATION] = generation
        ring(self.signals.doorbell)  # serve at once what waits

    def serve(self, current: Callable[[], tuple[BatchEvaluate, int]],
              should_stop: Callable[[], bool] = lambda: False,
              between: Callable[[], None] | None = None) -> None:
        """Serve as one lane until `should_stop()` (or the control block's stop flag); the
        lanes of a server each call this on their own thread. `current()` is the lane's
        batch evaluator and the generation it computes, asked before each batch (so a
        model switch goes in between two batches); `between()` runs after each batch or
        idle tick."""
        control = self.slots.ctl
        lane = _Lane(self.slots.layout, self.max_positions, self.signals.doorbell)
        while not should_stop() and not control[C_STOP]:
            ready = self._gather(lane)
            if len(ready):
                self.run_batch(lane, ready, *current())
            control[C_BEAT] += 1
            if between is not None:
                between()
            now = time.monotonic()
            if now - self._last_check > CLIENT_CHECK_S:
                with self._lock:
                    self._last_check = now
                    self.free_dead_clients()

    def _ready(self) -> list[int]:
        return [k for k, h in enumerate(self.slots.hdr) if h[S_STATE] == READY]

    def _waiting_for(self) -> int:
        """The live clients that no lane holds (a request of theirs may come)."""
        return sum(1 for h in self.slots.hdr if h[S_STATE] in (IDLE, READY))

    def _gather(self, lane: _Lane) -> list[int]:
        """The slots to serve now, taken for `lane` (maybe none, after a tick without a
        doorbell). A lane sleeps without the lock (a lane that holds it through its sleeps
        would starve the others of it) and gathers under it (the gather wait included, so
        that no other lane takes a part of its batch)."""
        ready = self._ready()
        if not ready:
            started = time.perf_counter()
            spin_end = started + (self.spin_s if lane.idle_s < SPIN_WHILE_WAITS_UNDER_S else 0)
            while not ready and time.perf_counter() < spin_end:
                ready = self._ready()
            if not ready and wait_fd(lane.poll, SERVER_TICK_S):
                drain(self.signals.doorbell)
            lane.idle_s = time.perf_counter() - started
        with self._lock:
            ready = self._ready()
            if ready and self.gather_wait_s > 0:
                ready = self._gather_wait(lane, ready)
            taken, total = [], 0
            hdr = self.slots.hdr
            for k in ready:
                total += max(0, hdr[k][S_COUNT])
                if total > self.max_positions:
                    break
                hdr[k][S_STATE] = TAKEN
                taken.append(k)
            return taken

    def _gather_wait(self, lane: _Lane, ready: list[int]) -> list[int]:
        """With some slots ready: wait up to `gather_wait_s` for every live client that no
        lane holds, or for a full batch."""
        hdr = self.slots.hdr
        deadline = time.monotonic() + self.gather_wait_s
        while len(ready) < self._waiting_for():
            if sum(hdr[k][S_COUNT] for k in ready) >= self.max_positions:
                break
            if self.lanes > 1 and self._in_net == 0:  # the net would idle: run now
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # another lane, idle, may drain the doorbell first: look again at least this often
            if wait_fd(lane.poll, min(left, GATHER_LOOK_S)):
                drain(self.signals.doorbell)
            ready = self._ready()
        return ready

    def run_batch(self, lane: _Lane, taken: Sequence[int], evaluate: BatchEvaluate,
                  generation: int) -> None:
        """One net call for the requests in slots `taken` (TAKEN by `lane`), results
        back with the `generation` that computed them, clients rung. Until they are, the
        lane counts as in the net."""
        with self._count_lock:
            self._in_net += 1
        try:
            self._run_batch(lane, taken, evaluate, generation)
        finally:
            with self._count_lock:
                self._in_net -= 1

    def _run_batch(self, lane: _Lane, taken: Sequence[int], evaluate: BatchEvaluate,
                   generation: int) -> None:
        sl = self.slots
        hdr, ctl = sl.hdr, sl.ctl
        epoch = ctl[C_EPOCH]
        at, spans = 0, []
        for k in taken:
            h = hdr[k]
            h[S_TAKEN_EPOCH] = epoch
            n = h[S_COUNT]
            if not 0 < n <= sl.layout.max_batch:  # a client that died while writing
                n = 0
            spans.append((k, at, n, h[S_SEQ]))
            at += n
        if len(spans) == 1:  # one request: the net reads it where it is
            k, _, n, _ = spans[0]
            planes, legal = sl.planes[k, :n], sl.legal[k, :n]
        else:
            for k, lo, n, _ in spans:
                lane.planes[lo : lo + n] = sl.planes[k, :n]
                lane.legal[lo : lo + n] = sl.legal[k, :n]
            planes, legal = lane.planes[:at], lane.legal[:at]
        if at:
            out = evaluate(planes, legal)
            priors, values = out[0], out[1]
            scores = out[2] if len(out) > 2 else None
        for k, lo, n, seq in spans:
            if n:
                sl.priors[k, :n] = priors[lo : lo + n]
                sl.values[k, :n] = values[lo : lo + n]
                sl.scores[k, :n] = 0.0 if scores is None else scores[lo : lo + n]
            h = hdr[k]
            h[S_GENERATION] = generation
            h[S_STATE] = IDLE  # before result_seq: the client may submit at once
            h[S_RESULT_SEQ] = seq
            ring(self.signals.done[k])
        with self._count_lock:
            self.batches += 1
            self.positions += at
            ctl[C_BATCHES] += 1
            ctl[C_POSITIONS] += at
            ctl[C_MAX_BATCH_SEEN] = max(ctl[C_MAX_BATCH_SEEN], at)

    def free_dead_clients(self) -> list[int]:
        """Free the slots whose client process is gone; returns them."""
        freed = []
        for k, h in enumerate(self.slots.hdr):
            if h[S_STATE] not in (FREE, TAKEN) and not pid_alive(h[S_PID]):
                h[S_STATE] = FREE
                freed.append(k)
        return freed


# ------------------------------------------------------------------------ a stand-in net


class StandInNet:
    """A deterministic net in numpy with a set latency per call: `latency_s` of sleep
    whatever the batch (a GPU's launch-bound call, without computing); 0 = instant.

    values = (the side to move's stones - the opponent's, planes 0 and 1) / (N * N);
    priors: over the legal moves, twice as much on an empty point as on pass, normalised.
    A row's results do not depend on the other rows of its batch.
    """

    def __init__(self, latency_s: float = 0.0):
        self.latency_s = latency_s
        self.calls = 0
        self.positions = 0

    def __call__(self, planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        started = time.perf_counter()
        b, _, n, _ = planes.shape
        own = planes[:, 0].reshape(b, n * n).astype(np.float32)
        opp = planes[:, 1].reshape(b, n * n).astype(np.float32)
        values = ((own.sum(1) - opp.sum(1)) / (n * n)).astype(np.float32)
        weights = np.ones(legal.shape, np.float32)
        weights[:, : n * n] += 1.0 - own - opp
        weights *= legal
        total = weights.sum(1, keepdims=True)
        priors = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
        self.calls += 1
        self.positions += b
        if self.latency_s > 0:
            left = self.latency_s - (time.perf_counter() - started)
            if left > 0:
                time.sleep(left)
        return priors, values


def positions_of(slots: SharedSlots) -> tuple[int, int]:
    """(batches, positions) the server has run on this segment, over all its epochs."""
    return slots.ctl[C_BATCHES], slots.ctl[C_POSITIONS]


def live_clients(slots: SharedSlots) -> Sequence[int]:
    """The slots with a client attached."""
    return [k for k, h in enumerate(slots.hdr) if h[S_STATE] != FREE]
