"""SSHConnector: the one module that speaks SSH to the worker hosts (paramiko).

Owns, per worker (a `configs.WorkerSpec`, known by its config name):
  - one reused connection (TCP_NODELAY, TCP_USER_TIMEOUT + SSH keepalives so a dead link
    becomes an error in seconds instead of a hang), key authentication (the worker's
    `key_path`, or the SSH agent and default keys when unset; never passwords),
  - host keys checked against `distributed.known_hosts`: an unknown host is refused unless
    `accept_new_host_keys` is set (then its key is recorded there); a changed key is ALWAYS
    refused, with both fingerprints in the error,
  - timeouts on every call, retries with exponential backoff and jitter for connections and
    transfers, and paramiko's errors translated into ours (`ConnectError`, `HostKeyError`,
    `AuthError`, `RemoteCommandError`, `DeployError`, `transfer.TransferError`) that name the
    worker, the host and the action, chained with `from e`,
  - the worker lifecycle: `preflight`, `deploy`, `start`, `stop`, `restart`, `is_running`,
    heartbeats, file transfers; the `*_all` forms return `{name: result | Exception}`.

Remote folder layout: `distributed.remote.WorkerPaths`. `--restart` against a running coach:
`distributed.restart_requests`. The command line (`python distributed/ssh_connector.py
--help`) is in `distributed/cli.py` (imported only when this file runs as a script).

What one connection is made of (the errors, host keys, the link and its SFTP session, a
command's capped output) is `distributed.ssh_link`; reading a host's preflight report is
`distributed.preflight`; the transfers are `distributed.sftp`. What stays here is the one
class, `SSHConnector`: every public method runs through the same per-worker connection, lock
and retry loop (`_connection`, `_with_retries`, `_exec`), so a split of transport from
lifecycle would leave one half calling the other's private machinery. The error classes are
imported here too, for the SSH workers (`training.fleet.ssh_workers`), the command line and
the tests.

It must not: import `training` or torch.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import stat
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

import paramiko

from configs import DEFAULT_CONFIG_PATH, DistributedConfig, WorkerSpec, load_config
from distributed import config_edit, remote
from distributed.remote import WorkerPaths, q
from distributed.preflight import PreflightReport, preflight_info, preflight_problems
from distributed.sftp import get_file, open_sftp, put_file, sftp_deadline
from distributed.ssh_link import (COMMAND_OUTPUT_MAX_BYTES, AuthError, CommandResult,
                                  ConnectError, Connection, DeployError, HostKeyError,
                                  HostKeyPolicy, ListingCapError, RemoteCommandError, Tail,
                                  UnknownWorkerError, drain, fingerprint,
                                  transport_factory)
from distributed.ssh_link import SSHError  # noqa: F401 - the errors' base, with them here
from distributed.status import Heartbeat, parse_heartbeat
from distributed.transfer import (
    DeadlineError,
    TransferError,
    TransferResult,
    TransferStats,
    VerifyError,
    fan_out,
    sha256_file,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

_NET_ERRORS = (paramiko.SSHException, EOFError, OSError)
HEARTBEAT_MAX_BYTES = 1 << 16
LISTING_MAX_ENTRIES = 10_000
"""The most entries a remote folder listing reads unless its caller says otherwise."""
LOG_TAIL_BYTES = 4096
"""What `log_tail` reads of a daemon's log: room for a traceback's last lines."""


# never retried: retrying cannot change the answer
_PERMANENT = (HostKeyError, AuthError, RemoteCommandError, DeployError, VerifyError)


@dataclass(frozen=True)
class DeployResult:
    """Outcome of `deploy`: the version now installed, and whether anything was done."""

    version: str
    skipped: bool
    seconds: float


def _is_pid(word: str) -> bool:
    return word.isascii() and word.isdigit() and len(word) <= 10


class SSHConnector:
    """SSH access to the configured workers; see the module docstring.

    `SSHConnector()` loads configs/config.yaml; the coach passes `cfg.distributed`.
    `start_command` is the daemon's argv template, default `remote.DEFAULT_START_COMMAND`
    (`{python} -m training.worker --name {name} --config {config} --dir {dir} --gpu-id
    {gpu_id} --log-to-stderr-only`); placeholders: `{python}` (the venv's python when
    deployed, else the configured one), `{name}`, `{config}` (root/config.yaml, push it with
    `put`), `{root}`, `{dir}` (the worker folder), `{models}`, `{log}`, `{gpu_id}`.
    """

    def __init__(
        self,
        cfg: DistributedConfig | None = None,
        *,
        config_path: str | os.PathLike | None = None,
        accept_new_host_keys: bool | None = None,
        start_command: Sequence[str] = remote.DEFAULT_START_COMMAND,
        stats: TransferStats | None = None,
        project: remote.ProjectInfo | None = None,
    ):
        self.config_path = Path(config_path) if config_path else DEFAULT_CONFIG_PATH
        if cfg is None:
            cfg = load_config(self.config_path).distributed
        self.cfg = cfg
        self.accept_new_host_keys = (
            cfg.accept_new_host_keys if accept_new_host_keys is None else accept_new_host_keys
        )
        self.start_command = tuple(start_command)
        self.stats = stats or TransferStats()
        self.project = project
        self._workers = {w.name: w for w in cfg.workers}
        self._conns: dict[str, Connection] = {}
        # clients still connecting (SSH, then the SFTP handshake): close() reaches them too
        self._opening: dict[str, paramiko.SSHClient] = {}
        self._closes = 0  # close() calls: a call in flight across one is not retried
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._archive: Path | None = None
        self._archive_dir: tempfile.TemporaryDirectory | None = None

    # ------------------------------------------------------------------ workers and config

    @property
    def workers(self) -> dict[str, WorkerSpec]:
        return dict(self._workers)

    def spec(self, name: str) -> WorkerSpec:
        try:
            return self._workers[name]
        except KeyError:
            raise UnknownWorkerError(
                f"no worker named {name!r} in the config; known: {sorted(self._workers)}"
            ) from None

    def _names(self, names: Iterable[str] | None) -> list[str]:
        names = list(self._workers) if names is None else list(names)
        for n in names:
            self.spec(n)
        return names

    def add_worker(self, host: str, user: str, *, name: str | None = None, port: int = 22,
                   key_path: str | None = None, gpu_id: int = 0,
                   weight: float | None = None) -> WorkerSpec:
        """Add a worker to the config file (comments kept, validated) and to this connector.

        A running coach notices the edited config.yaml and starts the worker.
        """
        spec = config_edit.add_worker(self.config_path, host, user, name=name, port=port,
                                      key_path=key_path, gpu_id=gpu_id, weight=weight)
        self._workers[spec.name] = spec
        return spec

    def remove_worker(self, name: str) -> None:
        """Remove a worker from the config file (comments kept) and from this connector."""
        config_edit.remove_worker(self.config_path, name)
        self._workers.pop(name, None)
        self._drop(name)

    def reconfigure(self, cfg: DistributedConfig) -> None:
        """Adopt a newly loaded config (the coach's watch on config.yaml). Workers removed or
        changed (host, port, key, ...) lose their connection; the others keep theirs."""
        new = {w.name: w for w in cfg.workers}
        for name, old in list(self._workers.items()):
            if new.get(name) != old:
                self._drop(name)
        self.cfg, self._workers = cfg, new

    # ------------------------------------------------------------------ connections

    def _where(self, name: str) -> str:
        s = self.spec(name)
        return f"{name} ({s.user}@{s.host}:{s.port})"

    def _err(self, cls, name: str, action: str, detail: str, **kw):
        s = self.spec(name)
        return cls(f"{self._where(name)}: {action}: {detail}", worker=name, host=s.host,
                   action=action, **kw)

    def _lock(self, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(name, threading.Lock())

    def _connection(self, name: str) -> Connection:
        conn = self._conns.get(name)
        if conn is not None and conn.is_active:
            return conn
        if conn is not None:
            self._drop(name)
        conn = self._open(name)
        self._conns[name] = conn
        return conn

    def _drop(self, name: str) -> None:
        opening = self._opening.pop(name, None)
        if opening is not None:
            opening.close()  # its thread's wait ends with an error
        conn = self._conns.pop(name, None)
        if conn is not None:
            try:
                conn.close()
            except _NET_ERRORS:
                pass

    def close(self) -> None:
        """Close every connection, those still connecting included: a call in flight ends
        with its error, without retrying (the supervisor's abort)."""
        self._closes += 1
        for name in {*self._conns, *self._opening}:
            self._drop(name)
        if self._archive_dir is not None:
            self._archive_dir.cleanup()
            self._archive_dir, self._archive = None, None

    def __enter__(self) -> SSHConnector:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _socket(self, name: str) -> socket.socket:
        """A TCP connection to the worker's host, its options set (ConnectError naming the
        worker and what to check otherwise)."""
        s, cfg = self.spec(name), self.cfg
        action = "connect"
        timeout = cfg.connect_timeout_s
        try:
            sock = socket.create_connection((s.host, s.port), timeout=timeout)
        except socket.gaierror as e:
            raise self._err(ConnectError, name, action, f"could not resolve {s.host}: {e}") from e
        except UnicodeError as e:  # idna: a label over 63 characters, an empty label, ...
            raise self._err(ConnectError, name, action,
                            f"{s.host!r} is not a valid host name ({e}); check the config") from e
        except (socket.timeout, TimeoutError) as e:
            raise self._err(ConnectError, name, action,
                            f"timed out after {timeout:g}s; check the host is up and reachable "
                            "(network, firewall)") from e
        except ConnectionRefusedError as e:
            raise self._err(ConnectError, name, action,
                            f"connection refused on port {s.port}; is sshd running?") from e
        except OSError as e:
            raise self._err(ConnectError, name, action, f"{type(e).__name__}: {e}") from e
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # else ~40 ms per channel
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        # a dead link otherwise hangs paramiko forever; the kernel now aborts the connection
        # when sent data (SSH keepalives included) stays unacknowledged this long
        user_timeout_ms = int(1000 * max(1.0, 2 * cfg.keepalive_s))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, user_timeout_ms)
        return sock

    def _open(self, name: str) -> Connection:
        s, cfg = self.spec(name), self.cfg
        action = "connect"
        timeout = cfg.connect_timeout_s
        sock = self._socket(name)
        known_hosts = Path(os.path.expanduser(cfg.known_hosts))
        client = paramiko.SSHClient()
        self._opening[name] = client
        try:
            if known_hosts.exists():
                client.load_host_keys(str(known_hosts))
            client.set_missing_host_key_policy(
                HostKeyPolicy(self.accept_new_host_keys, known_hosts, name))
            key = os.path.expanduser(s.key_path) if s.key_path else None
            client.connect(
                s.host, port=s.port, username=s.user, sock=sock, key_filename=key,
                allow_agent=key is None, look_for_keys=key is None, timeout=timeout,
                banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
                transport_factory=transport_factory,
            )
            if self._opening.get(name) is not client:  # closed while connecting
                raise ConnectionAbortedError("closed before the SFTP session")
            transport = client.get_transport()
            transport.set_keepalive(max(1, round(cfg.keepalive_s)))
            sftp = open_sftp(transport, timeout_s=cfg.transfer_timeout_s,
                             where=self._where(name))
            with sftp_deadline(sftp, cfg.transfer_timeout_s):
                home = sftp.normalize(".")
        except DeadlineError as e:  # the SFTP server withholds its handshake: not retried
            client.close()
            detail = str(e).removeprefix(self._where(name) + ": ")
            raise DeadlineError(f"{self._where(name)}: {action}: {detail} "
                                "(distributed.transfer_timeout_s)") from e
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as e:
            client.close()
            raise self._err(
                HostKeyError, name, "check host key",
                f"HOST KEY CHANGED for {s.host}: known_hosts ({known_hosts}) has "
                f"{e.expected_key.get_name()} {fingerprint(e.expected_key)}, the server offered "
                f"{e.key.get_name()} {fingerprint(e.key)}. This may be an attack or a "
                "reinstalled host; refusing. If the change is expected, remove the old line "
                f"(ssh-keygen -R {q(s.host if s.port == 22 else f'[{s.host}]:{s.port}')} "
                f"-f {q(str(known_hosts))}) and connect again.",
            ) from e
        except paramiko.AuthenticationException as e:
            client.close()
            raise self._err(
                AuthError, name, "authenticate",
                f"the server refused {'key ' + s.key_path if s.key_path else 'agent/default keys'}"
                f" for user {s.user}: {e}; check authorized_keys on the worker",
            ) from e
        except (*_NET_ERRORS, TransferError, paramiko.SFTPError) as e:
            client.close()  # a TransferError: the SFTP server's first reply was refused
            detail = f"{type(e).__name__}: {str(e).removeprefix(self._where(name) + ': ')}"
            if self._opening.get(name) is not client:
                detail = f"the connector was closed while connecting ({detail})"
            raise self._err(ConnectError, name, action, detail) from e
        finally:
            if self._opening.get(name) is client:  # one thread opens a worker (its lock)
                self._opening.pop(name, None)
        root = remote.absolute_root(s.remote_dir or cfg.remote_dir, home)
        log.debug("%s: connected, root %s", self._where(name), root)
        return Connection(client, root, sftp, where=self._where(name))

    def _backoff_s(self, attempt: int) -> float:
        cap = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * 2**attempt)
        return cap / 2 + random.uniform(0, cap / 2)  # "equal jitter"

    def _with_retries(self, name: str, action: str, fn: Callable[[Connection], T],
                      *, retry: bool = True) -> T:
        """Run fn on the worker's connection; on a dropped connection or failed transfer,
        reconnect and retry with backoff. Permanent errors are raised at once."""
        attempts = 1 + (self.cfg.retries if retry else 0)
        closes = self._closes
        with self._lock(name):
            for attempt in range(attempts):
                try:
                    conn = self._connection(name)
                    with conn.lock:
                        return fn(conn)
                except _PERMANENT:
                    raise
                except DeadlineError:
                    self._drop(name)  # the server may still be sending; never wait on it
                    raise
                except (ConnectError, TransferError) as e:
                    self._drop(name)
                    if attempt + 1 >= attempts or self._closes != closes:
                        raise
                    delay = self._backoff_s(attempt)
                    log.warning("%s: %s failed (attempt %d/%d), retrying in %.1fs: %s",
                                name, action, attempt + 1, attempts, delay, e)
                    time.sleep(delay)
        raise AssertionError("unreachable")

    def paths(self, name: str) -> WorkerPaths:
        """The worker's remote paths (connects to learn its home folder)."""
        return self._with_retries(name, "connect", lambda c: WorkerPaths(c.root, name))

    # ------------------------------------------------------------------ commands

    def _exec(self, conn: Connection, name: str, command: str, timeout_s: float,
              check: bool) -> CommandResult:
        action = f"run {command[:60]!r}"
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        try:
            transport = conn.client.get_transport()
            chan = transport.open_session(timeout=timeout_s)
            # run under POSIX sh whatever the user's login shell is (fish, csh, ...)
            chan.exec_command(f"exec /bin/sh -c {q(command)}")
            chan.shutdown_write()
            out, err = Tail(COMMAND_OUTPUT_MAX_BYTES), Tail(COMMAND_OUTPUT_MAX_BYTES)
            if not drain(chan, transport, deadline, out, err):
                raise self._err(RemoteCommandError, name, action,
                                f"no exit after {timeout_s:g}s (timed out)",
                                stdout=out.text(), stderr=err.text())
            code = chan.recv_exit_status()
            chan.close()
        except RemoteCommandError:
            raise
        except _NET_ERRORS as e:
            raise self._err(ConnectError, name, action, f"{type(e).__name__}: {e}") from e
        res = CommandResult(code, out.text(), err.text(), time.monotonic() - t0,
                            out.dropped + err.dropped)
        if res.dropped_bytes:
            log.warning("%s: %s printed %d bytes more than the %d kept", self._where(name),
                        action, res.dropped_bytes, COMMAND_OUTPUT_MAX_BYTES)
        if check and code != 0:
            raise self._err(RemoteCommandError, name, action,
                            f"exit code {code}: {res.stderr.strip()[-500:]}",
                            exit_code=code, stdout=res.stdout, stderr=res.stderr)
        return res

    def run(self, name: str, command: str | Sequence[str], *, timeout_s: float | None = None,
            check: bool = True, retry: bool = False) -> CommandResult:
        """Run a shell command (a string, or an argv list that gets quoted) on a worker.

        `retry` re-runs it after a dropped connection: only for idempotent commands.
        """
        if not isinstance(command, str):
            command = remote.join(command)
        timeout = self.cfg.command_timeout_s if timeout_s is None else timeout_s
        return self._with_retries(
            name, "run", lambda c: self._exec(c, name, command, timeout, check), retry=retry)

    # ------------------------------------------------------------------ files

    def _sftp(self, conn: Connection) -> paramiko.SFTPClient:
        return conn.open_sftp(self.cfg.transfer_timeout_s)

    def _named(self, e: TransferError, name: str, action: str, path: str) -> TransferError:
        """`e` (the SFTP client's, naming the worker) naming the action and path too; the same
        class, so a DeadlineError stays one."""
        if path in str(e):
            return e
        return type(e)(f"{self._where(name)}: {action} {path}: "
                       f"{str(e).removeprefix(self._where(name) + ': ')}")

    def put(self, name: str, local: str | os.PathLike, remote_path: str) -> TransferResult:
        """Upload a file atomically (temp name + posix-rename); relative paths are under the
        worker's root; parent folders are made. Its replies are read by the same deadline as
        a download's (`distributed.transfer_timeout_s`). Retries with backoff."""

        def op(c: Connection) -> TransferResult:
            target = WorkerPaths(c.root, name).resolve(remote_path)
            self._makedirs(c, name, os.path.dirname(target))
            sftp = self._sftp(c)
            with sftp_deadline(sftp, self.cfg.transfer_timeout_s):  # its replies, as a get's
                return put_file(sftp, local, target, where=self._where(name),
                                stats=self.stats, tmp_tag=name)

        return self._with_retries(name, f"upload {remote_path}", op)

    def get(self, name: str, remote_path: str, local: str | os.PathLike, *,
            expected_sha256: str | None = None, max_bytes: int | None = None,
            timeout_s: float | None = None) -> TransferResult:
        """Download via a `.partial` file, verify size (and sha256 when given), rename.

        Regular files only, at most `max_bytes` counted while reading, within `timeout_s`
        (default `distributed.transfer_timeout_s`; past it DeadlineError, not retried, and
        the connection is dropped): see `sftp.get_file`."""
        deadline_s = self.cfg.transfer_timeout_s if timeout_s is None else timeout_s

        def op(c: Connection) -> TransferResult:
            src = WorkerPaths(c.root, name).resolve(remote_path)
            return get_file(self._sftp(c), src, local, where=self._where(name),
                            stats=self.stats, expected_sha256=expected_sha256,
                            max_bytes=max_bytes, timeout_s=deadline_s)

        return self._with_retries(name, f"download {remote_path}", op)

    def read_bytes(self, name: str, remote_path: str, *, max_bytes: int = 1 << 20) -> bytes:
        """Read a small remote file whole (e.g. a heartbeat)."""

        def op(c: Connection) -> bytes:
            path = WorkerPaths(c.root, name).resolve(remote_path)
            try:
                sftp = self._sftp(c)
                with sftp_deadline(sftp, self.cfg.transfer_timeout_s):
                    st = sftp.lstat(path)
                    if st.st_mode is not None and not stat.S_ISREG(st.st_mode):
                        # a FIFO would block the SFTP server (and this connection) on open
                        raise VerifyError(f"{self._where(name)}: {path} is not a regular file"
                                          " (a link, FIFO or device); refused without opening"
                                          " it")
                    size = st.st_size
                    if size > max_bytes:
                        raise VerifyError(f"{self._where(name)}: {path} is {size} bytes, "
                                          f"over the limit {max_bytes}")
                    with sftp.open(path, "rb") as f:  # replies are bounded (BoundedSFTPClient)
                        return f.read(max_bytes + 1)[:max_bytes]
            except FileNotFoundError:
                raise
            except TransferError as e:
                raise self._named(e, name, "read", path) from e
            except (paramiko.SSHException, paramiko.SFTPError, EOFError, OSError) as e:
                raise TransferError(f"{self._where(name)}: read {path}: "
                                    f"{type(e).__name__}: {e}") from e

        return self._with_retries(name, f"read {remote_path}", op)

    def listdir(self, name: str, remote_path: str, *, max_entries: int = LISTING_MAX_ENTRIES,
                with_temporary: bool = False) -> list[str]:
        """Names in a remote folder (temporary `*.tmp`/`*.partial` names left out unless
        `with_temporary`).

        ListingCapError once the folder lists more than `max_entries` entries: the listing
        is read one reply at a time and stops there (bounded time and memory; within
        `distributed.transfer_timeout_s`)."""

        def op(c: Connection) -> list[str]:
            path = WorkerPaths(c.root, name).resolve(remote_path)
            names: list[str] = []
            try:
                # one READDIR in flight: stopping early leaves no reply unread on the channel
                sftp = self._sftp(c)
                with sftp_deadline(sftp, self.cfg.transfer_timeout_s):
                    for attr in sftp.listdir_iter(path, read_aheads=1):
                        if len(names) >= max_entries:
                            c.close_sftp()  # drops the open folder handle with the session
                            raise ListingCapError(f"{self._where(name)}: {path} lists more "
                                                  f"than {max_entries} entries")
                        names.append(attr.filename)
            except FileNotFoundError:
                return []
            except ListingCapError:
                raise
            except TransferError as e:
                raise self._named(e, name, "list", path) from e
            except (*_NET_ERRORS, paramiko.SFTPError) as e:
                raise TransferError(f"{self._where(name)}: list {path}: {e}") from e
            return sorted(n for n in names
                          if with_temporary or not n.endswith((".tmp", ".partial")))

        return self._with_retries(name, f"list {remote_path}", op)

    def remove(self, name: str, remote_path: str) -> bool:
        """Delete a remote file; False if it was already gone (idempotent)."""

        def op(c: Connection) -> bool:
            path = WorkerPaths(c.root, name).resolve(remote_path)
            try:
                sftp = self._sftp(c)
                with sftp_deadline(sftp, self.cfg.transfer_timeout_s):  # unsolicited replies
                    sftp.remove(path)                                  # wait no longer
                return True
            except FileNotFoundError:
                return False
            except TransferError as e:
                raise self._named(e, name, "remove", path) from e
            except _NET_ERRORS as e:
                raise TransferError(f"{self._where(name)}: remove {path}: {e}") from e

        return self._with_retries(name, f"remove {remote_path}", op)

    def _makedirs(self, c: Connection, name: str, path: str) -> None:
        sftp = self._sftp(c)
        try:
            with sftp_deadline(sftp, self.cfg.transfer_timeout_s):
                sftp.stat(path)
            return
        except FileNotFoundError:
            pass
        except TransferError as e:
            raise self._named(e, name, "stat", path) from e
        except _NET_ERRORS as e:
            raise TransferError(f"{self._where(name)}: stat {path}: {e}") from e
        self._exec(c, name, f"umask 077; mkdir -p {q(path)}", self.cfg.command_timeout_s, True)

    def push_files(self, files: Sequence[tuple[str | os.PathLike, str]],
                   names: Iterable[str] | None = None
                   ) -> dict[str, list[TransferResult] | Exception]:
        """Upload files, in order, to many workers in parallel (one thread per worker).

        `files` is [(local path, remote path template)]; a template may use `{models}`,
        `{dir}`, `{outbox}` or `{root}` for that worker's folders, e.g.
        `("runs/main/models/model_000013.pt.zst", "{models}/model_000013.pt.zst")`. A worker
        whose upload fails gets no later file (push a model before its manifest). Returns
        `{name: [TransferResult, ...] | Exception}`; `stats.last_push_s` is the wall time.
        """

        def push(name: str) -> list[TransferResult]:
            p = self.paths(name)
            out = []
            for local, template in files:
                target = template.format(models=p.models, dir=p.worker_dir, outbox=p.outbox,
                                         root=p.root)
                out.append(self.put(name, local, target))
            return out

        t0 = time.perf_counter()
        res = fan_out(push, self._names(names))
        self.stats.last_push_s = time.perf_counter() - t0
        return res

    def push_file(self, local: str | os.PathLike, remote_path: str,
                  names: Iterable[str] | None = None) -> dict[str, TransferResult | Exception]:
        """`push_files` of one file: `{name: TransferResult | Exception}`."""
        res = self.push_files([(local, remote_path)], names)
        return {n: (r if isinstance(r, Exception) else r[0]) for n, r in res.items()}

    # ------------------------------------------------------------------ lifecycle

    def _python(self, name: str) -> str:
        return self.spec(name).python or self.cfg.python

    def _project(self) -> remote.ProjectInfo:
        if self.project is None:
            self.project = remote.local_project()
        return self.project

    def preflight(self, name: str, *, with_torch: bool = True) -> PreflightReport:
        """Python version, project version, torch/CUDA/GPUs and free disk of one worker."""
        project = self._project()

        def op(c: Connection) -> CommandResult:
            cmd = remote.preflight_command(WorkerPaths(c.root, name), self._python(name),
                                           project.dist, with_torch)
            return self._exec(c, name, cmd, self.cfg.command_timeout_s, True)

        res = self._with_retries(name, "preflight", op)
        try:
            info = preflight_info(res.stdout)
        except ValueError as e:
            raise self._err(RemoteCommandError, name, "preflight", str(e)) from e
        s = self.spec(name)
        key = next((f"distributed.workers[{i}].gpu_id" for i, n in enumerate(self._workers)
                    if n == name), "gpu_id")
        problems = preflight_problems(info, spec=s, gpu_key=key, python=self._python(name),
                                      project=project, deploy=self.cfg.deploy,
                                      with_torch=with_torch)
        return PreflightReport(
            name=name, host=s.host, python=info["python"],
            project_version=info["project_version"], torch=info["torch"],
            cuda=info["cuda"], gpus=tuple(info["gpus"]), free_disk_gb=info["free_disk_gb"],
            hostname=info.get("hostname", ""), problems=tuple(problems))

    def _wheel(self) -> Path:
        if self._archive is None:
            self._archive_dir = tempfile.TemporaryDirectory(prefix="azgo-deploy-")
            self._archive = remote.build_wheel(self._project(), Path(self._archive_dir.name))
        return self._archive

    def deploy(self, name: str, *, force: bool = False) -> DeployResult:
        """Install the project's exact version into `<root>/venv` unless already there.

        "Already there" means the venv's marker holds this version AND the sha256 of this
        exact wheel (so edited code under an unchanged version is redeployed).
        """
        project = self._project()
        t0 = time.perf_counter()
        paths = self.paths(name)
        archive = self._wheel()
        want = f"{project.version} {sha256_file(archive)}"
        marker = remote.deployed_marker(paths)
        timeout = max(self.cfg.command_timeout_s, 300.0)  # pip may be slow
        if not force:
            have = self.run(name, f"cat {q(marker)} 2>/dev/null; exit 0", retry=True)
            if have.stdout.strip() == want:
                return DeployResult(project.version, True, time.perf_counter() - t0)
        try:
            self.run(name, remote.make_venv_command(paths, self._python(name)),
                     timeout_s=timeout, retry=True)
            target = f"{paths.deploy_dir}/{archive.name}"
            self.put(name, archive, target)
            self.run(name, remote.pip_install_command(paths, target, with_deps=False),
                     timeout_s=timeout, retry=True)
            missing = self.run(name, remote.missing_deps_command(paths, project.dist),
                               retry=True).stdout.split()
            slower = [m for m in missing if m in remote.SPEED_ONLY_DEPS]
            missing = [m for m in missing if m not in remote.SPEED_ONLY_DEPS]
            if slower:
                log.warning("%s: %s not installed: self-play runs the net as TorchScript, "
                            "slower (pip install %s into the host's Python to speed it up)",
                            name, " and ".join(slower), " ".join(slower))
            if missing:
                log.warning("%s: %s missing on the worker, pip installing them: %s",
                            name, len(missing), " ".join(missing))
                self.run(name, remote.pip_install_command(paths, target, with_deps=True),
                         timeout_s=timeout, retry=True)
            have = self.run(name, remote.installed_version_command(paths, project.dist),
                            retry=True).stdout.strip()
        except RemoteCommandError as e:
            raise self._err(DeployError, name, "deploy",
                            f"{e}; see the output above, or set distributed.deploy: false and "
                            "install by hand") from e
        if have != project.version:
            raise self._err(DeployError, name, "deploy",
                            f"after install the venv reports {have or 'nothing'}, "
                            f"expected {project.version}")
        self.run(name, f"printf '%s\\n' {q(want)} > {q(marker)}", retry=True)
        log.info("%s: deployed %s %s in %.1fs", name, project.dist, have,
                 time.perf_counter() - t0)
        return DeployResult(have, False, time.perf_counter() - t0)

    def start(self, name: str) -> int:
        """Start the worker daemon detached (no-op if running). Returns its pid."""
        s = self.spec(name)
        paths = self.paths(name)
        python = paths.venv_python if self.cfg.deploy else self._python(name)
        argv = remote.format_start_argv(
            self.start_command, python=python, name=name, config=paths.config,
            root=paths.root, dir=paths.worker_dir, models=paths.models, log=paths.log,
            gpu_id=s.gpu_id)
        try:
            out = self.run(name, remote.start_command(paths, argv), retry=True).stdout
        except RemoteCommandError as e:
            if not e.stdout.startswith("exited"):
                raise
            raise self._err(RemoteCommandError, name, "start",
                            f"the daemon exited right after start ({remote.join(argv)}); "
                            f"end of {paths.log}:\n{e.stderr.strip()}",
                            exit_code=e.exit_code, stdout=e.stdout, stderr=e.stderr) from e
        words = out.split()
        if len(words) != 2 or words[0] not in ("started", "running") or not _is_pid(words[1]):
            raise self._err(RemoteCommandError, name, "start",
                            f"unexpected output {out[-200:]!r}")
        log.info("%s: daemon %s, pid %s", name, words[0], words[1])
        return int(words[1])

    def stop(self, name: str) -> str:
        """SIGTERM, then SIGKILL after `stop_grace_s`. Returns 'terminated', 'killed' or
        'not-running'."""
        paths = self.paths(name)
        cmd = remote.stop_command(paths, self.cfg.stop_grace_s)
        out = self.run(name, cmd, timeout_s=self.cfg.command_timeout_s + self.cfg.stop_grace_s,
                       retry=True).stdout.split()
        return out[0] if out else "not-running"

    def restart(self, name: str) -> int:
        """Stop then start. Returns the new pid."""
        self.stop(name)
        return self.start(name)

    def is_running(self, name: str) -> int | None:
        """The daemon's pid if it is alive, else None."""
        out = self.run(name, remote.running_command(self.paths(name)), retry=True).stdout
        if not out.strip():
            return None
        if not _is_pid(out.split()[0]):
            raise self._err(RemoteCommandError, name, "check daemon",
                            f"unexpected output {out[-200:]!r}")
        return int(out.split()[0])

    def log_tail(self, name: str, max_bytes: int = LOG_TAIL_BYTES) -> str:
        """The end of the worker daemon's log (its output and a crash's last words), at most
        `max_bytes`; "" when it has none."""
        return self.run(name, remote.log_tail_command(self.paths(name), max_bytes),
                        retry=True).stdout

    def read_heartbeat(self, name: str) -> Heartbeat:
        """The worker's status.json (raises FileNotFoundError before its first heartbeat)."""
        paths = self.paths(name)
        data = self.read_bytes(name, paths.heartbeat, max_bytes=HEARTBEAT_MAX_BYTES)
        return parse_heartbeat(data, str(paths.heartbeat))

    # ------------------------------------------------------------------ many workers

    def for_each(self, action: Callable[[str], T],
                 names: Iterable[str] | None = None) -> dict[str, T | Exception]:
        """`action(name)` on every (or the given) worker in parallel: {name: result | error}."""
        return fan_out(action, self._names(names))

    def preflight_all(self, names=None, *, with_torch: bool = True):
        return self.for_each(lambda n: self.preflight(n, with_torch=with_torch), names)

    def deploy_all(self, names=None):
        return self.for_each(self.deploy, names)

    def start_all(self, names=None):
        return self.for_each(self.start, names)

    def stop_all(self, names=None):
        return self.for_each(self.stop, names)

    def restart_all(self, names=None):
        return self.for_each(self.restart, names)

    def read_heartbeats(self, names=None) -> dict[str, Heartbeat | Exception]:
        return self.for_each(self.read_heartbeat, names)


if __name__ == "__main__":
    # `python distributed/ssh_connector.py ...` (the user guide's command): the command line
    # lives in distributed/cli.py; importing it through the package keeps one copy of this
    # module (and of its exception classes) in the process.
    from distributed.cli import main

    sys.exit(main())
