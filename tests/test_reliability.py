"""Fault injection on the running pipeline, each test printing its figure.

The real coach (`start_main.py` as a subprocess, so it can be SIGKILLed) runs simulated worker
daemons (`training.simworker.SimWorker`: the real worker's folder protocol, random legal games,
and a `written.jsonl` ledger of every batch it wrote). After each fault the coach's
`ledger.jsonl` is compared with the workers' ledgers: every written batch ingested exactly
once, none lost. Distributed faults (a link down, a dead sshd) run the coach's SSH fleet
against hosts in network namespaces (`distributed.sshd_hosts.NetnsHosts`).

Figures are printed as `reliability <fault> key=value ...` (run with `-s` to see them;
docs/RELIABILITY.md has the table). `AZGO_LINK_DOWN_S` sets the outage of the link-down test
(default 12 s; docs/RELIABILITY.md's figure is for 30 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from distributed.status import WorkerState, parse_status_text
from tests.conftest import wait_until
from training.run import model_store
from training.simworker import read_written

REPO = Path(__file__).resolve().parent.parent
SIM = "training.simworker:SimWorker"

pytestmark = pytest.mark.slow


# ----------------------------------------------------------------------------- harness




def write_config(tmp: Path, **sections: dict) -> Path:
    """configs/tiny.yaml with short intervals, the run and logs under `tmp`, and overrides."""
    cfg = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    cfg["run"]["dir"] = str(tmp / "run")
    cfg["logging"]["dir"] = str(tmp / "logs")
    cfg["self_play"].update(workers=2, games_per_worker=100_000)  # no training unless asked
    cfg["distributed"].update(batch_size=5, heartbeat_interval_s=0.5, offline_after_s=3,
                              poll_interval_s=0.3, backoff_base_s=0.5, backoff_max_s=2,
                              stop_grace_s=3, max_outbox_batches=200)
    for section, values in sections.items():
        cfg[section].update(values)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


class CoachProc:
    """`start_main.py` with simulated local workers, as a subprocess we can kill."""

    def __init__(self, tmp: Path, config: Path, *extra: str, games_per_s: float = 20.0):
        self.tmp, self.config, self.extra = tmp, config, extra
        self.run = tmp / "run"
        self.status = tmp / "status.txt"
        # one torch thread for the coach's trainer and arena: their default (a thread a core)
        # on a machine whose cores the workers already keep busy makes every step wait for a
        # descheduled thread, 20 tiny steps taking 15 s instead of a fraction of one
        self.env = dict(os.environ, AZGO_SIM_GAMES_PER_S=str(games_per_s), OMP_NUM_THREADS="1")
        self.popen: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> CoachProc:
        self.starts += 1
        err = open(self.tmp / f"coach_{self.starts}.err", "wb")
        self.popen = subprocess.Popen(
            [sys.executable, str(REPO / "start_main.py"), "--config", str(self.config),
             "--worker-class", SIM, "--status-file", str(self.status), "--no-watch",
             "--cpu-only", *self.extra],
            cwd=str(self.tmp), env=self.env, stdout=subprocess.DEVNULL, stderr=err,
            stdin=subprocess.DEVNULL)
        err.close()
        return self

    def states(self) -> dict[str, WorkerState]:
        try:
            snap = parse_status_text(self.status.read_text())
        except (OSError, ValueError):
            return {}
        return {r.name: r.state for r in snap.workers}

    def all_active(self, names: list[str]) -> bool:
        s = self.states()
        return all(s.get(n) == WorkerState.ACTIVE for n in names)

    def worker_pid(self, name: str) -> int | None:
        try:
            return int((self.run / "workers" / name / "worker.pid").read_text())
        except (OSError, ValueError):
            return None

    def kill(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM: the coach stops its workers and collects what they flushed."""
        assert self.popen is not None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            raise

    def log_text(self) -> str:
        parts = [p.read_text(errors="replace") for p in sorted(self.tmp.glob("coach_*.err"))]
        return "\n".join(parts)

    def cleanup(self) -> None:
        """Kill whatever this test started that still runs (coach first, then daemons)."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=10)
        for pid_file in (self.run / "workers").glob("*/worker.pid"):
            try:
                pid = int(pid_file.read_text())
                if _cmdline(pid).count("start_worker.py"):
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def ledger(run: Path) -> list[dict]:
    path = run / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def check_exactly_once(run: Path, worker_dirs: list[Path], rejected_ok: frozenset = frozenset()
                       ) -> dict[str, int]:
    """Every batch a worker wrote is ingested exactly once; returns the counts."""
    entries = ledger(run)
    names = [e["name"] for e in entries]
    dupes = len(names) - len(set(names))
    ingested = {e["name"] for e in entries if e["status"] == "ingested"}
    replay = {p.name for p in (run / "replay").glob("*.npz.zst")}
    written = {w["name"] for d in worker_dirs for w in read_written(d)}
    left = {p.name for d in worker_dirs for p in (d / "outbox").glob("*.npz.zst")}
    lost = written - ingested - left
    assert dupes == 0, f"{dupes} batches counted twice"
    assert ingested == replay, (sorted(ingested ^ replay))[:5]
    assert not lost, f"written but never ingested: {sorted(lost)[:5]}"
    # a daemon killed between its rename and its ledger line leaves at most one unlisted batch
    assert len(ingested - written) <= 2, sorted(ingested - written)
    rejected = {e["name"] for e in entries if e["status"] != "ingested"}
    assert rejected == set(rejected_ok), rejected
    return {"written": len(written), "ingested": len(ingested), "duplicates": dupes,
            "lost": len(lost), "left_in_outbox": len(left)}


@pytest.fixture
def coach_factory(tmp_path):
    made: list[CoachProc] = []

    def make(config: Path, *extra: str, games_per_s: float = 20.0) -> CoachProc:
        c = CoachProc(tmp_path, config, *extra, games_per_s=games_per_s)
        made.append(c)
        return c

    yield make
    for c in made:
        c.cleanup()


# ----------------------------------------------------------------------------- local faults


def test_worker_sigkill_is_restarted_and_loses_no_batch(tmp_path, coach_factory):
    coach = coach_factory(write_config(tmp_path)).start()
    names = ["worker1", "worker2"]
    wait_until(lambda: coach.all_active(names), 120, "both workers Active")
    wait_until(lambda: len(ledger(coach.run)) >= 4, 60, "batches ingested")
    old = coach.worker_pid("worker1")
    assert old and "start_worker.py" in _cmdline(old)
    os.kill(old, signal.SIGKILL)
    t0 = time.monotonic()
    wait_until(lambda: coach.states().get("worker1") != WorkerState.ACTIVE
          or coach.worker_pid("worker1") != old, 30, "the kill to be noticed")
    folder = coach.run / "workers" / "worker1"
    wait_until(lambda: _heartbeat(folder).get("pid") not in (None, old)
          and _heartbeat(folder).get("state") == "Active"
          and coach.states().get("worker1") == WorkerState.ACTIVE, 120,
          "worker1's new daemon Active")
    back_s = time.monotonic() - t0
    n_before = len(ledger(coach.run))
    wait_until(lambda: len(ledger(coach.run)) > n_before + 2, 60, "collection to go on")
    assert coach.stop() == 0, coach.log_text()[-2000:]
    counts = check_exactly_once(coach.run, [coach.run / "workers" / n for n in names])
    print(f"reliability worker_sigkill active_again_s={back_s:.1f} lost={counts['lost']} "
          f"duplicates={counts['duplicates']} written={counts['written']} "
          f"ingested={counts['ingested']}")


def test_coach_sigkill_during_collection_counts_every_batch_once(tmp_path, coach_factory):
    config = write_config(tmp_path)
    coach = coach_factory(config, games_per_s=40.0)
    names = ["worker1", "worker2"]
    kills = 3
    coach.start()
    wait_until(lambda: coach.all_active(names), 120, "both workers Active")
    for k in range(kills):
        n = len(ledger(coach.run))
        wait_until(lambda: len(ledger(coach.run)) >= n + 3 + k, 60, "batches being ingested")
        pids = {w: coach.worker_pid(w) for w in names}
        coach.kill()  # mid-collection: batches arrive every poll
        time.sleep(0.5 + 0.3 * k)
        coach.start()
        wait_until(lambda: coach.all_active(names), 120, "workers Active after the coach restart")
        assert {w: coach.worker_pid(w) for w in names} == pids, "daemons were not adopted"
        if k == 0:  # a hostile batch: quarantined once, counted across the restarts
            bad = _hostile_batch(coach.run / "workers" / "worker2" / "outbox", "worker2")
    n = len(ledger(coach.run))
    wait_until(lambda: len(ledger(coach.run)) >= n + 3, 60, "collection after the last restart")
    wait_until(lambda: "1 batches rejected" in _row_error(coach, "worker2"), 30,
          "the rejection in worker2's status row")
    assert coach.stop() == 0, coach.log_text()[-2000:]
    assert not list((coach.run / "incoming").iterdir())
    assert (coach.run / "quarantine" / bad).exists()
    counts = check_exactly_once(coach.run, [coach.run / "workers" / n for n in names],
                                rejected_ok=frozenset([bad]))
    print(f"reliability coach_sigkill_collecting kills={kills} written={counts['written']} "
          f"ingested={counts['ingested']} duplicates={counts['duplicates']} "
          f"lost={counts['lost']} hostile_rejected=1 shown_in_status=1")


def _hostile_batch(outbox: Path, worker: str) -> str:
    """A batch with an illegal move (a stone on an occupied point) under a valid name."""
    import dataclasses

    import numpy as np

    from training.go import records

    rng = np.random.default_rng(5)
    recs = [records.random_record(5, 0.5, rng, simulations=8) for _ in range(3)]
    moves = recs[0].moves.copy()
    moves[1] = moves[0]
    recs[0] = dataclasses.replace(recs[0], moves=moves)
    name = records.batch_name(worker, 0, 90_000_000)
    records.write_batch(outbox / name, recs, records.BatchMeta.from_records(worker, recs))
    return name


def _row_error(coach: CoachProc, name: str) -> str:
    try:
        rows = parse_status_text(coach.status.read_text()).workers
    except (OSError, ValueError):
        return ""
    return next((r.last_error for r in rows if r.name == name), "")


def _trainer_pid(coach: CoachProc) -> int | None:
    for pid in _children(coach.popen.pid):
        if "training.trainer" in _cmdline(pid):
            return pid
    return None


def test_coach_sigkill_during_training_then_resume_trains_once(tmp_path, coach_factory):
    # no arena after the round: nothing here is about it (the local end-to-end test runs it)
    config = write_config(tmp_path, self_play={"games_per_worker": 10}, evaluation={"games": 0})
    coach = coach_factory(config, "--iterations", "1", games_per_s=5.0)
    names = ["worker1", "worker2"]
    coach.start()
    wait_until(lambda: _trainer_pid(coach), 240, "a training round to start")
    trainer = _trainer_pid(coach)
    coach.kill()
    wait_until(lambda: not Path(f"/proc/{trainer}").exists()
          or "training.trainer" not in _cmdline(trainer), 20,
          "the orphaned trainer to exit with its coach")
    coach.start()
    code = coach.popen.wait(timeout=400)
    assert code == 0, coach.log_text()[-3000:]
    gens = model_store.list_manifests(coach.run / "models")
    assert gens == [0, 1], gens
    counts = check_exactly_once(coach.run, [coach.run / "workers" / n for n in names])
    print(f"reliability coach_sigkill_training trainer_orphaned=0 generations={gens} "
          f"written={counts['written']} ingested={counts['ingested']} "
          f"duplicates={counts['duplicates']} lost={counts['lost']}")


def test_trainer_killed_round_fails_cleanly_and_is_retried(tmp_path, coach_factory):
    config = write_config(tmp_path, self_play={"games_per_worker": 10, "workers": 1},
                          evaluation={"games": 0})  # no arena after the round, as above
    coach = coach_factory(config, "--iterations", "1", games_per_s=5.0)
    coach.start()
    wait_until(lambda: _trainer_pid(coach), 240, "a training round to start")
    first = _trainer_pid(coach)
    time.sleep(1.0)  # let it get into its steps (torch import, data)
    os.kill(first, signal.SIGKILL)
    t0 = time.monotonic()
    wait_until(lambda: _trainer_pid(coach) not in (None, first), 120, "the round to be retried")
    retry_s = time.monotonic() - t0
    code = coach.popen.wait(timeout=400)
    assert code == 0, coach.log_text()[-3000:]
    assert model_store.list_manifests(coach.run / "models") == [0, 1]
    text = (tmp_path / "logs" / "distributed_training.log").read_text()
    assert "failed (exit -9" in text, text[-2000:]
    print(f"reliability trainer_killed retried_after_s={retry_s:.1f} generation_published=1")


def _status_rows(coach: CoachProc) -> dict:
    try:
        return {r.name: r for r in parse_status_text(coach.status.read_text()).workers}
    except (OSError, ValueError):
        return {}


class StatusWatch:
    """Samples status.txt's modification time every 0.05 s in a thread: the longest gap
    between two rewrites seen (what a user watching the file would see as staleness)."""

    def __init__(self, path: Path):
        import threading

        self.path, self.gaps, self._stop = path, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last, changed = None, time.monotonic()
        while not self._stop.is_set():
            try:
                m = self.path.stat().st_mtime_ns
            except OSError:
                m = None
            now = time.monotonic()
            if m != last:
                if last is not None:
                    self.gaps.append(now - changed)
                last, changed = m, now
            time.sleep(0.05)
        self.gaps.append(time.monotonic() - changed)

    def __enter__(self) -> StatusWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def longest_s(self) -> float:
        return max(self.gaps, default=0.0)


def test_hostile_heartbeat_shows_error_and_stalls_nothing(tmp_path, coach_factory):
    """worker2's daemon paused (SIGSTOP) and its status.json replaced by hostile files: a
    wrong type, a FIFO, escape sequences. worker2 reads Error with a printable reason, the
    coach keeps rewriting status.txt every poll and keeps collecting worker1."""
    coach = coach_factory(write_config(tmp_path)).start()
    names = ["worker1", "worker2"]
    wait_until(lambda: coach.all_active(names), 120, "both workers Active")
    hb_path = coach.run / "workers" / "worker2" / "status.json"
    pid2 = coach.worker_pid("worker2")
    os.kill(pid2, signal.SIGSTOP)
    figures = {}
    try:
        with StatusWatch(coach.status) as watch:
            good = json.loads(hb_path.read_text())
            for case, marker, write in [
                ("wrong_type", "games_per_s", lambda: hb_path.write_text(json.dumps(
                    {**good, "games_per_s": "fast", "time": time.time()}))),
                ("fifo", "not a regular file", lambda: (hb_path.unlink(), os.mkfifo(hb_path))),
                ("huge", "bytes, over",
                 lambda: (hb_path.unlink(), hb_path.write_bytes(b" " * (8 << 20)))),
            ]:
                n1 = _ingested(coach, "worker1")
                write()
                t0 = time.monotonic()
                wait_until(lambda: _status_rows(coach).get("worker2") is not None
                      and _status_rows(coach)["worker2"].state == WorkerState.ERROR
                      and marker in _row_error(coach, "worker2"), 20,
                      f"worker2 Error after a {case} heartbeat")
                figures[case] = time.monotonic() - t0
                row = _status_rows(coach)["worker2"]
                assert "heartbeat" in row.last_error, row.last_error
                assert row.last_error.isprintable(), row.last_error
                wait_until(lambda: _ingested(coach, "worker1") > n1 + 1, 30,
                      f"worker1 collected with worker2's {case} heartbeat")
                assert _status_rows(coach)["worker1"].state == WorkerState.ACTIVE
            hb_path.unlink()  # escape sequences in a well-formed heartbeat's last_error
            hb_path.write_text(json.dumps({**good, "time": time.time(), "state": "Error",
                                           "last_error": "\x1b[2J\x1b[31mboom\x07\x1b]0;t\x07"}))
            wait_until(lambda: "boom" in _row_error(coach, "worker2"), 20, "worker2's own error")
            text = coach.status.read_text()
            assert "\x1b" not in text and "\x07" not in text
    finally:
        os.kill(pid2, signal.SIGCONT)
    wait_until(lambda: coach.all_active(names), 60, "worker2 Active again once it writes again")
    assert coach.stop() == 0, coach.log_text()[-2000:]
    check_exactly_once(coach.run, [coach.run / "workers" / n for n in names])
    assert watch.longest_s < 0.3 + 2.0, watch.gaps  # poll_interval_s 0.3, a busy machine
    print("reliability hostile_heartbeat " + " ".join(
        f"{k}_error_shown_s={v:.1f}" for k, v in figures.items())
        + f" status_longest_gap_s={watch.longest_s:.2f} worker1_collected=yes")


def _ingested(coach: CoachProc, name: str) -> int:
    return sum(1 for e in ledger(coach.run) if e["worker"] == name)


# ----------------------------------------------------------------------------- worker-side faults


def _publish_fake_model(models: Path, generation: int, payload: bytes) -> model_store.Manifest:
    """A published model whose `.pt` is a zip archive (all SimWorker checks of a model)."""
    import zipfile

    src = models.parent / f"src{generation}"
    src.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(src / f"{model_store.model_stem(generation)}.pt", "w") as z:
        z.writestr("data.pkl", payload)
    m = model_store.publish_model(src, generation)
    model_store.copy_published(src, m, models)
    return m


def _daemon(folder: Path, config: Path, name: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "training.simworker", "--config", str(config), "--name", name,
         "--dir", str(folder), "--games-per-s", "20", *extra], cwd=str(REPO),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _heartbeat(folder: Path) -> dict:
    try:
        return json.loads((folder / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def test_model_corrupted_in_transit_keeps_the_previous_model(tmp_path):
    config = write_config(tmp_path)
    folder = tmp_path / "w"
    _publish_fake_model(folder / "models", 0, b"gen0")
    proc = _daemon(folder, config, "w1")
    try:
        wait_until(lambda: _heartbeat(folder).get("generation") == 0
              and _heartbeat(folder).get("state") == "Active", 60, "generation 0 in use")
        m = _publish_fake_model(tmp_path / "pub", 1, b"gen1" * 1000)
        data = bytearray((tmp_path / "pub" / m.zst_name).read_bytes())
        data[len(data) // 2] ^= 0xFF  # one flipped bit on the wire; the manifest is intact
        (folder / "models" / m.zst_name).write_bytes(bytes(data))
        (folder / "models" / m.json_name).write_text(
            (tmp_path / "pub" / m.json_name).read_text())
        t = wait_until(lambda: "refused" in _heartbeat(folder).get("last_error", ""), 60,
                  "the corrupt model to be refused")
        hb = _heartbeat(folder)
        assert hb["generation"] == 0, hb
        assert "sha256" in hb["last_error"] or "bytes" in hb["last_error"], hb["last_error"]
        n = hb["games_done"]
        wait_until(lambda: _heartbeat(folder).get("games_done", 0) > n + 10, 30,
                   "self-play to go on")
        state_after = _heartbeat(folder).get("state")
        fixed = _publish_fake_model(tmp_path / "pub2", 2, b"gen2")
        model_store.copy_published(tmp_path / "pub2", fixed, folder / "models")
        wait_until(lambda: _heartbeat(folder).get("generation") == 2, 60, "a good model to load")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    print(f"reliability corrupt_model refused_in_s={t:.1f} kept_generation=0 "
          f"state_after_refusal={state_after} then_loaded_generation=2")
    if state_after == "Syncing":
        pytest.xfail("training.worker: after refusing a model while one is in use the heartbeat "
                     "stays Syncing (the state set before loading is never restored); it "
                     "should be Active or Error (reported to the coach owner)")
    assert state_after in ("Active", "Error")


def _tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")


def test_worker_disk_full_shows_error_and_ingests_no_partial_batch(tmp_path, run_dir):
    """The worker folder on a 400 KB tmpfs: the daemon stays up in Error, nothing partial is
    collected, and once the coach's collection frees space it writes its kept games."""
    from training.fleet.collector import Collector, LocalSource
    from training.fleet.validation import validate_with_records

    config = write_config(tmp_path, distributed={"batch_size": 40, "max_outbox_batches": 1000})
    folder = tmp_path / "small"
    written = tmp_path / "written.jsonl"  # outside the full disk
    _tmpfs(folder, "400k")
    col = Collector(run_dir, validate_with_records(5, 0.5))
    try:
        _publish_fake_model(folder / "models", 0, b"gen0")
        proc = _daemon(folder, config, "w1", "--games-per-s", "400", "--ledger", str(written))
        try:
            t = wait_until(lambda: proc.poll() is not None
                      or _heartbeat(folder).get("state") == "Error", 120, "the disk to fill")
            hb = _heartbeat(folder)
            assert proc.poll() is None, "the daemon died on a full disk"
            assert hb["state"] == "Error" and "space" in hb["last_error"].lower(), hb
            leftovers = [p.name for p in (folder / "outbox").iterdir()]
            first = col.collect("w1", LocalSource(folder / "outbox"))
            back = wait_until(lambda: _heartbeat(folder).get("state") == "Active"
                         and _heartbeat(folder).get("batches_written", 0) > len(first.ingested),
                         60, "the worker to write again once space is free")
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            second = col.collect("w1", LocalSource(folder / "outbox"))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
    assert first.rejected == [] and second.rejected == [], "a partial batch reached validation"
    ingested = first.ingested + second.ingested
    names = {w["name"] for w in read_written(written)}
    assert set(ingested) == names and len(ingested) == len(set(ingested))
    print(f"reliability disk_full error_shown_s={t:.1f} heartbeat_state=Error "
          f"active_again_after_collect_s={back:.1f} ingested={len(ingested)} "
          f"written={len(names)} partial_ingested=0 "
          f"tmp_left={sum(n.endswith('.tmp') for n in leftovers)}")


