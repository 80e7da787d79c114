"""Local mode: worker daemons as subprocesses of the coach, on this machine.

A `LocalFleet` (a `training.fleet.fleet.Fleet`) runs `start_worker.py` once per worker, each with
its own folder `run_dir/workers/<name>` (`RunDir.worker`: models/, outbox/, status.json) and
its log in `logs/worker_<name>.log`, spread over the GPUs by `placement.plan_workers` (or all
on the CPU).
Each worker's `LocalBackend` starts, checks and stops its process (SIGTERM, then SIGKILL after
`distributed.stop_grace_s`), reads its heartbeat (a regular file only, read capped) and copies
models into its folder; its supervisor (`training.fleet.fleet`) restarts a dead daemon with backoff.
A daemon's stderr goes to `stderr.log` in its folder; the last line it wrote there before it
exited (`exit_reason`) is the worker's LAST ERROR. The daemons run in the repository (paths
they are given are absolute: `run_dir.absolute_paths`) at nice `WORKER_NICE`, below the coach
and its trainer.

Each worker's pid is written to `run_dir/workers/<name>/worker.pid`, so a coach restarted
after a crash adopts the daemons that still run instead of starting a second copy.

It must not: collect or validate batches (the collector does) or decide when to train.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from configs import Config
from distributed.status import HEARTBEAT_NAME, Heartbeat, StatusFormatError, read_heartbeat
from training.fleet.collector import LocalSource
from training.fleet.fleet import Backend, Fleet, WorkerFault, last_nonblank_line
from training.run import model_store
from training.run.model_store import Manifest
from training.run.run_dir import RunDir

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
PID_NAME = "worker.pid"
STDERR_NAME = "stderr.log"
STDERR_TAIL_BYTES = 4096  # what is read of it for a daemon's last words
WORKER_NICE = 10
"""Local daemons run this much below the coach's CPU priority: a training round or an arena
on the same cores then takes the CPU it needs (`benchmarks/train.py --beside-selfplay 2`, 2
cores: the trainer at 0.13x of its speed alone beside equal-priority self-play, 0.66x beside
niced self-play) and self-play fills the idle time."""


def plan_devices(cfg: Config, quiet: bool = False) -> list[str]:
    """One device per local worker ("cpu", "cuda:0", ...) by `placement.plan_workers` with
    this machine's GPUs and cores; its messages (the automatic count, an adjusted request)
    are logged and printed unless `quiet`."""
    sp = cfg.self_play
    n_gpus = 0
    if not sp.cpu_only:
        import torch

        n_gpus = torch.cuda.device_count()
    from training.fleet.placement import plan_workers

    devices, messages = plan_workers(sp.workers, sp.workers_per_gpu, sp.cpu_only, n_gpus,
                                     os.cpu_count())
    if not quiet:
        for m in messages:
            log.warning("%s", m)
            print(m, file=sys.stderr)
    return list(devices)


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


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def last_line(path: Path, start: int = 0, limit: int = STDERR_TAIL_BYTES) -> str:
    """The last non-blank line of `path` after byte `start`, reading at most its last
    `limit` bytes ("" when there is none or the file is missing)."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(max(start, end - limit))
            text = f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""
    return last_nonblank_line(text)


