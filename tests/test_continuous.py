"""The long-lived trainer (training.mode: continuous) as real processes on the CPU.

What is checked: two Gloo ranks under torchrun take in batches admitted while they run and
publish generations as rounds do (checkpoint, model, round result with equal checksums);
the ratio of trained samples to new samples holds and the trainer waits when no data comes;
a trainer killed with SIGKILL resumes from its checkpoint, counts each admission once and
says in its log what it resumed from; the admission log reads complete lines only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from configs import ConfigError, dump_config, load_config, override
from tests.conftest import REPO, wait_until
from training.train import round_result
from training.train.admissions import AdmissionError, AdmissionLog, AdmissionReader
from training.train.ddp import cpu_threads
from training.trainer import selfplay_cores
from training.train.train_state import load_checkpoint
from training.run.run_dir import RunDir

TINY = REPO / "configs" / "tiny.yaml"
BATCH = 16  # training.batch_size of these tests
SPG = 4  # training.steps_per_generation of these tests


@pytest.fixture(scope="module")
def batches(tmp_path_factory) -> list[tuple[Path, int]]:
    """Three real self-play batches of the tiny config, then a small one of a single game:
    (file, positions)."""
    from training.go.records import BatchMeta, batch_name, write_batch
    from training.learn.net import load_model, make_evaluator
    from training.train.train_state import write_initial_model
    from training.search.selfplay import SelfPlay

    cfg = load_config(TINY)
    d = tmp_path_factory.mktemp("batches")
    net, _ = load_model(write_initial_model(cfg, d / "gen0"))
    selfplay = SelfPlay(make_evaluator(net), cfg.go, cfg.mcts, cfg.self_play,
                        history=cfg.net.history, seed=11)
    out = []
    records: list = []
    for seq, games in enumerate((8, 8, 8, 1)):
        while len(records) < games:
            records += selfplay.step()
        records, spare = records[:games], records[games:]
        path = d / batch_name("worker1", 0, seq)
        write_batch(path, records, BatchMeta.from_records("worker1", records,
                                                          max_moves=cfg.go.max_moves))
        out.append((path, sum(r.num_moves for r in records)))
        records = spare
    return out


def _config(tmp_path: Path, run: Path, ratio: float, **more) -> Path:
    cfg = override(load_config(TINY), {
        "training.mode": "continuous", "training.samples_per_new_sample": ratio,
        "training.batch_size": BATCH, "training.lr_reference_batch": BATCH,
        "training.steps_per_generation": SPG, "run.dir": str(run), **more})
    path = tmp_path / "continuous.yaml"
    path.write_text(dump_config(cfg))
    return path


def _admit(run: Path, log: AdmissionLog, batch: tuple[Path, int]) -> None:
    """What the coach does: the batch into replay/, then one line in the admission log."""
    path, positions = batch
    shutil.copy(path, RunDir(run).replay / path.name)
    log.admit(path.name, positions)


def _state(run: Path) -> dict:
    try:
        return json.loads(RunDir(run).trainer_state.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _start(config: Path, log_path: Path, nproc: int = 1, *extra: str) -> subprocess.Popen:
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", "-m", "training.trainer"]
    else:
        cmd = [sys.executable, "-m", "training.trainer"]
    out = open(log_path, "ab")
    try:
        return subprocess.Popen([*cmd, "--config", str(config), "--continuous",
                                 "--no-progress", *extra], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**{k: v for k, v in os.environ.items()
                                        if k != "OMP_NUM_THREADS"}, "PYTHONPATH": str(REPO)})
    finally:
        out.close()


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def _waiting_at(run: Path, trained: int | None = None) -> bool:
    s = _state(run)
    return bool(s.get("waiting")) and (trained is None or s.get("trained_samples") == trained)


def _budget(ratio: float, positions: int) -> int:
    """Trained samples the trainer may reach after `positions` new ones: whole steps."""
    return int(ratio * positions) // BATCH * BATCH


def test_two_gloo_ranks_publish_generations_from_batches_admitted_while_they_run(
        tmp_path, batches):
    run = RunDir(tmp_path / "run").create().root
    (p1, n1), (p2, n2) = batches[0], batches[1]
    # the first batch buys between one and two generations of steps, the second one more
    ratio = 1.5 * SPG * BATCH / n1
    config = _config(tmp_path, run, ratio)
    log = AdmissionLog(RunDir(run).admissions)
    proc = _start(config, tmp_path / "trainer.log", nproc=2)
    try:
        wait_until(lambda: _waiting_at(run, 0), 120, "the trainer waiting for data")
        _admit(run, log, batches[0])
        wait_until(lambda: _waiting_at(run, _budget(ratio, n1)), 120,
                   "the first batch's steps")
        assert _state(run)["generation"] == 1, "one generation from the first batch"
        time.sleep(2)
        assert _state(run)["trained_samples"] == _budget(ratio, n1), "no data, no steps"
        _admit(run, log, batches[1])
        wait_until(lambda: _waiting_at(run, _budget(ratio, n1 + n2)), 120,
                   "the second batch's steps")
    finally:
        code = _stop(proc)
    text = (tmp_path / "trainer.log").read_text()
    # torchrun itself exits 1 on SIGTERM (it raises SignalException); its ranks stop cleanly
    assert "continuous trainer stopped" in text, "\n".join(
        line for line in text.splitlines() if not line.startswith(("  ", "E ", "Traceback")))
    assert code is not None
    paths = RunDir(run)
    for gen in (1, 2):
        result = round_result.read(paths.round_result(gen))
        assert result is not None and result.generation == gen and result.steps == SPG
        assert result.world_size == 2 and len(set(result.rank_checksums)) == 1
        assert paths.model(gen).exists() and paths.checkpoint(gen).exists()
    data = load_checkpoint(paths.checkpoint(2))["data"]
    assert data["admitted_seq"] == 2 and data["new_samples"] == n1 + n2
    rows = json.loads(paths.metrics_json.read_text())
    assert [r["generation"] for r in rows][:2] == [1, 2]


def test_the_trainer_holds_the_sample_ratio_and_waits_for_new_data(tmp_path, batches):
    run = RunDir(tmp_path / "run").create().root
    ratio = 1.0
    config = _config(tmp_path, run, ratio, **{"training.steps_per_generation": 1000})
    log = AdmissionLog(RunDir(run).admissions)
    proc = _start(config, tmp_path / "trainer.log")
    new = 0
    try:
        for batch in batches[:2]:
            _admit(run, log, batch)
            new += batch[1]
            wait_until(lambda: _waiting_at(run, _budget(ratio, new)), 120,
                       f"the steps of {new} new samples")
            step = _state(run)["global_step"]
            time.sleep(1.5)
            assert _state(run)["global_step"] == step, "it trained without new data"
    finally:
        code = _stop(proc)
    text = (tmp_path / "trainer.log").read_text()
    assert code == 0, text[-3000:]
    threads = cpu_threads(os.cpu_count(), selfplay_cores(load_config(config), 0,
                                                         os.cpu_count()), 1)
    assert f"continuous trainer: {threads} torch thread(s) per rank on the CPU" in text
    state = _state(run)
    assert state["new_samples"] == new
    assert ratio - BATCH / new <= state["trained_samples"] / new <= ratio
    assert state["global_step"] * BATCH == state["trained_samples"]


def test_the_first_step_waits_for_the_minimum_window_with_the_budget_kept(tmp_path, batches):
    """training.min_window_positions: with the first batch the window is too small, so no
    step; with the second it is big enough and the budget of both batches is trained."""
    run = RunDir(tmp_path / "run").create().root
    ratio = 1.0
    first, second = batches[0][1], batches[1][1]
    config = _config(tmp_path, run, ratio, **{"training.steps_per_generation": 1000,
                                              "training.min_window_positions": first + 1})
    log = AdmissionLog(RunDir(run).admissions)
    proc = _start(config, tmp_path / "trainer.log")
    try:
        _admit(run, log, batches[0])
        wait_until(lambda: _state(run).get("new_samples") == first and _waiting_at(run), 120,
                   "the first batch taken in")
        time.sleep(1.5)
        assert _state(run)["global_step"] == 0, "it trained below the minimum window"
        assert _budget(ratio, first) >= BATCH  # so it would have trained without the gate
        _admit(run, log, batches[1])
        wait_until(lambda: _waiting_at(run, _budget(ratio, first + second)), 120,
                   "the steps of both batches")
    finally:
        code = _stop(proc)
    assert code == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    assert _state(run)["global_step"] * BATCH == _budget(ratio, first + second)


def test_a_killed_trainer_resumes_from_its_checkpoint_and_counts_each_batch_once(
        tmp_path, batches):
    """Also the LR drop by the clock: a run of one hour (run.hours) whose trainer starts at
    0.5 hours trains at the full LR, and one started again at 0.85 at a tenth of it."""
    run = RunDir(tmp_path / "run").create().root
    # the first batch: one generation and two steps; the small one: a step or so, still
    # short of the next generation when the trainer is killed; the third: two generations
    first, small, third = batches[0], batches[3], batches[2]
    n1, n2, n3 = first[1], small[1], third[1]
    ratio = 1.5 * SPG * BATCH / n1
    assert ratio * (n1 + n2) < 2 * SPG * BATCH
    config = _config(tmp_path, run, ratio, **{"run.hours": 1.0,
                                              "training.lr_schedule_by_time": [[0.8, 0.1]]})
    log = AdmissionLog(RunDir(run).admissions)
    log_path = tmp_path / "trainer.log"
    proc = _start(config, log_path, 1, "--run-hours", "0.5")
    try:
        _admit(run, log, first)
        wait_until(lambda: _waiting_at(run, _budget(ratio, n1)), 120, "the first batch")
        _admit(run, log, small)
        wait_until(lambda: _waiting_at(run, _budget(ratio, n1 + n2))
                   and _state(run).get("admitted_seq") == 2, 60, "the small batch's steps")
    finally:
        _stop(proc, signal.SIGKILL)  # no chance to save anything
    assert load_checkpoint(RunDir(run).checkpoint(1))["data"]["admitted_seq"] == 1
    assert not RunDir(run).checkpoint(2).exists()
    _admit(run, log, third)  # admitted while no trainer runs
    proc = _start(config, log_path, 1, "--run-hours", "0.85")
    try:
        wait_until(lambda: _waiting_at(run, _budget(ratio, n1 + n2 + n3)), 120,
                   "the resumed trainer's steps")
    finally:
        assert _stop(proc) == 0
    text = log_path.read_text()
    assert "resumed from" in text and "checkpoint_000001.pt" in text
    assert "admissions through seq 1" in text and "2 admissions since are new data" in text
    state = _state(run)
    assert state["new_samples"] == n1 + n2 + n3, "an admission counted twice or lost"
    assert state["trained_samples"] <= ratio * (n1 + n2 + n3)
    lr = load_config(config).training.lr  # lr_reference_batch is the batch: no scaling
    assert round_result.read(RunDir(run).round_result(1)).lr == pytest.approx(lr)
    assert round_result.read(RunDir(run).round_result(2)).lr == pytest.approx(lr * 0.1)


def test_a_run_that_trained_in_rounds_goes_on_without_taking_its_window_as_new_data(
        tmp_path, batches):
    """A round's checkpoint has no admission seq: what was admitted before is the window the
    rounds trained on, and only later admissions buy steps."""
    from training.train.round import train_round

    run = RunDir(tmp_path / "run").create().root
    config = _config(tmp_path, run, 1.0)
    log = AdmissionLog(RunDir(run).admissions)
    _admit(run, log, batches[0])
    cfg = override(load_config(config), {"training.mode": "rounds"})
    train_round(cfg, run, steps=2, progress=False)
    proc = _start(config, tmp_path / "trainer.log")
    try:
        wait_until(lambda: _waiting_at(run, 0), 120, "the trainer waiting")
        assert _state(run)["admitted_seq"] == 1 and _state(run)["new_samples"] == 0
        _admit(run, log, batches[1])
        wait_until(lambda: _waiting_at(run, _budget(1.0, batches[1][1])), 120,
                   "the new batch's steps")
    finally:
        _stop(proc)
    assert "is a round's checkpoint" in (tmp_path / "trainer.log").read_text()


def test_on_the_cpu_the_trainer_takes_the_cores_the_local_workers_leave():
    """Beside local self-play the long-lived trainer takes the cores the workers leave (at
    least one), shared by the node's ranks; with the workers on other hosts, every core."""
    def threads(cfg, n_cpus, n_gpus, ranks):
        return cpu_threads(n_cpus, selfplay_cores(cfg, n_gpus, n_cpus), ranks)

    cfg = load_config(TINY)
    auto = override(cfg, {"self_play.workers": 0, "self_play.workers_per_gpu": 0,
                          "self_play.threads_per_worker": 1})  # one worker per core
    assert threads(auto, 2, 0, 1) == 1
    assert threads(auto, 16, 0, 1) == 1
    four = override(cfg, {"self_play.workers": 4, "self_play.threads_per_worker": 1})
    assert threads(four, 16, 0, 1) == 12 and threads(four, 16, 0, 2) == 6
    assert threads(override(four, {"self_play.threads_per_worker": 2}), 16, 0, 1) == 8
    assert threads(override(four, {"self_play.workers": 40}), 16, 0, 1) == 1
    remote = override(cfg, {"distributed.enabled": True})
    assert threads(remote, 16, 0, 1) == 16 and threads(remote, 16, 0, 4) == 4
    # two GPUs, automatic: 2 to 4 workers per GPU, each with its search on a core
    assert threads(override(auto, {"self_play.cpu_only": False}), 16, 2, 1) == 8
    assert threads(override(auto, {"self_play.cpu_only": True}), 16, 2, 1) == 1


