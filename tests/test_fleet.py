"""training.fleet.fleet with the SSH fleet against a real loopback sshd and a fake worker daemon
(tests/sshd.py): what a host gets at start (`--min-seq` from the coach's ledger, a config
without the other machines), and a supervisor stuck past its deadline abandoned, its
connection closed, and a fresh one carrying on."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from pathlib import Path

import pytest

from configs import WorkerSpec, load_config, override
from distributed.ssh_connector import SSHConnector
from tests.conftest import REPO, wait_until
from tests.sshd import (daemon_command, make_config, sshd_server,  # noqa: F401 - fixture
                        write_fake_daemon)

pytestmark = pytest.mark.ssh


def _cfg(srv, tmp: Path, **dist):
    """configs/tiny.yaml with worker1 on the loopback sshd and worker2 a host that is never
    contacted (its host, user and key must not reach worker1)."""
    workers = [
        {"host": srv.addr, "port": srv.port, "user": srv.user, "name": "worker1",
         "key_path": str(srv.client_key), "gpu_id": -1, "remote_dir": str(tmp / "host1")},
        {"host": "secret-host.example", "user": "secretuser", "name": "worker2",
         "key_path": "/secret/keys/id_worker2", "gpu_id": -1},
    ]
    values = {"run.dir": str(tmp / "run"), "logging.dir": str(tmp / "logs"),
              "distributed.enabled": True, "distributed.workers": workers,
              "distributed.worker_weights": {"worker2": 2.0},
              "distributed.known_hosts": str(srv.known_hosts), "distributed.deploy": False,
              "distributed.python": sys.executable, "distributed.connect_timeout_s": 3,
              "distributed.retries": 1, "distributed.backoff_base_s": 0.2,
              "distributed.backoff_max_s": 1, "distributed.poll_interval_s": 0.2,
              "distributed.heartbeat_interval_s": 0.2, "distributed.stop_grace_s": 1,
              **{f"distributed.{k}": v for k, v in dist.items()}}
    return override(load_config(REPO / "configs" / "tiny.yaml"), values)


def _heartbeat(tmp: Path) -> dict:
    try:
        return json.loads((tmp / "host1" / "workers" / "worker1" / "status.json").read_text())
    except (OSError, ValueError):
        return {}




def test_ssh_worker_starts_with_the_ledgers_min_seq_and_a_config_without_other_hosts(
        sshd_server, tmp_path):
    from training.fleet.ssh_workers import SSHFleet

    cfg = _cfg(sshd_server, tmp_path)
    (tmp_path / "run").mkdir()
    fleet = SSHFleet(cfg, tmp_path / "run", tmp_path / "run" / "config.yaml",
                     next_seq={"worker1": 42, "worker2": 7}.get,
                     start_command=daemon_command(write_fake_daemon(tmp_path)))
    backend = fleet.backend("worker1")
    try:
        backend.prepare()  # preflight, then the run's config
        backend.start(fleet.next_seq("worker1"))
        wait_until(lambda: _heartbeat(tmp_path).get("argv"), 30, "the daemon's first heartbeat")
        argv = _heartbeat(tmp_path)["argv"]
        assert argv[argv.index("--min-seq") + 1] == "42", argv
    finally:
        backend.stop()
        fleet.close()
    pushed = (tmp_path / "host1" / "config.yaml").read_text()
    for secret in ("secret-host.example", "secretuser", "/secret/keys", "worker2",
                   str(sshd_server.client_key)):
        assert secret not in pushed, secret
    worker_cfg = load_config(tmp_path / "host1" / "config.yaml")
    assert worker_cfg.distributed.workers == () and worker_cfg.go == cfg.go
    assert worker_cfg.distributed.batch_size == cfg.distributed.batch_size


def test_a_stuck_supervisor_is_abandoned_and_a_fresh_one_carries_on(sshd_server, tmp_path):
    """The worker's SSH session is frozen (SIGSTOP of its sshd process): every operation on
    that connection blocks. With a deadline shorter than the connector's own timeouts
    (transfer_timeout_s 60 s), the watchdog closes the connection and a new supervisor reads
    heartbeats over a new one."""
    import os
    import signal

    from training.fleet.fleet import Fleet
    from training.fleet.ssh_workers import SSHBackend, SSHFleet, write_worker_config

    class _ShortDeadline(SSHBackend):
        def deadline_s(self, op: str) -> float:
            return 3.0 if op == "read heartbeat" else super().deadline_s(op)

        def fresh(self) -> SSHBackend:
            return _ShortDeadline(self.cfg, self.spec, self.config_file, stats=self.stats,
                                  start_command=self.start_command)

    class _Fleet(SSHFleet):
        def backends_for(self, cfg):
            write_worker_config(cfg, self.config_file)
            return [_ShortDeadline(cfg, s, self.config_file, stats=self.stats,
                                   start_command=self.start_command)
                    for s in cfg.distributed.workers[:1]]

    cfg = _cfg(sshd_server, tmp_path, transfer_timeout_s=60, command_timeout_s=60)
    (tmp_path / "run").mkdir()
    fleet: Fleet = _Fleet(cfg, tmp_path / "run", tmp_path / "run" / "config.yaml",
                          start_command=daemon_command(write_fake_daemon(tmp_path)))
    member = fleet.members["worker1"]
    fleet.start(collector=None)
    frozen = None
    try:
        wait_until(lambda: member.heartbeat is not None, 60, "the first heartbeat")
        old_sup, old_backend = fleet._sups["worker1"], fleet.backend("worker1")
        session = int(old_backend.connector.run("worker1", "echo $PPID").stdout)
        os.kill(session, signal.SIGSTOP)
        frozen = session
        t0 = time.monotonic()
        stop = threading.Event()

        def watch() -> None:  # what the coach's loop does every pass
            while not stop.is_set():
                fleet.watchdog()
                time.sleep(0.2)

        threading.Thread(target=watch, daemon=True).start()
        try:
            wait_until(lambda: fleet._sups["worker1"] is not old_sup, 20, "the supervisor replaced")
            replaced_s = time.monotonic() - t0
            assert "stuck" in member.error and "read heartbeat" in member.error, member.error
            seen = member.heartbeat.time
            wait_until(lambda: member.heartbeat.time > seen, 20, "heartbeats over a new connection")
            recovered_s = time.monotonic() - t0
            wait_until(lambda: not old_sup.thread.is_alive(), 20, "the stuck thread to exit")
        finally:
            stop.set()
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        fleet.stop_all(timeout_s=20)
        fleet.close()
    assert replaced_s < 3.0 + 2.0
    print(f"frozen session: supervisor replaced after {replaced_s:.1f}s (deadline 3 s), "
          f"heartbeats again after {recovered_s:.1f}s; error shown: {member.error}")


def test_bring_ups_run_at_most_the_bound_at_once(tmp_path, monkeypatch):
    """Forty workers started together: never more than MAX_CONCURRENT_BRING_UPS bring-ups
    at once (a fleet of hundreds must not open hundreds of sessions in the same second), and
    every worker is still brought up."""
    from training.fleet import fleet as fleet_mod
    from training.fleet.collector import Collector, LocalSource
    from training.fleet.validation import validate_with_records

    monkeypatch.setattr(fleet_mod, "MAX_CONCURRENT_BRING_UPS", 3)
    lock = threading.Lock()
    now_running, peak, started = [0], [0], []

    class SlowStart(fleet_mod.Backend):
        """A machine whose daemon takes 0.1 s to start and then plays nothing."""

        def __init__(self, name: str):
            self.name = name
            (tmp_path / name).mkdir()

        def start(self, min_seq: int) -> int:
            with lock:
                now_running[0] += 1
                peak[0] = max(peak[0], now_running[0])
            time.sleep(0.1)
            with lock:
                now_running[0] -= 1
                started.append(self.name)
            return 1

        def is_running(self) -> bool:
            return True

        def stop(self) -> None:
            pass

        def read_heartbeat(self):
            return None

        def push_model(self, models_dir, manifest) -> None:
            pass

        def source(self):
            return LocalSource(tmp_path / self.name)

    class Forty(fleet_mod.Fleet):
        def backends_for(self, cfg):
            return [SlowStart(f"w{i}") for i in range(40)]

    cfg = override(load_config(REPO / "configs" / "tiny.yaml"),
                   {"run.dir": str(tmp_path / "run"), "distributed.poll_interval_s": 0.05})
    fleet = Forty(cfg)
    collector = Collector(tmp_path / "run", validate_with_records(5, 0.5))
    fleet.start(collector)
    try:
        wait_until(lambda: len(started) == 40, 30, "all 40 workers brought up")
    finally:
        fleet.stop_all(timeout_s=5)
    assert peak[0] == 3, f"at most 3 bring-ups at once, saw {peak[0]}"


@pytest.mark.ssh
def test_a_custom_worker_class_outside_the_project_is_shipped_and_imports_there(
        sshd_server, tmp_path, monkeypatch):
    """`--worker-class mymod:Cls` with --distributed: the module's file goes to the worker's
    root (the daemon's working folder) and imports there with the deployed project."""
    from training.fleet.ssh_workers import prepare_host, worker_class_files

    user = tmp_path / "user_code"
    user.mkdir()
    (user / "my_workers.py").write_text(
        "from training.worker import Worker\n\n\nclass Loud(Worker):\n    LOUD = 42\n")
    monkeypatch.syspath_prepend(str(user))
    assert worker_class_files("training.worker:Worker") == []
    assert [r for _, r in worker_class_files("my_workers:Loud")] == ["my_workers.py"]
    spec = WorkerSpec(host=sshd_server.addr, user=sshd_server.user, name="w1",
                      port=sshd_server.port, key_path=str(sshd_server.client_key),
                      remote_dir=str(tmp_path / "remote"), gpu_id=-1)
    config = tmp_path / "config.yaml"
    config.write_text("go:\n  board_size: 5\n")
    with SSHConnector(make_config([spec], sshd_server.known_hosts)) as conn:
        prepare_host(conn, "w1", config, deploy=False, worker_class="my_workers:Loud")
        root = tmp_path / "remote"
        assert (root / "my_workers.py").read_text() == (user / "my_workers.py").read_text()
        res = conn.run("w1", f"cd {root} && {sys.executable} -c "
                       "'from training.worker import import_worker_class as i; "
                       "print(i(\"my_workers:Loud\").LOUD)'")
        assert res.stdout.strip() == "42", res



def test_an_ssh_daemon_that_keeps_exiting_shows_its_logs_last_line_then_stays_in_error(
        sshd_server, tmp_path, monkeypatch):
    """The daemon on the host starts, logs, then dies with a message: LAST ERROR carries that
    message, read from the end of its log on the host, and after MAX_QUICK_EXITS quick exits in
    a row the worker stays in Error with it instead of restarting forever."""
    from training.fleet import fleet as fleet_mod
    from training.fleet.ssh_workers import SSHFleet

    monkeypatch.setattr(fleet_mod, "MAX_QUICK_EXITS", 2)
    script = tmp_path / "dying_daemon.py"
    script.write_text(
        "import sys, time\n"
        "print('worker starting', flush=True)\n"
        "time.sleep(1.0)\n"  # past the start command's own check
        "sys.exit('RuntimeError: CUDA error: no kernel image for this device')\n")
    cfg = _cfg(sshd_server, tmp_path)
    cfg = dataclasses.replace(cfg, distributed=dataclasses.replace(  # worker1 alone
        cfg.distributed, workers=cfg.distributed.workers[:1], worker_weights={}))
    (tmp_path / "run").mkdir()
    fleet = SSHFleet(cfg, tmp_path / "run", tmp_path / "run" / "config.yaml",
                     start_command=(sys.executable, str(script)))
    member = fleet.members["worker1"]
    fleet.start(collector=None)
    try:
        wait_until(lambda: member.fault, 90, "worker1 in Error")
    finally:
        fleet.stop_all(timeout_s=20)
        fleet.close()
    log_text = (tmp_path / "host1" / "logs" / "worker_worker1.log").read_text()
    assert log_text.count("worker starting") == 2 and member.restarts == 1, log_text
    assert member.fault.startswith(
        "daemon exited: RuntimeError: CUDA error: no kernel image for this device"), member.fault
    assert "exited 2 times in a row" in member.fault and "--restart worker1" in member.fault
