"""The coach's fleet: each worker driven by its own supervisor thread, so that the coach's loop
never waits on one host.

Vocabulary:
  - member: one worker (or training node), known by its config name. `Member` is its runtime
    record: what its supervisor last saw (heartbeat, fault, error, restarts, the model it
    holds, games collected) and what the coach's loop asks of it (quota, restart).
  - backend: how one worker's machine is reached (`Backend`): a local subprocess
    (`training.fleet.local_workers.LocalBackend`) or a daemon on an SSH host through a connector of
    its own (`training.fleet.ssh_workers.SSHBackend`), so that no lock is shared between hosts.
  - supervisor: the thread that drives one member, once per `distributed.poll_interval_s`:
    bring-up (prepare, start; retried with `backoff_s`), the heartbeat read, restart of a dead
    daemon (with backoff), the newest model pushed, and its outbox collected through the
    shared `training.fleet.collector.Collector` (which keeps the ledger and `replay/` single-writer
    and exactly-once).
  - deadline: every backend operation (connect, heartbeat read, listing, download, push, start,
    stop) is announced in `Member.busy` with its deadline. `Fleet.watchdog`, called by the
    coach's loop, abandons a supervisor stuck past it: the member's connections are closed
    (`Backend.abort`, in a thread of its own) and a fresh supervisor with a fresh backend takes
    over; the stuck thread, once unblocked, sees it was replaced and exits without writing.

Threading rule: each `Member` field has one writer, the supervisor or the coach's loop (marked
below); the loop reads members without locks, so nothing a stuck thread holds can stall it.

Failure kinds: `Unreachable` (network, host down: the worker reads Offline once its heartbeat
ages) and `WorkerFault` (the worker itself is wrong: a bad heartbeat, a failed preflight, a
daemon that exits at start: it reads Error with the reason). A daemon that exits is restarted
with backoff, its LAST ERROR the last line of its stderr (a local daemon's stderr.log, an SSH
daemon's log on its host); after `MAX_QUICK_EXITS` quick exits
in a row it is left in Error with that line instead of restarting forever. Any other
`Exception` in a supervisor pass is a bug: logged with its traceback, the pass retried after a
backoff.

It must not: decide the states shown (the coach does), age heartbeats other than through
`distributed.status.HeartbeatTracker` (a supervisor asks its own how long the heartbeat has
not changed, to know when a daemon's liveness is worth a command), train, or import paramiko.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

from configs import Config
from distributed.status import Heartbeat, HeartbeatTracker, printable
from training.fleet.collector import BatchSource, Collector, SourceError
from training.run.model_store import Manifest

log = logging.getLogger(__name__)
T = TypeVar("T")

# Bring-ups (prepare + start: SSH handshakes, a deploy, a preflight that imports torch on the
# host) run at most this many at once, so that a fleet of hundreds starting together does not
# open hundreds of sessions in the same second; the others wait their turn, one poll at a time.
MAX_CONCURRENT_BRING_UPS = 16

# A daemon that exits this many times in a row, each time before it has stayed up
# 4 x `distributed.backoff_max_s`, is not started again: the worker reads Error with the last
# line of the daemon's stderr (a wrong path, a missing package) until `ssh_connector.py
# --restart NAME` or a config edit that changes the worker.
MAX_QUICK_EXITS = 5


def backoff_s(previous_s: float, base_s: float, cap_s: float) -> float:
    """The next wait after a failure: `base_s`, then doubling, at most `cap_s`."""
    return min(cap_s, previous_s * 2 or base_s)


class Unreachable(Exception):
    """The worker's host or daemon could not be reached (network, host down): retried."""


class WorkerFault(Exception):
    """The worker itself is wrong (bad heartbeat, failed preflight, daemon exits at start)."""


