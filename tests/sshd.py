"""SSH test fixtures: a loopback sshd, hosts in network namespaces, a fake worker daemon.

The servers themselves are `distributed.sshd_hosts` (also used by benchmarks/transfer.py). Here:
pytest fixtures `sshd_server` (module scope, loopback) and `netns_hosts` (module scope, three
namespace hosts), `require_sshd`/`require_netns` (in CI, `CI=true`, a missing sshd or missing
root is a failure; elsewhere a skip with the reason), `make_config` (short timeouts), and a fake
daemon standing in for training.worker.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from configs import DistributedConfig, WorkerSpec
from distributed.sshd_hosts import (  # noqa: F401 - re-exported for the test modules
    SSHD,
    NetnsHosts,
    SSHServer,
    free_port,
    keygen,
    leftover_namespaces,
)

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


# ----------------------------------------------------------------------------- config, daemon
# The fake daemon stands in for training.worker (distributed/ must not depend on training): it
# writes a Heartbeat-format status.json every 0.2 s into its `--dir` (like training.worker),
# exits on SIGTERM, or ignores it with --ignore-term (to exercise the SIGKILL path).

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
