"""Extra training nodes without a shared filesystem: real trainers, real DDP (Gloo).

- Two "nodes" on this machine (`--nodes 2`, each relaunched through torch.distributed.run);
  node 1 gets an empty run folder and a `--cache-dir`: rank 0 sends it the window's batch
  files and the starting checkpoint over the process group. Its losses and weights equal a
  2-rank round that shares the run folder, and match one process within tolerance.
- Over SSH (a loopback sshd host, its own remote folder): the coach's `TrainingNodes` starts
  node 1's trainer with the same machinery as the workers; a trainer killed on the node makes
  the round fail within the process-group timeout, and the next round runs without the node.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from configs import dump_config, load_config, override
from distributed.sshd_hosts import free_port
from tests.conftest import REPO

TINY = REPO / "configs" / "tiny.yaml"
STEPS = 3


def _summary(proc: subprocess.CompletedProcess | tuple[str, str], code: int) -> dict:
    out, err = (proc.stdout, proc.stderr) if hasattr(proc, "stdout") else proc
    assert code == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _make_window_run(cfg, run: Path, batches: int = 2, games: int = 12) -> None:
    """run/models/model_000000.pt and `batches` real self-play batch files in run/replay."""
    from training.go.records import BatchMeta, batch_name, write_batch
    from training.learn.net import load_model, make_evaluator
    from training.train.train_state import write_initial_model
    from training.search.selfplay import SelfPlay

    (run / "replay").mkdir(parents=True)
    net, _ = load_model(write_initial_model(cfg, run))
    selfplay = SelfPlay(make_evaluator(net), cfg.go, cfg.mcts, cfg.self_play,
                        history=cfg.net.history, seed=11)
    for b in range(batches):
        records = []
        while len(records) < games:
            records += selfplay.step()
        write_batch(run / "replay" / batch_name("worker1", 0, b), records,
                    BatchMeta.from_records("worker1", records, max_moves=cfg.go.max_moves))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A run folder with a real window and checkpoint_000001 (one single-process round)."""
    from training.train.round import train_round

    d = tmp_path_factory.mktemp("nodes")
    cfg = load_config(TINY)
    base = d / "base"
    _make_window_run(cfg, base)
    train_round(cfg, base, steps=2, progress=False)  # -> checkpoint with optimizer momentum
    assert (base / "checkpoints" / "checkpoint_000001.pt").exists()
    return d


def _copy_run(work: Path, name: str) -> Path:
    dest = work / name
    shutil.copytree(work / "base", dest, ignore=shutil.ignore_patterns(".window"))
    return dest


def _tree(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
def test_a_node_without_the_run_folder_trains_from_what_rank_0_sends(work):
    run = _copy_run(work, "two_nodes")
    node1 = work / "node1"
    (node1 / "run").mkdir(parents=True)
    port = str(free_port())
    procs = []
    for node_rank in (0, 1):
        where = (["--run-dir", str(run)] if node_rank == 0 else
                 ["--run-dir", str(node1 / "run"), "--cache-dir", str(node1 / "cache")])
        cmd = [sys.executable, "-m", "training.trainer", "--config", str(TINY), *where,
               "--steps", str(STEPS), "--no-progress", "--gpus", "1", "--nodes", "2",
               "--node-rank", str(node_rank), "--master-addr", "127.0.0.1",
               "--master-port", port]
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=240) for p in procs]
    assert procs[1].returncode == 0, outs[1][1][-3000:]
    two_nodes = _summary(outs[0], procs[0].returncode)
    assert two_nodes["world_size"] == 2 and two_nodes["generation"] == 2
    assert len(set(two_nodes["rank_checksums"])) == 1  # equal weights on both nodes

    # node 1 received the window and the checkpoint, and wrote nothing else anywhere
    assert _tree(node1 / "run") == []
    replay = sorted(p.name for p in (run / "replay").glob("*.npz.zst"))
    assert sorted(p.name for p in (node1 / "cache" / "replay").glob("*.npz.zst")) == replay
    assert _tree(node1 / "cache" / "start") == ["checkpoint_000001.pt"]
    assert (run / "models" / "model_000002.pt").exists()
    assert (run / "checkpoints" / "checkpoint_000002.pt").exists()

    # the same round with both ranks sharing the run folder: identical step by step
    shared = _copy_run(work, "shared")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "training.trainer", "--no-progress", "--config", str(TINY), "--run-dir",
         str(shared), "--steps", str(STEPS)],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    same = _summary(proc, proc.returncode)
    np.testing.assert_allclose(two_nodes["step_losses"], same["step_losses"], atol=1e-6)
    assert two_nodes["rank_checksums"] == pytest.approx(same["rank_checksums"], rel=1e-7)

    # and one process on the same total batch (BatchNorm sees half batches: a tolerance)
    from training.train.round import train_round

    single = train_round(load_config(TINY), _copy_run(work, "single"), steps=STEPS,
                         progress=False)
    np.testing.assert_allclose(two_nodes["step_losses"], single.step_losses, rtol=0.05)
    print(f"losses: two nodes {two_nodes['step_losses']} single {single.step_losses}")


