"""The self-play worker daemon: real tiny nets, real files, real subprocesses."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from configs import override
from distributed.status import WorkerState, read_heartbeat
from tests.conftest import REPO, wait_until
from training.go.records import read_batch
from training.go.records import batch_name_or_none, outbox_batches
from training.run import model_store
from training.worker import Worker


def _publish(cfg, folder: Path, generation: int, seed: int = 0) -> model_store.Manifest:
    """Write a real random net as generation `generation` into a worker's models/ folder."""
    import torch

    from training.learn.net import net_from_config, save_model

    torch.manual_seed(seed)
    src = folder.parent / "published"
    save_model(src / f"model_{generation:06d}.pt", net_from_config(cfg.net, cfg.go.board_size),
               generation)
    manifest = model_store.publish_model(src, generation, cfg.distributed.wire_level)
    model_store.copy_published(src, manifest, folder / "models")
    return manifest




def _heartbeat(folder: Path) -> dict:
    try:
        return json.loads((folder / "status.json").read_text())
    except FileNotFoundError:
        return {}


@pytest.fixture
def cfg(tiny_cfg, run_dir):
    return override(tiny_cfg, {"run.dir": str(run_dir), "distributed.heartbeat_interval_s": 0.2})


def test_worker_writes_valid_batches_and_continues_sequence_after_restart(cfg, run_dir):
    folder = run_dir / "workers" / "w1"
    _publish(cfg, folder, 0)
    first = Worker(cfg, "w1", folder).run(max_games=25)
    assert first.games >= 25 and first.generation == 0  # a step may finish several games
    names = outbox_batches(folder / "outbox")
    seqs = [batch_name_or_none(n)[2] for n in names]
    assert seqs == list(range(len(names))) and len(names) == first.batches
    # full batches of batch_size=10, then the finished games flushed at the stop
    games = [len(read_batch(folder / "outbox" / n)[1]) for n in names]
    assert all(g == 10 for g in games[:-1]) and 0 < games[-1] <= 10
    assert sum(games) == first.games
    # the coach collects (deletes) them; a new daemon must not reuse a sequence number
    for n in names:
        (folder / "outbox" / n).unlink()
    Worker(cfg, "w1", folder).run(max_games=10)
    assert batch_name_or_none(outbox_batches(folder / "outbox")[0])[2] == len(names)
    hb = read_heartbeat(folder / "status.json")
    assert hb.state == WorkerState.OFFLINE and hb.games_done >= 10 and hb.generation == 0


def test_games_that_waited_batch_max_wait_s_are_sent_without_filling_a_batch(cfg, run_dir):
    folder = run_dir / "workers" / "w1"
    _publish(cfg, folder, 0)
    big = override(cfg, {"distributed.batch_size": 1000, "distributed.batch_max_wait_s": 0})
    assert Worker(big, "w1", folder).run(max_games=12).batches == 1  # only the flush at stop
    for n in outbox_batches(folder / "outbox"):
        (folder / "outbox" / n).unlink()
    fresh = override(big, {"distributed.batch_max_wait_s": 0.001})
    summary = Worker(fresh, "w1", folder).run(max_games=12)
    games = [len(read_batch(folder / "outbox" / n)[1]) for n in outbox_batches(folder / "outbox")]
    assert summary.batches == len(games) > 1 and sum(games) == summary.games


def test_compression_false_stores_batches_and_models_that_read_the_same(cfg, run_dir):
    """distributed.compression: false writes zstd frames of raw blocks (no compression work):
    the batch is about its raw size, and the coach's validator and the worker read both."""
    from training.fleet.validation import validate_with_records

    folder = run_dir / "workers" / "w1"
    manifest = _publish(override(cfg, {"distributed.compression": False}), folder, 0)
    stored = folder / "models" / manifest.zst_name
    assert stored.read_bytes()[4:6] == bytes([0x00, 0x38]), "a stored frame"
    plain = override(cfg, {"distributed.compression": False})
    Worker(plain, "w1", folder).run(max_games=10)  # loads the stored model
    names = outbox_batches(folder / "outbox")
    raw = (folder / "outbox" / names[0]).read_bytes()
    assert raw[4:6] == bytes([0x00, 0x38])
    info = validate_with_records(cfg.go.board_size, cfg.go.komi)(folder / "outbox" / names[0])
    assert info.games == len(read_batch(folder / "outbox" / names[0])[1]) > 0
    from distributed.transfer import compress_bytes, decompress_bytes

    assert len(raw) > 2 * len(compress_bytes(decompress_bytes(raw, 1 << 30), 3))