def test_the_admission_log_is_read_by_complete_lines_and_a_torn_tail_is_cut(tmp_path):
    path = tmp_path / "admitted.jsonl"
    log = AdmissionLog(path)
    log.admit("worker1_000000_00000000.npz.zst", 10)
    reader = AdmissionReader(path)
    with open(path, "ab") as f:
        f.write(b'{"seq": 2, "name": "worker1_000000_000')  # a crash in mid-line
    assert [a.seq for a in reader.poll()] == [1] and reader.poll() == []
    log = AdmissionLog(path)  # the coach again: the torn line is gone
    assert log.seq == 1 and log.admit("worker1_000000_00000001.npz.zst", 5) == 2
    assert [(a.seq, a.positions) for a in reader.poll()] == [(2, 5)]
    with open(path, "ab") as f:
        f.write(b'{"seq": 7, "name": "../../etc/passwd", "positions": 1}\n')
    with pytest.raises(AdmissionError, match="seq 7 where 3 was expected"):
        reader.poll()


def test_continuous_mode_refuses_training_nodes_naming_both_keys():
    cfg = load_config(TINY)
    with pytest.raises(ConfigError, match="training.mode.*distributed.training_nodes"):
        override(cfg, {"training.mode": "continuous", "distributed.training_nodes": [
            {"host": "127.0.0.1", "user": "me", "name": "node1"}]})


