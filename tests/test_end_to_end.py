"""End to end on the tiny config: the real coach, real worker daemons, the real trainer.

Local mode (the default a new user runs): two generations through `start_main.py`, a run
that goes on from the first of them (--from-run) and stops at its --hours; a worker killed
with SIGKILL is restarted and Active again; a coach killed mid-run resumes and counts every
batch exactly once. Distributed mode against two real loopback sshd hosts lives in
tests/test_distributed_e2e.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from configs import dump_config, override
from distributed.status import WorkerState, parse_status_text, read_status
from tests.conftest import REPO, wait_until
from training.run import model_store

pytestmark = pytest.mark.slow




def _status(path: Path):
    try:
        return parse_status_text(path.read_text())
    except (OSError, ValueError):
        return None


def _ledger(run: Path) -> list[dict]:
    path = run / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _kill_leftover_workers(run: Path) -> None:
    """Workers run in their own session; never leave one behind after a test."""
    for pid_file in run.glob("workers/*/worker.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


@pytest.fixture
def setup(tiny_cfg, tmp_path):
    run = tmp_path / "run"
    cfg = override(tiny_cfg, {"run.dir": str(run), "logging.dir": str(tmp_path / "logs")})
    config = tmp_path / "config.yaml"
    config.write_text(dump_config(cfg))
    yield cfg, config, run, tmp_path / "status.txt"
    _kill_leftover_workers(run)


def _start_main(config: Path, status: Path, *args: str, one_thread: bool = True
                ) -> subprocess.Popen:
    # one torch thread for the coach's rounds trainer and arena: their default (a thread a
    # core) on a machine whose cores the worker already keeps busy makes every step wait for a
    # descheduled thread, 20 tiny steps taking 15 s instead of a fraction of one. The
    # continuous trainer picks its own count unless OMP_NUM_THREADS is set: left to it.
    env = dict(os.environ, OMP_NUM_THREADS="1") if one_thread else None
    return subprocess.Popen(
        [sys.executable, "start_main.py", "--config", str(config), "--status-file", str(status),
         *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _assert_exactly_once(run: Path) -> list[dict]:
    entries = _ledger(run)
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)), "a batch was counted twice"
    replay = sorted(p.name for p in (run / "replay").glob("*.npz.zst"))
    assert sorted(n for n, e in zip(names, entries) if e["status"] == "ingested") == replay
    seqs = sorted(e["seq"] for e in entries if e["worker"] == "worker1")
    assert seqs == list(range(len(seqs))), "a batch was lost (gap in the sequence)"
    return entries


def test_local_default_trains_two_generations(setup):
    cfg, config, run, status = setup
    proc = _start_main(config, status, "--iterations", "2")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert "generations=2 last_generation=2" in out
    assert model_store.list_manifests(run / "models") == [0, 1, 2]
    # the second model reached the worker, which played with it
    assert 2 in model_store.list_manifests(run / "workers" / "worker1" / "models")
    entries = _assert_exactly_once(run)
    assert any(e["generation"] >= 1 for e in entries)
    snap = parse_status_text(status.read_text())
    assert snap.generation == 2 and snap.workers_total == 1
    assert snap.last_loss is not None and snap.window_positions > 0
    rows = json.loads((run / "metrics.json").read_text())
    by_gen = {r["generation"]: r for r in rows}
    assert {1, 2} <= set(by_gen) and "loss" in by_gen[2] and "games_per_s" in by_gen[2]
    assert (run / "progress.png").stat().st_size > 0
    assert "published generation 2" in (run.parent / "logs" /
                                         "distributed_training.log").read_text()
    assert (run.parent / "logs" / "worker_worker1.log").exists()
    _branch_goes_on_from_generation_1(cfg, config, run, status)


def _branch_goes_on_from_generation_1(cfg, config: Path, run: Path, status: Path) -> None:
    """`--from-run RUN --from-generation 1 --run-dir NEW`: the new run starts with generation
    1's models, checkpoint, games and metrics, trains generation 2 from checkpoint 1 (its step
    goes on), and the source is only read."""
    from training.train.train_state import load_checkpoint

    before = {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    branch = run.parent / "branch"
    busy = subprocess.run(  # a folder that exists is refused, and nothing is written
        [sys.executable, "start_main.py", "--config", str(config), "--from-run", str(run),
         "--from-generation", "1", "--run-dir", str(run)], cwd=REPO, capture_output=True,
        text=True, timeout=120)
    assert busy.returncode == 2 and "exists; --from-run starts a new run folder" in busy.stderr
    kept = [e for e in _ledger(run)
            if e["status"] == "ingested" and 0 <= e.get("coach_generation", -1) <= 1]
    proc = _start_main(config, status, "--iterations", "1", "--hours", "10", "--from-run",
                       str(run), "--from-generation", "1", "--run-dir", str(branch))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert "generations=1 last_generation=2" in out
    assert model_store.list_manifests(branch / "models") == [0, 1, 2]
    assert (branch / "models" / "model_000001.pt").read_bytes() == (
        run / "models" / "model_000001.pt").read_bytes()
    step_1 = load_checkpoint(run / "checkpoints" / "checkpoint_000001.pt")["step"]
    assert load_checkpoint(branch / "checkpoints" / "checkpoint_000002.pt")["step"] == (
        step_1 + cfg.training.steps_per_generation)
    entries = _assert_exactly_once(branch)
    assert entries[:len(kept)] == kept and len(entries) > len(kept)
    assert all(e["coach_generation"] >= 1 for e in entries[len(kept):]
               if e["status"] == "ingested")  # a batch of nothing but repeats is refused
    rows = {r["generation"]: r for r in json.loads((branch / "metrics.json").read_text())}
    source_rows = {r["generation"]: r for r in json.loads((run / "metrics.json").read_text())}
    assert rows[1] == source_rows[1] and "loss" in rows[2]
    shown = read_status(status)  # the status file shows the hours against the limit
    assert shown.hours_limit == 10 and shown.run_hours >= source_rows[1]["elapsed_s"] / 3600 - 0.01
    after = {p.relative_to(run): p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    assert after == before, "the source run was changed"
    _hours_count_the_run_it_went_on_from(config, branch, status, source_rows[1]["elapsed_s"],
                                         rows[2]["run_s"])


def _hours_count_the_run_it_went_on_from(config: Path, branch: Path, status: Path,
                                         source_s: float, run_s: float) -> None:
    """--hours counts the hours of the run a --from-run run went on from: its trainer was
    told them, its metrics carry them, and a limit already reached stops it at once."""
    log = (branch.parent / "logs" / "distributed_training.log").read_text()
    told = [float(ln.split("--run-hours ")[1].split()[0]) for ln in log.splitlines()
            if "training generation 2 on" in ln and "--run-hours" in ln]
    assert told and source_s / 3600 <= told[-1] <= run_s / 3600
    assert run_s > source_s
    limit = f"{0.5 * run_s / 3600:.6f}"  # already run: the resumed coach stops at once
    proc = _start_main(config, status, "--hours", limit, "--run-dir", str(branch))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "run.hours reached" in out and "generations=0 last_generation=2" in out


def test_killed_worker_is_restarted_and_active_again(setup):
    cfg, config, run, status = setup
    from training.coach import Coach

    coach = Coach(override(cfg, {"self_play.games_per_worker": 100000}), config_path=config,
                  status_path=status, watch_config=False)
    t = threading.Thread(target=coach.run)
    t.start()
    try:
        def worker_active() -> bool:
            snap = _status(status)
            return bool(snap and snap.workers and snap.workers[0].state == WorkerState.ACTIVE)

        wait_until(worker_active, 120, "worker1 Active")
        pid = coach.fleet.pid("worker1")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: coach.fleet.pid("worker1") not in (None, pid), 60, "a new daemon")
        wait_until(lambda: worker_active() and _status(status).workers[0].restarts == 1, 120,
              "worker1 Active again after its restart")
    finally:
        coach.stop()
        t.join(timeout=120)
    assert not t.is_alive()
    _assert_exactly_once(run)


def test_coach_killed_mid_run_resumes_with_every_batch_counted_once(setup):
    cfg, config, run, status = setup
    config.write_text(dump_config(override(cfg, {"evaluation.games": 0})))  # budget: no arena
    proc = _start_main(config, status, "--iterations", "5")
    try:
        wait_until(lambda: len(_ledger(run)) >= 6, 180, "six ingested batches")
    finally:
        proc.kill()  # SIGKILL: no clean-up of any kind
        proc.wait()
    before = {e["name"] for e in _ledger(run)}
    pid = int((run / "workers" / "worker1" / "worker.pid").read_text())
    # the orphaned worker keeps playing and filling its outbox meanwhile
    proc = _start_main(config, status, "--iterations", "1")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert "resuming" in (run.parent / "logs" / "distributed_training.log").read_text()
    entries = _assert_exactly_once(run)
    assert before <= {e["name"] for e in entries}
    assert len(entries) > len(before)
    log_text = (run.parent / "logs" / "distributed_training.log").read_text()
    assert f"adopting running daemon pid {pid}" in log_text
    assert not list((run / "workers" / "worker1" / "outbox").glob("*.npz.zst"))


def test_continuous_mode_publishes_and_resumes_after_the_coach_is_killed(setup):
    """training.mode continuous through start_main.py: one trainer for the run publishes
    generations that the coach publishes, plots and shows; after a SIGKILL of the coach (the
    trainer dies with it) a new coach admits what was missed and its trainer resumes from
    the newest checkpoint with every admitted batch counted once."""
    from training.train.admissions import AdmissionReader
    from training.train.train_state import latest, load_checkpoint

    cfg, config, run, status = setup
    config.write_text(dump_config(override(cfg, {
        "training.mode": "continuous", "training.samples_per_new_sample": 1.0,
        "training.steps_per_generation": 4, "training.batch_size": 16,
        "training.lr_reference_batch": 16, "evaluation.games": 0})))
    logs = run.parent / "logs"
    proc = _start_main(config, status, "--iterations", "5", one_thread=False)
    try:
        wait_until(lambda: len(model_store.list_manifests(run / "models")) >= 3, 240,
                   "two generations published")
    finally:
        proc.kill()  # SIGKILL: the trainer gets SIGTERM as its parent dies
        proc.wait()
    assert (run / "progress.png").stat().st_size > 0
    assert {1, 2} <= {r["generation"] for r in json.loads((run / "metrics.json").read_text())}
    # two: the first may be a generation the killed trainer had already written
    proc = _start_main(config, status, "--iterations", "2", one_thread=False)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    coach_log = (logs / "distributed_training.log").read_text()
    assert "starting the continuous trainer: it resumes from checkpoint_" in coach_log
    trainer_log = (logs / "trainer_continuous.log").read_text()
    assert "continuous trainer: resumed from" in trainer_log
    entries = _assert_exactly_once(run)
    admitted = []
    reader = AdmissionReader(run / "admitted.jsonl")
    while batch := reader.poll():
        admitted += batch
    names = [a.name for a in admitted]
    assert len(names) == len(set(names)), "a batch admitted twice"
    assert set(names) <= {e["name"] for e in entries if e["status"] == "ingested"}
    gen, newest = latest(run / "checkpoints", "checkpoint")
    data = load_checkpoint(newest)["data"]
    taken = [a for a in admitted if a.seq <= data["admitted_seq"]]
    assert data["new_samples"] == sum(a.positions for a in taken), "a batch counted twice"
    assert data["trained_samples"] <= data["new_samples"] * 1.0
    assert read_status(status).generation >= 3