# ----------------------------------------------------------------------------- SSH faults

from tests.sshd import netns_hosts  # noqa: E402,F401 - fixture (module scope, 3 hosts)

LINK_DOWN_S = float(os.environ.get("AZGO_LINK_DOWN_S", "12"))


def sim_cluster(tmp: Path, hosts) -> Any:
    """The real coach in distributed mode (a thread of this process) collecting from
    simulated daemons on the namespace hosts, with short timeouts (`SimCluster` of
    benchmarks/pipeline.py)."""
    from benchmarks.pipeline import SimCluster

    return SimCluster(tmp, hosts.n, config=REPO / "configs" / "tiny.yaml", games_per_s=10.0,
                      hosts=hosts, overrides={
                          "distributed.batch_size": 5, "distributed.heartbeat_interval_s": 0.5,
                          "distributed.offline_after_s": 3, "distributed.poll_interval_s": 0.3,
                          "distributed.connect_timeout_s": 2,
                          "distributed.command_timeout_s": 15,
                          "distributed.transfer_timeout_s": 5, "distributed.retries": 1,
                          "distributed.backoff_base_s": 0.3, "distributed.backoff_max_s": 2,
                          "distributed.keepalive_s": 1, "distributed.stop_grace_s": 2})


def _ingested_by(sim: Any, name: str) -> int:
    return sum(1 for e in sim.ledger() if e["worker"] == name)