def test_the_coach_side_admits_keeps_the_trainer_alive_and_publishes_its_generations(
        tmp_path, batches, caplog):
    """`LongLivedTrainer` driven alone, as the coach drives it: ingested batches become
    admissions, the real trainer publishes through `Generations` (published, concluded),
    a trainer killed with SIGKILL is started again and resumes from its checkpoint, and
    stopping ends it."""
    import logging
    import threading

    from training.generations import Counts, Generations, ModelPublished, RoundConcluded
    from training.long_lived_trainer import LongLivedTrainer

    caplog.set_level(logging.INFO)
    run = tmp_path / "run"
    (_, n1), (_, n2) = batches[0], batches[1]
    ratio = 1.5 * SPG * BATCH / n1
    cfg = load_config(_config(tmp_path, run, ratio, **{
        "logging.dir": str(tmp_path / "logs"), "evaluation.games": 0,
        "evaluation.gnugo_games": 0, "distributed.backoff_max_s": 1.0}))
    paths = RunDir(run).create()
    paths.config.write_text(dump_config(cfg))
    gens = Generations(cfg, paths, threading.Event())
    rounds = LongLivedTrainer(gens)
    gens.ensure_first_model()
    ingested: list[tuple[str, int]] = []

    def ingest(batch: tuple[Path, int]) -> None:  # what the collector does
        shutil.copy(batch[0], paths.replay / batch[0].name)
        ingested.append((batch[0].name, batch[1]))

    events: list = []

    def drive_until(generation: int) -> None:
        def published() -> bool:
            events.extend(rounds.advance(Counts(8 * len(ingested), 8,
                                                ingested=tuple(ingested))))
            # the coach takes in the newest generation: one trained meanwhile may be skipped
            return any(isinstance(e, ModelPublished) and e.generation >= generation
                       for e in events)
        try:
            wait_until(published, 120, f"generation {generation} published", interval_s=0.2)
        except AssertionError:
            log = tmp_path / "logs" / "trainer_continuous.log"
            raise AssertionError(f"generation {generation} not published; the trainer's log "
                                 f"ends:\n{log.read_text()[-3000:]}\n{caplog.text[-2000:]}")

    try:
        ingest(batches[0])
        drive_until(1)
        assert any(isinstance(e, RoundConcluded) and e.generation == 1 for e in events)
        assert [a.name for a in AdmissionReader(paths.admissions).poll()] == [ingested[0][0]]
        assert (paths.models / "model_000001.json").exists()  # published for the workers
        first = rounds.trainer
        os.kill(first.pid, signal.SIGKILL)
        ingest(batches[1])
        drive_until(2)
        assert rounds.trainer is not None and rounds.trainer is not first
    finally:
        rounds.abandon()
    assert first.poll() is not None and rounds.trainer is None
    text = caplog.text
    assert "the continuous trainer exited (code -9" in text
    assert "it resumes from checkpoint_000001.pt" in text
    assert load_checkpoint(paths.checkpoint(2))["data"]["new_samples"] == n1 + n2


