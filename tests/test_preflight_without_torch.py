"""A worker host whose Python cannot import torch fails preflight with a message that says how
to install it there (a real loopback sshd; the host's Python is a fresh venv without torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from configs import WorkerSpec
from distributed.ssh_connector import SSHConnector
from tests.sshd import make_config, sshd_server  # noqa: F401 - sshd_server is a fixture

pytestmark = pytest.mark.ssh


def test_a_host_without_torch_is_told_how_to_install_it(sshd_server, tmp_path):
    bare = tmp_path / "bare-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = str(bare / "bin" / "python")
    spec = WorkerSpec(host=sshd_server.addr, port=sshd_server.port, user=sshd_server.user,
                      key_path=str(sshd_server.client_key), name="worker1", gpu_id=-1,
                      remote_dir=str(tmp_path / "remote"), python=python)
    cfg = make_config([spec], sshd_server.known_hosts)
    with SSHConnector(cfg, config_path=tmp_path / "config.yaml") as c:
        report = c.preflight("worker1")
    assert not report.ok
    (problem,) = [p for p in report.problems if p.startswith("torch not importable")]
    assert f"install torch for {python} on {sshd_server.addr}" in problem, problem
    assert (f"`{python} -m pip install torch==2.13.0 --index-url "
            "https://download.pytorch.org/whl/cpu`") in problem, problem
    assert "a GPU host: without --index-url" in problem, problem
    assert "name it in distributed.python" in problem, problem
