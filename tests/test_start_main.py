"""start_main.py: each flag lands on its config key, validated by the schema; a second coach
on a running run folder is refused; Ctrl-C stops the coach without C++ teardown noise."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import start_main
from configs import load_config, override
from tests.conftest import REPO, wait_until


def _cfg(*argv: str):
    args = start_main.parse_args(["--config", str(REPO / "configs" / "tiny.yaml"), *argv])
    cfg = override(load_config(args.config), start_main.overrides_from_args(args))
    return args, cfg


def test_guide_flags_set_their_config_keys():
    _, cfg = _cfg("--workers", "3", "--workers-per-gpu", "2", "--cpu-only", "--simulations",
                  "50", "--batch-size", "64", "--lr", "0.1", "--window-passes", "2",
                  "--filters", "32", "--blocks", "3", "--iterations", "4", "--mixed-precision",
                  "--gpus", "2")
    assert cfg.self_play.workers == 3 and cfg.self_play.workers_per_gpu == 2
    assert cfg.self_play.cpu_only and cfg.mcts.simulations == 50
    assert cfg.training.batch_size == 64 and cfg.training.lr == 0.1 and cfg.training.epochs == 2
    assert cfg.net.filters == 32 and cfg.net.blocks == 3 and cfg.run.iterations == 4
    assert cfg.training.mixed_precision and cfg.training.gpus == 2


def test_epochs_on_the_coach_are_the_guides_cycles_not_window_passes():
    # the parallel self-play guide: --epochs 500 --games-per-epoch 64 = 500 cycles of 64 games
    _, cfg = _cfg("--epochs", "500", "--games-per-epoch", "64")
    assert cfg.run.iterations == 500 and cfg.training.epochs == 0
    _, cfg = _cfg("--window-passes", "3")
    assert cfg.training.epochs == 3 and cfg.run.iterations == 0


def test_the_guides_other_spellings_set_the_same_keys():
    _, cfg = _cfg("--learning-rate", "0.05", "--accept-new-host-keys")
    assert cfg.training.lr == 0.05 and cfg.distributed.accept_new_host_keys
    _, cfg = _cfg()
    assert not cfg.distributed.accept_new_host_keys  # only when asked


def test_games_per_epoch_is_spread_over_the_workers_that_will_run():
    import os

    _, cfg = _cfg("--workers", "3", "--cpu-only")
    running = min(3, os.cpu_count() or 1)  # at most one CPU worker per core
    assert start_main.games_per_worker(100, cfg) == -(-100 // running)
    assert start_main.games_per_worker(1, cfg) == 1


def test_help_says_the_worker_class_reaches_ssh_workers_too(capsys):
    with pytest.raises(SystemExit):
        start_main.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    help_text = text[text.index("--worker-class WORKER_CLASS module"):text.rindex("--no-watch")]
    assert "for local workers" not in help_text
    assert "over SSH" in help_text


def test_bad_flag_value_is_a_one_line_error_with_exit_code_2(capsys):
    rc = start_main.main(["--config", str(REPO / "configs" / "tiny.yaml"), "--simulations", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "mcts.simulations must be between 1 and 100000, got 0" in err[0]


def test_checkpoint_must_exist_and_fit_the_config(tmp_path, capsys):
    from training.learn.net import net_from_config, save_model

    tiny = str(REPO / "configs" / "tiny.yaml")
    assert start_main.main(["--config", tiny, "--checkpoint", str(tmp_path / "none.pt")]) == 2
    assert "no such file" in capsys.readouterr().err
    cfg = load_config(tiny)
    other = override(cfg, {"net.filters": cfg.net.filters * 2})
    save_model(tmp_path / "wide.pt", net_from_config(other.net, cfg.go.board_size), 3)
    assert start_main.main(["--config", tiny, "--checkpoint", str(tmp_path / "wide.pt")]) == 2
    err = capsys.readouterr().err
    assert "its net differs from the config's: filters" in err and "Traceback" not in err
    save_model(tmp_path / "good.pt", net_from_config(cfg.net, cfg.go.board_size), 3)
    assert start_main.check_initial_model(str(tmp_path / "good.pt"), cfg) is None


def test_a_new_run_starts_from_the_checkpoint_as_generation_0(tiny_cfg, tmp_path):
    import torch

    from training.coach import Coach
    from training.learn.net import load_model, net_from_config, save_model

    torch.manual_seed(5)
    net = net_from_config(tiny_cfg.net, tiny_cfg.go.board_size)
    save_model(tmp_path / "trained.pt", net, 12)
    cfg = override(tiny_cfg, {"run.dir": str(tmp_path / "run")})
    coach = Coach(cfg, status_path=tmp_path / "status.txt", watch_config=False,
                  initial_model=tmp_path / "trained.pt")
    coach.setup()
    zero, info = load_model(tmp_path / "run" / "models" / "model_000000.pt")
    assert info.generation == 0 and info.meta["from_generation"] == 12
    for a, b in zip(zero.state_dict().values(), net.state_dict().values()):
        assert torch.equal(a, b)
    assert (tmp_path / "run" / "models" / "model_000000.json").exists()  # published


def test_a_branch_is_refused_with_what_to_do_and_writes_nothing(tiny_cfg, tmp_path, capsys):
    """--from-run/--from-generation: wrong combinations, a source that is not a run, a
    generation not published or without its checkpoint; the one that works takes generation
    0..N only. The whole branch, going on with training, is in tests/test_end_to_end.py."""
    from training.learn.net import net_from_config, save_model
    from training.branch import BranchError, branch_run
    from training.run.model_store import publish_model
    from training.run.run_dir import RunDir

    tiny = str(REPO / "configs" / "tiny.yaml")
    new = tmp_path / "new"
    for args, says in [
            (["--from-run", str(tmp_path)], "--from-run DIR and --from-generation N go together"),
            (["--from-run", str(tmp_path), "--from-generation", "1", "--fresh"],
             "leave out --checkpoint, --resume and --fresh"),
            (["--from-run", str(tmp_path), "--from-generation", "1", "--run-dir",
              str(tmp_path)], "exists; --from-run starts a new run folder")]:
        assert start_main.main(["--config", tiny, *args]) == 2
        assert says in capsys.readouterr().err
    src = RunDir(tmp_path / "src").create()
    with pytest.raises(BranchError, match="not a run folder"):
        branch_run(src.root, new, 0)
    src.config.write_text("run: {}\n")
    with pytest.raises(BranchError, match=r"--from-generation 1: not a published model .*none"):
        branch_run(src.root, new, 1)
    net = net_from_config(tiny_cfg.net, tiny_cfg.go.board_size)
    for g in (0, 1):
        save_model(src.model(g), net, g)
        publish_model(src.models, g)
    with pytest.raises(BranchError, match="checkpoint_000001.pt is missing"):
        branch_run(src.root, new, 1)
    assert not new.exists() and not list(tmp_path.glob(".new.branch-*"))
    done = branch_run(src.root, new, 0)
    assert sorted(p.name for p in (new / "models").iterdir()) == [
        "model_000000.json", "model_000000.pt", "model_000000.pt.zst"]
    assert done.models == 3 and done.batches == 0 and (new / "config.yaml").is_file()
    with pytest.raises(BranchError, match="exists"):
        branch_run(src.root, new, 0)


def test_training_nodes_without_distributed_self_play_are_refused_by_name(tmp_path, capsys):
    cfg = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    cfg["run"]["dir"] = str(tmp_path / "run")
    cfg["distributed"]["training_nodes"] = [{"host": "node1.example", "user": "u"}]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert start_main.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "distributed.training_nodes" in err and "--distributed" in err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ the running coach


def _tiny_run_config(tmp: Path, **evaluation) -> Path:
    """configs/tiny.yaml with the run and logs under `tmp`: training soon, and a long arena."""
    cfg = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    cfg["run"]["dir"] = str(tmp / "run")
    cfg["logging"]["dir"] = str(tmp / "logs")
    cfg["self_play"]["games_per_worker"] = 10
    cfg["evaluation"].update(evaluation)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _start(config: Path, tmp: Path, tag: str) -> subprocess.Popen:
    """start_main.py in a session of its own, so that SIGINT can go to its whole process
    group as a terminal's Ctrl-C does."""
    return subprocess.Popen(
        [sys.executable, str(REPO / "start_main.py"), "--config", str(config), "--no-watch",
         "--status-file", str(tmp / "status.txt")], cwd=str(tmp), start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=open(tmp / f"{tag}.out", "wb"),
        stderr=open(tmp / f"{tag}.err", "wb"))




