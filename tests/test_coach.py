"""The collector's exactly-once ingestion; the coach's load balancing, rounds and status."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from configs import override
from distributed.status import Heartbeat, WorkerState, parse_status_text
from training.fleet import balance
from training.fleet.collector import Collector, LocalSource
from training.fleet.validation import validate_with_records
from training.go.records import BatchMeta, random_record, write_batch

N, KOMI = 5, 0.5


def _batch(outbox: Path, worker: str, seq: int, games: int = 3, *, size: int = N,
           generation: int = 0, honest: bool = False) -> str:
    """A batch of random games (`honest`: passing as the run's self-play does)."""
    rng = np.random.default_rng(seq)
    records = [random_record(size, KOMI, rng, generation=generation, seed=seq * 100 + i,
                             honest_passes=honest)
               for i in range(games)]
    name = f"{worker}_{generation:06d}_{seq:08d}.npz.zst"
    outbox.mkdir(parents=True, exist_ok=True)
    write_batch(outbox / name, records, BatchMeta.from_records(worker, records))
    return name


def _collector(run_dir: Path) -> Collector:
    return Collector(run_dir, validate_with_records(N, KOMI))


def _ledger(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "ledger.jsonl").read_text().splitlines()]


def test_batches_are_ingested_once_and_the_worker_copy_deleted(run_dir, tmp_path):
    outbox = tmp_path / "outbox"
    names = [_batch(outbox, "w1", s) for s in range(3)]
    c = _collector(run_dir)
    res = c.collect("w1", LocalSource(outbox))
    assert res.ingested == names and res.games == 9
    assert sorted(p.name for p in (run_dir / "replay").iterdir()) == names
    assert not list(outbox.iterdir())
    # the worker (or a copy left by a crash) offers the same name again: only deleted
    (outbox / names[0]).write_bytes((run_dir / "replay" / names[0]).read_bytes())
    res = _collector(run_dir).collect("w1", LocalSource(outbox))
    assert res.ingested == [] and res.duplicates == 1 and not list(outbox.iterdir())
    assert [e["name"] for e in _ledger(run_dir)] == names


def test_coach_killed_between_rename_and_ledger_counts_the_batch_once(run_dir, tmp_path):
    outbox = tmp_path / "outbox"
    name = _batch(outbox, "w1", 0)
    # the state a coach leaves when it dies after the rename into replay/ but before the
    # ledger line and the delete on the worker
    (run_dir / "replay").mkdir()
    (run_dir / "replay" / name).write_bytes((outbox / name).read_bytes())
    (run_dir / "incoming").mkdir()
    (run_dir / "incoming" / "w1_000000_00000001.npz.zst.partial").write_bytes(b"half")
    c = _collector(run_dir)
    assert [e["name"] for e in _ledger(run_dir)] == [name]
    assert c.tally["w1"].games == 3
    assert not list((run_dir / "incoming").iterdir())
    res = c.collect("w1", LocalSource(outbox))
    assert res.duplicates == 1 and res.ingested == []
    assert len(_ledger(run_dir)) == 1 and c.next_seq("w1") == 1


def test_torn_ledger_line_is_skipped_and_rebuilt_from_replay(run_dir, tmp_path):
    outbox = tmp_path / "outbox"
    names = [_batch(outbox, "w1", s) for s in range(2)]
    _collector(run_dir).collect("w1", LocalSource(outbox))
    text = (run_dir / "ledger.jsonl").read_text()
    (run_dir / "ledger.jsonl").write_text(text[: len(text) - 20])  # crash mid-append
    c = _collector(run_dir)
    assert sorted(c.entries) == names and c.tally["w1"].games == 6


