"""SSHConnector against a real OpenSSH server on loopback (tests/sshd.py starts it).

Covers commands, atomic SFTP transfers, the daemon lifecycle, heartbeats, preflight, deploy,
host-key policy (unknown, accepted, changed), a wrong key, and shell metacharacters in paths.
Each fault test prints its figure.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import pytest

from configs import WorkerSpec
from distributed.remote import ProjectInfo, local_project
from distributed.ssh_connector import (
    AuthError,
    ConnectError,
    HostKeyError,
    PreflightReport,
    RemoteCommandError,
    SSHConnector,
    UnknownWorkerError,
)
from distributed.status import HeartbeatTracker, WorkerState
from distributed.transfer import TransferError, VerifyError, sha256_file
from tests.sshd import (  # noqa: F401 - sshd_server is a fixture
    SSHServer,
    daemon_command,
    keygen,
    make_config,
    sshd_server,
    write_fake_daemon,
)

pytestmark = pytest.mark.ssh

NASTY = "a b;$(touch PWNED)'\"`touch PWNED2`&|<>*?"


def _spec(srv: SSHServer, tmp: Path, name: str = "worker1", **kw) -> WorkerSpec:
    kw.setdefault("remote_dir", str(tmp / f"remote_{name}"))
    return WorkerSpec(host=srv.addr, port=srv.port, user=srv.user,
                      key_path=str(srv.client_key), name=name, gpu_id=-1, **kw)


def _connector(srv, tmp, *, known_hosts=None, specs=None, **kw) -> SSHConnector:
    specs = specs or [_spec(srv, tmp)]
    start_command = kw.pop("start_command", None)
    cfg = make_config(specs, known_hosts or srv.known_hosts, **kw)
    extra = {"start_command": start_command} if start_command else {}
    return SSHConnector(cfg, config_path=tmp / "config.yaml", **extra)


@pytest.fixture
def conn(sshd_server, tmp_path):
    c = _connector(sshd_server, tmp_path)
    yield c
    c.close()


def test_run_command_and_reuse_connection(conn, sshd_server):
    accepted_before = sshd_server.log_text().count("Accepted publickey")
    t0 = time.perf_counter()
    res = conn.run("worker1", ["echo", "hello", NASTY])
    first = time.perf_counter() - t0
    assert res.exit_code == 0 and res.stdout == f"hello {NASTY}\n"
    t0 = time.perf_counter()
    for _ in range(10):
        conn.run("worker1", "true")
    per_cmd = (time.perf_counter() - t0) / 10
    print(f"first command (connect+auth+exec) {first * 1000:.0f} ms, "
          f"then {per_cmd * 1000:.1f} ms per command on the reused connection")
    # one connection for all eleven commands (timings vary too much on a loaded 2-core box
    # to assert on: ~3-4 ms idle, plus the remote shell's rc files)
    assert conn._conns["worker1"].client.get_transport().is_active()
    assert sshd_server.log_text().count("Accepted publickey") == accepted_before + 1


def test_failed_command_names_worker_and_exit_code(conn):
    with pytest.raises(RemoteCommandError) as e:
        conn.run("worker1", "echo oops >&2; exit 3")
    assert e.value.exit_code == 3 and "oops" in e.value.stderr
    assert "worker1" in str(e.value) and "127.0.0.1" in str(e.value)
    res = conn.run("worker1", "exit 4", check=False)
    assert res.exit_code == 4


def test_command_timeout(conn):
    t0 = time.perf_counter()
    with pytest.raises(RemoteCommandError, match="timed out"):
        conn.run("worker1", "sleep 30", timeout_s=1.0)
    dt = time.perf_counter() - t0
    print(f"command timeout 1.0 s -> error after {dt:.2f} s")
    assert dt < 3.0


def test_unknown_worker_is_a_lookup_error(conn):
    with pytest.raises(UnknownWorkerError, match="worker1"):
        conn.run("nope", "true")


def test_put_get_round_trip_with_metacharacters(conn, tmp_path):
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(3 << 20))
    remote = f"models/{NASTY}/model_000001.pt.zst"
    res = conn.put("worker1", src, remote)
    remote_abs = Path(res.path)
    assert remote_abs.read_bytes() == src.read_bytes()
    assert res.sha256 == sha256_file(src)
    assert [p.name for p in remote_abs.parent.iterdir()] == ["model_000001.pt.zst"]
    assert remote_abs.parent.stat().st_mode & 0o077 == 0, "folders it makes are private"
    back = tmp_path / f"back {NASTY}.bin"
    got = conn.get("worker1", remote, back, expected_sha256=res.sha256)
    assert back.read_bytes() == src.read_bytes() and got.size == 3 << 20
    assert conn.listdir("worker1", f"models/{NASTY}") == ["model_000001.pt.zst"]
    assert conn.stats.bytes_sent == 3 << 20 and conn.stats.bytes_received == 3 << 20
    assert not list(tmp_path.rglob("PWNED*")) and not Path("PWNED").exists()
    assert conn.remove("worker1", remote) is True
    assert conn.remove("worker1", remote) is False


def test_download_with_wrong_checksum_leaves_no_file(conn, tmp_path):
    src = tmp_path / "g.bin"
    src.write_bytes(b"game batch" * 1000)
    conn.put("worker1", src, "outbox/g.bin")
    dst = tmp_path / "in" / "g.bin"
    dst.parent.mkdir()
    t0 = time.perf_counter()
    with pytest.raises(VerifyError, match="sha256"):
        conn.get("worker1", "outbox/g.bin", dst, expected_sha256="0" * 64)
    assert time.perf_counter() - t0 < 1.0, "a verification failure must not be retried"
    assert list(dst.parent.iterdir()) == []
    with pytest.raises(TransferError, match="over the limit"):
        conn.get("worker1", "outbox/g.bin", dst, max_bytes=100)
    assert list(dst.parent.iterdir()) == []
    t0 = time.perf_counter()
    with pytest.raises(FileNotFoundError):
        conn.get("worker1", "outbox/missing.bin", dst)
    assert time.perf_counter() - t0 < 1.0, "a missing file must not be retried"
    assert list(dst.parent.iterdir()) == []


def test_push_file_fans_out_to_every_worker(sshd_server, tmp_path):
    specs = [_spec(sshd_server, tmp_path, f"w{i}") for i in range(1, 4)]
    with _connector(sshd_server, tmp_path, specs=specs) as c:
        src = tmp_path / "m.bin"
        src.write_bytes(os.urandom(1 << 20))
        res = c.push_file(src, "models/m.bin")
        assert set(res) == {"w1", "w2", "w3"}
        for name, r in res.items():
            assert not isinstance(r, Exception), r
            assert Path(r.path).read_bytes() == src.read_bytes()
        assert c.stats.last_push_s is not None
        manifest = tmp_path / "m.json"
        manifest.write_text("{}")
        res = c.push_files([(src, "{models}/model_000002.pt.zst"),
                            (manifest, "{models}/model_000002.json")], ["w1", "w3"])
        assert set(res) == {"w1", "w3"}
        for name in ("w1", "w3"):
            models = Path(c.paths(name).models)
            assert sorted(p.name for p in models.iterdir()) == ["model_000002.json",
                                                               "model_000002.pt.zst"]
            assert [r.path for r in res[name]] == [str(models / "model_000002.pt.zst"),
                                                   str(models / "model_000002.json")]


def test_daemon_lifecycle_start_is_running_heartbeat_stop(sshd_server, tmp_path):
    script = write_fake_daemon(tmp_path)
    with _connector(sshd_server, tmp_path, start_command=daemon_command(script)) as c:
        assert c.is_running("worker1") is None
        t0 = time.perf_counter()
        pid = c.start("worker1")
        print(f"start returned in {time.perf_counter() - t0:.3f} s (detached), pid {pid}")
        assert c.start("worker1") == pid, "a second start must not spawn a second daemon"
        assert c.is_running("worker1") == pid
        deadline = time.monotonic() + 10
        while True:
            try:
                hb = c.read_heartbeat("worker1")
                break
            except FileNotFoundError:
                assert time.monotonic() < deadline, "no heartbeat within 10 s"
                time.sleep(0.1)
        assert hb.pid == pid and hb.name == "worker1"
        assert HeartbeatTracker(5).observe("worker1", hb)[0] is WorkerState.ACTIVE
        # own session: the daemon is its session leader, so the SSH session ending
        # could not take it down
        assert os.getsid(pid) == pid
        log = Path(c.paths("worker1").log)
        assert log.exists()
        t0 = time.perf_counter()
        assert c.stop("worker1") == "terminated"
        print(f"stop (SIGTERM honoured) took {time.perf_counter() - t0:.2f} s")
        assert c.is_running("worker1") is None
        assert c.stop("worker1") == "not-running"
        new_pid = c.restart("worker1")
        assert new_pid != pid and c.is_running("worker1") == new_pid
        c.stop("worker1")


def test_daemon_that_dies_at_once_is_reported_with_its_log(sshd_server, tmp_path):
    # a wrong python path: the typical mistake, and it dies within the 0.3 s check even on a
    # loaded machine (a Python that fails after its imports may outlive the check: the
    # coach's heartbeat watch catches that one)
    cmd = (str(tmp_path / "no such python"), "-m", "training.worker")
    with _connector(sshd_server, tmp_path, start_command=cmd) as c:
        with pytest.raises(RemoteCommandError, match="exited right after start") as e:
            c.start("worker1")
        assert "no such python" in str(e.value) and "No such file" in str(e.value)
        assert c.is_running("worker1") is None


def test_stop_escalates_to_sigkill_after_grace(sshd_server, tmp_path):
    script = write_fake_daemon(tmp_path)
    cmd = daemon_command(script, "--ignore-term")
    with _connector(sshd_server, tmp_path, start_command=cmd, stop_grace_s=0.5) as c:
        pid = c.start("worker1")
        time.sleep(0.3)
        t0 = time.perf_counter()
        assert c.stop("worker1") == "killed"
        dt = time.perf_counter() - t0
        print(f"SIGTERM ignored -> SIGKILL after grace 0.5 s: stop took {dt:.2f} s")
        assert c.is_running("worker1") is None
        assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False


def test_stale_pid_file_of_another_process_is_not_ours(sshd_server, tmp_path):
    script = write_fake_daemon(tmp_path)
    with _connector(sshd_server, tmp_path, start_command=daemon_command(script)) as c:
        paths = c.paths("worker1")
        Path(paths.pid_file).parent.mkdir(parents=True, exist_ok=True)
        Path(paths.pid_file).write_text(f"{os.getpid()}\n")  # this pytest: alive, not ours
        assert c.is_running("worker1") is None
        assert c.stop("worker1") == "not-running"  # and it did not kill pytest
        pid = c.start("worker1")
        assert pid != os.getpid()
        c.stop("worker1")


def test_metacharacters_in_remote_dir_are_harmless(sshd_server, tmp_path):
    script = write_fake_daemon(tmp_path)
    spec = _spec(sshd_server, tmp_path, remote_dir=str(tmp_path / NASTY / "root"))
    with _connector(sshd_server, tmp_path, specs=[spec],
                    start_command=daemon_command(script, NASTY)) as c:
        pid = c.start("worker1")
        assert c.is_running("worker1") == pid
        c.put("worker1", script, "x.py")
        assert (tmp_path / NASTY / "root" / "x.py").exists()
        pf = c.preflight("worker1", with_torch=False)
        assert pf.python.startswith("3.")
        deadline = time.monotonic() + 10
        while True:
            try:
                hb = c.read_heartbeat("worker1")
                break
            except FileNotFoundError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert hb.pid == pid
        assert c.stop("worker1") == "terminated"
    pwned = [p for p in tmp_path.rglob("PWNED*")] + [p for p in Path.cwd().glob("PWNED*")]
    assert pwned == [], f"a metacharacter was executed: {pwned}"
    print(f"remote_dir {NASTY!r}: start/put/preflight/heartbeat/stop ran, nothing executed")


def test_preflight_reports_python_torch_and_disk(conn):
    t0 = time.perf_counter()
    rep = conn.preflight("worker1")
    print(f"preflight in {time.perf_counter() - t0:.2f} s: {rep}")
    assert isinstance(rep, PreflightReport)
    assert rep.python == ".".join(map(str, sys.version_info[:3]))
    assert rep.free_disk_gb > 0
    assert rep.torch is not None  # torch is installed on this test host
    assert rep.ok, rep.problems  # gpu_id -1: no GPU needed


def test_gpu_id_0_runs_on_a_cpu_only_host_and_a_missing_gpu_names_the_key(sshd_server,
                                                                          tmp_path):
    """The default gpu_id 0 passes preflight on a host without CUDA (the daemon plays on
    its CPU); a GPU the host does not have is a problem that names the key and what to
    set."""
    from distributed.preflight import gpu_problem

    specs = [WorkerSpec(host=sshd_server.addr, port=sshd_server.port, user=sshd_server.user,
                        key_path=str(sshd_server.client_key), name=n, gpu_id=g,
                        remote_dir=str(tmp_path / n)) for n, g in (("worker1", 0), ("worker2", 64))]
    with _connector(sshd_server, tmp_path, specs=specs) as c:
        first, second = c.preflight("worker1"), c.preflight("worker2")
    assert first.ok, first.problems
    assert not second.ok
    assert any(p.startswith("distributed.workers[1].gpu_id is 64 but the host has")
               and "-1" in p for p in second.problems), second.problems
    assert gpu_problem("gpu_id", 0, 0) is None and gpu_problem("gpu_id", -1, 0) is None
    assert "set gpu_id: -1" in gpu_problem("gpu_id", 1, 0)
    assert "one of 0..1" in gpu_problem("gpu_id", 2, 2) and gpu_problem("gpu_id", 1, 2) is None


def test_unknown_host_key_refused_unless_accepted(sshd_server, tmp_path):
    kh = tmp_path / "known_hosts_empty"
    kh.write_text("")
    t0 = time.perf_counter()
    with _connector(sshd_server, tmp_path, known_hosts=kh) as c:
        with pytest.raises(HostKeyError) as e:
            c.run("worker1", "true")
    dt = time.perf_counter() - t0
    assert "SHA256:" in str(e.value) and "accept-new-host-keys" in str(e.value)
    print(f"unknown host key refused in {dt:.2f} s (no retries): {e.value}")
    assert kh.read_text() == ""
    cfg_kh = tmp_path / "sub" / "known_hosts"  # missing file and folder: created
    with _connector(sshd_server, tmp_path, known_hosts=cfg_kh,
                    accept_new_host_keys=True) as c:
        assert c.run("worker1", "echo ok").stdout == "ok\n"
    line = cfg_kh.read_text().split()
    assert line[0] == f"[127.0.0.1]:{sshd_server.port}"
    assert line[1:] == sshd_server.known_hosts.read_text().split()[1:]
    with _connector(sshd_server, tmp_path, known_hosts=cfg_kh) as c:  # now known
        assert c.run("worker1", "echo ok").stdout == "ok\n"


def test_changed_host_key_refused_with_both_fingerprints(sshd_server, tmp_path):
    other = keygen(tmp_path / "other_host_key")
    typ, b64 = other.with_suffix(".pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts_changed"
    kh.write_text(f"[127.0.0.1]:{sshd_server.port} {typ} {b64}\n")
    expected_fp = _fp_of_pub(b64)
    actual_fp = _fp_of_pub(sshd_server.host_key.with_suffix(".pub").read_text().split()[1])
    for accept in (False, True):  # even accept_new_host_keys never accepts a CHANGED key
        with _connector(sshd_server, tmp_path, known_hosts=kh,
                        accept_new_host_keys=accept) as c:
            with pytest.raises(HostKeyError) as e:
                c.run("worker1", "true")
        msg = str(e.value)
        assert "CHANGED" in msg and expected_fp in msg and actual_fp in msg
    assert kh.read_text().count("\n") == 1
    print(f"changed host key refused: {msg}")


def _fp_of_pub(b64: str) -> str:
    import base64

    digest = hashlib.sha256(base64.b64decode(b64)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def test_wrong_key_is_an_auth_error_without_retries(sshd_server, tmp_path):
    wrong = keygen(tmp_path / "wrong_key")
    spec = _spec(sshd_server, tmp_path)
    spec = WorkerSpec(**{**spec.__dict__, "key_path": str(wrong)})
    t0 = time.perf_counter()
    with _connector(sshd_server, tmp_path, specs=[spec], retries=3) as c:
        with pytest.raises(AuthError) as e:
            c.run("worker1", "true")
    dt = time.perf_counter() - t0
    print(f"wrong key refused in {dt:.2f} s: {e.value}")
    assert "worker1" in str(e.value) and str(wrong) in str(e.value)
    assert isinstance(e.value.__cause__, Exception)
    assert dt < 2.0, "auth failures must not be retried"


def test_refused_port_fails_fast_after_retries(sshd_server, tmp_path):
    spec = _spec(sshd_server, tmp_path)
    spec = WorkerSpec(**{**spec.__dict__, "port": _closed_port()})
    t0 = time.perf_counter()
    with _connector(sshd_server, tmp_path, specs=[spec], retries=2, backoff_base_s=0.1) as c:
        with pytest.raises(ConnectError, match="refused") as e:
            c.run("worker1", "true", retry=True)
    dt = time.perf_counter() - t0
    print(f"closed port: ConnectError after 3 attempts in {dt:.2f} s: {e.value}")
    assert dt < 3.0


def _closed_port() -> int:
    from tests.sshd import free_port

    return free_port()


def test_deploy_installs_exact_version_once(sshd_server, tmp_path):
    proj = _fake_project(tmp_path / "proj", "azgo-deploytest", "0.3.1")
    spec = _spec(sshd_server, tmp_path)
    cfg_kw = dict(deploy=True, command_timeout_s=120.0)
    cfg = make_config([spec], sshd_server.known_hosts, **cfg_kw)
    with SSHConnector(cfg, project=proj) as c:
        t0 = time.perf_counter()
        first = c.deploy("worker1")
        t1 = time.perf_counter()
        second = c.deploy("worker1")
        t2 = time.perf_counter()
        print(f"deploy: fresh venv + install {t1 - t0:.1f} s, already installed (skip) "
              f"{t2 - t1:.2f} s")
        assert (first.version, first.skipped) == ("0.3.1", False)
        assert (second.version, second.skipped) == ("0.3.1", True)
        venv_py = c.paths("worker1").venv_python
        out = c.run("worker1", [venv_py, "-c", "import azgo_deploytest_pkg, zstandard; "
                                "print(azgo_deploytest_pkg.VERSION)"]).stdout
        assert out.strip() == "0.3.1"  # zstandard came from the host (system site packages)
        pf = c.preflight("worker1", with_torch=False)
        assert pf.project_version == "0.3.1"
    # the code changes, the version does not: a new coach (new archive) redeploys
    (proj.root / "azgo_deploytest_pkg" / "__init__.py").write_text('VERSION = "0.3.1"\nX = 2\n')
    with SSHConnector(cfg, project=proj) as c:
        third = c.deploy("worker1")
        assert not third.skipped
        out = c.run("worker1", [c.paths("worker1").venv_python, "-c",
                                "import azgo_deploytest_pkg as m; print(m.X)"]).stdout
        assert out.strip() == "2"
        assert c.deploy("worker1").skipped


def _fake_project(root: Path, dist: str, version: str) -> ProjectInfo:
    """A tiny installable project in a git repo, standing in for ours (the archive is built
    from `git ls-files`, and this test must not depend on our own packaging state)."""
    import subprocess

    pkg = root / "azgo_deploytest_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f'VERSION = "{version}"\n')
    (root / "setup.cfg").write_text(
        f"[metadata]\nname = {dist}\nversion = {version}\n\n"
        "[options]\npackages = azgo_deploytest_pkg\ninstall_requires =\n    zstandard\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    return local_project(root)


def test_reconfigure_keeps_unchanged_connections(sshd_server, tmp_path):
    import dataclasses

    specs = [_spec(sshd_server, tmp_path, "w1"), _spec(sshd_server, tmp_path, "w2")]
    with _connector(sshd_server, tmp_path, specs=specs) as c:
        c.for_each(lambda n: c.run(n, "true"))
        kept = c._conns["w1"]
        moved = dataclasses.replace(specs[1], gpu_id=0)
        c.reconfigure(dataclasses.replace(c.cfg, workers=(specs[0], moved)))
        assert c._conns.get("w1") is kept and "w2" not in c._conns
        c.reconfigure(dataclasses.replace(c.cfg, workers=(moved,)))
        assert set(c.workers) == {"w2"} and "w1" not in c._conns
        with pytest.raises(UnknownWorkerError):
            c.run("w1", "true")


def test_backoff_grows_exponentially_with_jitter_and_a_cap(conn):
    for attempt in range(8):
        cap = min(conn.cfg.backoff_max_s, conn.cfg.backoff_base_s * 2**attempt)
        delays = [conn._backoff_s(attempt) for _ in range(50)]
        assert all(cap / 2 <= d <= cap for d in delays)
        assert len(set(delays)) > 1  # jitter: workers do not retry in lockstep


def test_invalid_host_name_is_a_connect_error(sshd_server, tmp_path):
    spec = WorkerSpec(**{**_spec(sshd_server, tmp_path).__dict__, "host": "a" * 70 + ".example"})
    with _connector(sshd_server, tmp_path, specs=[spec], retries=0) as c:
        with pytest.raises(ConnectError, match="not a valid host name") as e:
            c.run("worker1", "true")
    assert "worker1" in str(e.value)
