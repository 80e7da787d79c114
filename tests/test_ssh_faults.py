"""Faults against several real SSH hosts in network namespaces (tests/sshd.py makes them).

Each test prints its figure: host unreachable (error within the timeout), link taken down in
the middle of a transfer (error within the timeout, the retry completes, no half file ever
visible under the final name), sshd killed on one host (that worker Offline, the others
unaffected), and a parallel push to every host.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pytest

from configs import WorkerSpec
from distributed.ssh_connector import ConnectError, SSHConnector
from distributed.status import Heartbeat, HeartbeatTracker, WorkerState
from distributed.transfer import TransferError, sha256_file
from tests.sshd import (  # noqa: F401 - netns_hosts is a fixture
    NetnsHosts,
    daemon_command,
    leftover_namespaces,
    make_config,
    netns_hosts,
    require_netns,
    write_fake_daemon,
)

pytestmark = [pytest.mark.ssh, pytest.mark.netns]


def _specs(hosts: NetnsHosts, tmp: Path) -> list[WorkerSpec]:
    return [
        WorkerSpec(host=hosts.addr(i), user=hosts.servers[i - 1].user, name=f"worker{i}",
                   key_path=str(hosts.client_key), gpu_id=-1,
                   remote_dir=str(tmp / f"host{i}"))
        for i in range(1, hosts.n + 1)
    ]


def _connector(hosts, tmp, **kw) -> SSHConnector:
    start_command = kw.pop("start_command", None)
    cfg = make_config(_specs(hosts, tmp), hosts.known_hosts, **kw)
    extra = {"start_command": start_command} if start_command else {}
    return SSHConnector(cfg, **extra)


def test_hosts_are_separate_machines_on_the_bridge(netns_hosts, tmp_path):
    with _connector(netns_hosts, tmp_path) as c:
        addrs = c.for_each(lambda n: c.run(n, "echo $SSH_CONNECTION").stdout.split()[2])
        assert addrs == {f"worker{i}": netns_hosts.addr(i) for i in (1, 2, 3)}


def test_parallel_push_to_all_hosts(netns_hosts, tmp_path):
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(8 << 20))
    with _connector(netns_hosts, tmp_path) as c:
        c.for_each(lambda n: c.run(n, "true"))  # connect first: time the transfer alone
        t0 = time.perf_counter()
        res = c.push_file(src, "models/model_000001.pt.zst")
        dt = time.perf_counter() - t0
    assert all(not isinstance(r, Exception) for r in res.values()), res
    for i in (1, 2, 3):
        assert sha256_file(tmp_path / f"host{i}" / "models" / "model_000001.pt.zst") == \
            sha256_file(src)
    print(f"8 MB to 3 namespace hosts in parallel: {dt:.2f} s "
          f"({3 * 8 / dt:.0f} MB/s aggregate)")


def test_unreachable_host_errors_within_the_timeout(netns_hosts, tmp_path):
    netns_hosts.link_down(2)
    try:
        with _connector(netns_hosts, tmp_path, connect_timeout_s=1.0, retries=1,
                        backoff_base_s=0.1, backoff_max_s=0.2) as c:
            t0 = time.perf_counter()
            res = c.for_each(lambda n: c.run(n, "echo up", retry=True).stdout)
            dt = time.perf_counter() - t0
    finally:
        netns_hosts.link_up(2)
    assert res["worker1"] == "up\n" and res["worker3"] == "up\n"
    err = res["worker2"]
    assert isinstance(err, ConnectError), err
    assert "worker2" in str(err) and netns_hosts.addr(2) in str(err) and "timed out" in str(err)
    # 2 attempts x 1 s connect timeout + at most 0.2 s backoff, plus scheduling slack
    print(f"unreachable host: {type(err).__name__} after {dt:.2f} s "
          f"(2 attempts x 1.0 s timeout), other hosts answered: {err}")
    assert dt < 2 * 1.0 + 0.2 + 1.5


def test_link_down_mid_transfer_then_retry_completes(netns_hosts, tmp_path, caplog):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(48 << 20))
    final = tmp_path / "host1" / "models" / "big.bin"
    with _connector(netns_hosts, tmp_path, connect_timeout_s=1.0, retries=6,
                    backoff_base_s=0.3, backoff_max_s=1.0, keepalive_s=1.0) as c:
        c.run("worker1", "true")
        # throttle host 1 so the upload lasts long enough to be cut in the middle
        netns_hosts.rate(1, "80mbit")
        seen_partial_final = []
        out: dict = {}

        def push():
            t = time.perf_counter()
            try:
                out["res"] = c.put("worker1", src, "models/big.bin")
            except Exception as e:  # noqa: BLE001 - reported below
                out["err"] = e
            out["t_end"] = time.perf_counter() - t

        th = threading.Thread(target=push)
        with caplog.at_level(logging.WARNING, logger="distributed.ssh_connector"):
            th.start()
            # wait until a temporary file has grown past 4 MB, then cut the link
            folder = final.parent
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                tmps = list(folder.glob(".big.bin.*.tmp")) if folder.exists() else []
                if tmps and tmps[0].stat().st_size > (4 << 20):
                    break
                time.sleep(0.02)
            cut_at = tmps[0].stat().st_size
            netns_hosts.link_down(1)
            t_down = time.perf_counter()
            while not caplog.records and time.perf_counter() - t_down < 20:
                if final.exists():
                    seen_partial_final.append(final.stat().st_size)
                time.sleep(0.05)
            t_err = time.perf_counter() - t_down
            time.sleep(1.0)
            netns_hosts.link_up(1)
            t_up = time.perf_counter()
            while th.is_alive():
                if final.exists() and final.stat().st_size != src.stat().st_size:
                    seen_partial_final.append(final.stat().st_size)
                th.join(0.05)
        netns_hosts.rate(1, None)
    assert "err" not in out, out.get("err")
    assert caplog.records, "the cut transfer did not fail within 20 s"
    assert seen_partial_final == [], "a partial file was visible under the final name"
    assert sha256_file(final) == sha256_file(src)
    assert [p.name for p in final.parent.iterdir()] == ["big.bin"], "temp files left behind"
    print(f"link down after {cut_at / 2**20:.1f} MB of 48 MB: error after {t_err:.2f} s "
          f"(TCP_USER_TIMEOUT 2 s), link up 1 s later, retry completed "
          f"{time.perf_counter() - t_up:.2f} s after link up; first warning: "
          f"{caplog.records[0].getMessage()[:160]}")
    assert t_err < 2.0 + 3.0


def test_link_down_mid_download_leaves_only_a_partial_then_completes(netns_hosts, tmp_path):
    remote_file = tmp_path / "host1" / "outbox" / "batch.npz.zst"
    remote_file.parent.mkdir(parents=True)
    remote_file.write_bytes(os.urandom(32 << 20))
    dst = tmp_path / "replay" / "batch.npz.zst"
    dst.parent.mkdir()
    with _connector(netns_hosts, tmp_path, connect_timeout_s=1.0, retries=6,
                    backoff_base_s=0.3, backoff_max_s=1.0, keepalive_s=1.0) as c:
        c.run("worker1", "true")
        netns_hosts.rate(1, "80mbit")
        out: dict = {}
        th = threading.Thread(target=lambda: out.setdefault(
            "res", c.get("worker1", "outbox/batch.npz.zst", dst,
                         expected_sha256=sha256_file(remote_file))))
        th.start()
        partial = dst.with_name(dst.name + ".partial")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if partial.exists() and partial.stat().st_size > (4 << 20):
                break
            time.sleep(0.02)
        netns_hosts.link_down(1)
        visible = []
        t_down = time.perf_counter()
        while time.perf_counter() - t_down < 4.0:
            if dst.exists():
                visible.append(dst.stat().st_size)
            time.sleep(0.05)
        netns_hosts.link_up(1)
        th.join(60)
        netns_hosts.rate(1, None)
    assert not th.is_alive() and "res" in out
    assert visible == [], "a partial download was visible under the final name"
    assert sha256_file(dst) == sha256_file(remote_file)
    assert sorted(p.name for p in dst.parent.iterdir()) == ["batch.npz.zst"]
    print(f"download cut for 4 s: only {partial.name} existed meanwhile; retry completed "
          f"{time.perf_counter() - t_down:.1f} s after the cut, sha256 verified")


def test_killed_sshd_makes_that_worker_offline_only(netns_hosts, tmp_path):
    script = write_fake_daemon(tmp_path)
    with _connector(netns_hosts, tmp_path, start_command=daemon_command(script),
                    retries=1, connect_timeout_s=1.0, backoff_base_s=0.1,
                    backoff_max_s=0.2) as c:
        pids = c.start_all()
        assert all(isinstance(p, int) for p in pids.values()), pids
        deadline = time.monotonic() + 10
        while True:
            hbs = c.read_heartbeats()
            if all(isinstance(h, Heartbeat) for h in hbs.values()):
                break
            assert time.monotonic() < deadline, hbs
            time.sleep(0.2)
        netns_hosts.kill_sshd(2)  # listener and the session we held: the host is gone
        t0 = time.perf_counter()
        hbs = c.read_heartbeats()
        dt = time.perf_counter() - t0
        tracker = HeartbeatTracker(offline_after_s=3.0)
        states = {n: tracker.observe(n, h if isinstance(h, Heartbeat) else None)[0]
                  for n, h in hbs.items()}
        assert states == {"worker1": WorkerState.ACTIVE, "worker2": WorkerState.OFFLINE,
                          "worker3": WorkerState.ACTIVE}, hbs
        assert isinstance(hbs["worker2"], (ConnectError, TransferError))
        print(f"sshd killed on worker2: polled all 3 in {dt:.2f} s -> {states}; "
              f"worker2: {hbs['worker2']}")
        netns_hosts.restart_sshd(2)
        assert isinstance(c.read_heartbeat("worker2"), Heartbeat), "no reconnect after restart"
        stopped = c.stop_all()
        assert all(s in ("terminated", "killed") for s in stopped.values()), stopped


def test_namespaces_are_cleaned_up(tmp_path):
    require_netns()
    with NetnsHosts(tmp_path, 2) as hosts:
        assert len(leftover_namespaces()) >= 2
        names = list(hosts.namespaces)
    left = [n for n in leftover_namespaces() if n in names]
    assert left == []