@pytest.mark.slow
def test_second_coach_on_a_running_run_folder_is_refused_naming_the_first(tmp_path):
    config = _tiny_run_config(tmp_path, games=0)
    first = _start(config, tmp_path, "first")
    try:
        wait_until(lambda: (tmp_path / "status.txt").exists(), 180, "the first coach's status")
        t0 = time.monotonic()
        second = subprocess.run(
            [sys.executable, str(REPO / "start_main.py"), "--config", str(config), "--fresh",
             "--no-watch", "--status-file", str(tmp_path / "status2.txt")], cwd=str(tmp_path),
            capture_output=True, text=True, timeout=120)
        refused_s = time.monotonic() - t0
        assert first.poll() is None, (tmp_path / "first.err").read_text()[-2000:]
    finally:
        os.killpg(first.pid, signal.SIGINT)
        first.wait(timeout=120)
    assert second.returncode == 2, second.stderr[-2000:]
    err = second.stderr.strip().splitlines()
    assert len(err) == 1 and f"pid {first.pid}" in err[0] and "already running" in err[0], err
    # --fresh did not move the running coach's folder aside
    assert not list(tmp_path.glob("run.old-*")) and (tmp_path / "run" / "coach.lock").exists()
    print(f"second coach refused in {refused_s:.1f}s: {err[0]}")


