"""The ssh_connector command line and config editing (add/remove worker keep comments).

The SSH parts (`--check`, `--restart --direct`) run against a real loopback sshd.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from configs import load_config
from tests.conftest import REPO
from distributed import config_edit, restart_requests
from distributed.cli import main
from distributed.config_edit import ConfigEditError
from distributed.ssh_connector import SSHConnector
from distributed.status import StatusSnapshot, WorkerRow, WorkerState, write_status
from tests.sshd import sshd_server, write_fake_daemon  # noqa: F401 - sshd_server is a fixture


@pytest.fixture
def cfg_file(tmp_path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text((REPO / "configs" / "config.yaml").read_text())
    return path


def _comments(text: str) -> list[str]:
    return [line.split("#", 1)[1].strip() for line in text.splitlines() if "#" in line]


def test_add_and_remove_worker_keep_comments_and_validate(cfg_file):
    before = cfg_file.read_text()
    spec = config_edit.add_worker(cfg_file, "gpu1.example.com", "alice", key_path="~/.ssh/id",
                                  gpu_id=1, weight=2.0)
    assert spec.name == "worker1" and spec.gpu_id == 1
    config_edit.add_worker(cfg_file, "gpu2.example.com", "bob", name="fast", port=2222)
    text = cfg_file.read_text()
    missing = [c for c in _comments(before) if c not in _comments(text)]
    assert missing == [], f"comments lost: {missing}"
    cfg = load_config(cfg_file)
    assert [w.name for w in cfg.distributed.workers] == ["worker1", "fast"]
    assert cfg.distributed.workers[1].port == 2222
    assert cfg.distributed.worker_weights == {"worker1": 2.0}
    config_edit.remove_worker(cfg_file, "worker1")
    cfg = load_config(cfg_file)
    assert [w.name for w in cfg.distributed.workers] == ["fast"]
    assert cfg.distributed.worker_weights == {}
    assert [c for c in _comments(before) if c not in _comments(cfg_file.read_text())] == []
    # outside the distributed section nothing changed at all
    assert before.split("distributed:")[0] == cfg_file.read_text().split("distributed:")[0]


def test_invalid_or_duplicate_add_changes_nothing(cfg_file):
    config_edit.add_worker(cfg_file, "h1", "u")
    before = cfg_file.read_text()
    with pytest.raises(ConfigEditError, match="gpu_id"):
        config_edit.add_worker(cfg_file, "h2", "u", gpu_id=-5)
    with pytest.raises(ConfigEditError, match="already exists"):
        config_edit.add_worker(cfg_file, "h2", "u", name="worker1")
    with pytest.raises(ConfigEditError, match="letters, digits"):
        config_edit.add_worker(cfg_file, "h2", "u", name="w;rm -rf /")
    with pytest.raises(ConfigEditError, match="no worker named"):
        config_edit.remove_worker(cfg_file, "ghost")
    assert cfg_file.read_text() == before
    assert [p.name for p in cfg_file.parent.iterdir()] == ["config.yaml"]


def test_removing_an_unnamed_worker_does_not_rename_the_others(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("distributed:\n  workers:  # mine\n    - {host: a, user: u}\n"
                    "    - {host: b, user: u}\n    - {host: c, user: u}\n")
    config_edit.remove_worker(path, "worker1")
    cfg = load_config(path)
    assert [(w.name, w.host) for w in cfg.distributed.workers] == [("worker2", "b"),
                                                                   ("worker3", "c")]
    assert "# mine" in path.read_text()


def test_python_api_add_worker_as_in_the_guide(cfg_file):
    connector = SSHConnector(config_path=cfg_file)
    spec = connector.add_worker("new_worker.com", "username")
    assert spec.name in connector.workers and spec.host == "new_worker.com"
    assert load_config(cfg_file).distributed.workers[-1].host == "new_worker.com"
    connector.remove_worker(spec.name)
    assert spec.name not in connector.workers


def test_cli_add_remove_and_status(cfg_file, tmp_path, capsys):
    assert main(["--config", str(cfg_file), "--add-worker", "h.example", "carol",
                 "--name", "w9", "--gpu-id", "-1", "--weight", "1.5"]) == 0
    assert "added w9" in capsys.readouterr().out
    assert load_config(cfg_file).distributed.worker_weights == {"w9": 1.5}
    assert main(["--config", str(cfg_file), "--remove-worker", "w9"]) == 0
    assert main(["--config", str(cfg_file), "--remove-worker", "w9"]) == 1
    assert "no worker named" in capsys.readouterr().err
    status = tmp_path / "status.txt"
    write_status(status, StatusSnapshot(
        games_per_s=145.2, workers_active=1, workers_total=2, model_sync_s=12.3,
        network_mb_per_min=45.6, generation=4,
        workers=[WorkerRow("w1", "h1", WorkerState.ACTIVE, games_per_s=3.0),
                 WorkerRow("w2", "h2", WorkerState.OFFLINE, last_error="refused")]))
    assert main(["--status", "--status-file", str(status)]) == 0
    out = capsys.readouterr().out
    for line in ("Games/second: 145.2", "Workers active: 1/2", "Model sync time: 12.3s",
                 "Network usage: 45.6 MB/min"):
        assert line in out.splitlines()
    assert "Offline" in out and "refused" in out


def _ssh_config(tmp_path: Path, srv, python: str) -> Path:
    path = tmp_path / "ssh.yaml"
    path.write_text(f"""\
