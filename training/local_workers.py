"""Local mode: worker daemons as subprocesses of the coach, on this machine.

A `LocalFleet` runs `start_worker.py` once per worker, each with its own folder
`run_dir/workers/<name>` (models/, outbox/, status.json) and its log in
`logs/worker_<name>.log`, spread over the GPUs by `placement.plan_workers` (or all on the CPU).
It restarts a worker whose process died, with exponential backoff, and stops them with
SIGTERM (then SIGKILL after `distributed.stop_grace_s`). The daemons run at nice
`WORKER_NICE`, below the coach and its trainer.

Each worker's pid is written to `run_dir/workers/<name>/worker.pid`, so a coach restarted
after a crash adopts the daemons that still run instead of starting a second copy.

Fleet vocabulary shared with the SSH fleet (`training.ssh_workers`): `names()`, `start_all()`,
`supervise()`, `push_model()`, `heartbeats()`, `source(name)`, `set_workers()`, `stop_all()`,
`restarts`, `hosts`, `gpus`.

It must not: collect or validate batches (the collector does) or decide when to train.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from configs import Config
from distributed.status import (
    HEARTBEAT_NAME,
    Heartbeat,
    StatusFormatError,
    WorkerState,
    read_heartbeat,
)
from training import model_store
from training.collector import LocalSource
from training.model_store import Manifest

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
PID_NAME = "worker.pid"
WORKER_NICE = 10
"""Local daemons run this much below the coach's CPU priority: a training round or an arena
on the same cores then takes the CPU it needs (`benchmarks/train.py --beside-selfplay 2`, 2
cores: the trainer at 0.13x of its speed alone beside equal-priority self-play, 0.66x beside
niced self-play) and self-play fills the idle time."""


@dataclass
class _Proc:
    name: str
    folder: Path
    device: str
    popen: subprocess.Popen | None = None
    adopted_pid: int | None = None
    restarts: int = 0
    next_start: float = 0.0
    backoff_s: float = 0.0
    started_at: float = 0.0
    log_file: Path | None = None
    last_exit: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        if self.popen is not None:
            return self.popen.pid
        return self.adopted_pid

    def is_running(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        if self.adopted_pid is not None:
            return _pid_is_worker(self.adopted_pid)
        return False


def _pid_is_worker(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (macOS): trust the pid
    if b"start_worker.py" not in cmdline:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except (OSError, IndexError):
        return True


class LocalFleet:
    """Worker daemons as local subprocesses."""

    def __init__(self, cfg: Config, run_dir: str | os.PathLike, config_file: str | os.PathLike,
                 devices: list[str], *, next_seq=lambda name: 0,
                 worker_class: str | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.config_file = Path(config_file)
        self.next_seq = next_seq
        self.worker_class = worker_class
        self.log_dir = Path(cfg.logging.dir)
        self.procs: dict[str, _Proc] = {}
        self.set_workers(devices)

    # ------------------------------------------------------------------ membership

    def set_workers(self, devices: list[str]) -> tuple[list[str], list[str]]:
        """Run len(devices) workers named worker1..N; returns (added, removed) names."""
        wanted = {f"worker{i + 1}": dev for i, dev in enumerate(devices)}
        removed = [n for n in self.procs if n not in wanted]
        for name in removed:
            self._stop(self.procs.pop(name))
        added = []
        for name, device in wanted.items():
            if name not in self.procs:
                folder = self.run_dir / "workers" / name
                folder.mkdir(parents=True, exist_ok=True)
                self.procs[name] = _Proc(name, folder, device)
                added.append(name)
        return added, removed

    def names(self) -> list[str]:
        return list(self.procs)

    @property
    def hosts(self) -> dict[str, str]:
        return {n: "localhost" for n in self.procs}

    @property
    def gpus(self) -> dict[str, str]:
        return {n: ("cpu" if p.device == "cpu" else p.device.split(":")[-1])
                for n, p in self.procs.items()}

    @property
    def restarts(self) -> dict[str, int]:
        return {n: p.restarts for n, p in self.procs.items()}

    def last_errors(self) -> dict[str, str]:
        return {n: p.last_exit for n, p in self.procs.items()}

    def folder(self, name: str) -> Path:
        return self.procs[name].folder

    def pid(self, name: str) -> int | None:
        return self.procs[name].pid

    # ------------------------------------------------------------------ lifecycle

    def start_all(self) -> dict[str, int | Exception]:
        results: dict[str, int | Exception] = {}
        for name, proc in self.procs.items():
            try:
                results[name] = self._start(proc)
            except OSError as e:
                results[name] = e
                log.error("worker %s: could not start: %s", name, e)
        return results

    def start(self, name: str) -> int:
        """Start one worker (adopting a daemon that still runs); returns its pid."""
        return self._start(self.procs[name])

    def _start(self, proc: _Proc) -> int:
        pid_file = proc.folder / PID_NAME
        if proc.popen is None and pid_file.exists():
            try:
                old = int(pid_file.read_text().strip())
            except ValueError:
                old = -1
            if old > 0 and _pid_is_worker(old):
                proc.adopted_pid = old
                log.info("worker %s: adopting running daemon pid %d", proc.name, old)
                return old
        cmd = [sys.executable, str(REPO / "start_worker.py"), "--config", str(self.config_file),
               "--name", proc.name, "--dir", str(proc.folder), "--log-dir", str(self.log_dir),
               "--device", proc.device, "--min-seq", str(self.next_seq(proc.name)),
               "--nice", str(WORKER_NICE)]
        if self.worker_class:
            cmd += ["--worker-class", self.worker_class]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(self.cfg.self_play.threads_per_worker))
        # the worker's own log file holds its story; stderr here catches only crashes at import
        self.log_dir.mkdir(parents=True, exist_ok=True)
        err = open(proc.folder / "stderr.log", "ab")
        try:
            proc.popen = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=err,
                                          start_new_session=True)
        finally:
            err.close()
        proc.adopted_pid = None
        proc.started_at = time.monotonic()
        (proc.folder / PID_NAME).write_text(f"{proc.popen.pid}\n")
        log.info("worker %s: started pid %d on %s", proc.name, proc.popen.pid, proc.device)
        return proc.popen.pid

    def supervise(self) -> list[str]:
        """Restart dead workers with exponential backoff; returns the names restarted."""
        now = time.monotonic()
        restarted = []
        base = self.cfg.distributed.backoff_base_s
        cap = self.cfg.distributed.backoff_max_s
        for name, proc in self.procs.items():
            if proc.is_running():
                if proc.backoff_s and now - proc.started_at > 4 * cap:
                    proc.backoff_s = 0.0  # it has stayed up: forget earlier failures
                continue
            if proc.next_start == 0.0:
                code = proc.popen.returncode if proc.popen is not None else None
                proc.last_exit = f"daemon exited (code {code})"
                proc.backoff_s = min(cap, proc.backoff_s * 2 or base)
                proc.next_start = now + proc.backoff_s
                log.warning("worker %s: %s; restarting in %.1fs", name, proc.last_exit,
                            proc.backoff_s)
                continue
            if now >= proc.next_start:
                proc.next_start = 0.0
                proc.restarts += 1
                try:
                    self._start(proc)
                    restarted.append(name)
                except OSError as e:
                    log.error("worker %s: restart failed: %s", name, e)
        return restarted

    def restart(self, name: str) -> None:
        """Stop and start one worker now (the --restart request)."""
        proc = self.procs[name]
        self._stop(proc)
        proc.restarts += 1
        proc.next_start = 0.0
        self._start(proc)

    def _stop(self, proc: _Proc) -> None:
        pid = proc.pid
        if pid is None or not proc.is_running():
            proc.popen = None
            proc.adopted_pid = None
            return
        log.info("worker %s: stopping pid %d", proc.name, pid)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + self.cfg.distributed.stop_grace_s
        while time.monotonic() < deadline and proc.is_running():
            time.sleep(0.05)
        if proc.is_running():
            log.warning("worker %s: did not stop within %.0fs; SIGKILL", proc.name,
                        self.cfg.distributed.stop_grace_s)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.popen is not None:
            try:
                proc.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        proc.popen = None
        proc.adopted_pid = None
        (proc.folder / PID_NAME).unlink(missing_ok=True)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            try:
                os.kill(proc.pid, signal.SIGTERM) if proc.is_running() else None
            except (ProcessLookupError, TypeError):
                pass
        for proc in self.procs.values():
            self._stop(proc)

    # ------------------------------------------------------------------ files

    def push_model(self, models_dir: Path, manifest: Manifest,
                   names: list[str] | None = None) -> dict[str, float | Exception]:
        """Copy a published model into each worker's models/ folder (manifest last)."""
        results: dict[str, float | Exception] = {}
        for name in names or list(self.procs):
            proc = self.procs[name]
            t0 = time.perf_counter()
            try:
                model_store.copy_published(models_dir, manifest, proc.folder / "models")
                model_store.prune_models(proc.folder / "models", keep=2)
                results[name] = time.perf_counter() - t0
            except OSError as e:
                results[name] = e
                log.warning("worker %s: model push failed: %s", name, e)
        return results

    def has_model(self, name: str, generation: int) -> bool:
        return generation in model_store.list_manifests(self.procs[name].folder / "models")

    def heartbeats(self) -> dict[str, Heartbeat | None]:
        out: dict[str, Heartbeat | None] = {}
        for name, proc in self.procs.items():
            try:
                out[name] = read_heartbeat(proc.folder / HEARTBEAT_NAME)
            except (OSError, StatusFormatError):
                out[name] = None
            if out[name] is not None and not proc.is_running():
                # a dead or stopped daemon is Offline, whatever its last heartbeat said
                out[name] = dataclasses.replace(out[name], state=WorkerState.OFFLINE)
        return out

    def source(self, name: str) -> LocalSource:
        return LocalSource(self.procs[name].folder / "outbox")