def _worker_dirs(sim: Any) -> list[Path]:
    return [sim.worker_dir(i) for i in range(1, sim.n + 1)]


@pytest.mark.ssh
@pytest.mark.netns
def test_link_down_worker_offline_then_active_without_duplicates(netns_hosts, tmp_path):
    sim = sim_cluster(tmp_path, netns_hosts).start()
    try:
        wait_until(sim.all_active, 180, "three workers Active")
        wait_until(lambda: _ingested_by(sim, "sim01") >= 2, 60, "batches from sim01")
        others = {n: _ingested_by(sim, n) for n in ("sim02", "sim03")}
        t_before, w_before = time.monotonic(), time.time()
        time.sleep(4.0)
        rate_before = sum(_ingested_by(sim, n) - c for n, c in others.items()) / (
            time.monotonic() - t_before)
        gap_before = _longest_ingest_gap(sim, ("sim02", "sim03"), w_before, time.time())
        watch = StatusWatch(sim.status).__enter__()
        netns_hosts.link_down(1)
        t0 = time.monotonic()
        w0 = time.time()
        others = {n: _ingested_by(sim, n) for n in ("sim02", "sim03")}
        try:
            offline_s = wait_until(lambda: sim.states().get("sim01") == WorkerState.OFFLINE, 60,
                              "sim01 Offline")
            time.sleep(max(0.0, LINK_DOWN_S - (time.monotonic() - t0)))
            assert all(sim.states().get(n) == WorkerState.ACTIVE for n in others)
            rate_during = sum(_ingested_by(sim, n) - c for n, c in others.items()) / (
                time.monotonic() - t0)
            assert rate_during > 0, "the other workers' batches stalled during the outage"
            gap_during = _longest_ingest_gap(sim, ("sim02", "sim03"), w0, time.time())
        finally:
            netns_hosts.link_up(1)
            watch.__exit__()
        # the cut host reads Offline within offline_after_s (3 s) plus the heartbeat interval,
        # a poll and a busy machine's slack; status.txt was rewritten every poll meanwhile;
        # the others' batches came as often as before the cut
        assert offline_s < 3 + 4.0, offline_s
        assert watch.longest_s < 0.3 + 2.0, sorted(watch.gaps)[-5:]
        assert gap_during < max(2 * gap_before, gap_before + 3.0), (gap_before, gap_during)
        t1 = time.monotonic()
        n1 = _ingested_by(sim, "sim01")
        active_s = wait_until(lambda: sim.states().get("sim01") == WorkerState.ACTIVE
                         and _ingested_by(sim, "sim01") > n1, 120, "sim01 Active again")
    finally:
        sim.close()
    counts = check_exactly_once(sim.run, _worker_dirs(sim))
    print(f"reliability link_down outage_s={t1 - t0:.0f} offline_after_s={offline_s:.1f} "
          f"active_again_s={active_s:.1f} duplicates={counts['duplicates']} "
          f"lost={counts['lost']} ingested={counts['ingested']} "
          f"others_batches_per_s_before={rate_before:.2f} during={rate_during:.2f} "
          f"others_longest_gap_s_before={gap_before:.1f} during={gap_during:.1f} "
          f"status_longest_gap_s={watch.longest_s:.2f}")