def test_batches_handed_over_on_a_pass_whose_admission_fails_are_admitted_on_a_later_one(
        tmp_path):
    """The coach hands the driver each ingested batch once (`Counts.ingested`: the pass's new
    ones). A pass on which the admission log cannot be written (here a folder stands in its
    place) raises; the batches it was handed are admitted on the next pass, in order."""
    import threading

    from training.generations import Counts, Generations
    from training.go.records import batch_name
    from training.long_lived_trainer import LongLivedTrainer

    run = tmp_path / "run"
    cfg = load_config(_config(tmp_path, run, 1.0, **{"logging.dir": str(tmp_path / "logs")}))
    paths = RunDir(run).create()
    paths.admissions.mkdir()  # not a file: the log cannot be opened
    driver = LongLivedTrainer(Generations(cfg, paths, threading.Event()), trainer_cmd=[
        sys.executable, "-c", "import time; time.sleep(120)"])
    names = [batch_name("worker1", 0, seq) for seq in (1, 2, 3)]
    try:
        with pytest.raises(OSError):
            driver.advance(Counts(2, 8, ingested=((names[0], 10), (names[1], 20))))
        paths.admissions.rmdir()
        driver.advance(Counts(3, 8, ingested=((names[2], 30),)))
        driver.advance(Counts(3, 8))
    finally:
        driver.abandon()
    admitted = AdmissionReader(paths.admissions).poll()
    assert [(a.name, a.positions) for a in admitted] == list(zip(names, (10, 20, 30)))


def test_the_trainer_log_is_read_from_its_end_and_rotated_when_large(tmp_path, monkeypatch):
    """A trainer's exit reads the last lines of its log from its last 64 KiB only, and a log
    past its size limit is moved to `.1` when the next trainer starts."""
    from training import long_lived_trainer as cr
    from training.run.child_process import log_tail

    log = tmp_path / "trainer_continuous.log"
    with open(log, "wb") as f:
        f.write(b"x" * (8 << 20) + b"\n")  # a long line: never read whole
        f.write(b"".join(b"line %d\n" % i for i in range(40)))
    assert log_tail(log, 3).splitlines() == ["line 37", "line 38", "line 39"]
    monkeypatch.setattr(cr, "LOG_ROTATE_BYTES", 1 << 20)
    cr._rotate(log)
    assert not log.exists() and (tmp_path / "trainer_continuous.log.1").stat().st_size > 8 << 20
    log.write_bytes(b"small\n")
    cr._rotate(log)
    assert log.read_bytes() == b"small\n"