@pytest.mark.parametrize("kind", ["corrupt", "wrong_board", "foreign_name"])
def test_bad_batches_are_quarantined_and_counted_per_worker(run_dir, tmp_path, kind):
    outbox = tmp_path / "outbox"
    good = _batch(outbox, "w1", 0)
    if kind == "corrupt":
        bad = _batch(outbox, "w1", 1)
        data = bytearray((outbox / bad).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (outbox / bad).write_bytes(bytes(data))
    elif kind == "wrong_board":
        bad = _batch(outbox, "w1", 1, size=7)
    else:  # another worker's name in w1's outbox
        bad = _batch(outbox, "w2", 5)
    c = _collector(run_dir)
    res = c.collect("w1", LocalSource(outbox))
    assert res.ingested == [good] and res.rejected == [bad]
    kept = c.quarantine_path("w1", bad)  # another worker's name: never under that name
    assert kept.exists() and not (kind == "foreign_name" and c.is_known(bad))
    reason = kept.with_name(kept.name + ".reason.txt").read_text()
    assert bad in reason or "w1" in reason
    assert c.tally["w1"].rejected == 1 and c.tally["w1"].batches == 1
    assert not list(outbox.iterdir())
    # on restart the rejected name stays known
    assert _collector(run_dir).tally["w1"].rejected == 1


def test_collect_stops_at_max_games_and_leaves_the_rest(run_dir, tmp_path):
    outbox = tmp_path / "outbox"
    names = [_batch(outbox, "w1", s) for s in range(4)]
    res = _collector(run_dir).collect("w1", LocalSource(outbox), max_games=5)
    assert res.ingested == names[:2]
    assert sorted(p.name for p in outbox.iterdir()) == names[2:]


# ------------------------------------------------------------------ coach: load balancing


def _coach(cfg, run_dir, names, **overrides):
    """A coach with a local fleet of `names` (worker1..N; no process started) whose workers
    all read Active."""
    from training.coach import Coach
    from training.fleet.local_workers import LocalFleet

    cfg = override(cfg, {"run.dir": str(run_dir), **overrides})
    coach = Coach(cfg, status_path=run_dir / "status.txt", watch_config=False)
    coach.collector = _collector(run_dir)
    coach.fleet = LocalFleet(cfg, run_dir, run_dir / "config.yaml",
                             lambda c: ["cpu"] * len(names))
    assert coach.fleet.names() == names
    for n in names:
        coach.fleet.members[n].heartbeat = Heartbeat(
            name=n, state=WorkerState.ACTIVE, pid=1, generation=0, games_per_s=1.0,
            games_done=7, time=0.0)
        coach.states[n] = WorkerState.ACTIVE
    return coach


def test_weights_set_each_workers_share_of_a_generation():
    names = ["worker1", "worker2"]
    configured = {"worker1": 1.0, "worker2": 2.0}
    weights = balance.weights(names, configured, True, {})
    assert balance.capped(True, configured)
    # G = games_per_worker (20) x 2 active = 40 games: 1/3 and 2/3 of it
    target = balance.generation_target(20, 2)
    assert target == 40
    assert balance.quotas(names, names, weights, {"worker1": 0, "worker2": 0}, target) == {
        "worker1": 14, "worker2": 27}
    # worker2 ahead of its share: must wait
    quotas = balance.quotas(names, names, weights, {"worker1": 5, "worker2": 30}, target)
    assert quotas["worker2"] == 0 and quotas["worker1"] == 9
    # both at their share: the next round of quotas opens for both, in the same ratio
    assert balance.quotas(names, names, weights, {"worker1": 14, "worker2": 30}, target) == {
        "worker1": 13, "worker2": 24}
    # worker2 Offline: training goes on without it
    target = balance.generation_target(20, 1)
    assert target == 20
    assert balance.quotas(names, ["worker1"], weights, {"worker1": 14, "worker2": 30},
                          target)["worker2"] is None


def test_without_weights_nothing_is_capped_and_weight_is_measured_speed():
    names = ["worker1", "worker2"]
    assert balance.weights(names, {}, True, {"worker1": 1.0, "worker2": 3.0}) == {
        "worker1": 1.0, "worker2": 3.0}
    # nothing is capped: a generation's games come from whoever plays them
    assert not balance.capped(True, {})
    assert balance.quotas(names, names, None, {"worker1": 0, "worker2": 0}, 40) == {
        "worker1": None, "worker2": None}
    assert balance.generation_target(20, 1) == 20  # worker2 Offline: training goes on


def test_the_coach_balances_with_its_config_and_its_workers_numbers(tiny_cfg, run_dir):
    """The coach hands `training.fleet.balance` the configured weights, its active workers and the
    games each delivered this generation; its supervisors get the quotas."""
    cfg = override(tiny_cfg, {"distributed.workers": [
        {"host": "a", "user": "u"}, {"host": "b", "user": "u"}]})
    coach = _coach(cfg, run_dir, ["worker1", "worker2"],
                   **{"distributed.worker_weights": {"worker1": 1.0, "worker2": 2.0}})
    members = coach.fleet.members
    members["worker1"].games_collected, members["worker2"].games_collected = 5, 30
    assert coach.generation_target() == 40
    coach._set_quotas()
    assert (members["worker1"].quota, members["worker2"].quota) == (9, 0)
    coach.states["worker2"] = WorkerState.OFFLINE
    assert coach.generation_target() == 20 and coach.quotas()["worker2"] is None


def test_status_file_shows_states_weights_and_shares(tiny_cfg, run_dir):
    coach = _coach(tiny_cfg, run_dir, ["worker1", "worker2"])
    coach.fleet.members["worker1"].games_collected = 30
    coach.fleet.members["worker2"].games_collected = 10
    coach.states["worker2"] = WorkerState.OFFLINE
    coach.generations.generation = 3
    from training.fleet.collector import WorkerTally

    coach.collector.tally["worker2"] = WorkerTally(batches=1, games=10, rejected=2)
    coach._write_status()
    snap = parse_status_text((run_dir / "status.txt").read_text())
    assert snap.workers_active == 1 and snap.workers_total == 2 and snap.generation == 3
    rows = {r.name: r for r in snap.workers}
    assert rows["worker1"].state == WorkerState.ACTIVE
    assert rows["worker2"].state == WorkerState.OFFLINE
    assert rows["worker1"].share == pytest.approx(0.75) and rows["worker2"].share == 0.25
    assert rows["worker2"].games == 10 and "2 batches rejected" in rows["worker2"].last_error
    # the games each daemon finished (its heartbeat) beside the games collected
    assert rows["worker1"].games == 0 and rows["worker1"].played == 7


def test_the_rejection_budget_is_the_config_key(tiny_cfg, run_dir):
    from training.coach import Coach

    cfg = override(tiny_cfg, {"distributed.max_rejected_batches": 3, "run.dir": str(run_dir)})
    coach = Coach(cfg, status_path=run_dir / "status.txt", watch_config=False)
    coach.setup()  # builds the collector as a run does (no worker is started)
    assert coach.collector.max_rejected == 3


def test_a_worker_over_its_rejection_budget_reads_error_with_the_reason(tiny_cfg, run_dir):
    coach = _coach(tiny_cfg, run_dir, ["worker1", "worker2"])
    assert hasattr(coach.collector, "over_budget"), "the collector reports rejection budgets"
    coach.collector.over_budget["worker2"] = "\x1b[31m50 files rejected\x1b[0m: collection stopped"
    coach._observe()
    assert coach.states == {"worker1": WorkerState.ACTIVE, "worker2": WorkerState.ERROR}
    coach._write_status()
    rows = {r.name: r for r in parse_status_text((run_dir / "status.txt").read_text()).workers}
    assert rows["worker2"].state == WorkerState.ERROR
    assert rows["worker2"].last_error.startswith("50 files rejected: collection stopped")


def test_a_config_change_of_the_board_or_the_net_is_refused_and_the_rest_kept(
        tiny_cfg, run_dir, caplog):
    from configs import dump_config

    coach = _coach(tiny_cfg, run_dir, ["worker1"])
    coach.config_path = run_dir / "user.yaml"
    changed = override(coach.cfg, {"go.board_size": 7, "net.filters": 64,
                                   "distributed.offline_after_s": 99.0})
    coach.config_path.write_text(dump_config(changed))
    with caplog.at_level("ERROR"):
        coach._reload_config()
    assert coach.cfg.go == tiny_cfg.go and coach.cfg.net == tiny_cfg.net
    assert "go.board_size 5 -> 7" in caplog.text and "net.filters" in caplog.text
    assert coach.cfg.distributed.offline_after_s == 99.0  # the other keys apply
    assert "filters: 16" in (run_dir / "config.yaml").read_text()  # what the trainer reads
    coach.config_path.write_text(dump_config(override(coach.cfg, {"net.inference": "trace"})))
    coach._reload_config()
    assert coach.cfg.net.inference == "trace"  # how searches run the net is not the net


def test_a_failing_stage_of_the_loop_never_stops_the_later_ones(tiny_cfg, run_dir, caplog):
    coach = _coach(tiny_cfg, run_dir, ["worker1"])
    coach.requests_dir = run_dir / "requests"

    def _handle_requests():
        raise ValueError("a bad restart-request entry")

    coach._handle_requests = _handle_requests
    advanced = []
    coach._advance_training = lambda: advanced.append(1)
    with caplog.at_level("ERROR"):
        coach._step()
    assert "handle requests failed" in caplog.text
    assert advanced == [1], "the training stage ran after the failed one"
    assert (run_dir / "status.txt").exists(), "status.txt is written after a failed stage"


def test_status_file_and_requests_are_under_the_folder_the_user_runs_in(tiny_cfg, tmp_path,
                                                                        monkeypatch):
    from training.coach import Coach

    monkeypatch.chdir(tmp_path)
    coach = Coach(override(tiny_cfg, {"run.dir": str(tmp_path / "run")}), watch_config=False)
    assert coach.status_path.resolve() == tmp_path / "distributed" / "status.txt"
    assert coach.requests_dir.resolve() == tmp_path / "distributed" / "requests"


def test_a_relative_run_dir_and_log_dir_are_the_coachs_folder_for_workers_and_trainer(
        tiny_cfg, tmp_path, monkeypatch):
    """The daemons and the trainer run in the repository: the paths they are given are the
    ones the coach means, resolved from the folder it was started in."""
    from training.coach import Coach
    from training.fleet.local_workers import LocalFleet

    monkeypatch.chdir(tmp_path)
    coach = Coach(override(tiny_cfg, {"run.dir": "runs/x", "logging.dir": "logs"}),
                  watch_config=False)
    assert coach.run_dir == tmp_path / "runs" / "x"
    assert coach.cfg.logging.dir == str(tmp_path / "logs")
    backend = LocalFleet(coach.cfg, coach.run_dir, coach.run_config_path,
                         lambda c: ["cpu"]).backend("worker1")
    assert backend.folder == tmp_path / "runs" / "x" / "workers" / "worker1"
    assert backend.log_dir == tmp_path / "logs" and backend.config_file.is_absolute()
    cmd = coach.rounds.trainer_command(1)
    assert str(tmp_path / "runs" / "x" / "config.yaml") in cmd


def test_a_daemon_that_keeps_exiting_shows_its_last_words_then_stays_in_error(
        tiny_cfg, run_dir, monkeypatch):
    """A local daemon that cannot read its config exits at once: LAST ERROR carries the last
    line of its stderr, and after MAX_QUICK_EXITS quick exits in a row the worker reads Error
    with that line and is not started again."""
    import time

    from tests.conftest import wait_until
    from training.coach import Coach
    from training.fleet import fleet as fleet_mod
    from training.fleet.local_workers import LocalFleet

    monkeypatch.setattr(fleet_mod, "MAX_QUICK_EXITS", 3)
    cfg = override(tiny_cfg, {"run.dir": str(run_dir), "logging.dir": str(run_dir / "logs"),
                              "distributed.backoff_base_s": 0.1,
                              "distributed.backoff_max_s": 0.4,
                              "distributed.poll_interval_s": 0.1})
    coach = Coach(cfg, status_path=run_dir / "status.txt", watch_config=False)
    coach.collector = _collector(run_dir)
    coach.fleet = LocalFleet(coach.cfg, run_dir, run_dir / "missing.yaml", lambda c: ["cpu"])
    member = coach.fleet.members["worker1"]
    stderr_log = run_dir / "workers" / "worker1" / "stderr.log"
    coach.fleet.start(coach.collector)
    try:
        wait_until(lambda: member.fault, 120, "worker1 in Error")
        time.sleep(2.0)  # several backoffs' worth: no further start
        coach._observe()
        coach._write_status()
    finally:
        coach.fleet.stop_all(timeout_s=10)
    starts = stderr_log.read_text().count("cannot read the config file")
    assert starts == 3 and member.restarts == 2, (starts, member.restarts)
    row = parse_status_text((run_dir / "status.txt").read_text()).workers[0]
    assert row.state == WorkerState.ERROR, row
    assert row.last_error.startswith("daemon exited: error: ")
    assert "missing.yaml: cannot read the config file" in row.last_error
    assert "exited 3 times in a row" in member.fault and "--restart worker1" in member.fault


# ------------------------------------------------------------------ coach: training rounds

# A trainer command for the coach: copies a prepared model file to the new model's place, and
# a prepared round result into rounds/ when given one (the coach appends --generation N,
# ignored here).
FAKE_TRAINER = """
import shutil, sys
source, model, result, dest = sys.argv[1:5]
shutil.copy(source, model)
if result:
    shutil.copy(result, dest)
"""


def _model_file(path, tiny_cfg, poison: bool = False):
    """A tiny model file; with `poison` one weight is NaN (a diverged round)."""
    import torch

    from training.learn.net import net_from_config, save_model

    net = net_from_config(tiny_cfg.net, tiny_cfg.go.board_size)
    if poison:
        with torch.no_grad():
            next(net.parameters()).view(-1)[0] = float("nan")
    save_model(path, net, generation=1)
    return path


def _round_result(generation: int, loss: float):
    """A round result with every required field (zeros but the generation and the loss)."""
    from dataclasses import MISSING, fields

    from training.train.round_result import RoundResult

    values = {f.name: 0 for f in fields(RoundResult)
              if f.default is MISSING and f.default_factory is MISSING}
    values.update(generation=generation, loss=loss, model_path="", checkpoint_path="")
    return RoundResult(**values)


def _train_one_round(coach, result_file: str = "") -> bool:
    """Start a round with FAKE_TRAINER and drive it to its end; True when the model went out
    to the workers (published and pushed)."""
    import time

    gen = _start_fake_round(coach, result_file)
    coach.start_round()
    assert coach.rounds.current is not None and coach.rounds.current.generation == gen
    t0 = time.monotonic()
    while coach.generations.concluded == 0:
        assert time.monotonic() - t0 < 60, "the round did not end"
        coach._advance_training()
        time.sleep(0.05)
    assert coach.generations.generation == gen and coach.rounds.in_hand() is None
    return coach.fleet.target.generation == gen


def _start_fake_round(coach, result_file: str = "", source=None) -> int:
    import sys

    coach.paths.create()
    gen = coach.rounds.next_generation()
    source = source or _model_file(coach.paths.root.parent / "source.pt", coach.cfg)
    coach.rounds.trainer_cmd = [sys.executable, "-c", FAKE_TRAINER, str(source),
                         str(coach.paths.model(gen)), result_file,
                         str(coach.paths.round_result(gen))]
    return gen


def _round_coach(tiny_cfg, run_dir):
    """A coach whose workers read Active, whose rounds run FAKE_TRAINER; no arena."""
    coach = _coach(tiny_cfg, run_dir, ["worker1"], **{
        "logging.dir": str(run_dir.parent / "logs"), "evaluation.games": 0,
        "evaluation.gnugo_games": 0, "evaluation.gating": "none"})
    coach.generations.generation = 0
    return coach


def test_the_round_result_file_gives_the_loss_and_the_model_goes_out(tiny_cfg, run_dir):
    from training.train import round_result

    coach = _round_coach(tiny_cfg, run_dir)
    prepared = run_dir.parent / "prepared.json"
    round_result.write(prepared, _round_result(1, 0.75))
    assert _train_one_round(coach, str(prepared))
    assert coach.generations.last_loss == 0.75 and coach.generations.concluded == 1
    assert (coach.paths.models / "model_000001.json").exists()


def test_a_round_driven_alone_reports_started_published_concluded(tiny_cfg, run_dir):
    """`Rounds` without a coach: given the config, the run folder and counts, it says what
    happened as events, and touches no fleet, collector or coach."""
    import sys
    import threading
    import time

    from training.train import round_result
    from training.generations import (Counts, Generations, ModelPublished, RoundConcluded,
                                      RoundStarted)
    from training.rounds import Rounds
    from training.run.run_dir import RunDir

    cfg = override(tiny_cfg, {"run.dir": str(run_dir), "logging.dir": str(run_dir / "logs"),
                              "evaluation.games": 0, "evaluation.gnugo_games": 0,
                              "self_play.games_per_worker": 10})
    paths = RunDir(run_dir).create()
    source = _model_file(run_dir.parent / "source.pt", cfg)
    prepared = run_dir.parent / "prepared.json"
    round_result.write(prepared, _round_result(1, 0.5))
    gens = Generations(cfg, paths, threading.Event())
    rounds = Rounds(gens, trainer_cmd=[
        sys.executable, "-c", FAKE_TRAINER, str(source), str(paths.model(1)), str(prepared),
        str(paths.round_result(1))])
    gens.ensure_first_model()
    assert gens.generation == 0
    assert rounds.advance(Counts(total_games=9, target=10)) == []  # not due
    events = rounds.advance(Counts(total_games=10, target=10))
    assert events == [RoundStarted(1)]
    seen: list = []
    t0 = time.monotonic()
    while not any(isinstance(e, RoundConcluded) for e in seen):
        assert time.monotonic() - t0 < 60, "the round did not end"
        seen += rounds.advance(Counts(total_games=12, target=10))
        time.sleep(0.05)
    assert seen == [ModelPublished(1), RoundConcluded(1, True, seen[1].train_s, None)]
    assert gens.generation == 1 and gens.last_loss == 0.5 and rounds.new_games(12) == 2


def test_without_gating_the_arena_rates_beside_the_next_round_one_at_a_time(
        tiny_cfg, run_dir, caplog):
    """gating none: the round concludes when training ends, the model goes out, and the next
    round starts while the real arena still rates the last one; a generation trained while
    that rating runs is published unrated; the rating's Elo lands in its own metrics row."""
    import logging
    import sys
    import threading
    import time

    from training.train import round_result
    from training.generations import (Counts, Generations, ModelPublished, Rated,
                                      RoundConcluded, RoundStarted)
    from training.rounds import Rounds
    from training.run import metrics
    from training.run.run_dir import RunDir

    cfg = override(tiny_cfg, {"run.dir": str(run_dir), "logging.dir": str(run_dir / "logs"),
                              "evaluation.games": 2, "evaluation.gnugo_games": 0,
                              "evaluation.gating": "none", "evaluation.simulations": 4})
    paths = RunDir(run_dir).create()
    source = _model_file(run_dir.parent / "source.pt", cfg)
    release = threading.Event()

    class HeldArena(Generations):  # the real arena, started only once the test lets it
        def _evaluate(self, generation):
            assert release.wait(60)
            return super()._evaluate(generation)

    gens = HeldArena(cfg, paths, threading.Event())
    rounds = Rounds(gens)
    gens.ensure_first_model()

    def train(gen: int, total: int) -> list:
        prepared = run_dir.parent / f"prepared_{gen}.json"
        round_result.write(prepared, _round_result(gen, 1.0 / gen))
        rounds.trainer_cmd = [sys.executable, "-c", FAKE_TRAINER, str(source),
                              str(paths.model(gen)), str(prepared), str(paths.round_result(gen))]
        seen = rounds.advance(Counts(total_games=total, target=10))
        assert seen == [RoundStarted(gen)]
        t0 = time.monotonic()
        while not any(isinstance(e, RoundConcluded) for e in seen):
            assert time.monotonic() - t0 < 60, "the round did not end"
            seen += rounds.advance(Counts(total_games=total, target=10))
            time.sleep(0.05)
        return seen

    seen = train(1, 10)
    assert seen[1:] == [ModelPublished(1), RoundConcluded(1, True, seen[2].train_s, None)]
    assert gens.rating is not None and gens.rating.is_alive()  # generation 1's arena
    with caplog.at_level(logging.INFO, logger="training.generations"):
        seen = train(2, 20)  # the next round starts and ends while generation 1 is rated
    assert seen[1:] == [ModelPublished(2), RoundConcluded(2, True, seen[2].train_s, None)]
    assert "generation 2 is not rated" in caplog.text
    release.set()
    t0, seen = time.monotonic(), []
    while gens.rating is not None:
        assert time.monotonic() - t0 < 120, "the arena did not end"
        seen += rounds.advance(Counts(total_games=20, target=10))
        time.sleep(0.05)
    assert seen == [Rated(1)]  # the coach draws the plot again
    rows = {r["generation"]: r for r in metrics.read_metrics(run_dir)}
    assert rows[1]["arena_opponent"] == 0 and rows[1]["arena_wins"] + rows[1][
        "arena_draws"] + rows[1]["arena_losses"] == 2 and isinstance(rows[1]["elo"], float)
    assert "elo" not in rows.get(2, {}) and gens.elo == rows[1]["elo"]
    train(3, 30)  # rated against generation 1: every link of the chain is a measured one
    t0 = time.monotonic()
    while gens.rating is not None:
        assert time.monotonic() - t0 < 120, "the arena did not end"
        rounds.advance(Counts(total_games=30, target=10))
        time.sleep(0.05)
    row = {r["generation"]: r for r in metrics.read_metrics(run_dir)}[3]
    assert row["arena_opponent"] == 1 and row["elo"] == pytest.approx(
        rows[1]["elo"] + row["elo_diff"])


def test_metrics_columns_merged_by_processes_at_once_are_all_kept(run_dir):
    """The coach, the trainer and the arena may merge into metrics.json at the same time."""
    import subprocess
    import sys

    from training.run.metrics import read_metrics

    code = ("import sys\nfrom training.run.metrics import record_metrics\n"
            "for g in range(25):\n"
            "    record_metrics(sys.argv[1], g, **{'w' + sys.argv[2]: g})\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(run_dir), str(w)],
                              cwd=str(Path(__file__).resolve().parent.parent))
             for w in range(4)]
    assert [p.wait(120) for p in procs] == [0] * 4
    rows = read_metrics(run_dir)
    assert [r["generation"] for r in rows] == list(range(25))
    for r in rows:
        assert {f"w{w}" for w in range(4)} <= set(r), r


