"""Real DDP: two trainer processes with Gloo on CPU under torchrun (subprocesses, tiny net).

What is checked: weights equal across ranks after training, only rank 0 writes
files (an audit hook in every rank records each file opened for writing), the DDP loss on a
fixed seed matches one process on the same total batch, a killed or hung rank makes the run
exit with an error within the timeout, and a checkpoint resumes to the same next-step loss.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from configs import dump_config, load_config, override
from tests.conftest import REPO
from training.learn.samples import synthetic_samples
from training.train.round import train_round

TINY = REPO / "configs" / "tiny.yaml"
STEPS = 5

# Put on PYTHONPATH, this records in $AZGO_AUDIT_LOG.<rank> every file that a trainer rank
# opens for writing (or renames into place) under $AZGO_AUDIT_DIR.
_AUDIT_SITECUSTOMIZE = textwrap.dedent(
    """
    import os, sys
    _root, _log, _rank = (os.environ.get(k) for k in ("AZGO_AUDIT_DIR", "AZGO_AUDIT_LOG", "RANK"))
    if _root and _log and _rank is not None:
        _root = os.path.realpath(_root)

        def _note(path):
            path = os.path.realpath(os.fsdecode(path))
            if path.startswith(_root):
                with open(f"{_log}.{_rank}", "a") as f:
                    f.write(path + "\\n")

        def _hook(event, args):
            if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
                mode, flags = args[1] or "", args[2] or 0
                if any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR):
                    _note(args[0])
            elif event in ("os.rename", "os.replace"):
                _note(args[1])

        sys.addaudithook(_hook)
    """
)


def _torchrun(args: list[str], *, nproc: int = 2, env: dict | None = None,
              timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", "training.trainer", "--no-progress", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _summary(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ddp")
    cfg = load_config(TINY)
    data = synthetic_samples(640, cfg.go.board_size, cfg.net.history, seed=3)
    data.save(d / "samples.npz")
    (d / "audit").mkdir()
    (d / "audit" / "sitecustomize.py").write_text(_AUDIT_SITECUSTOMIZE)
    return d


@pytest.fixture(scope="module")
def ddp_run(work) -> dict:
    """One 2-rank round of STEPS steps with the write audit on."""
    run = work / "run"
    env = {
        "PYTHONPATH": os.pathsep.join([str(work / "audit"), str(REPO)]),
        "AZGO_AUDIT_DIR": str(run),
        "AZGO_AUDIT_LOG": str(work / "writes"),
    }
    proc = _torchrun(["--config", str(TINY), "--run-dir", str(run),
                      "--samples", str(work / "samples.npz"), "--steps", str(STEPS)], env=env)
    return {"summary": _summary(proc), "run": run, "stderr": proc.stderr}


def test_weights_are_equal_across_ranks_after_training(ddp_run):
    summary = ddp_run["summary"]
    assert summary["world_size"] == 2 and summary["steps"] == STEPS
    sums = summary["rank_checksums"]
    assert len(sums) == 2 and sums[0] == sums[1]


def test_only_rank_0_writes_files(ddp_run, work):
    rank0 = (work / "writes.0").read_text().splitlines()
    assert not (work / "writes.1").exists(), (work / "writes.1").read_text()
    names = {Path(p).name for p in rank0}
    assert {"model_000001.pt", "checkpoint_000001.pt", "metrics.json"} <= names
    files = sorted(p.relative_to(ddp_run["run"]).as_posix()
                   for p in ddp_run["run"].rglob("*") if p.is_file())
    assert files == ["checkpoints/checkpoint_000001.pt", "metrics.csv", "metrics.json",
                     "metrics.lock", "models/model_000001.pt", "rounds/round_000001.json"]


def test_ddp_loss_matches_one_process_on_the_same_total_batch(ddp_run, work, tmp_path):
    from training.learn.samples import SampleArrays

    cfg = override(load_config(TINY), {"replay.validation_fraction": 0.05})
    data = SampleArrays.load(work / "samples.npz", cfg.replay.validation_fraction)
    single = train_round(cfg, tmp_path, dataset=data, steps=STEPS, progress=False)
    ddp = ddp_run["summary"]["step_losses"]
    # Same samples per step (DistributedSampler's interleaving of one permutation); BatchNorm
    # statistics come from each rank's half batch, hence a tolerance rather than equality.
    np.testing.assert_allclose(ddp, single.step_losses, rtol=0.03)
    assert ddp_run["summary"]["loss"] == pytest.approx(single.loss, rel=0.03)


def test_checkpoint_resumes_to_the_same_next_step_loss_under_ddp(ddp_run, work):
    resumed_dir = work / "resumed"
    shutil.copytree(ddp_run["run"], resumed_dir)
    common = ["--config", str(TINY), "--samples", str(work / "samples.npz")]
    resumed = _summary(_torchrun([*common, "--run-dir", str(resumed_dir), "--steps", "1"]))
    assert resumed["generation"] == 2 and resumed["global_step"] == STEPS + 1
    # The straight run goes through the trainer's own relaunch (--gpus 2 -> torch.distributed.run)
    proc = subprocess.run(
        [sys.executable, "-m", "training.trainer", *common, "--run-dir", str(work / "straight"),
         "--gpus", "2", "--steps", str(STEPS + 1), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    straight = _summary(proc)
    assert straight["world_size"] == 2
    assert resumed["step_losses"][0] == pytest.approx(straight["step_losses"][STEPS], abs=1e-6)


def _config_with_timeout(work: Path, timeout_s: float) -> Path:
    path = work / f"timeout_{timeout_s:g}.yaml"
    path.write_text(dump_config(override(load_config(TINY), {"training.timeout_s": timeout_s})))
    return path


def test_a_killed_rank_makes_the_run_exit_with_an_error(work):
    run = work / "killed"
    t0 = time.monotonic()
    proc = _torchrun(["--config", str(_config_with_timeout(work, 20)), "--run-dir", str(run),
                      "--samples", str(work / "samples.npz"), "--steps", "50",
                      "--test-kill-rank-at", "1:2"], timeout=180)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert "rank 1 kills itself" in proc.stderr
    assert not (run / "models").exists()
    print(f"killed rank: run ended after {elapsed:.1f}s (timeout 20s)")
    assert elapsed < 20 + 60  # startup on a busy 2-core machine takes up to ~30 s


def test_a_hung_rank_ends_the_run_after_the_timeout(work):
    run = work / "hung"
    t0 = time.monotonic()
    proc = _torchrun(["--config", str(_config_with_timeout(work, 5)), "--run-dir", str(run),
                      "--samples", str(work / "samples.npz"), "--steps", "50",
                      "--test-hang-rank-at", "1:2"], timeout=180)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert "another rank failed or a collective timed out" in proc.stderr
    assert not (run / "models").exists()
    print(f"hung rank: run ended after {elapsed:.1f}s (timeout 5s)")
    assert elapsed < 5 + 60


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(cmds: list[list[str]]) -> tuple[list[tuple[str, str]], dict]:
    """Run two trainer processes at once; ((stdout, stderr) of each, rank 0's summary)."""
    procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for cmd in cmds]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    return outs, json.loads(outs[0][0].strip().splitlines()[-1])


