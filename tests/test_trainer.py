"""One process training rounds: files, resume, OOM fallback, LR rules, CLI (real CPU nets).

Multi-process DDP runs are in tests/test_ddp.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from configs import override
from tests.conftest import REPO
from training.train import round_result
from training.learn.net import load_model
from training.learn.samples import SampleArrays, config_samples, synthetic_samples
from training.run.run_dir import RunDir
from training.train.train_state import (
    WarmupSchedule,
    drop_multiplier,
    load_checkpoint,
    scaled_lr,
    write_initial_model,
)
from training.train.round import train_round
from training.train.steps import FaultHooks
from training.train.ddp import cpu_threads
from training.trainer import build_parser, config_from_args, relaunch_command, selfplay_cores
from training.learn.training_error import TrainingError


@pytest.fixture
def samples(tiny_cfg) -> SampleArrays:
    data = synthetic_samples(512, tiny_cfg.go.board_size, tiny_cfg.net.history, seed=1)
    data.validation = synthetic_samples(64, tiny_cfg.go.board_size, tiny_cfg.net.history, seed=2)
    return data


def test_round_writes_model_checkpoint_and_metrics(tiny_cfg, run_dir, samples):
    result = train_round(tiny_cfg, run_dir, dataset=samples, steps=6, progress=False)
    assert result.generation == 1 and result.steps == 6 and result.global_step == 6
    assert result.samples == 6 * tiny_cfg.training.batch_size
    assert np.isfinite(result.loss) and result.val_loss is not None
    assert 0.0 <= result.policy_accuracy <= 1.0
    net, info = load_model(run_dir / "models" / "model_000001.pt")
    assert info.generation == 1 and info.board_size == tiny_cfg.go.board_size
    ckpt = load_checkpoint(run_dir / "checkpoints" / "checkpoint_000001.pt")
    assert ckpt["generation"] == 1 and ckpt["step"] == 6
    assert set(ckpt) >= {"model", "optimizer", "schedule", "rng", "config", "data"}
    # the model inside the checkpoint loads for single-device inference too
    net2, info2 = load_model(run_dir / "checkpoints" / "checkpoint_000001.pt")
    x = torch.from_numpy(samples.planes[:4])
    with torch.inference_mode():
        torch.testing.assert_close(net(x)[0], net2(x)[0], rtol=0, atol=0)
    rows = json.loads((run_dir / "metrics.json").read_text())
    assert rows[0]["generation"] == 1 and rows[0]["loss"] == pytest.approx(result.loss)
    assert round_result.read(RunDir(run_dir).round_result(1)) == result  # what the coach reads
    assert not list(run_dir.rglob("*.tmp"))


def test_training_lowers_the_loss(tiny_cfg, run_dir, samples):
    result = train_round(tiny_cfg, run_dir, dataset=samples, steps=60, progress=False)
    first, last = np.mean(result.step_losses[:5]), np.mean(result.step_losses[-5:])
    assert last < 0.8 * first, (first, last)


def test_training_lowers_the_auxiliary_losses_on_a_small_fixed_set(tiny_cfg, tmp_path):
    data = synthetic_samples(64, tiny_cfg.go.board_size, tiny_cfg.net.history, seed=4)
    first = train_round(tiny_cfg, tmp_path, dataset=data, steps=2, progress=False)
    train_round(tiny_cfg, tmp_path, dataset=data, steps=60, progress=False)
    last = train_round(tiny_cfg, tmp_path, dataset=data, steps=2, progress=False)
    for key in ("ownership_loss", "score_loss", "opponent_policy_loss"):
        before, after = getattr(first, key), getattr(last, key)
        assert 0 < after < 0.8 * before, (key, before, after)
    row = json.loads((tmp_path / "metrics.json").read_text())[-1]
    assert row["ownership_loss"] == pytest.approx(last.ownership_loss)


def test_samples_without_auxiliary_targets_train_the_main_heads(tiny_cfg, run_dir, tmp_path):
    """A sample file from before the auxiliary targets: those heads get no loss."""
    full = synthetic_samples(128, tiny_cfg.go.board_size, tiny_cfg.net.history, seed=5)
    path = tmp_path / "old.npz"
    np.savez(path, planes=full.planes, policy=full.policy, value=full.value)
    data = SampleArrays.load(path)
    assert data.targets == {}
    result = train_round(tiny_cfg, run_dir, dataset=data, steps=3, progress=False)
    assert np.isfinite(result.loss) and result.policy_loss > 0
    assert result.ownership_loss == result.score_loss == result.opponent_policy_loss == 0.0


def test_a_sample_file_keeps_its_auxiliary_targets(tiny_cfg, tmp_path):
    full = synthetic_samples(40, tiny_cfg.go.board_size, tiny_cfg.net.history, seed=6)
    full.save(tmp_path / "s.npz")
    back = SampleArrays.load(tmp_path / "s.npz", validation_fraction=0.25)
    assert set(back.targets) == set(full.targets) and len(back) == 30
    np.testing.assert_array_equal(back.targets["ownership"], full.targets["ownership"][10:])
    np.testing.assert_array_equal(back.validation.samples([0])["score"],
                                  full.targets["score"][:1])
    np.savez(tmp_path / "bad.npz", planes=full.planes, policy=full.policy, value=full.value,
             ownership=full.targets["ownership"])
    with pytest.raises(TrainingError, match="ownership and ownership_mask go together"):
        SampleArrays.load(tmp_path / "bad.npz")


def test_checkpoint_resumes_to_the_same_next_step_loss(tiny_cfg, tmp_path, samples):
    straight = train_round(tiny_cfg, tmp_path / "a", dataset=samples, steps=5, progress=False)
    train_round(tiny_cfg, tmp_path / "b", dataset=samples, steps=4, progress=False)
    resumed = train_round(tiny_cfg, tmp_path / "b", dataset=samples, steps=1, progress=False)
    assert resumed.generation == 2 and resumed.global_step == 5
    assert resumed.step_losses[0] == straight.step_losses[4]
    a = load_model(tmp_path / "a" / "models" / "model_000001.pt")[0].state_dict()
    b = load_model(tmp_path / "b" / "models" / "model_000002.pt")[0].state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_the_lr_schedule_drops_at_its_global_step_across_rounds(tiny_cfg, tmp_path, samples):
    cfg = override(tiny_cfg, {"training.warmup_steps": 0,
                              "training.lr_schedule": [[6, 0.1]]})
    first = train_round(cfg, tmp_path, dataset=samples, steps=4, progress=False)
    # the second round resumes at global step 4 and crosses the drop at step 6
    second = train_round(cfg, tmp_path, dataset=samples, steps=4, progress=False)
    assert first.lr == pytest.approx(cfg.training.lr)
    assert second.global_step == 8 and second.lr == pytest.approx(cfg.training.lr * 0.1)
    saved = torch.load(tmp_path / "checkpoints" / "checkpoint_000002.pt", weights_only=True)
    assert [tuple(d) for d in saved["schedule"]["drops"]] == [(6.0, 0.1)]


def test_a_run_with_hours_drops_the_lr_by_the_share_of_its_hours(tiny_cfg, tmp_path, samples):
    cfg = override(tiny_cfg, {"training.warmup_steps": 0, "training.lr_schedule": [[2, 0.5]],
                              "training.lr_schedule_by_time": [[0.8, 0.1]], "run.hours": 2.0})
    # before 80% of the 2 hours: the full LR, the step schedule not applied (step 4 > 2)
    early = train_round(cfg, tmp_path, dataset=samples, steps=4, progress=False, run_hours=1.5)
    late = train_round(cfg, tmp_path, dataset=samples, steps=4, progress=False, run_hours=1.6)
    assert early.lr == pytest.approx(cfg.training.lr)
    assert late.lr == pytest.approx(cfg.training.lr * 0.1)
    # without the hours (a trainer run by hand) the step schedule applies
    alone = train_round(cfg, tmp_path, dataset=samples, steps=1, progress=False)
    assert alone.lr == pytest.approx(cfg.training.lr * 0.5)


def test_drop_multiplier_is_the_last_share_reached():
    drops = ((0.5, 0.3), (0.8, 0.1))
    assert [drop_multiplier(drops, s) for s in (0.0, 0.49, 0.5, 0.79, 0.8, 1.3)] == \
        [1.0, 1.0, 0.3, 0.3, 0.1, 0.1]
    assert drop_multiplier((), 0.9) == 1.0


def test_a_round_starts_from_the_newest_model_when_there_is_no_checkpoint(
    tiny_cfg, run_dir, samples
):
    write_initial_model(tiny_cfg, run_dir)
    result = train_round(tiny_cfg, run_dir, dataset=samples, steps=1, progress=False)
    assert result.generation == 1
    again = train_round(tiny_cfg, run_dir, dataset=samples, steps=1, progress=False)
    assert again.generation == 2 and again.global_step == 2


def test_out_of_memory_halves_the_micro_batch_and_accumulates(tiny_cfg, tmp_path, samples):
    hooks = FaultHooks(fake_oom_at_micro_batch=16)  # batch 32: 32 and 16 fail, 8 fits
    result = train_round(tiny_cfg, tmp_path / "oom", dataset=samples, steps=4, progress=False,
                         hooks=hooks)
    assert result.micro_batch == 8 and result.accumulation == 4
    assert result.samples == 4 * 32 and len(result.step_losses) == 4
    # the same optimizer steps as without OOM (BatchNorm sees smaller batches: close, not equal)
    plain = train_round(tiny_cfg, tmp_path / "ok", dataset=samples, steps=4, progress=False)
    np.testing.assert_allclose(result.step_losses, plain.step_losses, rtol=0.1)


def test_step_sums_weigh_each_micro_batch_by_its_rows_and_sum_each_step():
    from training.train.steps import AUX_LOSSES, StepStats, step_sums

    width = 3 + len(AUX_LOSSES)
    one = StepStats(torch.tensor([[1.0, 2.0, 3.0] + [0.5] * (width - 3)]), [4])
    two = StepStats(torch.tensor([[1.0, 1.0, 2.0] + [1.0] * (width - 3),
                                  [3.0, 0.5, 1.0] + [2.0] * (width - 3)]), [2, 6])
    sums = step_sums([one, two])
    assert sums.shape == (2, 4 + len(AUX_LOSSES))
    np.testing.assert_array_equal(sums[0], [4.0, 8.0, 3.0, 4.0] + [2.0] * (width - 3))
    np.testing.assert_array_equal(sums[1], [1 * 2 + 3 * 6, 1 * 2 + 0.5 * 6, 3.0, 8.0]
                                  + [1 * 2 + 2 * 6] * (width - 3))
    assert step_sums([]).shape == (0, 4 + len(AUX_LOSSES))


def test_losses_read_from_the_device_in_groups_are_each_steps_own(tiny_cfg, tmp_path, samples):
    # 20 steps: 3 read alone, a group of SYNC_EVERY_STEPS (16), then 1; the per-step losses
    # equal a run of the same steps read one by one
    from training.train import phases

    grouped = train_round(tiny_cfg, tmp_path / "g", dataset=samples, steps=20, progress=False)
    old = phases.SYNC_EVERY_STEPS
    phases.SYNC_EVERY_STEPS = 1
    try:
        single = train_round(tiny_cfg, tmp_path / "s", dataset=samples, steps=20,
                             progress=False)
    finally:
        phases.SYNC_EVERY_STEPS = old
    assert len(grouped.step_losses) == len(grouped.step_seconds) == 20
    assert grouped.step_losses == single.step_losses
    assert grouped.samples == 20 * 32 and grouped.steps == 20


def test_out_of_memory_at_micro_batch_one_is_raised(tiny_cfg, run_dir, samples):
    with pytest.raises(RuntimeError, match="out of memory"):
        train_round(tiny_cfg, run_dir, dataset=samples, steps=1, progress=False,
                    hooks=FaultHooks(fake_oom_at_micro_batch=1))


def test_grad_accumulation_matches_the_full_batch_in_size(tiny_cfg, run_dir, samples):
    cfg = override(tiny_cfg, {"training.grad_accumulation": 4})
    result = train_round(cfg, run_dir, dataset=samples, steps=2, progress=False)
    assert result.micro_batch == 8 and result.accumulation == 4 and result.samples == 64


def test_epochs_set_the_round_length(tiny_cfg, run_dir, samples):
    cfg = override(tiny_cfg, {"training.epochs": 2})
    small = synthetic_samples(100, tiny_cfg.go.board_size, tiny_cfg.net.history)
    result = train_round(cfg, run_dir, dataset=small, progress=False)
    assert result.steps == 2 * 3  # 100 // 32 full batches per pass (drop_last)


@pytest.mark.parametrize("name", ["config.yaml", "gpu.yaml"])
def test_synthetic_samples_fit_each_shipped_configs_net(name, run_dir):
    # the benchmarks and the GPU check train on synthetic samples of the shipped configs:
    # their planes must be the ones that config's net reads (liberty planes included)
    from configs import load_config
    cfg = override(load_config(REPO / "configs" / name), {
        "training.batch_size": 16, "training.mixed_precision": False,
        "replay.validation_fraction": 0.0})
    data = config_samples(cfg, 64, seed=7)
    result = train_round(cfg, run_dir, dataset=data, steps=1, progress=False)
    assert result.steps == 1 and np.isfinite(result.loss)


def test_allocation_failures_of_cuda_libraries_count_as_out_of_memory():
    from training.train.steps import is_oom as _is_oom

    assert _is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert _is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                                "`cublasCreate(handle)`"))
    assert _is_oom(RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"))
    assert not _is_oom(RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED"))
    assert not _is_oom(ValueError("out of memory"))  # not a runtime failure of the step


def test_too_few_samples_for_one_batch_is_a_clear_error(tiny_cfg, run_dir):
    small = synthetic_samples(8, tiny_cfg.go.board_size, tiny_cfg.net.history)
    with pytest.raises(TrainingError, match="fewer than one batch"):
        train_round(tiny_cfg, run_dir, dataset=small, steps=1, progress=False)


def test_mixed_precision_on_the_cpu_trains_in_bf16_autocast(tiny_cfg, tmp_path, samples,
                                                            monkeypatch):
    from configs import override

    seen = []
    real = torch.autocast

    def spy(*args, **kwargs):
        seen.append((kwargs.get("device_type"), kwargs.get("dtype")))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "autocast", spy)
    cfg = override(tiny_cfg, {"training.mixed_precision": True, "training.amp_dtype": "fp16"})
    mixed = train_round(cfg, tmp_path / "mixed", dataset=samples, steps=8, progress=False)
    assert seen and set(seen) == {("cpu", torch.bfloat16)}  # fp16 is for GPUs: bf16 here
    plain = train_round(tiny_cfg, tmp_path / "plain", dataset=samples, steps=8, progress=False)
    assert np.isfinite(mixed.loss)
    assert mixed.loss == pytest.approx(plain.loss, rel=0.1)  # the same round in bf16


def test_a_non_finite_round_fails_and_writes_no_model(tiny_cfg, run_dir, samples):
    samples.planes[:] = np.nan  # a bug or a bad node: every loss is NaN
    with pytest.raises(TrainingError, match="non-finite loss or weight"):
        train_round(tiny_cfg, run_dir, dataset=samples, steps=2, progress=False)
    assert not (run_dir / "models" / "model_000001.pt").exists()
    assert not (run_dir / "rounds").exists() or not list((run_dir / "rounds").iterdir())


def test_a_model_file_out_of_range_or_with_nan_is_refused_before_use(tiny_cfg, tmp_path):
    from training.learn.net import ModelError, net_from_config, save_model

    net = net_from_config(tiny_cfg.net, tiny_cfg.go.board_size)
    path = tmp_path / "model_000001.pt"
    save_model(path, net, generation=1)
    data = torch.load(path, weights_only=True)
    data["config"]["filters"] = 16384  # about 10 GB a layer if it were built
    torch.save(data, tmp_path / "huge.pt")
    with pytest.raises(ModelError, match="filters = 16384 is outside"):
        load_model(tmp_path / "huge.pt")
    with torch.no_grad():
        next(net.parameters()).view(-1)[0] = float("inf")
    save_model(path, net, generation=1)
    with pytest.raises(ModelError, match="NaN or infinite"):
        load_model(path)


def test_damaged_checkpoint_is_named_in_the_error(tiny_cfg, run_dir, samples):
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "checkpoint_000003.pt").write_bytes(b"garbage")
    with pytest.raises(TrainingError, match="checkpoint_000003.pt"):
        train_round(tiny_cfg, run_dir, dataset=samples, steps=1, progress=False)


def test_lr_scaling_rules_and_warmup():
    assert scaled_lr(0.02, 512, 256, "linear") == pytest.approx(0.04)
    assert scaled_lr(0.02, 1024, 256, "sqrt") == pytest.approx(0.04)
    assert scaled_lr(0.02, 1024, 256, "none") == pytest.approx(0.02)
    sched = WarmupSchedule(peak_lr=1.0, warmup_steps=4)
    lrs = []
    for _ in range(6):
        lrs.append(sched.lr())
        sched.step += 1
    assert lrs == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    # drops multiply the LR from their global step on, warmup included
    sched = WarmupSchedule(peak_lr=1.0, warmup_steps=2, drops=((3, 0.5), (5, 0.1)))
    lrs = []
    for _ in range(7):
        lrs.append(sched.lr())
        sched.step += 1
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.5, 0.1, 0.1])


def test_flags_override_the_config_and_are_validated(tmp_path):
    args = build_parser().parse_args(
        ["--config", str(REPO / "configs" / "tiny.yaml"), "--run-dir", str(tmp_path),
         "--batch-size", "64", "--lr", "0.1", "--epochs", "3", "--mixed-precision"]
    )
    cfg = config_from_args(args)
    assert cfg.training.batch_size == 64 and cfg.training.lr == 0.1
    assert cfg.training.epochs == 3 and cfg.training.mixed_precision
    assert cfg.run.dir == str(tmp_path)
    bad = build_parser().parse_args(
        ["--config", str(REPO / "configs" / "tiny.yaml"), "--batch-size", "0"]
    )
    with pytest.raises(Exception, match="training.batch_size"):
        config_from_args(bad)


def test_launchers_spellings_are_understood_and_a_bad_flag_value_is_refused(monkeypatch,
                                                                           capsys):
    tiny = str(REPO / "configs" / "tiny.yaml")
    args = build_parser().parse_args(["--config", tiny, "--learning-rate", "0.07"])
    assert config_from_args(args).training.lr == 0.07
    # python -m torch.distributed.launch passes --local-rank=N (older: --local_rank N)
    assert build_parser().parse_args(["--config", tiny, "--local-rank=3"]).local_rank == 3
    assert build_parser().parse_args(["--config", tiny, "--local_rank", "2"]).local_rank == 2
    from training.trainer import main

    with pytest.raises(SystemExit) as e:
        main(["--config", tiny, "--num-workers", "-1"])
    assert e.value.code == 2
    assert "--num-workers must be >= 0, got -1" in capsys.readouterr().err


def test_gpus_and_nodes_relaunch_through_torch_distributed_run(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    tiny = str(REPO / "configs" / "tiny.yaml")
    argv = ["--config", tiny, "--gpus", "2"]
    args = build_parser().parse_args(argv)
    cmd = relaunch_command(args, argv, config_from_args(args))
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone"]
    assert cmd[-len(argv) - 2 :] == ["-m", "training.trainer", *argv]
    argv = ["--config", tiny, "--gpus", "1", "--nodes", "2", "--node-rank", "1",
            "--master-addr", "10.0.0.1", "--master-port", "29600"]
    args = build_parser().parse_args(argv)
    cmd = relaunch_command(args, argv, config_from_args(args))
    assert "--nnodes=2" in cmd and "--node_rank=1" in cmd
    assert "--master_addr=10.0.0.1" in cmd and "--master_port=29600" in cmd
    args = build_parser().parse_args(["--config", tiny])
    assert relaunch_command(args, [], config_from_args(args)) is None  # one process: no relaunch
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    args = build_parser().parse_args(["--config", tiny, "--gpus", "2"])
    assert relaunch_command(args, [], config_from_args(args)) is None  # already under torchrun


def test_command_line_round_prints_a_json_summary(tiny_cfg, tmp_path, samples):
    samples.save(tmp_path / "samples.npz")
    proc = subprocess.run(
        [sys.executable, "-m", "training.trainer", "--config", str(REPO / "configs/tiny.yaml"),
         "--run-dir", str(tmp_path / "run"), "--samples", str(tmp_path / "samples.npz"),
         "--steps", "3"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["generation"] == 1 and summary["steps"] == 3
    assert "train gen 1" in proc.stderr  # the progress bar goes to stderr
    # beside the tiny config's local workers (one per core) it takes what they leave: 1 thread
    cores = os.cpu_count() or 1
    threads = cpu_threads(cores, selfplay_cores(tiny_cfg, 0, cores), 1)
    assert f"trainer: {threads} torch thread(s) per rank on the CPU" in proc.stderr
    assert (tmp_path / "run" / "models" / "model_000001.pt").exists()
    written = json.loads((tmp_path / "run" / "rounds" / "round_000001.json").read_text())
    assert written == summary  # the result file says what the summary line says


def test_command_line_without_games_says_what_to_do(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "training.trainer", "--config", str(REPO / "configs/tiny.yaml"),
         "--run-dir", str(tmp_path / "run"), "--samples", str(tmp_path / "missing.npz")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert "missing.npz" in proc.stderr and "cannot read samples" in proc.stderr


def test_a_net_with_liberty_planes_plays_trains_and_plays_again(tiny_cfg, run_dir):
    """net.liberties: self-play writes games, the window feeds the 6 planes to a round, and
    the trained model searches and answers genmove; a model without them is refused."""
    from training.go.features import num_planes
    from training.go.records import BatchMeta, batch_name, write_batch
    from training.learn.net import make_evaluator, net_from_config
    from training.play.players import NetPlayer
    from training.go.rules import Position
    from training.search.selfplay import SelfPlay

    cfg = override(tiny_cfg, {"net.liberties": True, "run.dir": str(run_dir)})
    net = net_from_config(cfg.net, cfg.go.board_size)
    assert net.in_planes == num_planes(cfg.net.history, True) and net.config["liberties"]
    selfplay = SelfPlay(make_evaluator(net), cfg.go, cfg.mcts, cfg.self_play,
                        history=cfg.net.history, seed=3, liberties=True)
    records = []
    while len(records) < 12:
        records += selfplay.step()
    paths = RunDir(run_dir).create()
    write_batch(paths.replay / batch_name("w1", 0, 0), records,
                BatchMeta.from_records("w1", records, max_moves=cfg.go.max_moves))
    write_initial_model(cfg, run_dir)
    result = train_round(cfg, run_dir, steps=3, progress=False)
    trained, _ = load_model(result.model_path)
    assert trained.liberties and np.isfinite(result.loss)
    player = NetPlayer(result.model_path, simulations=8, cfg=cfg)
    move = player.genmove(Position(cfg.go.board_size, cfg.go.komi), 1)
    assert move is not None and 0 <= move <= cfg.go.board_size ** 2
    plain = override(cfg, {"net.liberties": False})
    with pytest.raises(TrainingError, match="liberty planes"):
        train_round(plain, run_dir, steps=1, progress=False)


@pytest.mark.parametrize("pooling", [True, False])
def test_the_soft_policy_head_learns_the_policy_target_to_the_quarter(tiny_cfg, tmp_path,
                                                                      samples, pooling):
    """net.soft_policy_head: a head trained on the policy target ** 1/4 (renormalised), with
    its loss reported; its loss falls over a few steps on a fixed set; off, it reports 0."""
    cfg = override(tiny_cfg, {"net.soft_policy_head": True, "net.global_pooling": pooling,
                              "training.soft_policy_weight": 8.0})
    first = train_round(cfg, tmp_path / "a", dataset=samples, steps=2, progress=False,
                        checkpoint="none")
    later = train_round(cfg, tmp_path / "a", dataset=samples, steps=30, progress=False)
    assert 0 < later.soft_policy_loss < first.soft_policy_loss
    net, _ = load_model(later.model_path)
    assert net.soft_policy_head and net.config["soft_policy_head"]
    with torch.inference_mode():
        out = net(torch.from_numpy(samples.planes[:4]), heads=True)
    assert out["soft_policy"].shape == out["policy"].shape
    plain = train_round(tiny_cfg, tmp_path / "b", dataset=samples, steps=2, progress=False)
    assert plain.soft_policy_loss == 0.0


def test_the_000_guides_script_options_run_with_num_workers_noted(tmp_path, samples):
    """The 000 guide's "Python Script Options", --num-workers (data-loader workers) among
    them: the round runs; there is no data loader, and the log says so."""
    samples.save(tmp_path / "samples.npz")
    proc = subprocess.run(
        [sys.executable, "-m", "training.trainer", "--config", str(REPO / "configs/tiny.yaml"),
         "--run-dir", str(tmp_path / "run"), "--samples", str(tmp_path / "samples.npz"),
         "--world-size", "1", "--rank", "0", "--local-rank", "0", "--backend", "gloo",
         "--batch-size", "32", "--num-workers", "4", "--learning-rate", "0.001", "--steps", "2",
         "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["steps"] == 2
    assert "--num-workers 4: noted" in proc.stderr and "no data loader" in proc.stderr


def test_help_under_the_legacy_launcher_exits_0():
    """`python -m torch.distributed.launch --nproc_per_node=1 -m training.trainer --help`:
    the help, and exit code 0 (the elastic `record` wrapper returns None for --help's exit)."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.launch", "--nproc_per_node=1", "-m",
         "training.trainer", "--help"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--num-workers" in proc.stdout and "Traceback" not in proc.stderr