def test_with_logging_tensorboard_each_generation_goes_to_tensorboard_too(tiny_cfg, run_dir):
    """The scalars are read back with TensorBoard's own event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from training.train import round_result
    from training.run.metrics import record_metrics

    coach = _round_coach(override(tiny_cfg, {"logging.tensorboard": True}), run_dir)
    prepared = run_dir.parent / "prepared.json"
    round_result.write(prepared, _round_result(1, 0.75))
    record_metrics(run_dir, 1, loss=0.75, policy_loss=0.5)  # what the trainer writes
    _train_one_round(coach, str(prepared))
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"loss", "policy_loss", "games_total", "train_s"} <= set(tags), tags
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 0.75)]


def test_a_model_with_a_nan_weight_is_never_published(tiny_cfg, run_dir, caplog):
    import time

    coach = _round_coach(tiny_cfg, run_dir)
    poisoned = _model_file(run_dir.parent / "nan.pt", tiny_cfg, poison=True)
    gen = _start_fake_round(coach, source=poisoned)
    with caplog.at_level("ERROR", logger="training.generations"):
        coach.start_round()
        t0 = time.monotonic()
        while coach.rounds.in_hand() is not None:
            assert time.monotonic() - t0 < 60, "the round did not end"
            coach._advance_training()
            time.sleep(0.05)
    gens = coach.generations
    assert gens.generation == 0 and gens.concluded == 0  # not published
    assert not coach.paths.model(gen).exists()
    assert coach.paths.model(gen).with_name(f"model_{gen:06d}.pt.refused").exists()
    assert not (coach.paths.models / f"model_{gen:06d}.json").exists()
    assert "NaN or infinite" in caplog.text


def test_a_round_without_a_result_counts_with_its_loss_unknown(tiny_cfg, run_dir, caplog):
    coach = _round_coach(tiny_cfg, run_dir)
    coach.paths.create()
    stale = coach.paths.round_result(1)  # left by an earlier attempt: not this round's
    stale.write_text(json.dumps({"generation": 1, "loss": 9.0}))
    with caplog.at_level("WARNING", logger="training.generations"):
        _train_one_round(coach)
    assert coach.generations.last_loss is None and coach.generations.concluded == 1
    assert coach.generations.generation == 1
    assert not stale.exists()
    assert "wrote no round result" in caplog.text


def test_an_unreadable_round_result_is_logged_and_the_round_still_counts(tiny_cfg, run_dir,
                                                                         caplog):
    coach = _round_coach(tiny_cfg, run_dir)
    prepared = run_dir.parent / "prepared.json"
    prepared.write_text("{not json")
    with caplog.at_level("ERROR", logger="training.generations"):
        _train_one_round(coach, str(prepared))
    assert coach.generations.last_loss is None and coach.generations.concluded == 1
    assert coach.generations.generation == 1
    assert "round result is unreadable" in caplog.text


def test_a_resumed_run_keeps_the_board_and_net_it_was_started_with(tiny_cfg, run_dir, caplog):
    """A new default (or an edit) of net.* meets a run folder of the old net: the run goes on
    with its own net, its models load, and the log says what was kept and how to get the
    config's."""
    from configs import load_config
    from training.coach import Coach

    first = Coach(override(tiny_cfg, {"run.dir": str(run_dir)}), watch_config=False,
                  status_path=run_dir / "status.txt")
    first._prepare_run_dir()
    first.generations.ensure_first_model()
    first._lock.release()
    newer = override(tiny_cfg, {"run.dir": str(run_dir), "net.liberties": True,
                                "net.soft_policy_head": True, "net.inference": "eager",
                                "distributed.offline_after_s": 77.0})
    coach = Coach(newer, watch_config=False, status_path=run_dir / "status.txt")
    with caplog.at_level("WARNING"):
        coach._prepare_run_dir()
    coach._lock.release()
    assert coach.cfg.net == replace(tiny_cfg.net, inference="eager")
    assert coach.rounds.cfg is coach.cfg and coach.cfg.distributed.offline_after_s == 77.0
    assert "net.liberties False (the config says True)" in caplog.text
    assert "--fresh" in caplog.text
    assert load_config(run_dir / "config.yaml").net.liberties is False
    # a new run folder takes the config as it is
    fresh = Coach(override(newer, {"run.dir": str(run_dir / "new")}), watch_config=False,
                  status_path=run_dir / "status.txt")
    fresh._prepare_run_dir()
    fresh._lock.release()
    assert fresh.cfg.net.liberties is True