def _longest_ingest_gap(sim: Any, names: tuple[str, ...], t0: float, t1: float) -> float:
    """The longest wait between two ingests of any of `names` in [t0, t1] (unix time)."""
    times = sorted([t0, t1] + [e["time"] for e in sim.ledger()
                               if e["worker"] in names and t0 <= e["time"] <= t1])
    return max(b - a for a, b in zip(times, times[1:]))


@pytest.mark.ssh
@pytest.mark.netns
def test_sshd_killed_worker_offline_others_unaffected(netns_hosts, tmp_path):
    sim = sim_cluster(tmp_path, netns_hosts).start()
    try:
        wait_until(sim.all_active, 180, "three workers Active")
        netns_hosts.kill_sshd(2)
        try:
            offline_s = wait_until(lambda: sim.states().get("sim02") == WorkerState.OFFLINE, 60,
                              "sim02 Offline")
            others = {n: _ingested_by(sim, n) for n in ("sim01", "sim03")}
            time.sleep(3.0)
            assert all(sim.states().get(n) == WorkerState.ACTIVE for n in others)
            assert all(_ingested_by(sim, n) > c for n, c in others.items()), "others stalled"
        finally:
            netns_hosts.restart_sshd(2)
        n2 = _ingested_by(sim, "sim02")
        active_s = wait_until(lambda: sim.states().get("sim02") == WorkerState.ACTIVE
                         and _ingested_by(sim, "sim02") > n2, 120, "sim02 Active again")
    finally:
        sim.close()
    counts = check_exactly_once(sim.run, _worker_dirs(sim))
    print(f"reliability sshd_killed offline_after_s={offline_s:.1f} others_active=2/2 "
          f"active_again_after_restart_s={active_s:.1f} duplicates={counts['duplicates']} "
          f"lost={counts['lost']}")
