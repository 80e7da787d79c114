"""Distributed mode: worker daemons on SSH hosts, driven through `SSHConnector`.

An `SSHFleet` is the coach's view of `distributed.workers`; it speaks the same fleet
vocabulary as `training.local_workers.LocalFleet` (`names`, `start_all`, `start`,
`supervise`, `restart`, `push_model`, `heartbeats`, `source`, `set_workers`, `stop_all`,
`hosts`, `gpus`, `restarts`, `last_errors`), so the coach's loop is the same for both.

Bringing a worker up: preflight (Python, torch, GPUs, disk; problems make it Error and it is
retried with backoff) -> deploy the project's exact version (unless `distributed.deploy` is
off) -> upload the run's config -> start the daemon detached (`python -m training.worker`,
its own session and pid file, log in `<remote_dir>/logs/worker_<name>.log`). Each worker's
folder on its host is `<remote_dir>/workers/<name>` (models/, outbox/, status.json); a new
model goes to every worker's models/ in parallel (model first, manifest last), and the
generation two before it is deleted there.

Supervision: a worker whose heartbeat stopped changing is asked over SSH whether its daemon
runs; a dead daemon is started again with exponential backoff. A host that cannot be reached
is Offline; the connector reconnects on the next call, so a worker comes back by itself when
its link does.

It must not: import paramiko (only `distributed/` does), or decide when to train.
"""

from __future__ import annotations

import logging
import os
import posixpath
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configs import Config, WorkerSpec
from distributed.ssh_connector import SSHConnector, SSHError
from distributed.status import Heartbeat
from distributed.transfer import TransferError, TransferStats
from training.collector import SourceError
from training.model_store import Manifest

log = logging.getLogger(__name__)

START_COMMAND = ("{python}", "-m", "training.worker", "--name", "{name}", "--config", "{config}",
                 "--dir", "{dir}", "--models-dir", "{models}", "--gpu-id", "{gpu_id}",
                 "--log-to-stderr-only")
_ERRORS = (SSHError, TransferError, OSError)


@dataclass
class _Supervision:
    up: bool = False  # brought up (preflight, deploy, config, start) at least once
    restarts: int = 0
    backoff_s: float = 0.0
    next_try: float = 0.0
    error: str = ""
    hb_time: float | None = None  # the last heartbeat's own time
    hb_changed: float = 0.0  # monotonic time it last changed
    down_until: float = 0.0  # unreachable: no heartbeat reads or collecting before this
    down_backoff_s: float = 0.0


class SSHSource:
    """One worker's outbox over SFTP (a `collector.BatchSource`)."""

    def __init__(self, connector: SSHConnector, name: str, outbox: str):
        self.connector = connector
        self.name = name
        self.outbox = outbox

    def list_batches(self) -> list[str]:
        try:
            names = self.connector.listdir(self.name, self.outbox)
        except _ERRORS as e:
            raise SourceError(f"{self.name}: cannot list {self.outbox}: {e}") from e
        return sorted(n for n in names if n.endswith(".npz.zst") and not n.startswith("."))

    def fetch(self, name: str, dest: Path) -> int:
        """Regular files only, capped while reading, within distributed.transfer_timeout_s
        (`transfer.get_file`); a refused file is BatchRefused, a too slow one FetchTooSlow."""
        from distributed.transfer import DeadlineError, VerifyError
        from training.collector import MAX_BATCH_BYTES, BatchRefused, FetchTooSlow

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