# ------------------------------------------------------------------ floods through the real path


def _set_up_coach(tiny_cfg, run_dir, **overrides):
    """A coach built as a run builds it (`setup`: its collector, rules and pace from the
    config); no worker is started."""
    from training.coach import Coach

    cfg = override(tiny_cfg, {"run.dir": str(run_dir), **overrides})
    coach = Coach(cfg, status_path=run_dir / "status.txt", watch_config=False)
    coach.setup()
    return coach


def test_the_coach_holds_every_batch_to_the_runs_rules(tiny_cfg, run_dir, tmp_path):
    """The collector the coach builds refuses a batch of more games than the run's batches
    hold (distributed.batch_size 10 + parallel_games 16), though the batch's own meta is
    consistent: the rules come from the run's config, not from the batch."""
    coach = _set_up_coach(tiny_cfg, run_dir)
    outbox = tmp_path / "outbox"
    big = _batch(outbox, "worker1", 0, games=27, honest=True)
    ok = _batch(outbox, "worker1", 1, games=3, honest=True)
    res = coach.collector.collect("worker1", LocalSource(outbox), paced=False)
    assert res.rejected == [big] and res.ingested == [ok]
    reason = (run_dir / "quarantine" / f"{big}.reason.txt").read_text()
    assert "27 games, more than this run's batches hold (26)" in reason