def last_nonblank_line(text: str) -> str:
    """The last line of `text` that is not blank, stripped ("" when there is none): a
    daemon's last words in what it wrote."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class Backend(ABC):
    """One worker's machine: each method is one operation with a deadline (`deadline_s`).

    Network failures raise `Unreachable`, faults of the worker `WorkerFault`."""

    name: str
    host: str = "-"
    gpu: str = "-"
    spec: object = None  # what it was built from; a changed spec replaces the member

    def deadline_s(self, op: str) -> float:
        """Seconds `op` may take before its supervisor is abandoned."""
        return 60.0

    def prepare(self) -> None:
        """Once before the first start (SSH: preflight, deploy, the run's config)."""

    @abstractmethod
    def start(self, min_seq: int) -> int:
        """Start the daemon (adopt one that runs); its first batch number >= `min_seq`."""

    @abstractmethod
    def is_running(self) -> bool: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def read_heartbeat(self) -> Heartbeat | None:
        """The daemon's heartbeat, None before its first one."""

    @abstractmethod
    def push_model(self, models_dir: Path, manifest: Manifest) -> None: ...

    @abstractmethod
    def source(self) -> BatchSource: ...

    def cheap_liveness(self) -> bool:
        """True when `is_running` costs nothing (a local pid) and is asked every pass."""
        return False

    def exit_reason(self) -> str:
        """The last line the daemon wrote to its stderr (a local daemon: since it was started;
        an SSH daemon: its log's last line), once it has exited ("" when not known)."""
        return ""

    def abort(self) -> None:
        """Close the connections, so that an operation blocked on them fails now."""

    def fresh(self) -> Backend:
        """A new backend for the same worker (after an abandoned supervisor)."""
        return self

    def close(self) -> None: ...


@dataclass(frozen=True)
class Busy:
    op: str
    started: float  # time.monotonic()
    deadline: float


@dataclass
class Member:
    """One worker's runtime record (see the module docstring for who writes what)."""

    name: str
    host: str = "-"
    gpu: str = "-"
    # written by the supervisor
    heartbeat: Heartbeat | None = None  # the newest heartbeat read
    running: bool | None = None  # False: the daemon is known to be gone
    fault: str = ""  # non-empty: the worker is in Error for this reason
    error: str = ""  # the last operational error (shown in LAST ERROR)
    restarts: int = 0
    quick_exits: int = 0  # the daemon's exits in a row, each soon after its start
    started: bool = False
    prepared: bool = False
    delivered: int = -1  # newest model generation pushed to it
    games_collected: int = 0  # games ingested from it since the coach started
    busy: Busy | None = None
    backoff_s: float = 0.0
    next_try: float = 0.0  # time.monotonic() before which a failed step is not retried
    # written by the coach's loop
    quota: int | None = None  # games it may still deliver this generation (None: no cap)
    games_baseline: int = 0  # games_collected when the current generation's count began
    speed: float = 0.0  # smoothed games/s
    restart_requested: threading.Event = field(default_factory=threading.Event)
    collect_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def generation_games(self) -> int:
        """Games collected from it since the current generation's count began."""
        return self.games_collected - self.games_baseline


class _Abandoned(Exception):
    """Raised in a supervisor thread that the watchdog replaced."""


@dataclass(frozen=True)
class Target:
    """The model every worker should hold."""

    generation: int
    models_dir: Path
    manifest: Manifest


class _DeadlineSource:
    """A backend's `BatchSource` with each listing, download and delete under a deadline."""

    def __init__(self, sup: Supervisor, inner: BatchSource):
        self.sup, self.inner = sup, inner

    def list_batches(self) -> list[str]:
        return self.sup.op("list outbox", self.inner.list_batches)

    def fetch(self, name: str, dest: Path) -> int:
        return self.sup.op("download", lambda: self.inner.fetch(name, dest))

    def delete(self, name: str) -> None:
        return self.sup.op("delete", lambda: self.inner.delete(name))


class Supervisor:
    """The thread that drives one member (see the module docstring)."""

    def __init__(self, fleet: Fleet, member: Member, backend: Backend):
        self.fleet, self.member, self.backend = fleet, member, backend
        self.abandoned = False
        self._heartbeats = HeartbeatTracker(0.0)  # only the age of this member's is asked
        self._quiet_since = time.monotonic()  # taken over or (re)started: no heartbeat due yet
        self._down_until = 0.0
        self._down_s = 0.0
        self._up_since = 0.0
        self._push_after = 0.0
        self.thread = threading.Thread(target=self._run, name=f"supervise-{member.name}",
                                       daemon=True)

    # ------------------------------------------------------------------ operations

    def op(self, name: str, fn: Callable[[], T]) -> T:
        """Run one backend operation under its deadline (announced in `member.busy`)."""
        if self.abandoned:
            raise _Abandoned(name)
        now = time.monotonic()
        self.member.busy = Busy(name, now, now + self.backend.deadline_s(name))
        try:
            return fn()
        finally:
            if self.abandoned:
                raise _Abandoned(name)
            self.member.busy = None

    def _failed(self, what: str, err: Exception) -> None:
        if self.abandoned:
            return  # replaced: the member is the new supervisor's now
        m, dist = self.member, self.fleet.cfg.distributed
        reason = printable(f"{what}: {type(err).__name__}: {err}")
        m.backoff_s = backoff_s(m.backoff_s, dist.backoff_base_s, dist.backoff_max_s)
        m.next_try = time.monotonic() + m.backoff_s
        if isinstance(err, WorkerFault):
            m.fault = reason
        m.error = reason
        log.log(logging.ERROR if isinstance(err, WorkerFault) else logging.WARNING,
                "worker %s: %s; retrying in %.1fs", m.name, reason, m.backoff_s)

    def _unreachable(self, what: str, err: Exception) -> None:
        if self.abandoned:
            return
        m, dist = self.member, self.fleet.cfg.distributed
        m.error = printable(f"{what}: {type(err).__name__}: {err}")
        self._down_s = backoff_s(self._down_s, dist.backoff_base_s, dist.backoff_max_s)
        self._down_until = time.monotonic() + self._down_s
        log.warning("worker %s: unreachable (%s); next try in %.1fs", m.name, m.error,
                    self._down_s)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        stop, wake = self.fleet.stopping, self.fleet.wake[self.member.name]
        while not stop.is_set() and not self.abandoned:
            try:
                self.step()
            except _Abandoned:
                return
            except Exception as e:  # noqa: BLE001 - the supervisor's loop boundary
                if self.abandoned:
                    return
                log.exception("worker %s: supervisor pass failed", self.member.name)
                self._failed("supervisor", e)
            wake.wait(self.fleet.cfg.distributed.poll_interval_s)
            wake.clear()

    def step(self) -> None:
        """One pass: bring up, heartbeat, liveness, model, collect."""
        m, b = self.member, self.backend
        now = time.monotonic()
        if now < self._down_until:
            return  # unreachable: the next try waits out its backoff
        if m.restart_requested.is_set():
            m.restart_requested.clear()
            m.restarts += 1
            m.quick_exits, m.fault = 0, ""
            log.info("worker %s: restarting (requested)", m.name)
            try:
                self.op("stop", b.stop)
            except (Unreachable, WorkerFault) as e:
                self._unreachable("stop", e)
                return
            m.started, m.next_try = False, 0.0
        if not m.started and (now < m.next_try or not self._bring_up()):
            if not b.cheap_liveness():
                return  # no daemon on that host yet: nothing to read or collect
        if not self._heartbeat():
            return
        if not self._liveness():
            return
        if m.running:
            self._push()
        self._collect()

    def _bring_up(self) -> bool:
        m, b = self.member, self.backend
        if not self.fleet.bring_ups.acquire(timeout=self.fleet.cfg.distributed.poll_interval_s):
            return False  # others are being brought up: try again next pass
        try:
            if not m.prepared:
                self.op("prepare", b.prepare)
                m.prepared = True
            pid = self.op("start", lambda: b.start(self.fleet.next_seq(m.name)))
        except (Unreachable, WorkerFault) as e:
            if isinstance(e, WorkerFault):
                m.prepared = False  # preflight and config again next time
            self._failed("bring-up", e)
            return False
        finally:
            self.fleet.bring_ups.release()
        m.started, m.running, m.fault, m.error = True, True, "", ""
        self._quiet_since = self._up_since = time.monotonic()
        log.info("worker %s: daemon up, pid %s", m.name, pid)
        return True

    def _heartbeat(self) -> bool:
        m = self.member
        try:
            hb = self.op("read heartbeat", self.backend.read_heartbeat)
        except WorkerFault as e:
            m.fault = printable(f"bad heartbeat: {e}")
            if m.error != m.fault:
                log.error("worker %s: %s", m.name, m.fault)
            m.error = m.fault
            return True  # collecting and pushing go on; the state shows Error
        except Unreachable as e:
            self._unreachable("heartbeat", e)
            return False
        if m.fault.startswith("bad heartbeat"):
            m.fault = ""
        if self._down_s:  # reachable again: the outage's error is over
            m.error, self._down_s = "", 0.0
        if hb is not None:
            self._heartbeats.observe(m.name, hb)  # remembers when its time last changed
            m.heartbeat = hb
        return True

    def _liveness(self) -> bool:
        """Restart a daemon that is gone; a remote one is asked only when its heartbeat is
        stale (that costs a command)."""
        m, b = self.member, self.backend
        dist = self.fleet.cfg.distributed
        stale_after = max(3 * dist.heartbeat_interval_s, 2.0)
        now = time.monotonic()
        _, age = self._heartbeats.observe(m.name, None, now)  # age None: none read yet
        quiet_s = min(now - self._quiet_since, math.inf if age is None else age)
        if not b.cheap_liveness() and quiet_s <= stale_after:
            return True
        try:
            alive = self.op("check daemon", b.is_running)
        except (Unreachable, WorkerFault) as e:
            self._unreachable("check daemon", e)
            return False
        if alive:
            m.running = True
            if m.backoff_s and time.monotonic() - self._up_since > 4 * dist.backoff_max_s:
                m.backoff_s = 0.0  # it has stayed up: forget earlier failures
            return True
        m.running = False
        if m.started:
            m.started = False
            self._exited(time.monotonic() - self._up_since)
        return False

    def _exited(self, up_s: float) -> None:
        """The daemon is gone after `up_s` seconds: restart it after a backoff, or, after
        MAX_QUICK_EXITS quick exits in a row, leave the worker in Error with the reason."""
        m, dist = self.member, self.fleet.cfg.distributed
        try:
            reason = printable(self.op("exit reason", self.backend.exit_reason))[:300]
        except (Unreachable, WorkerFault, OSError) as e:
            reason = ""
            log.warning("worker %s: its stderr is not readable: %s", m.name, e)
        m.error = f"daemon exited: {reason}" if reason else "daemon exited"
        quick_s = 4 * dist.backoff_max_s
        m.quick_exits = m.quick_exits + 1 if up_s <= quick_s else 0
        if m.quick_exits >= MAX_QUICK_EXITS:
            m.fault = m.error = printable(
                f"{m.error} (exited {m.quick_exits} times in a row, each within "
                f"{quick_s:.0f}s of its start: not restarted; fix it, then `python "
                f"distributed/ssh_connector.py --restart {m.name}`)")
            m.next_try = math.inf
            log.error("worker %s: %s", m.name, m.fault)
            return
        m.restarts += 1
        m.backoff_s = backoff_s(m.backoff_s, dist.backoff_base_s, dist.backoff_max_s)
        m.next_try = time.monotonic() + m.backoff_s
        log.warning("worker %s: daemon not running (%s); restart %d in %.1fs", m.name,
                    m.error, m.restarts, m.backoff_s)

    def _push(self) -> None:
        m, target = self.member, self.fleet.target
        t0 = time.monotonic()
        if target is None or m.delivered >= target.generation or t0 < self._push_after:
            return
        try:
            self.op("push model", lambda: self.backend.push_model(target.models_dir,
                                                                  target.manifest))
        except (Unreachable, WorkerFault, OSError) as e:
            m.error = printable(f"model push of generation {target.generation} failed: {e}")
            if isinstance(e, WorkerFault):  # e.g. a flooded models/ folder: Error, with why
                m.fault = m.error
            self._push_after = t0 + self.fleet.cfg.distributed.backoff_max_s
            log.warning("worker %s: %s; retrying in %.0fs", m.name, m.error,
                        self.fleet.cfg.distributed.backoff_max_s)
            return
        m.delivered = target.generation
        if m.fault.startswith("model push"):
            m.fault = m.error = ""
        self.fleet.stats.last_push_s = time.monotonic() - t0
        log.info("worker %s: pushed generation %d in %.2fs", m.name, target.generation,
                 time.monotonic() - t0)

    def _collect(self, *, everything: bool = False) -> None:
        m = self.member
        quota = None if everything else m.quota
        if quota == 0 or self.fleet.collector is None:
            return
        if not m.collect_lock.acquire(blocking=False):
            return  # a replaced supervisor still unwinds its collection
        try:
            source = _DeadlineSource(self, self.backend.source())
            res = self.fleet.collector.collect(m.name, source, max_games=quota,
                                               current_generation=self.fleet.generation,
                                               paced=not everything)
        except (SourceError, Unreachable) as e:
            if self.abandoned:
                return
            m.error = printable(f"collect: {e}")
            log.warning("worker %s: collecting failed, will retry: %s", m.name, m.error)
            return
        finally:
            m.collect_lock.release()
        m.games_collected += res.games

    def final_collect(self) -> None:
        """Everything left in the outbox (the coach is stopping; quotas do not apply)."""
        try:
            self._collect(everything=True)
        except _Abandoned:
            pass


class Fleet:
    """The workers of one coach, each with its supervisor (see the module docstring).

    Subclasses say how the config maps to backends (`backends_for`); `set_workers(cfg)`
    follows an edited config the same way for both kinds."""

    def __init__(self, cfg: Config, *, next_seq: Callable[[str], int] = lambda name: 0,
                 stats=None):
        from distributed.transfer import TransferStats

        self.cfg = cfg
        self.next_seq = next_seq
        self.stats = stats or TransferStats()
        self.collector: Collector | None = None
        self.generation = 0  # the coach's current generation (stamped on ingested batches)
        self.target: Target | None = None
        self.stopping = threading.Event()
        self.bring_ups = threading.BoundedSemaphore(MAX_CONCURRENT_BRING_UPS)
        self.members: dict[str, Member] = {}
        self.wake: dict[str, threading.Event] = {}
        self._sups: dict[str, Supervisor] = {}
        self._running = False
        self._add(self.backends_for(cfg))

    # ------------------------------------------------------------------ membership

    def backends_for(self, cfg: Config) -> list[Backend]:
        """The backends the config asks for (subclasses)."""
        return []

    def _add(self, backends: list[Backend]) -> None:
        for b in backends:
            self.members[b.name] = Member(b.name, host=b.host, gpu=b.gpu)
            self.wake[b.name] = threading.Event()
            self._sups[b.name] = Supervisor(self, self.members[b.name], b)
            if self._running:
                self._sups[b.name].thread.start()

    def names(self) -> list[str]:
        return list(self.members)

    def backend(self, name: str) -> Backend:
        return self._sups[name].backend

    def set_workers(self, cfg: Config) -> tuple[list[str], list[str]]:
        """Follow an edited config: removed (and changed) workers are stopped in the
        background, added (and changed) ones start. Returns (added, removed)."""
        self.cfg = cfg
        wanted = {b.name: b for b in self.backends_for(cfg)}
        changed = [n for n, b in wanted.items()
                   if n in self._sups and self._sups[n].backend.spec != b.spec]
        removed = [n for n in self._sups if n not in wanted]
        for name in removed + changed:
            self._retire(name)
        added = [n for n in wanted if n not in self._sups]
        self._add([wanted[n] for n in added])
        return [n for n in added if n not in changed] + changed, removed

    def _retire(self, name: str) -> None:
        """Drop a member; a thread of its own (bounded by the stop deadline, never by the
        coach's loop) stops its daemon, which writes its finished games as a last batch,
        then collects what its outbox holds: a removed worker's games are not left behind."""
        sup = self._sups.pop(name)
        self.members.pop(name)
        self.wake.pop(name).set()
        sup.abandoned = True
        backend = sup.backend.fresh()

        def stop() -> None:
            try:
                backend.stop()
                self._collect_all(name, backend)
            except (Unreachable, WorkerFault, SourceError, OSError) as e:
                log.warning("worker %s: could not stop and collect the removed worker: %s",
                            name, e)
            finally:
                backend.close()
                sup.backend.close()

        threading.Thread(target=stop, name=f"retire-{name}", daemon=True).start()

    def _collect_all(self, name: str, backend: Backend, passes: int = 100) -> None:
        """Everything in a stopped worker's outbox, a pass at a time (quotas do not apply)."""
        if self.collector is None:
            return
        for _ in range(passes):
            res = self.collector.collect(name, backend.source(),
                                         current_generation=self.generation, paced=False)
            if res.ingested:
                log.info("worker %s (removed): collected its last %d games", name, res.games)
            if not res.deferred or res.over_budget:
                return

    # ------------------------------------------------------------------ what the coach asks

    def start(self, collector: Collector) -> None:
        """Start every supervisor (each brings its worker up, then collects from it)."""
        self.collector = collector
        self._running = True
        for sup in self._sups.values():
            sup.thread.start()

    def publish(self, generation: int, models_dir: Path, manifest: Manifest) -> None:
        """Every worker gets this model (its supervisor pushes it, retried until done)."""
        self.generation = generation
        self.target = Target(generation, Path(models_dir), manifest)
        for ev in list(self.wake.values()):
            ev.set()

    def request_restart(self, name: str) -> None:
        self.members[name].restart_requested.set()
        self.wake[name].set()

    def watchdog(self, now: float | None = None) -> list[str]:
        """Abandon supervisors stuck past their operation's deadline; returns their names."""
        now = time.monotonic() if now is None else now
        replaced = []
        for name, sup in list(self._sups.items()):
            busy = sup.member.busy
            if busy is None or now <= busy.deadline or sup.abandoned:
                continue
            m = sup.member
            m.error = printable(f"{busy.op} stuck for {now - busy.started:.0f}s (deadline "
                                f"{busy.deadline - busy.started:.0f}s): connection closed, "
                                "retrying")
            log.error("worker %s: %s", name, m.error)
            sup.abandoned = True
            old = sup.backend
            threading.Thread(target=old.abort, name=f"abort-{name}", daemon=True).start()
            m.busy = None
            fresh = Supervisor(self, m, old.fresh())
            self._sups[name] = fresh
            if self._running:
                fresh.thread.start()
            replaced.append(name)
        return replaced

    def stop_all(self, timeout_s: float | None = None) -> None:
        """Stop the supervisors, then every daemon in parallel; returns within `timeout_s`
        (default: one stop attempt's timeouts) whatever the hosts do."""
        self.stopping.set()
        for ev in list(self.wake.values()):
            ev.set()
        end = time.monotonic() + 2.0  # a pass in progress finishes its operation
        for sup in self._sups.values():
            if sup.thread.is_alive():
                sup.thread.join(timeout=max(0.0, end - time.monotonic()))
        jobs = []
        for name, sup in self._sups.items():
            backend = sup.backend if not sup.thread.is_alive() else sup.backend.fresh()
            t = threading.Thread(target=self._stop_one, args=(name, backend),
                                 name=f"stop-{name}", daemon=True)
            t.start()
            jobs.append((t, backend.deadline_s("stop")))
        d = self.cfg.distributed
        one_try = d.connect_timeout_s + d.command_timeout_s + d.stop_grace_s + 5.0
        limit = timeout_s if timeout_s is not None else min(
            max((dl for _, dl in jobs), default=0.0), one_try)
        end = time.monotonic() + limit
        for t, _ in jobs:
            t.join(timeout=max(0.0, end - time.monotonic()))
        for t, _ in jobs:
            if t.is_alive():
                log.warning("stopping: %s did not finish in %.0fs; left behind", t.name, limit)
        self._running = False

    def _stop_one(self, name: str, backend: Backend) -> None:
        try:
            backend.stop()
        except (Unreachable, WorkerFault, OSError) as e:
            log.warning("worker %s: stop failed: %s", name, e)
        m = self.members.get(name)
        if m is not None:
            m.running = False

    def final_collect(self, timeout_s: float) -> None:
        """Collect what the stopped daemons flushed, in parallel, within `timeout_s`."""
        threads = []
        for name, sup in self._sups.items():
            fresh = Supervisor(self, sup.member, sup.backend)
            t = threading.Thread(target=fresh.final_collect, name=f"collect-{name}",
                                 daemon=True)
            t.start()
            threads.append((fresh, t))
        end = time.monotonic() + timeout_s
        for fresh, t in threads:
            t.join(timeout=max(0.0, end - time.monotonic()))
            if t.is_alive():
                fresh.abandoned = True
                log.warning("stopping: collecting from %s did not finish in %.0fs",
                            fresh.member.name, timeout_s)
                threading.Thread(target=fresh.backend.abort, daemon=True).start()

    def close(self) -> None:
        for sup in self._sups.values():
            sup.backend.close()


class Job:
    """One blocking call (e.g. starting the training nodes of a round) in a thread of its
    own, polled by the coach's loop without waiting; `overdue` after `deadline_s`."""

    def __init__(self, name: str, fn: Callable[[], T], deadline_s: float):
        self.name, self.deadline_s = name, deadline_s
        self.deadline = time.monotonic() + deadline_s
        self._result: list = []
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._result.append((True, fn()))
        except Exception as e:  # noqa: BLE001 - handed to the poller by result()
            self._result.append((False, e))

    def done(self) -> bool:
        return bool(self._result)

    def overdue(self) -> bool:
        return not self._result and time.monotonic() > self.deadline

    def result(self):
        """The call's value, or its exception raised here (only once `done`)."""
        ok, value = self._result[0]
        if not ok:
            raise value
        return value