class SSHFleet:
    """Worker daemons on the configured SSH hosts."""

    def __init__(self, cfg: Config, run_dir: str | os.PathLike, config_file: str | os.PathLike,
                 *, stats: TransferStats | None = None, next_seq=lambda name: 0,
                 connector: SSHConnector | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.config_file = Path(config_file)
        self.stats = stats or TransferStats()
        self.connector = connector or SSHConnector(cfg.distributed, start_command=START_COMMAND,
                                                   stats=self.stats)
        self.sup: dict[str, _Supervision] = {n: _Supervision() for n in self.connector.workers}
        self._outbox: dict[str, str] = {}

    # ------------------------------------------------------------------ membership

    def names(self) -> list[str]:
        return list(self.connector.workers)

    @property
    def hosts(self) -> dict[str, str]:
        return {n: s.host for n, s in self.connector.workers.items()}

    @property
    def gpus(self) -> dict[str, str]:
        return {n: ("cpu" if s.gpu_id < 0 else str(s.gpu_id))
                for n, s in self.connector.workers.items()}

    @property
    def restarts(self) -> dict[str, int]:
        return {n: s.restarts for n, s in self.sup.items()}

    def last_errors(self) -> dict[str, str]:
        return {n: s.error for n, s in self.sup.items()}

    def set_workers(self, specs: list[WorkerSpec], cfg: Config) -> tuple[list[str], list[str]]:
        """Follow an edited config: stop removed workers, take in added (started by the
        caller with `start`). Returns (added, removed)."""
        old = self.connector.workers
        new = {s.name: s for s in specs}
        removed = [n for n in old if n not in new]
        changed = [n for n in old if n in new and old[n] != new[n]]
        for name in removed + changed:
            try:
                self.connector.stop(name)
            except _ERRORS as e:
                log.warning("%s: could not stop the removed worker: %s", name, e)
        self.connector.close()
        self.cfg = cfg
        self.connector = SSHConnector(cfg.distributed, start_command=START_COMMAND,
                                      stats=self.stats)
        for name in removed:
            self.sup.pop(name, None)
            self._outbox.pop(name, None)
        added = [n for n in new if n not in old] + changed
        for name in added:
            self.sup[name] = _Supervision()
            self._outbox.pop(name, None)
        return added, removed

    # ------------------------------------------------------------------ lifecycle

    def _bring_up(self, name: str) -> int:
        report = self.connector.preflight(name)
        if not report.ok:
            raise SSHError(f"{name}: preflight: " + "; ".join(report.problems), worker=name)
        if self.cfg.distributed.deploy:
            self.connector.deploy(name)
        paths = self.connector.paths(name)
        self.connector.put(name, self.config_file, paths.config)
        pid = self.connector.start(name)
        self.sup[name].up = True
        self.sup[name].error = ""
        return pid

    def start_all(self) -> dict[str, Any]:
        results = self.connector.for_each(self._bring_up)
        now = time.monotonic()
        for name, res in results.items():
            if isinstance(res, Exception):
                self._failed(name, res, now)
        return results

    def start(self, name: str) -> int:
        return self._bring_up(name)

    def _failed(self, name: str, err: Exception, now: float) -> None:
        s = self.sup[name]
        s.error = f"{type(err).__name__}: {err}"
        base, cap = self.cfg.distributed.backoff_base_s, self.cfg.distributed.backoff_max_s
        s.backoff_s = min(cap, s.backoff_s * 2 or base)
        s.next_try = now + s.backoff_s
        log.error("worker %s: %s; retrying in %.1fs", name, s.error, s.backoff_s)

    def supervise(self) -> list[str]:
        """Start workers not up yet, restart dead daemons (with backoff); returns restarted."""
        now = time.monotonic()
        stale_after = max(3 * self.cfg.distributed.heartbeat_interval_s, 2.0)
        due = [n for n, s in self.sup.items() if now >= s.next_try and now >= s.down_until
               and (not s.up or now - s.hb_changed > stale_after)]
        if not due:
            return []
        results = self.connector.for_each(lambda n: self._check(n, now), due)
        restarted = []
        for name, res in results.items():
            if isinstance(res, Exception):
                self._failed(name, res, now)
            elif res:
                restarted.append(name)
        return restarted

    def _check(self, name: str, now: float) -> bool:
        s = self.sup[name]
        if not s.up:
            self._bring_up(name)
            return False
        if self.connector.is_running(name) is not None:
            return False
        s.restarts += 1
        log.warning("worker %s: daemon not running; restart %d", name, s.restarts)
        self.connector.start(name)
        s.backoff_s = 0.0
        return True

    def restart(self, name: str) -> None:
        self.sup[name].restarts += 1
        self.connector.restart(name)

    def stop_all(self) -> None:
        for name, res in self.connector.stop_all().items():
            if isinstance(res, Exception):
                log.warning("worker %s: stop failed: %s", name, res)

    def close(self) -> None:
        self.connector.close()

    # ------------------------------------------------------------------ files

    def push_model(self, models_dir: Path, manifest: Manifest,
                   names: list[str] | None = None) -> dict[str, Any]:
        """Model file, then manifest, to every worker in parallel (`stats.last_push_s`)."""
        files = [(models_dir / manifest.zst_name, "{models}/" + manifest.zst_name),
                 (models_dir / manifest.json_name, "{models}/" + manifest.json_name)]
        results = self.connector.push_files(files, names)
        old = manifest.generation - 2
        done = [n for n, r in results.items() if not isinstance(r, Exception)]
        if old >= 0 and done:
            self.connector.for_each(lambda n: self._remove_model(n, old), done)
        return results

    def _remove_model(self, name: str, generation: int) -> None:
        models = posixpath.join(self.connector.paths(name).worker_dir, "models")
        stem = f"model_{generation:06d}"
        for suffix in (".json", ".pt.zst"):  # manifest first: never a dangling manifest
            self.connector.remove(name, posixpath.join(models, stem + suffix))

    def heartbeats(self) -> dict[str, Heartbeat | Exception | None]:
        """Every worker's heartbeat; an unreachable host is skipped for a backoff period so
        one dead link never stalls the coach's loop."""
        now = time.monotonic()
        out: dict[str, Heartbeat | Exception | None] = {n: None for n in self.sup}
        reachable = [n for n, s in self.sup.items() if now >= s.down_until]
        if not reachable:
            return out
        results = self.connector.for_each(self.connector.read_heartbeat, reachable)
        base, cap = self.cfg.distributed.backoff_base_s, self.cfg.distributed.backoff_max_s
        for name, res in results.items():
            s = self.sup.get(name)
            if s is None:
                continue
            if isinstance(res, FileNotFoundError):
                res = None  # reachable, no heartbeat yet
            if isinstance(res, Exception):
                s.down_backoff_s = min(cap, s.down_backoff_s * 2 or base)
                s.down_until = time.monotonic() + s.down_backoff_s
                log.warning("worker %s: unreachable (%s); next try in %.1fs", name, res,
                            s.down_backoff_s)
            else:
                s.down_backoff_s = 0.0
            if isinstance(res, Heartbeat) and res.time != s.hb_time:
                s.hb_time, s.hb_changed = res.time, now
            out[name] = res
        return out

    def source(self, name: str) -> SSHSource:
        if time.monotonic() < self.sup[name].down_until:
            raise SourceError(f"{name}: unreachable, retrying later")
        if name not in self._outbox:
            try:
                self._outbox[name] = self.connector.paths(name).outbox
            except _ERRORS as e:
                raise SourceError(f"{name}: unreachable: {e}") from e
        return SSHSource(self.connector, name, self._outbox[name])