def _row_shares(window) -> dict[str, float]:
    _, files, _ = window._locate(np.arange(len(window)))
    owners = np.array([window._sidecars[int(f)].name.split("_")[0] for f in files])
    return {w: float((owners == w).mean()) for w in sorted(set(owners))}


def test_a_flood_through_the_coach_holds_its_share_of_the_trainers_window(
        tiny_cfg, run_dir, tmp_path):
    """A worker sending 50x the other's games, ingested by the coach's collector, holds at
    most 1.5 x its equal share of the window the trainer opens (`open_replay_window`, the
    real path with the run's share slack), and status.txt counts the same window."""
    from training.train.ddp import DistContext
    from training.train.node_relay import open_replay_window

    coach = _set_up_coach(tiny_cfg, run_dir, **{"replay.min_positions": 10**5,
                                                  "replay.max_positions": 10**5,
                                                  "replay.validation_fraction": 0.0})
    honest, flood = tmp_path / "honest", tmp_path / "flood"
    _batch(honest, "worker1", 0, games=2, honest=True)
    for seq in range(1, 51):
        _batch(flood, "worker2", seq, games=2, honest=True)
    assert len(coach.collector.collect("worker1", LocalSource(honest)).ingested) == 1
    assert len(coach.collector.collect("worker2", LocalSource(flood), paced=False,
                                       ).ingested) == 50
    window = open_replay_window(coach.cfg, run_dir, DistContext())
    shares = _row_shares(window)
    longest = max(int(e - s) for _, s, e, *_ in window._segments.tolist())
    print(f"coach flood 50x: the flood's share of the trainer's window {shares['worker2']:.3f}")
    assert shares["worker2"] <= 0.75 + longest / len(window), shares
    honest_positions = next(e.positions for e in coach.collector.window_entries()
                            if e.worker == "worker1")
    games, positions, _ = coach.window()
    assert positions <= 4 * honest_positions + 2 * longest  # the status figure: same rule
    assert window.stats().positions <= 4 * honest_positions + 2 * longest