# ------------------------------------------------------------------------------ over SSH


@pytest.fixture(scope="module")
def node_host(tmp_path_factory):
    """One loopback sshd host for the training node (its own remote folder)."""
    from tests.sshd import require_sshd
    from training.sandbox import start_hosts

    require_sshd()
    folder = tmp_path_factory.mktemp("node_host")
    servers = start_hosts(1, folder)
    try:
        yield folder, servers[0]
    finally:
        for s in servers:
            s.kill()


def _coach(work: Path, node_host, name: str, changes: dict):
    """A Coach (distributed, no self-play workers) with one training node and a run folder
    holding the base window and checkpoint; its own master port."""
    from training.coach import Coach
    from training.fleet.remote_training import TrainingNodes
    from training.sandbox import sandbox_config

    folder, server = node_host
    cfg = sandbox_config(load_config(TINY), [server], folder)
    node = {"host": server.addr, "port": server.port, "user": server.user, "name": "node1",
            "key_path": str(server.client_key), "gpu_id": -1,
            "remote_dir": str(folder / f"{name}_node1")}
    cfg = override(cfg, {"distributed.workers": [], "distributed.training_nodes": [node],
                         "run.dir": str(work / name), "logging.dir": str(work / name / "logs"),
                         "training.master_port": free_port(), "evaluation.games": 0,
                         "distributed.backoff_max_s": 30, **changes})
    coach = Coach(cfg, distributed=True, watch_config=False)
    shutil.copytree(work / "base", coach.run_dir, ignore=shutil.ignore_patterns(".window"))
    coach.setup()  # as run() does: collector, fleet (no workers), training nodes
    assert isinstance(coach.rounds.training_nodes, TrainingNodes)
    return coach, Path(node["remote_dir"])


def _status_nodes(coach) -> str:
    """The training nodes as status.txt shows them, read back from the rendered text."""
    from distributed.status import parse_status_text, render_status

    return parse_status_text(render_status(coach.snapshot())).training_nodes


def _start_round(coach, timeout_s: float = 120) -> None:
    """`coach.start_round()` and the loop passes until the round runs: the nodes are
    started by a job off the coach's loop."""
    import time

    t0 = time.monotonic()
    coach.start_round()
    while coach.rounds.current is None:
        assert coach.rounds.node_start is not None, "the round was not started (see the log)"
        assert time.monotonic() - t0 < timeout_s, "the nodes did not start in time"
        time.sleep(0.2)
        coach._advance_training()


def _wait_round(coach, timeout_s: float) -> float:
    """Drive the coach's round until the trainer exited; returns the seconds it took."""
    import time

    t0 = time.monotonic()
    rnd = coach.rounds.current
    while coach.rounds.current is rnd:
        assert time.monotonic() - t0 < timeout_s, "the round did not end in time"
        coach._advance_training()
        time.sleep(0.2)
    if (taken := coach.generations.evaluating) is not None:
        taken.evaluation.join(60)
    return time.monotonic() - t0