distributed:   # the test's worker
  enabled: true
  workers:
    - name: worker1
      host: {srv.addr}
      port: {srv.port}
      user: {srv.user}
      key_path: "{srv.client_key}"
      gpu_id: -1
  known_hosts: "{srv.known_hosts}"
  deploy: false
  python: "{python}"
  remote_dir: "{tmp_path / 'remote'}"
  connect_timeout_s: 3
  stop_grace_s: 1
""")
    return path


@pytest.mark.ssh
def test_cli_check_prints_a_preflight_table(sshd_server, tmp_path):
    cfg = _ssh_config(tmp_path, sshd_server, sys.executable)
    # as a module from the repository root (works without an install) ...
    res = subprocess.run([sys.executable, "-m", "distributed.ssh_connector", "--config",
                          str(cfg), "--check"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    print(res.stdout, res.stderr)
    lines = res.stdout.splitlines()
    assert lines[0].split()[:3] == ["NAME", "HOST", "PYTHON"]
    assert lines[1].split()[0] == "worker1" and "127.0.0.1" in lines[1]
    # the project version mismatches unless deployed (deploy: false): reported, exit 1
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr
    # ... and as a script path, the way the user guide calls it (needs the package
    # importable: `pip install -e .`; PYTHONPATH stands in for that install here). --status
    # (no SSH) keeps this second start-up cheap.
    status = tmp_path / "status.txt"
    write_status(status, StatusSnapshot(games_per_s=1.5, workers_active=1, workers_total=1))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res2 = subprocess.run([sys.executable, "distributed/ssh_connector.py", "--status",
                           "--status-file", str(status)], cwd=REPO, capture_output=True,
                          text=True, env=env, timeout=120)
    assert "Games/second: 1.5" in res2.stdout.splitlines(), res2.stderr


def test_cli_restart_is_handed_to_a_running_coach(tmp_path, cfg_file, capsys):
    config_edit.add_worker(cfg_file, "h", "u", name="worker1")
    reqs = tmp_path / "requests"
    taken = []

    def coach():  # what the coach's loop does each round
        deadline = time.monotonic() + 5
        while not taken and time.monotonic() < deadline:
            taken.extend(restart_requests.take_requests(reqs))
            time.sleep(0.05)

    th = threading.Thread(target=coach)
    th.start()
    rc = main(["--config", str(cfg_file), "--restart", "worker1", "--requests-dir", str(reqs),
               "--wait", "5"])
    th.join()
    assert rc == 0 and taken == [("restart", "worker1")]
    assert "handed to the running coach" in capsys.readouterr().out
    assert list(reqs.iterdir()) == []


@pytest.mark.ssh
def test_cli_restart_without_coach_restarts_over_ssh(sshd_server, tmp_path, capsys):
    script = write_fake_daemon(tmp_path)
    # a per-host "python" that runs the fake daemon whatever the start command asks for
    fake_python = tmp_path / "fake python"
    fake_python.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{script}' \"$@\"\n")
    fake_python.chmod(0o755)
    cfg = _ssh_config(tmp_path, sshd_server, str(fake_python))
    reqs = tmp_path / "requests"
    rc = main(["--config", str(cfg), "--restart", "worker1", "--requests-dir", str(reqs),
               "--wait", "0.3"])
    out = capsys.readouterr().out
    assert rc == 0 and "restarting directly" in out and "restarted worker1: pid" in out
    assert list(reqs.iterdir()) == []
    pid = int(out.split("pid")[-1])
    with SSHConnector(config_path=cfg) as c:
        assert c.is_running("worker1") == pid
        rc = main(["--config", str(cfg), "--restart", "worker1", "--direct"])
        new_pid = int(capsys.readouterr().out.split("pid")[-1])
        assert rc == 0 and new_pid != pid and c.is_running("worker1") == new_pid
        assert c.stop("worker1") == "terminated"


def test_cli_unknown_worker_is_a_clean_error(cfg_file, capsys):
    assert main(["--config", str(cfg_file), "--restart", "nobody", "--direct"]) == 1
    assert "no worker named 'nobody'" in capsys.readouterr().err


def test_restart_of_a_local_mode_worker_goes_to_the_running_coach(tmp_path):
    """Local-mode workers are not in distributed.workers; the coach alone can restart them."""
    import threading

    from distributed import cli, restart_requests

    requests = tmp_path / "requests"
    taken: list = []

    def coach():
        for _ in range(100):
            got = restart_requests.take_requests(requests)
            if got:
                taken.extend(got)
                return
            threading.Event().wait(0.05)

    t = threading.Thread(target=coach)
    t.start()
    rc = cli.main(["--config", str(REPO / "configs" / "tiny.yaml"), "--restart", "worker1",
                   "--requests-dir", str(requests), "--wait", "5"])
    t.join()
    assert rc == 0
    assert taken == [("restart", "worker1")]


def test_restart_of_an_unknown_local_worker_without_coach_is_a_clear_error(tmp_path, capsys):
    from distributed import cli

    rc = cli.main(["--config", str(REPO / "configs" / "tiny.yaml"), "--restart", "worker7",
                   "--requests-dir", str(tmp_path / "r"), "--wait", "0.2"])
    assert rc == 1
    assert "no running coach took the restart of worker7" in capsys.readouterr().err