@pytest.mark.slow
def test_ctrl_c_during_evaluation_prints_no_cxx_teardown_noise(tmp_path):
    """SIGINT to the coach's process group (Ctrl-C) while its arena plays: the coach stops
    cleanly (exit 0) and nothing but log lines reaches stderr."""
    config = _tiny_run_config(tmp_path, games=400)  # an arena long enough to be inside
    coach = _start(config, tmp_path, "coach")
    log_file = tmp_path / "logs" / "distributed_training.log"
    try:
        wait_until(lambda: log_file.exists() and "trained generation 1" in log_file.read_text(),
                  400, "the first training round")
        time.sleep(3.0)  # the arena is under way (it plays 400 games)
        assert "arena generation=1" not in log_file.read_text(), "the arena already ended"
        os.killpg(coach.pid, signal.SIGINT)
        code = coach.wait(timeout=120)
    finally:
        if coach.poll() is None:
            os.killpg(coach.pid, signal.SIGKILL)
            coach.wait()
    err = (tmp_path / "coach.err").read_text(errors="replace")
    assert "terminate called" not in err, err[-3000:]
    assert code == 0, err[-3000:]
    stray = [ln for ln in err.splitlines()
             if ln.strip() and not re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ", ln)]
    assert stray == [], stray[:20]


@pytest.mark.slow
def test_a_coach_started_in_another_folder_runs_there_and_its_workers_play(tmp_path):
    """From an empty folder, `python3 <repo>/start_main.py --config <repo>/configs/tiny.yaml`:
    one run folder, there, and the worker's games land in it (its daemon runs in the
    repository and is given the same folder)."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    coach = subprocess.Popen(
        [sys.executable, str(REPO / "start_main.py"), "--config",
         str(REPO / "configs" / "tiny.yaml"), "--iterations", "2", "--no-watch"],
        cwd=str(cwd), start_new_session=True, stdin=subprocess.DEVNULL,
        stdout=open(tmp_path / "coach.out", "wb"), stderr=open(tmp_path / "coach.err", "wb"))
    run = cwd / "runs" / "tiny"
    try:
        wait_until(lambda: coach.poll() is not None or list((run / "replay").glob("*.npz.zst")),
                   300, "a batch of the worker's games in the run folder")
        assert coach.poll() is None, (tmp_path / "coach.err").read_text()[-3000:]
    finally:
        if coach.poll() is None:
            os.killpg(coach.pid, signal.SIGINT)
        try:
            coach.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(coach.pid, signal.SIGKILL)
            coach.wait()
    assert sorted(p.name for p in (cwd / "runs").iterdir()) == ["tiny"]
    assert (run / "workers" / "worker1" / "status.json").exists()
    assert (cwd / "logs" / "worker_worker1.log").exists()
    assert (cwd / "distributed" / "status.txt").exists()
    written = load_config(run / "config.yaml")
    assert written.run.dir == str(run) and written.logging.dir == str(cwd / "logs")