@pytest.mark.slow
def test_two_nodes_on_loopback_train_together(work):
    """--nodes 2: each 'node' relaunches itself through torch.distributed.run (one rank each)."""
    port = str(_free_port())
    run = work / "two_nodes"
    cmds = []
    for node_rank in (0, 1):
        cmd = [sys.executable, "-m", "training.trainer", "--config", str(TINY),
               "--run-dir", str(run if node_rank == 0 else work / "two_nodes_node1"),
               "--samples", str(work / "samples.npz"), "--steps", "3", "--no-progress",
               "--gpus", "1", "--nodes", "2", "--node-rank", str(node_rank),
               "--master-addr", "127.0.0.1", "--master-port", port]
        cmds.append(cmd)
    outs, summary = _two_processes(cmds)
    assert summary["world_size"] == 2 and len(set(summary["rank_checksums"])) == 1
    assert (run / "models" / "model_000001.pt").exists()
    assert not (work / "two_nodes_node1" / "models").exists()  # node 1 holds rank 1: no files


def test_ranks_started_by_hand_train_together_and_only_rank_0_prints(work):
    """The 000 guide's `--world-size 2 --rank R` (each rank started by hand, gloo), with the
    progress bar on: rank 0 prints the bar, its log and the summary; rank 1 prints nothing."""
    port = str(_free_port())
    cmds = []
    for rank in (0, 1):
        cmd = [sys.executable, "-m", "training.trainer", "--config", str(TINY),
               "--run-dir", str(work / f"by_hand_{rank}"),
               "--samples", str(work / "samples.npz"), "--steps", "3",
               "--world-size", "2", "--rank", str(rank), "--backend", "gloo",
               "--batch-size-per-gpu", "8", "--master-addr", "127.0.0.1", "--master-port", port]
        cmds.append(cmd)
    outs, summary = _two_processes(cmds)
    assert summary["world_size"] == 2 and len(set(summary["rank_checksums"])) == 1
    assert summary["micro_batch"] * summary["accumulation"] == 8, "8 per rank"
    assert "train gen 1" in outs[0][1] and "INFO" in outs[0][1]
    assert outs[1] == ("", ""), f"rank 1 printed: {outs[1]!r}"