def test_one_game_batches_wait_in_the_outbox_and_status_counts_them(tiny_cfg, run_dir,
                                                                     tmp_path):
    """With the run's pace (distributed.partial_batch_interval_s), one-game batches from a
    worker are taken one per interval; the rest wait in its outbox and status.txt counts
    them, in its header and the worker's row."""
    coach = _set_up_coach(tiny_cfg, run_dir, **{"distributed.partial_batch_interval_s": 60})
    assert coach.collector.partial_interval_s == 60 and coach.collector.full_batch_games == 10
    outbox = tmp_path / "outbox"
    for seq in range(12):
        _batch(outbox, "worker1", seq, games=1, honest=True)
    res = coach.collector.collect("worker1", LocalSource(outbox))
    assert len(res.ingested) == 1 and res.deferred == 11 and len(list(outbox.iterdir())) == 11
    coach._write_status()
    snap = parse_status_text((run_dir / "status.txt").read_text())
    assert snap.batches_deferred == 11
    row = next(r for r in snap.workers if r.name == "worker1")
    assert "11 batches deferred" in row.last_error


def _minimal_batch(outbox: Path, worker: str, seq: int, games: int) -> str:
    """A full batch of three-move games, each resigned by the side to move: valid, distinct,
    and as cheap as a batch can be."""
    rng = np.random.default_rng(seq)
    recs = []
    for i in range(games):
        rec = random_record(N, KOMI, rng, seed=seq * 100 + i, honest_passes=True)
        points = rng.choice(N * N, size=3, replace=False).astype(np.int16)
        recs.append(replace(
            rec, moves=points, visits=rec.visits[:3] * 0 + np.eye(N * N + 1, dtype=np.uint16)[
                points] * 8, values=np.zeros(3, np.float16), full_search=np.ones(3, np.bool_),
            surprise=np.zeros(3, np.float16), resigned=True, result=1, score=float("nan")))
    name = f"{worker}_000000_{seq:08d}.npz.zst"
    outbox.mkdir(parents=True, exist_ok=True)
    write_batch(outbox / name, recs, BatchMeta.from_records(worker, recs))
    return name


