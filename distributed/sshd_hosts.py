"""Throwaway SSH hosts on this machine, for tests and benchmarks (never for production).

`SSHServer` runs Debian's /usr/sbin/sshd with its own config, a generated ed25519 host key and
an authorized client key, listening on one address and port, never touching the system's sshd.
`known_hosts` pins its host key. The login user is whoever runs it (root is allowed with a key
only: PermitRootLogin prohibit-password); `/run/sshd` (privilege separation) is created.

`NetnsHosts` makes N fake hosts (root only): a bridge with 10.200.X.1/24 in the root namespace
(X: the first free subnet), and per host a network namespace joined by a veth pair (address
10.200.X.(10+i)), each running its own `SSHServer` on port 22. Names carry this process's pid
and a counter, so parallel runs do not collide, and leftovers of dead runs are removed first.
Fault helpers: `link_down`/`link_up` (the root-side veth), `rate` (a tbf bandwidth cap),
`blackhole`/`unblackhole` (an nftables table inside the host's namespace that drops every
packet on its link, both ways: the link stays up, connections just go silent),
`kill_sshd` (listener and every session), `restart_sshd`. Traffic goes only to loopback and to
the addresses made here; nothing is routed out. `close()` (also at exit) removes everything.

It must not: touch the system's sshd, ~/.ssh, or any address outside 127/8 and its own subnet.
"""

from __future__ import annotations

import atexit
import fcntl
import getpass
import ipaddress
import itertools
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


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
_BLACKHOLE = "azgo_blackhole"  # nftables table of `NetnsHosts.blackhole`, in the host's netns
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
        self.dir.mkdir(parents=True, exist_ok=True)
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
        # one process at a time picks a subnet and takes it (test runs in parallel)
        with open(Path(tempfile.gettempdir()) / "azgo-netns.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
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

    def rate(self, i: int, rate: str | None) -> None:
        """Cap host i's link at `rate` (tc tbf, e.g. "100mbit"); None removes the cap."""
        dev = self.veths[i - 1]
        if rate is None:
            subprocess.run(["tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)
        else:
            subprocess.run(["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                            "burst", "256kbit", "latency", "400ms"], check=True)

    def rate_both_ways(self, i: int, rate: str | None) -> None:
        """Cap host i's link at `rate` in both directions (tbf on the root-side veth for
        traffic to the host, on the host's eth0 for traffic from it); None removes both."""
        self.rate(i, rate)
        prefix = ["ip", "netns", "exec", self.namespaces[i - 1], "tc", "qdisc"]
        if rate is None:
            subprocess.run(prefix + ["del", "dev", "eth0", "root"], capture_output=True)
        else:
            subprocess.run(prefix + ["replace", "dev", "eth0", "root", "tbf", "rate", rate,
                                     "burst", "256kbit", "latency", "400ms"], check=True)

    def blackhole(self, i: int) -> None:
        """Drop every packet to and from host i (nftables in its namespace): open connections
        and new ones hang until their timeouts, as with a dead router on the way."""
        rules = (f"table inet {_BLACKHOLE} {{\n"
                 "  chain input { type filter hook input priority 0; policy drop; }\n"
                 "  chain output { type filter hook output priority 0; policy drop; }\n}\n")
        subprocess.run(["ip", "netns", "exec", self.namespaces[i - 1], "nft", "-f", "-"],
                       input=rules, text=True, check=True, capture_output=True)

    def unblackhole(self, i: int) -> None:
        """Undo `blackhole(i)` (a no-op when host i is not black-holed)."""
        subprocess.run(["ip", "netns", "exec", self.namespaces[i - 1], "nft", "delete", "table",
                        "inet", _BLACKHOLE], capture_output=True)

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