def test_world_size_alone_launches_that_many_processes_here(work):
    import argparse

    from training.trainer import apply_world_size, build_parser, relaunch_command

    cfg = load_config(TINY)
    args = build_parser().parse_args(["--world-size", "3"])
    cmd = relaunch_command(args, ["--world-size", "3"], apply_world_size(args, cfg))
    assert "--nproc_per_node=3" in cmd and cmd[-2:] == ["--world-size", "3"]
    from configs import ConfigError

    for bad in (["--rank", "0"], ["--world-size", "0"], ["--world-size", "2", "--rank", "2"]):
        with pytest.raises(ConfigError, match="--rank|--world-size"):
            apply_world_size(build_parser().parse_args(bad), cfg)
    assert isinstance(args, argparse.Namespace)


def test_backend_nccl_without_a_gpu_is_refused_naming_gloo(work, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "training.trainer", "--config", str(TINY), "--run-dir",
         str(tmp_path), "--samples", str(work / "samples.npz"), "--steps", "1", "--no-progress",
         "--backend", "nccl"], cwd=REPO, capture_output=True, text=True, timeout=120)
    if proc.returncode == 0:
        pytest.skip("a CUDA GPU is visible: nccl is a valid choice here")
    assert proc.returncode == 1 and "use gloo" in proc.stderr, proc.stderr[-1000:]


def test_two_ranks_train_from_the_real_replay_window(work):
    """Default data: the replay window over run/replay, opened identically on both ranks;
    equal weights after steps of two micro-batches each show no_sync + the final all-reduce."""
    from training.go.records import BatchMeta, batch_name, write_batch
    from training.learn.net import load_model, make_evaluator
    from training.train.train_state import write_initial_model
    from training.search.selfplay import SelfPlay

    cfg = load_config(TINY)
    run = work / "window_run"
    (run / "replay").mkdir(parents=True)
    net, _ = load_model(write_initial_model(cfg, run))
    selfplay = SelfPlay(make_evaluator(net), cfg.go, cfg.mcts, cfg.self_play,
                        history=cfg.net.history, seed=7)
    records = []
    while len(records) < 24:
        records += selfplay.step()
    write_batch(run / "replay" / batch_name("worker1", 0, 0), records,
                BatchMeta.from_records("worker1", records, max_moves=cfg.go.max_moves))
    # with gradient accumulation: no_sync on the first micro-batch, all-reduce on the second
    accumulate = work / "accumulate.yaml"
    accumulate.write_text(dump_config(override(cfg, {"training.grad_accumulation": 2})))
    summary = _summary(_torchrun(["--config", str(accumulate), "--run-dir", str(run),
                                  "--steps", "3"]))
    assert summary["generation"] == 1 and summary["world_size"] == 2
    assert summary["accumulation"] == 2 and summary["micro_batch"] == 8
    assert len(set(summary["rank_checksums"])) == 1 and np.isfinite(summary["loss"])


@pytest.mark.slow
def test_torchrun_max_restarts_recovers_from_a_killed_rank(work):
    """The restarted group joins under attempt-prefixed store keys (flaky without them here)."""
    run = work / "restarted"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "--max-restarts=1", "-m", "training.trainer", "--no-progress", "--config", str(TINY),
           "--run-dir", str(run), "--samples", str(work / "samples.npz"), "--steps", "4",
           "--test-kill-rank-at", "1:2"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert "rank 1 kills itself" in proc.stderr
    summary = _summary(proc)
    assert summary["generation"] == 1 and summary["steps"] == 4
    assert (run / "models" / "model_000001.pt").exists()