def test_full_batches_of_minimal_games_are_paced_and_honest_full_batches_are_not(
        tiny_cfg, run_dir, tmp_path):
    """A worker sending full batches (distributed.batch_size games) of three-move games gets
    one batch in per interval, as if they were partial; an honest worker's full batches all
    go in at once."""
    coach = _set_up_coach(tiny_cfg, run_dir, **{"distributed.partial_batch_interval_s": 60})
    full = coach.cfg.distributed.batch_size
    assert coach.collector.full_batch_positions == full * N * N // 4
    flood, honest = tmp_path / "flood", tmp_path / "honest"
    for seq in range(6):
        _minimal_batch(flood, "worker2", seq, games=full)
        _batch(honest, "worker1", seq, games=full, honest=True)
    res = coach.collector.collect("worker2", LocalSource(flood))
    assert len(res.ingested) == 1 and res.paced == 5 and res.rejected == [], res
    assert res.positions == 3 * full
    res = coach.collector.collect("worker1", LocalSource(honest))
    assert len(res.ingested) == 6 and res.paced == 0, res
    assert res.positions >= 6 * coach.collector.full_batch_positions


def test_the_trainers_last_error_reaches_status_txt(tiny_cfg, run_dir):
    """What the rounds know of a trainer that keeps failing is in the coach's status.txt."""
    coach = _set_up_coach(tiny_cfg, run_dir)
    coach._write_status()
    assert parse_status_text((run_dir / "status.txt").read_text()).trainer_error == ""
    coach.generations.trainer_error = "trainer failed 3 times in a row: exit 1; ValueError: bad"
    coach._write_status()
    shown = parse_status_text((run_dir / "status.txt").read_text()).trainer_error
    assert shown.startswith("trainer failed 3 times in a row") and "ValueError" in shown