class LocalBackend(Backend):
    """One local worker daemon (a subprocess of the coach, or adopted after a restart)."""

    def __init__(self, cfg: Config, name: str, folder: Path, device: str, config_file: Path,
                 worker_class: str | None = None):
        self.cfg, self.name, self.folder, self.device = cfg, name, Path(folder), device
        self.config_file, self.worker_class = Path(config_file), worker_class
        self.host = "localhost"
        self.gpu = "cpu" if device == "cpu" else device.split(":")[-1]
        self.spec = (name, device)
        self.popen: subprocess.Popen | None = None
        self.adopted_pid: int | None = None
        self.log_dir = Path(cfg.logging.dir)
        self._stderr_from = 0  # stderr.log's size when the daemon was started

    def deadline_s(self, op: str) -> float:
        return self.cfg.distributed.stop_grace_s + 30.0 if op == "stop" else 60.0

    @property
    def pid(self) -> int | None:
        if self.popen is not None:
            return self.popen.pid
        return self.adopted_pid

    def cheap_liveness(self) -> bool:
        return True

    def is_running(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        if self.adopted_pid is not None:
            return _pid_is_worker(self.adopted_pid)
        return False

    def start(self, min_seq: int) -> int:
        """Start the daemon (adopting one that still runs); returns its pid."""
        self.folder.mkdir(parents=True, exist_ok=True)
        pid_file = self.folder / PID_NAME
        if self.popen is None and pid_file.exists():
            try:
                old = int(pid_file.read_text().strip())
            except ValueError:
                old = -1
            if old > 0 and _pid_is_worker(old):
                self.adopted_pid = old
                self._stderr_from = _size(self.folder / STDERR_NAME)
                log.info("worker %s: adopting running daemon pid %d", self.name, old)
                return old
        cmd = [sys.executable, str(REPO / "start_worker.py"), "--config", str(self.config_file),
               "--name", self.name, "--dir", str(self.folder), "--log-dir", str(self.log_dir),
               "--device", self.device, "--min-seq", str(min_seq), "--nice", str(WORKER_NICE)]
        if self.worker_class:
            cmd += ["--worker-class", self.worker_class]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(self.cfg.self_play.threads_per_worker))
        # the worker's own log file holds its story; stderr here catches only crashes at import
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            with open(self.folder / STDERR_NAME, "ab") as err:
                self._stderr_from = err.seek(0, os.SEEK_END)
                self.popen = subprocess.Popen(cmd, cwd=str(REPO), env=env,
                                              stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL, stderr=err,
                                              start_new_session=True)
        except OSError as e:
            raise WorkerFault(f"cannot start {cmd[1]}: {e}") from e
        self.adopted_pid = None
        pid_file.write_text(f"{self.popen.pid}\n")
        log.info("worker %s: started pid %d on %s", self.name, self.popen.pid, self.device)
        return self.popen.pid

    def exit_reason(self) -> str:
        """The last non-blank line the daemon wrote to stderr.log since its start (at most
        the file's last `STDERR_TAIL_BYTES` are read)."""
        return last_line(self.folder / STDERR_NAME, self._stderr_from)

    def stop(self) -> None:
        pid = self.pid
        if pid is None or not self.is_running():
            self.popen = None
            self.adopted_pid = None
            return
        log.info("worker %s: stopping pid %d", self.name, pid)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + self.cfg.distributed.stop_grace_s
        while time.monotonic() < deadline and self.is_running():
            time.sleep(0.05)
        if self.is_running():
            log.warning("worker %s: did not stop within %.0fs; SIGKILL", self.name,
                        self.cfg.distributed.stop_grace_s)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.popen is not None:
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.popen = None
        self.adopted_pid = None
        (self.folder / PID_NAME).unlink(missing_ok=True)

    def read_heartbeat(self) -> Heartbeat | None:
        try:
            return read_heartbeat(self.folder / HEARTBEAT_NAME)
        except FileNotFoundError:
            return None
        except (OSError, StatusFormatError) as e:
            raise WorkerFault(str(e)) from e

    def push_model(self, models_dir: Path, manifest: Manifest) -> None:
        """Copy a published model into the worker's models/ folder (manifest last)."""
        model_store.copy_published(models_dir, manifest, self.folder / "models")
        model_store.prune_models(self.folder / "models")

    def has_model(self, generation: int) -> bool:
        return generation in model_store.list_manifests(self.folder / "models")

    def source(self) -> LocalSource:
        return LocalSource(self.folder / "outbox")


class LocalFleet(Fleet):
    """Worker daemons as local subprocesses, named worker1..N, one per device."""

    def __init__(self, cfg: Config, run_dir: str | os.PathLike, config_file: str | os.PathLike,
                 devices: Callable[[Config], list[str]] = plan_devices, *,
                 next_seq: Callable[[str], int] = lambda name: 0,
                 worker_class: str | None = None, stats=None):
        self.run_dir = Path(run_dir)
        self.config_file = Path(config_file)
        self.devices = devices
        self.worker_class = worker_class
        super().__init__(cfg, next_seq=next_seq, stats=stats)

    def backends_for(self, cfg: Config) -> list[Backend]:
        paths = RunDir(self.run_dir)
        return [LocalBackend(cfg, f"worker{i + 1}", paths.worker(f"worker{i + 1}"), dev,
                             self.config_file, self.worker_class)
                for i, dev in enumerate(self.devices(cfg))]

    def pid(self, name: str) -> int | None:
        return self.backend(name).pid

    def folder(self, name: str) -> Path:
        return self.backend(name).folder