def test_corrupt_model_is_refused_and_previous_model_kept(cfg, run_dir):
    folder = run_dir / "workers" / "w1"
    _publish(cfg, folder, 0)
    worker = Worker(cfg, "w1", folder)
    worker.run(max_games=10)
    good = _publish(cfg, folder, 1, seed=1)
    zst = folder / "models" / good.zst_name
    data = bytearray(zst.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, wrong sha256
    zst.write_bytes(bytes(data))
    worker._stop.clear()
    summary = worker.run(max_games=40)
    assert summary.generation == 0
    hb = json.loads((folder / "status.json").read_text())
    assert "sha256" in hb["last_error"] and "generation 1" in hb["last_error"]
    assert hb["generation"] == 0


def test_worker_waits_for_a_model_then_picks_it_up(cfg, run_dir):
    folder = run_dir / "workers" / "w1"
    worker = Worker(cfg, "w1", folder)
    t = threading.Thread(target=worker.run, kwargs={"max_games": 10})
    t.start()
    try:
        wait_until(lambda: (folder / "status.json").exists(), 10, "first heartbeat")
        assert read_heartbeat(folder / "status.json").state == WorkerState.SYNCING
        _publish(cfg, folder, 0)
        t.join(timeout=120)
        assert not t.is_alive()
    finally:
        worker.stop()
        t.join(timeout=30)
    assert worker.games_done >= 10 and worker.generation == 0


def test_full_outbox_pauses_selfplay_and_says_so(cfg, run_dir):
    cfg = override(cfg, {"distributed.max_outbox_batches": 2})
    folder = run_dir / "workers" / "w1"
    _publish(cfg, folder, 0)
    worker = Worker(cfg, "w1", folder)
    t = threading.Thread(target=worker.run)
    t.start()
    try:
        wait_until(lambda: _heartbeat(folder).get("paused"), 120,
              "a paused heartbeat")
        games = worker.games_done
        time.sleep(1.0)
        assert worker.games_done == games  # paused: no more games
        assert len(outbox_batches(folder / "outbox")) == 2
        for n in outbox_batches(folder / "outbox"):  # the coach collects
            (folder / "outbox" / n).unlink()
        wait_until(lambda: worker.games_done > games, 60, "self-play to resume")
        wait_until(lambda: _heartbeat(folder).get("paused"), 120, "paused again")
        _publish(cfg, folder, 1, seed=1)  # a worker waiting for the coach still switches
        wait_until(lambda: _heartbeat(folder).get("generation") == 1, 30, "generation 1")
        assert _heartbeat(folder)["paused"]
    finally:
        worker.stop()
        t.join(timeout=60)


class MarkingWorker(Worker):
    """The user guide's custom worker: custom initialisation on top of Worker's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        (self.folder / "custom_init.txt").write_text(self.name)


@pytest.mark.slow
def test_an_older_heartbeat_snapshot_never_lands_after_a_newer_one(cfg, run_dir, monkeypatch):
    """The beat thread and the main loop both write status.json: a beat that took its
    snapshot first must not overwrite what the main loop wrote after it (here: a heartbeat
    that said "paused" after the worker had resumed)."""
    import training.worker as worker_module

    folder = run_dir / "workers" / "w1"
    _publish(cfg, folder, 0)
    worker = Worker(cfg, "w1", folder)
    real_write = worker_module.write_json_atomic
    snapshot_taken = threading.Event()

    def slow_for_the_beat(path, data):
        if threading.current_thread().name == "slow-beat":
            snapshot_taken.set()
            time.sleep(0.5)  # the main loop changes state and writes meanwhile
        real_write(path, data)

    monkeypatch.setattr(worker_module, "write_json_atomic", slow_for_the_beat)
    worker.paused = True
    beat = threading.Thread(target=worker._write_heartbeat, name="slow-beat")
    beat.start()
    assert snapshot_taken.wait(10)
    with worker._lock:
        worker.paused = False  # resumed
    worker._write_heartbeat()
    beat.join()
    assert _heartbeat(folder)["paused"] is False


def test_daemon_stops_cleanly_on_sigterm_with_a_custom_worker_class(cfg, run_dir):
    folder = run_dir / "workers" / "w1"
    _publish(cfg, folder, 0)
    config = run_dir / "config.yaml"
    from configs import dump_config

    config.write_text(dump_config(cfg))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard > 256
    proc = subprocess.Popen(  # started under a soft open-files limit of 256: it raises it
        [sys.executable, "start_worker.py", "--config", str(config), "--name", "w1", "--dir",
         str(folder), "--worker-class", "tests.test_worker:MarkingWorker"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)))
    try:
        wait_until(lambda: len(outbox_batches(folder / "outbox")) >= 2, 120, "two batches")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (folder / "custom_init.txt").read_text() == "w1"
    hb = json.loads((folder / "status.json").read_text())
    assert hb["state"] == "Offline" and hb["games_done"] > 0
    assert hb["discarded_games"] > 0  # tiny: 16 games in progress at any time
    total = sum(len(read_batch(folder / "outbox" / n)[1])
                for n in outbox_batches(folder / "outbox"))
    assert total == hb["games_done"]  # every finished game is in a batch, none half-written
    text = (folder / "logs" / "worker_w1.log").read_text()
    assert "worker w1 stopped" in text
    raised = re.search(r"open files limit: (\d+)", text)
    assert raised and int(raised.group(1)) > 256, text[:2000]
    if hard != resource.RLIM_INFINITY:
        assert int(raised.group(1)) == hard
    # what the daemon created is its user's alone (umask 077)
    made = [folder / "outbox", folder / "logs", folder / "logs" / "worker_w1.log",
            folder / "status.json", *(folder / "outbox").iterdir()]
    assert all(path.stat().st_mode & 0o077 == 0 for path in made), \
        [(path.name, oct(path.stat().st_mode)) for path in made]


def test_lower_priority_sets_the_process_and_its_session_group(tmp_path):
    """Local daemons yield the CPU to the trainer: nice value and, under Linux autogroup
    (each daemon is its own session), the session group's nice value."""
    import subprocess
    import sys

    code = ("import os; from training.worker import lower_priority; lower_priority(7); "
            "print(os.getpriority(os.PRIO_PROCESS, 0)); "
            "p = '/proc/self/autogroup'; print(open(p).read().split()[-1] if os.path.exists(p) "
            "else 'none')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         start_new_session=True, timeout=60, cwd=str(REPO))
    assert out.returncode == 0, out.stderr
    nice, group = out.stdout.split()
    assert int(nice) == os.getpriority(os.PRIO_PROCESS, 0) + 7
    assert group in ("7", "none")


def test_second_daemon_on_one_worker_folder_is_refused_naming_the_first(cfg, run_dir):
    """Two daemons on one folder would both reserve sequence 0 (one batch lost): the second
    is refused before it reads or reserves anything, in-process and from the command line."""
    from training.worker import EXIT_FOLDER_BUSY, WorkerFolderBusy

    folder = run_dir / "workers" / "w1"
    first = Worker(cfg, "w1", folder)
    with pytest.raises(WorkerFolderBusy) as err:
        Worker(cfg, "w1", folder)
    assert str(folder) in str(err.value) and f"pid {os.getpid()}" in str(err.value)
    proc = subprocess.run(
        [sys.executable, "-m", "training.worker", "--config", str(REPO / "configs" / "tiny.yaml"),
         "--name", "w1", "--dir", str(folder), "--gpu-id", "-1", "--log-to-stderr-only"],
        cwd=str(REPO), capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_FOLDER_BUSY, proc.stderr[-2000:]
    assert f"in use by another worker daemon (pid {os.getpid()})" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (folder / "worker_state.json").exists(), "the refused daemon reserved a number"
    first.release_folder()
    Worker(cfg, "w1", folder).release_folder()  # free again once the first lets go


def test_disk_filled_by_someone_else_shows_error_even_from_the_heartbeat_thread(cfg, tmp_path):
    """The heartbeat thread, not a batch write, is the first to meet the full disk (here: no
    model yet, so no batch is written at all). Its reserve-backed write must say Error: an
    "Active" heartbeat written with the reserve's space left nothing to report the full disk
    with, and the worker read Active forever (the disk-full test's 120 s timeout under load)."""
    folder = tmp_path / "small"
    folder.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        worker = Worker(cfg, "w1", folder)  # no model: it waits (Syncing), heartbeat beats
        t = threading.Thread(target=worker.run, daemon=True)
        t.start()
        try:
            wait_until(lambda: _heartbeat(folder).get("state") == "Syncing", 30,
                       "a first heartbeat")
            with open(folder / "filler", "wb", buffering=0) as f:  # someone fills the disk
                try:
                    while True:
                        f.write(b"\0" * 4096)
                except OSError:
                    pass
            wait_until(lambda: _heartbeat(folder).get("state") == "Error", 10,
                       "Error on a full disk")
            assert "space" in _heartbeat(folder)["last_error"]
        finally:
            worker.stop()
            t.join(timeout=30)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_one_retention_rule_for_every_workers_models_folder(tmp_path):
    """Local pushes and SSH pushes keep the same models: the newest two published."""
    assert model_store.stale_generations([3, 0, 2, 1, 2]) == [0, 1]
    assert model_store.stale_generations([5]) == []
    names = ["model_000004.json", "model_000004.pt.zst", "model_000007.json", "x.json",
             ".model_000009.json.tmp", "model_000008.pt.zst"]
    assert model_store.manifest_generations(names) == [4, 7]
    assert model_store.stale_files(4) == ("model_000004.json", "model_000004.pt.zst")


def test_the_one_folder_watcher_sees_writes_and_moves_of_matching_files_only(tmp_path):
    """The coach's config watch and the worker's models watch are `training.run.watch`."""
    from training.run.watch import watch

    changed = threading.Event()
    observer = watch(tmp_path, lambda p: p.endswith(".json"), changed)
    assert observer is not None
    try:
        (tmp_path / "notes.txt").write_text("x")
        assert not changed.wait(0.5)
        (tmp_path / "m.json.tmp").write_text("{}")
        os.replace(tmp_path / "m.json.tmp", tmp_path / "m.json")  # how manifests arrive
        assert changed.wait(5)
        changed.clear()
        (tmp_path / "m.json").read_text()  # reading never counts
        assert not changed.wait(0.5)
    finally:
        observer.stop()
        observer.join(timeout=5)


class _SlowToBuild(Worker):
    """Building generation 1's evaluator takes 3 s (a big net's export and warm-up)."""

    def load_evaluator(self, model_path):
        evaluate, generation = super().load_evaluator(model_path)
        if generation >= 1:
            self.build_started = time.monotonic()
            time.sleep(3.0)
        return evaluate, generation


def test_a_new_model_loads_while_the_games_go_on_then_goes_in(cfg, run_dir):
    folder = run_dir / "workers" / "w1"
    _publish(cfg, folder, 0)
    cfg = override(cfg, {"distributed.max_outbox_batches": 10_000})  # never paused here
    worker = _SlowToBuild(cfg, "w1", folder)
    t = threading.Thread(target=worker.run, kwargs={"max_games": 100_000})
    t.start()
    try:
        wait_until(lambda: worker.generation == 0 and worker.games_done > 0, 60, "gen 0 plays")
        _publish(cfg, folder, 1, seed=1)
        wait_until(lambda: hasattr(worker, "build_started"), 30, "the build of generation 1")
        before = worker.games_done
        time.sleep(2.0)  # inside the 3 s build
        assert worker.generation == 0
        assert worker.games_done > before, "self-play stopped while the model was built"
        wait_until(lambda: worker.generation == 1, 30, "generation 1 in use")
        phases = worker.switch_phases()
        assert phases["generation"] == 1 and phases["build_s"] >= 3.0
        assert "waited_s" in phases and phases["unpack_s"] < 5.0
        wait_until(lambda: _heartbeat(folder).get("generation") == 1, 10, "the heartbeat")
        assert _heartbeat(folder)["switch"]["generation"] == 1
    finally:
        worker.stop()
        t.join(timeout=60)
    assert not t.is_alive()
    assert [p.name for p in (folder / "cache").glob("model_*.pt")] == ["model_000001.pt"]


class _PlainEngine:
    """A custom self-play engine with only the documented methods (no offer_evaluator)."""

    def __init__(self, inner):
        self.inner = inner

    def step(self):
        return self.inner.step()

    def set_evaluator(self, evaluate, generation):
        self.inner.set_evaluator(evaluate, generation)

    def discard_unfinished(self):
        return self.inner.discard_unfinished()


class _PlainEngineWorker(Worker):
    def make_selfplay(self, evaluate, generation):
        return _PlainEngine(super().make_selfplay(evaluate, generation))


def test_a_custom_engine_without_offer_gets_the_new_model_between_steps(cfg, run_dir):
    folder = run_dir / "workers" / "w1"
    _publish(cfg, folder, 0)
    cfg = override(cfg, {"distributed.max_outbox_batches": 10_000})
    worker = _PlainEngineWorker(cfg, "w1", folder)
    t = threading.Thread(target=worker.run, kwargs={"max_games": 100_000})
    t.start()
    try:
        wait_until(lambda: worker.games_done > 0, 60, "generation 0 plays")
        _publish(cfg, folder, 1, seed=1)
        wait_until(lambda: worker.generation == 1, 30, "generation 1 in use")
        assert worker._selfplay.inner.generation == 1
    finally:
        worker.stop()
        t.join(timeout=60)
    assert not t.is_alive()
