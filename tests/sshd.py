"""Throwaway OpenSSH servers for the SSH tests: one on loopback, or N hosts in network namespaces.

`SSHServer` runs Debian's /usr/sbin/sshd with its own config, a generated ed25519 host key and
an authorized client key, listening on one address and port, never touching the system's sshd.
`known_hosts` pins its host key. Login user is whoever runs the tests (root is allowed with a
key only: PermitRootLogin prohibit-password); `/run/sshd` (privilege separation) is created.

`NetnsHosts` makes N fake hosts: a bridge with 10.200.X.1/24 in the root namespace, and per host
a network namespace joined by a veth pair (address 10.200.X.(10+i)), each running its own
`SSHServer` on port 22. Names carry this process's pid, so parallel runs do not collide, and
leftovers of dead runs are removed first. Fault helpers: `link_down`/`link_up` (the root side
veth), `kill_sshd` (listener and every session), `restart_sshd`. Traffic goes only to loopback
and to addresses made here; nothing is routed out. Everything is torn down on `close()`, at
fixture teardown and at exit.

In CI (`CI=true`) a missing sshd or missing root is a failure, elsewhere a skip with the reason.
"""

from __future__ import annotations

import atexit
import getpass
import ipaddress
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from configs import DistributedConfig, WorkerSpec

SSHD = "/usr/sbin/sshd"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def require_sshd() -> None:
    """Fail (CI) or skip (elsewhere) unless sshd and ssh-keygen are installed."""
    if not os.path.exists(SSHD):
        _unavailable(f"{SSHD} not installed (apt-get install openssh-server)")
    if not shutil.which("ssh-keygen"):
        _unavailable("ssh-keygen not installed (apt-get install openssh-client)")


def require_netns() -> None:
    """Fail (CI) or skip (elsewhere) unless we are root with `ip netns` available."""
    require_sshd()
    if os.geteuid() != 0:
        _unavailable("network-namespace tests need root")
    if not shutil.which("ip"):
        _unavailable("iproute2 (`ip`) not installed")


def keygen(path: Path, comment: str = "azgo-test") -> Path:
    """Make an ed25519 key pair at `path` (and `path`.pub) unless it exists."""
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f",
                        str(path)], check=True)
    return path


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def known_hosts_name(addr: str, port: int) -> str:
    return addr if port == 22 else f"[{addr}]:{port}"


def _children(pid: int) -> list[int]:
    """All descendants of `pid` (from /proc), deepest last."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class SSHServer:
    """One private sshd (see the module docstring)."""

    def __init__(self, state_dir: Path, addr: str = "127.0.0.1", port: int | None = None, *,
                 netns: str | None = None, client_key: Path | None = None):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.addr, self.netns = addr, netns
        self.port = port or free_port(addr)
        self.user = getpass.getuser()
        self.host_key = keygen(self.dir / "host_ed25519", "test-host")
        self.client_key = client_key or keygen(self.dir / "client_key", "test-client")
        self.known_hosts = self.dir / "known_hosts"
        self.proc: subprocess.Popen | None = None
        (self.dir / "authorized_keys").write_text(
            Path(str(self.client_key) + ".pub").read_text())
        os.chmod(self.dir / "authorized_keys", 0o600)
        self.known_hosts.write_text(self.known_hosts_line())
        self.config = self.dir / "sshd_config"
        self.config.write_text(f"""\
