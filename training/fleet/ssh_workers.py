"""Distributed mode: worker daemons on SSH hosts, each driven through a connector of its own.

An `SSHFleet` (a `training.fleet.fleet.Fleet`) is the coach's view of `distributed.workers`; each
worker's `SSHBackend` owns one `SSHConnector` for that host alone, so a dead link, a stuck
transfer or a held lock on one host never touches another (after an abandoned operation the
supervisor gets a fresh backend with a fresh connector; `abort` closes the old one's socket).

Bringing a worker up (`prepare_host`, shared with `training.fleet.remote_training`): the worker
folder's lease (`<worker folder>/lease.json`: this run's identity, main node and run folder,
renewed every 20 s with the heartbeat reads; a folder whose lease another run renewed within
two minutes is refused as WorkerFault, so two coaches never share one) -> preflight
(Python, torch, GPUs, disk; problems make it Error and it is retried with backoff) -> deploy
the project's exact version (unless `distributed.deploy` is off) -> upload the run's config,
redacted (`worker_config`: no other worker's host, user or key path) -> start the daemon
detached (`python -m training.worker ... --min-seq N`, N from the coach's ledger, so a wiped
remote folder never reuses a batch number; its own session and pid file, log in
`<remote_dir>/logs/worker_<name>.log`). Each worker's folder on its host is
`<remote_dir>/workers/<name>` (models/, outbox/, status.json); a new model goes to its models/
(model first, manifest last), and the generation two before it is deleted there.

Errors are translated for the supervisor: a connection or transfer failure is `Unreachable`
(Offline once the heartbeat ages; the connector reconnects on the next call, so a worker comes
back by itself when its link does), a refused host key or login, a failed preflight or a
daemon that exits at start is `WorkerFault` (Error).

It must not: import paramiko (only `distributed/` does), or decide when to train.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import posixpath
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable

from configs import Config, WorkerSpec, dump_config
from distributed import remote
from distributed.ssh_connector import (
    AuthError,
    DeployError,
    HostKeyError,
    ListingCapError,
    RemoteCommandError,
    SSHConnector,
    SSHError,
)
from distributed.status import Heartbeat, StatusFormatError, printable
from distributed.transfer import (
    DeadlineError,
    TransferError,
    TransferStats,
    VerifyError,
    write_atomic,
)
from training.fleet.collector import (MAX_BATCH_BYTES, MAX_LISTED, BatchRefused, FetchTooSlow,
                                      ListingTooLong, SourceError)
from training.fleet.fleet import Backend, Fleet, Unreachable, WorkerFault, last_nonblank_line
from training.go.records import batch_names_among
from training.run import model_store
from training.run.model_store import Manifest
from training.run.run_dir import RunDir

log = logging.getLogger(__name__)

START_COMMAND = remote.DEFAULT_START_COMMAND
_ERRORS = (SSHError, TransferError, OSError)
_FAULTS = (HostKeyError, AuthError, DeployError, RemoteCommandError, VerifyError,
           StatusFormatError)


def worker_config(cfg: Config) -> Config:
    """The config a worker host gets: the run's, without any host, user, key path or weight
    of the other machines (a worker host needs none of them)."""
    dist = dataclasses.replace(cfg.distributed, workers=(), training_nodes=(),
                               worker_weights={}, master_addr=None)
    return dataclasses.replace(cfg, distributed=dist)


def write_worker_config(cfg: Config, path: Path) -> Path:
    """`worker_config(cfg)` written atomically to `path` (pushed to every host)."""
    write_atomic(path, dump_config(worker_config(cfg)))
    return path


def prepare_host(connector: SSHConnector, name: str, config_file: Path, deploy: bool,
                 run: str | None = None, worker_class: str | None = None) -> None:
    """The worker folder's lease for `run` (when given), preflight, deploy (when on) and the
    run's config: once before a host's first start. Raises SSHError (a failed preflight is a
    RemoteCommandError naming the problems), or WorkerFault for a folder another run uses."""
    if run is not None:
        take_lease(connector, name, run)
    report = connector.preflight(name)
    if not report.ok:
        raise RemoteCommandError(f"{name}: preflight: " + "; ".join(report.problems),
                                 worker=name, action="preflight")
    if deploy:
        connector.deploy(name)
    for local, remote_rel in worker_class_files(worker_class):
        connector.put(name, local, remote_rel)  # under the root, the daemon's cwd
    connector.put(name, config_file, connector.paths(name).config)


PROJECT_PACKAGES = ("training", "distributed", "configs")
CLASS_FILES_MAX_BYTES = 4 << 20


def worker_class_files(spec: str | None) -> list[tuple[Path, str]]:
    """The files a host needs to import the user's worker class `module:Class` when its
    module is not part of this project (the deployed package): the module's file, or every
    .py file of its top-level package, as (local path, path under the remote root, which is
    the daemon's working folder and so on its import path). [] for a project module."""
    if not spec:
        return []
    import importlib.util

    module = spec.partition(":")[0]
    top = module.split(".")[0]
    if top in PROJECT_PACKAGES:
        return []
    found = importlib.util.find_spec(top)
    if found is None or found.origin is None:
        raise WorkerFault(f"worker class {spec!r}: module {top} not found on the main node")
    origin = Path(found.origin)
    if found.submodule_search_locations:  # a package: ship its .py files
        root = origin.parent
        files = [(p, posixpath.join(top, *p.relative_to(root).parts))
                 for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts]
    else:
        files = [(origin, f"{top}.py")]
    if sum(p.stat().st_size for p, _ in files) > CLASS_FILES_MAX_BYTES:
        raise WorkerFault(f"worker class {spec!r}: {top} is over {CLASS_FILES_MAX_BYTES} "
                          "bytes; install it on the worker hosts by hand")
    return files


def translate(err: Exception) -> Exception:
    """A connector error as the supervisor's `Unreachable` or `WorkerFault`."""
    if isinstance(err, _FAULTS):
        return WorkerFault(str(err))
    return Unreachable(str(err))


MODELS_MAX_LISTED = 1000
"""Entries of any kind a worker's models/ listing may hold (an honest one holds two
generations' files); past it the model push is refused as WorkerFault, the listing cut there."""
LEASE_TTL_S = 120.0
"""A worker folder's lease that its coach has not renewed for this long is free (the coach is
gone); a live coach renews it every `LEASE_RENEW_S`."""
LEASE_RENEW_S = 20.0
LEASE_MAX_BYTES = 4096


def run_identity(run_dir: str | os.PathLike) -> str:
    """The run a coach serves, as a worker folder's lease names it: the main node and the
    run folder (a resumed coach of the same run takes its own lease back)."""
    return f"{socket.gethostname()}:{Path(run_dir).resolve()}"


def take_lease(connector: SSHConnector, name: str, run: str, *, now: float | None = None
               ) -> None:
    """Write (or renew) the worker folder's lease for `run`; WorkerFault when another run's
    coach renewed it within LEASE_TTL_S: two coaches never share a worker folder (each would
    collect the other's games and push its models)."""
    now = time.time() if now is None else now
    path = connector.paths(name).lease
    try:
        held = json.loads(connector.read_bytes(name, path, max_bytes=LEASE_MAX_BYTES))
    except FileNotFoundError:
        held = None
    except (ValueError, RecursionError) as e:  # unreadable: taken over, as an expired one
        log.warning("%s: its lease %s is unreadable (%s); taken over", name, path,
                    printable(f"{type(e).__name__}: {e}", 120))
        held = None
    if isinstance(held, dict) and held.get("run") != run:
        age = now - float(held.get("time", 0) or 0) if _finite(held.get("time")) else 1e18
        if age < LEASE_TTL_S:
            raise WorkerFault(
                f"{name}: its folder {connector.paths(name).worker_dir} is used by another "
                f"run ({printable(held.get('run'), 200)}, pid {printable(held.get('pid'), 20)}, "
                f"renewed {max(age, 0):.0f}s ago): stop that coach, or give this run's "
                "worker another name or distributed.remote_dir")
    with tempfile.TemporaryDirectory(prefix="azgo-lease-") as tmp:
        local = Path(tmp) / "lease.json"
        local.write_text(json.dumps({"run": run, "pid": os.getpid(), "time": now}))
        connector.put(name, local, path)


def _finite(value: object) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int of hundreds of digits
        return False


class SSHSource:
    """One worker's outbox over SFTP (a `collector.BatchSource`)."""

    def __init__(self, connector: SSHConnector, name: str, outbox: str):
        self.connector = connector
        self.name = name
        self.outbox = outbox

    def list_batches(self) -> list[str]:
        """The outbox's batch names; ListingTooLong past `MAX_LISTED` entries of any kind."""
        try:
            names = self.connector.listdir(self.name, self.outbox, max_entries=MAX_LISTED)
        except ListingCapError as e:
            raise ListingTooLong(f"{self.name}: {e}") from e
        except _ERRORS as e:
            raise SourceError(f"{self.name}: cannot list {self.outbox}: {e}") from e
        return batch_names_among(names)

    def fetch(self, name: str, dest: Path) -> int:
        """Regular files only, capped while reading, within distributed.transfer_timeout_s
        (`sftp.get_file`); a refused file is BatchRefused, a too slow one FetchTooSlow."""
        try:
            return self.connector.get(self.name, posixpath.join(self.outbox, name), dest,
                                      max_bytes=MAX_BATCH_BYTES).size
        except VerifyError as e:  # a symlink, FIFO, device, oversized or growing file
            raise BatchRefused(f"{self.name}: {name}: {e}") from e
        except DeadlineError as e:
            raise FetchTooSlow(f"{self.name}: {name}: {e}") from e
        except _ERRORS as e:
            raise SourceError(f"{self.name}: cannot download {name}: {e}") from e

    def delete(self, name: str) -> None:
        try:
            self.connector.remove(self.name, posixpath.join(self.outbox, name))
        except _ERRORS as e:
            raise SourceError(f"{self.name}: cannot delete {name}: {e}") from e


class SSHBackend(Backend):
    """One worker daemon on an SSH host (see the module docstring)."""

    def __init__(self, cfg: Config, spec: WorkerSpec, config_file: Path, *,
                 stats: TransferStats, start_command: tuple[str, ...] = START_COMMAND,
                 project: remote.ProjectInfo | None = None, run: str | None = None):
        self.cfg, self.spec, self.name = cfg, spec, spec.name
        self.host = spec.host
        self.gpu = "cpu" if spec.gpu_id < 0 else str(spec.gpu_id)
        self.config_file, self.stats = Path(config_file), stats
        self.start_command, self.project = tuple(start_command), project
        self.run = run  # the lease's run identity (None: no lease, e.g. a one-off command)
        self._leased_at = -math.inf
        self.connector = SSHConnector(dataclasses.replace(cfg.distributed, workers=(spec,)),
                                      start_command=self.start_command, stats=stats,
                                      project=project)
        self._outbox: str | None = None

    def deadline_s(self, op: str) -> float:
        """Every attempt's own timeouts plus the backoffs between them, and a margin."""
        d = self.cfg.distributed
        per_try = d.connect_timeout_s + {
            "prepare": 4 * max(d.command_timeout_s, 300.0),
            "stop": d.command_timeout_s + d.stop_grace_s,
            "start": 2 * d.command_timeout_s,
            "check daemon": d.command_timeout_s,
            "push model": 2 * d.transfer_timeout_s,
        }.get(op, d.transfer_timeout_s)
        return (d.retries + 1) * per_try + d.retries * d.backoff_max_s + 5.0

    def _call(self, fn: Callable, *args):
        try:
            return fn(*args)
        except _ERRORS + (StatusFormatError,) as e:
            raise translate(e) from e

    def prepare(self) -> None:
        self._call(prepare_host, self.connector, self.name, self.config_file,
                   self.cfg.distributed.deploy, self.run, self.cfg.self_play.worker_class)
        self._leased_at = time.monotonic()

    def start(self, min_seq: int) -> int:
        self.connector.start_command = (*self.start_command, "--min-seq", str(min_seq))
        return self._call(self.connector.start, self.name)

    def is_running(self) -> bool:
        return self._call(self.connector.is_running, self.name) is not None

    def stop(self) -> None:
        self._call(self.connector.stop, self.name)

    def exit_reason(self) -> str:
        """The last non-blank line of the daemon's log on the host (of its last
        `LOG_TAIL_BYTES`): a crash's last words, or the last thing it logged before a kill."""
        return last_nonblank_line(self._call(self.connector.log_tail, self.name))

    def read_heartbeat(self) -> Heartbeat | None:
        if self.run is not None and time.monotonic() - self._leased_at > LEASE_RENEW_S:
            self._call(take_lease, self.connector, self.name, self.run)
            self._leased_at = time.monotonic()
        try:
            return self._call(self.connector.read_heartbeat, self.name)
        except Unreachable as e:
            if isinstance(e.__cause__, FileNotFoundError):
                return None  # reachable, no heartbeat yet
            raise

    def push_model(self, models_dir: Path, manifest: Manifest) -> None:
        """Model file, then manifest; then the stale generations there are deleted
        (`model_store.stale_generations`, the local workers' rule), and the temporary files
        of earlier cut uploads. models/ is listed once, at most MODELS_MAX_LISTED entries:
        past that the push is WorkerFault."""
        def push() -> None:
            models = self.connector.paths(self.name).models
            for local in (manifest.zst_name, manifest.json_name):
                self.connector.put(self.name, Path(models_dir) / local,
                                   posixpath.join(models, local))
            try:
                listed = self.connector.listdir(self.name, models, with_temporary=True,
                                                max_entries=MODELS_MAX_LISTED)
            except ListingCapError as e:
                raise WorkerFault(f"{self.name}: {e} (an honest one holds a few models): "
                                  "empty it on the worker, then restart the worker") from e
            held = model_store.manifest_generations(listed)
            for old in model_store.stale_generations(held):
                for name in model_store.stale_files(old):
                    self.connector.remove(self.name, posixpath.join(models, name))
            # this connector's uploads just ended: any temporary file of its own left here is
            # an upload the link cut (of an older generation, never uploaded again)
            for name in listed:
                if name.startswith(".model_") and name.endswith(f".{self.name}.tmp"):
                    self.connector.remove(self.name, posixpath.join(models, name))

        self._call(push)

    def source(self) -> SSHSource:
        if self._outbox is None:
            try:
                self._outbox = self.connector.paths(self.name).outbox
            except _ERRORS as e:
                raise SourceError(f"{self.name}: unreachable: {e}") from e
        return SSHSource(self.connector, self.name, self._outbox)

    def abort(self) -> None:
        self.connector.close()

    def fresh(self) -> SSHBackend:
        return SSHBackend(self.cfg, self.spec, self.config_file, stats=self.stats,
                          start_command=self.start_command, project=self.project,
                          run=self.run)

    def close(self) -> None:
        self.connector.close()


class SSHFleet(Fleet):
    """Worker daemons on the configured SSH hosts, one `SSHBackend` each.

    `connector` (optional) only lends its start command (e.g. a simulated daemon's) and
    project info; each worker still gets a connector of its own."""

    def __init__(self, cfg: Config, run_dir: str | os.PathLike, config_file: str | os.PathLike,
                 *, stats: TransferStats | None = None,
                 next_seq: Callable[[str], int] = lambda name: 0,
                 connector: SSHConnector | None = None,
                 start_command: tuple[str, ...] | None = None):
        self.run_dir = Path(run_dir)
        self.source_config = Path(config_file)
        self.config_file = RunDir(self.run_dir).worker_config
        self.start_command = tuple(start_command or (connector.start_command if connector
                                                     else START_COMMAND))
        self.project = connector.project if connector is not None else None
        if connector is not None:
            connector.close()
        super().__init__(cfg, next_seq=next_seq, stats=stats)

    def backends_for(self, cfg: Config) -> list[Backend]:
        write_worker_config(cfg, self.config_file)
        run = run_identity(self.run_dir)
        return [SSHBackend(cfg, spec, self.config_file, stats=self.stats,
                           start_command=self.start_command, project=self.project, run=run)
                for spec in cfg.distributed.workers]