@pytest.mark.slow
@pytest.mark.ssh
def test_the_coach_trains_a_round_with_a_node_over_ssh(work, node_host):
    coach, node_root = _coach(work, node_host, "ssh_round", {})
    try:
        assert coach.snapshot().training_nodes == "node1 Idle"
        _start_round(coach)
        assert coach.rounds.round_nodes == ["node1"]
        assert _status_nodes(coach) == "node1 Training"
        seconds = _wait_round(coach, 150)
        assert _status_nodes(coach) == "node1 Ready"
    finally:
        if coach.rounds.current is not None:
            coach.rounds.current.popen.kill()
        coach.rounds.training_nodes.stop_round()
        coach.rounds.training_nodes.close()
    log_text = (coach.run_dir / "logs" / "trainer_000002.log").read_text()
    summary = json.loads(log_text.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and len(set(summary["rank_checksums"])) == 1
    assert (coach.run_dir / "models" / "model_000002.pt").exists()
    assert coach.rounds.training_nodes.in_round == []  # the node's trainer was stopped
    node_dir = node_root / "workers" / "node1"
    replay = sorted(p.name for p in (coach.run_dir / "replay").glob("*.npz.zst"))
    assert sorted(p.name for p in (node_dir / "cache" / "replay").glob("*.npz.zst")) == replay
    written = [p for p in _tree(node_root) if p.endswith(".pt")]
    assert written == ["workers/node1/cache/start/checkpoint_000001.pt"]  # received, no model
    print(f"two-node round over SSH: {seconds:.1f}s, loss {summary['loss']:.4f}")


@pytest.mark.slow
@pytest.mark.ssh
def test_a_killed_node_fails_the_round_and_the_next_one_runs_without_it(work, node_host):
    import time

    timeout_s = 15
    coach, node_root = _coach(work, node_host, "ssh_killed",
                              {"training.timeout_s": timeout_s,
                               "training.steps_per_generation": 100000})
    nodes = coach.rounds.training_nodes
    try:
        _start_round(coach)
        assert coach.rounds.round_nodes == ["node1"]
        log_path = coach.run_dir / "logs" / "trainer_000002.log"
        t0 = time.monotonic()
        while "training generation 2" not in (log_path.read_text() if log_path.exists()
                                              else ""):
            assert time.monotonic() - t0 < 120, "the round never started training"
            assert coach.rounds.current.popen.poll() is None, log_path.read_text()[-3000:]
            time.sleep(0.5)
        pid_file = node_root / "run" / "worker_node1.pid"
        pgid = int(pid_file.read_text())
        nodes.connector.run("node1", f"kill -9 -{pgid}")  # the node's whole trainer
        seconds = _wait_round(coach, timeout_s + 60)
        assert coach.rounds.current is None and not (coach.run_dir / "models" / "model_000002.pt").exists()
        assert nodes.available() == []  # benched
        assert re.fullmatch(r"node1 Benched \d+s: its trainer died during the round",
                            _status_nodes(coach)), _status_nodes(coach)
        print(f"killed node: round failed after {seconds:.1f}s (timeout {timeout_s}s)")

        # the coach carries on: the retried round runs on the main node alone
        coach.cfg = override(coach.cfg, {"training.steps_per_generation": 3})
        coach.run_config_path.write_text(dump_config(coach.cfg))
        _start_round(coach)
        assert coach.rounds.round_nodes == []
        _wait_round(coach, 120)
    finally:
        if coach.rounds.current is not None:
            coach.rounds.current.popen.kill()
        nodes.stop_round()
        nodes.close()
    assert (coach.run_dir / "models" / "model_000002.pt").exists()
    text = (coach.run_dir / "logs" / "trainer_000002.log").read_text()
    assert json.loads(text.strip().splitlines()[-1])["world_size"] == 1


def test_training_nodes_follow_config_edits_from_the_next_round(tmp_path):
    """Nodes added to or removed from the config take part from the next round on."""
    from training.coach import Coach

    def node(name: str) -> dict:
        return {"host": "127.0.0.1", "port": 22, "user": "u", "name": name, "gpu_id": -1}

    cfg = override(load_config(TINY), {"run.dir": str(tmp_path / "run"),
                                       "logging.dir": str(tmp_path / "logs"),
                                       "distributed.training_nodes": [node("node1")]})
    coach = Coach(cfg, distributed=True, watch_config=False)
    coach.setup()
    first = coach.rounds.training_nodes
    assert first.names() == ["node1"] and first.describe() == "node1 Idle"
    assert coach.snapshot().training_nodes == "node1 Idle"
    coach.rounds.sync_training_nodes()
    assert coach.rounds.training_nodes is first  # unchanged config: the same nodes, kept set up
    # what the coach's config reload hands the rounds
    coach.generations.cfg = override(cfg, {"distributed.training_nodes": [
        node("node1"), node("node2")]})
    coach.rounds.sync_training_nodes()
    assert coach.rounds.training_nodes.names() == ["node1", "node2"]
    coach.generations.cfg = override(cfg, {"distributed.training_nodes": []})
    coach.rounds.sync_training_nodes()
    assert coach.rounds.training_nodes is None and coach.snapshot().training_nodes == ""
    local = Coach(cfg, distributed=False, watch_config=False)
    local.rounds.sync_training_nodes()
    assert local.rounds.training_nodes is None  # training nodes: a distributed-mode feature