Port {self.port}
ListenAddress {addr}
HostKey {self.host_key}
PidFile none
AuthorizedKeysFile {self.dir}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
StrictModes no
X11Forwarding no
AllowTcpForwarding no
PrintMotd no
MaxStartups 100:30:200
MaxSessions 50
LogLevel INFO
Subsystem sftp internal-sftp
""")

    def known_hosts_line(self) -> str:
        pub = self.host_key.with_suffix(".pub").read_text().split()
        return f"{known_hosts_name(self.addr, self.port)} {pub[0]} {pub[1]}\n"

    def start(self, wait_s: float = 10.0) -> SSHServer:
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        subprocess.run(prefix + [SSHD, "-t", "-f", str(self.config)], check=True)
        log = open(self.dir / "sshd.log", "ab")
        self.proc = subprocess.Popen(prefix + [SSHD, "-D", "-e", "-f", str(self.config)],
                                     stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.dir / 'sshd.log').read_text()}")
            try:
                socket.create_connection((self.addr, self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"sshd on {self.addr}:{self.port} did not come up")

    @property
    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Kill the listener AND every session it forked (new and old connections die)."""
        if self.proc is None:
            return
        pids = [self.proc.pid] + _children(self.proc.pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        self.kill()

    def restart(self) -> SSHServer:
        self.kill()
        return self.start()

    def log_text(self) -> str:
        try:
            return (self.dir / "sshd.log").read_text()
        except OSError:
            return ""


# ----------------------------------------------------------------------------- namespaces

_LIVE: list["NetnsHosts"] = []
_COUNTER = itertools.count(1)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _remove_stale_namespaces() -> None:
    """Delete azt<pid>* namespaces, veths and bridges of test runs whose process is gone."""
    pat = re.compile(r"^azt(\d+)")
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        m = pat.match(ns)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            for pid in _ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", ns, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        dev = line.split(": ")[1].split("@")[0] if ": " in line else ""
        m = pat.match(dev)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _ip("link", "del", dev, check=False)


def _free_subnet() -> str:
    used = _ip("-o", "-4", "addr", "show", check=False).stdout
    for x in range(0, 250):
        if f" 10.200.{x}." not in used:
            return f"10.200.{x}"
    raise RuntimeError("no free 10.200.X.0/24 subnet")


class NetnsHosts:
    """N fake SSH hosts in network namespaces on one bridge (see the module docstring)."""

    def __init__(self, state_dir: Path, n: int = 3):
        self.dir = Path(state_dir)
        self.n = n
        tag = f"azt{os.getpid()}x{next(_COUNTER)}"
        self.bridge = f"{tag}br"
        self.namespaces = [f"{tag}h{i}" for i in range(1, n + 1)]
        self.veths = [f"{tag}v{i}" for i in range(1, n + 1)]
        self.servers: list[SSHServer] = []
        self.client_key = keygen(self.dir / "client_key")
        self.known_hosts = self.dir / "known_hosts"
        self.net = ""
        self._up = False

    def addr(self, i: int) -> str:
        """Address of host i (1-based)."""
        return f"{self.net}.{10 + i}"

    def up(self) -> NetnsHosts:
        _remove_stale_namespaces()
        self.net = _free_subnet()
        _LIVE.append(self)
        self._up = True
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.net}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (ns, veth) in enumerate(zip(self.namespaces, self.veths), start=1):
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            srv = SSHServer(self.dir / ns, self.addr(i), 22, netns=ns,
                            client_key=self.client_key)
            self.servers.append(srv)
        for srv in self.servers:
            srv.start()
        self.known_hosts.write_text("".join(s.known_hosts_line() for s in self.servers))
        assert ipaddress.ip_address(self.addr(1)).is_private
        return self

    def link_down(self, i: int) -> None:
        _ip("link", "set", self.veths[i - 1], "down")

    def link_up(self, i: int) -> None:
        _ip("link", "set", self.veths[i - 1], "up")

    def kill_sshd(self, i: int) -> None:
        self.servers[i - 1].kill()

    def restart_sshd(self, i: int) -> None:
        self.servers[i - 1].restart()

    def close(self) -> None:
        if not self._up:
            return
        self._up = False
        for srv in self.servers:
            srv.kill()
        for ns in self.namespaces:
            for pid in _ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", ns, check=False)
        for veth in self.veths:
            _ip("link", "del", veth, check=False)
        _ip("link", "del", self.bridge, check=False)
        if self in _LIVE:
            _LIVE.remove(self)

    def __enter__(self) -> NetnsHosts:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.close()


@atexit.register
def _cleanup_at_exit() -> None:
    for hosts in list(_LIVE):
        hosts.close()


def leftover_namespaces() -> list[str]:
    """Namespaces of this process still present (for the cleanup assertion)."""
    tag = f"azt{os.getpid()}x"
    return [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines()
            if line.startswith(tag)]


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def sshd_server():
    """A loopback sshd for the module (key: `.client_key`, pinned `.known_hosts`)."""
    require_sshd()
    tmp = Path(tempfile.mkdtemp(prefix="azgo-sshd-"))
    srv = SSHServer(tmp)
    srv.start()
    try:
        yield srv
    finally:
        srv.kill()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def netns_hosts():
    """Three namespace hosts for the module (`.servers`, `.client_key`, `.known_hosts`)."""
    require_netns()
    tmp = Path(tempfile.mkdtemp(prefix="azgo-netns-"))
    hosts = NetnsHosts(tmp, 3)
    try:
        hosts.up()
        yield hosts
    finally:
        hosts.close()
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- test config and fake daemon
# The fake daemon stands in for training.worker (distributed/ must not depend on training): it
# writes a Heartbeat-format status.json every 0.2 s into its `--dir` (like training.worker), exits on
# SIGTERM, or ignores it with --ignore-term (to exercise the SIGKILL path).

FAKE_DAEMON = r'''
import json, os, signal, sys, time
args = sys.argv[1:]
name, d = args[args.index("--name") + 1], args[args.index("--dir") + 1]
if "--ignore-term" in args:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
os.makedirs(d, exist_ok=True)
n = 0
while True:
    hb = {"name": name, "state": "Active", "pid": os.getpid(), "generation": 3,
          "games_done": n, "games_per_s": 5.0, "positions_per_s": 300.0,
          "outbox_backlog": 0, "paused": False, "last_error": "", "time": time.time(),
          "argv": args}
    tmp = os.path.join(d, ".status.json.tmp")
    with open(tmp, "w") as f:
        json.dump(hb, f)
    os.replace(tmp, os.path.join(d, "status.json"))
    n += 1
    time.sleep(0.2)
'''


def write_fake_daemon(folder: Path) -> Path:
    path = folder / "fake_daemon.py"
    path.write_text(FAKE_DAEMON)
    return path


def daemon_command(script: Path, *extra: str) -> tuple[str, ...]:
    """A start-command template running the fake daemon with this test's Python."""
    return (sys.executable, str(script), "--name", "{name}", "--dir", "{dir}", *extra)


def make_config(workers: list[WorkerSpec], known_hosts: Path, **overrides) -> DistributedConfig:
    """Short timeouts and backoffs so that fault tests finish in seconds."""
    base = dict(
        enabled=True,
        workers=tuple(workers),
        known_hosts=str(known_hosts),
        connect_timeout_s=3.0,
        command_timeout_s=20.0,
        transfer_timeout_s=10.0,
        retries=2,
        backoff_base_s=0.2,
        backoff_max_s=1.0,
        keepalive_s=1.0,
        offline_after_s=3.0,
        deploy=False,
        python=sys.executable,
        stop_grace_s=1.0,
    )
    base.update(overrides)
    return DistributedConfig(**base)
