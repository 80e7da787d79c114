"""distributed/status.py: heartbeats, worker states, and status.txt rendering/parsing."""

from __future__ import annotations

import json
import os
import time

import pytest

from distributed.status import (
    Heartbeat,
    HeartbeatTracker,
    StatusFormatError,
    StatusSnapshot,
    WorkerRow,
    WorkerState,
    parse_heartbeat,
    parse_status_text,
    read_heartbeat,
    read_status,
    render_status,
    write_heartbeat,
    write_status,
)


def _snapshot() -> StatusSnapshot:
    return StatusSnapshot(
        games_per_s=145.2,
        workers_active=3,
        workers_total=4,
        model_sync_s=12.3,
        network_mb_per_min=45.6,
        generation=13,
        window_games=50000,
        window_positions=3_000_000,
        staleness_generations=1.25,
        last_loss=1.2345,
        elo=345.5,
        run_hours=1.2345,
        hours_limit=2.0,
        updated="2026-11-21 20:30:01",
        workers=[
            WorkerRow("worker1", "gpu1.example.com", WorkerState.ACTIVE, "0", 13, 1200, 40.5,
                      1.0, 0.2, 1.2, 0, ""),
            WorkerRow("worker2", "10.200.0.12", WorkerState.SYNCING, "1", 12, 2400, 80.25,
                      2.0, 0.4, 0.4, 1, ""),
            WorkerRow("w 3; rm -rf /", "host", WorkerState.ERROR, "cpu", None, 0, 0.0, 1.0,
                      0.2, 30.0, 3, "ConnectError: worker3 (host): connect refused\nretrying"),
            WorkerRow("worker4", "h4", WorkerState.OFFLINE, "-", None, 5, 0.0, 1.0, 0.2,
                      None, 0, "x" * 400),
        ],
    )


def test_status_header_shows_the_guide_metrics_exactly():
    text = render_status(_snapshot())
    lines = text.splitlines()
    for expected in ("Games/second: 145.2", "Workers active: 3/4", "Model sync time: 12.3s",
                     "Network usage: 45.6 MB/min"):
        assert expected in lines
    print(text)


def test_status_text_parses_back():
    snap = _snapshot()
    back = parse_status_text(render_status(snap))
    assert back.games_per_s == 145.2
    assert (back.workers_active, back.workers_total) == (3, 4)
    assert back.model_sync_s == 12.3 and back.network_mb_per_min == 45.6
    assert back.generation == 13 and back.window_games == 50000
    assert back.window_positions == 3_000_000 and back.staleness_generations == 1.25
    assert back.last_loss == 1.2345 and back.elo == 345.5
    assert back.run_hours == 1.23 and back.hours_limit == 2.0
    assert back.updated == "2026-11-21 20:30:01"
    assert [r.name for r in back.workers] == [r.name for r in snap.workers]
    for a, b in zip(back.workers[:2], snap.workers[:2]):
        assert a == b
    w3 = back.workers[2]
    assert w3.state is WorkerState.ERROR and w3.generation is None and w3.restarts == 3
    assert w3.last_error == "ConnectError: worker3 (host): connect refused retrying"
    w4 = back.workers[3]
    assert w4.heartbeat_age_s is None and len(w4.last_error) == 160
    assert w4.last_error.endswith("...")


def test_a_finished_run_says_when_after_what_and_its_newest_generation():
    assert "Finished" not in render_status(_snapshot())
    snap = _snapshot()
    snap.finished, snap.finished_after = "2026-11-21 21:30:01", "the hours limit (run.hours 2)"
    text = render_status(snap)
    assert text.splitlines()[1] == ("Finished: 2026-11-21 21:30:01 UTC after the hours limit "
                                    "(run.hours 2); newest generation 13")
    back = parse_status_text(text)
    assert (back.finished, back.finished_after) == (snap.finished, snap.finished_after)
    assert back.generation == 13 and back.updated == "2026-11-21 20:30:01"


def test_training_nodes_line_shows_only_when_there_are_nodes():
    assert "Training nodes" not in render_status(_snapshot())
    snap = _snapshot()
    snap.training_nodes = "node1 Training; node2 Benched 60s: its trainer\ndied"
    text = render_status(snap)
    assert "Training nodes: node1 Training; node2 Benched 60s: its trainer died" in text
    back = parse_status_text(text)
    assert back.training_nodes == "node1 Training; node2 Benched 60s: its trainer died"
    assert len(back.workers) == 4  # the table still parses below the extra line


def test_run_time_shows_the_hours_against_the_limit():
    snap = _snapshot()
    assert "Run time: 1.23 h of 2 h" in render_status(snap).splitlines()
    snap.hours_limit = 0.0  # no --hours: no limit to show
    text = render_status(snap)
    assert "Run time: 1.23 h" in text.splitlines()
    back = parse_status_text(text)
    assert back.run_hours == 1.23 and back.hours_limit == 0.0
    snap.run_hours, snap.hours_limit = 0.5, 1.5
    assert parse_status_text(render_status(snap)).hours_limit == 1.5
    bad = render_status(_snapshot()).replace("Run time: 1.23 h of 2 h", "Run time: soon")
    with pytest.raises(StatusFormatError, match="Run time: soon"):
        parse_status_text(bad)


def test_status_table_is_fixed_width():
    lines = render_status(_snapshot()).splitlines()
    table = lines[lines.index("") + 1 :]
    col = table[0].index("STATE")
    assert all(line[col:].split()[0] in {"STATE", "\U0001F7E2", "\U0001F7E1", "\U0001F534",
                                         "\u26AA"} for line in table)
    # each state with the user guide's indicator: green, yellow, red, white
    marks = {line[col:].split()[1]: line[col:].split()[0] for line in table[1:]}
    expected = {"Active": "\U0001F7E2", "Syncing": "\U0001F7E1", "Error": "\U0001F534",
                "Offline": "\u26AA"}
    assert marks == {state: expected[state] for state in marks} and len(marks) >= 3


def test_empty_status_round_trips():
    snap = StatusSnapshot(updated="2026-01-01 00:00:00")
    back = parse_status_text(render_status(snap))
    assert back.model_sync_s is None and back.last_loss is None and back.elo is None
    assert back.run_hours is None and "Run time: -" in render_status(snap)
    assert back.workers == []
    assert "Model sync time: -" in render_status(snap)


def test_write_status_is_atomic_and_reads_back(tmp_path):
    path = tmp_path / "status.txt"
    write_status(path, _snapshot())
    assert read_status(path).games_per_s == 145.2
    assert [p.name for p in tmp_path.iterdir()] == ["status.txt"]


def test_garbage_status_text_raises():
    with pytest.raises(StatusFormatError):
        parse_status_text("hello\n")
    bad = render_status(_snapshot()).replace("Workers active: 3/4", "Workers active: lots")
    with pytest.raises(StatusFormatError):
        parse_status_text(bad)


def test_heartbeat_round_trip_and_unknown_keys(tmp_path):
    hb = Heartbeat("worker1", WorkerState.SYNCING, 4242, generation=7, games_done=300,
                   games_per_s=2.5, positions_per_s=150.0, outbox_backlog=2, paused=False,
                   last_error="", time=1_700_000_000.0)
    write_heartbeat(tmp_path / "status.json", hb)
    assert read_heartbeat(tmp_path / "status.json") == hb
    data = (tmp_path / "status.json").read_text().replace('"pid"', '"future_key": 1, "pid"')
    assert parse_heartbeat(data) == hb
    with pytest.raises(StatusFormatError):
        parse_heartbeat(b"{not json")
    with pytest.raises(StatusFormatError):
        parse_heartbeat('{"name": "w", "state": "Sleeping", "pid": 1}')


def test_heartbeat_tracker_ignores_clock_skew():
    tracker = HeartbeatTracker(offline_after_s=5)
    skewed = 10_000.0  # the worker's clock is hours off the coach's
    hb = Heartbeat("w", WorkerState.ACTIVE, 1, time=skewed)
    assert tracker.observe("w", hb, now=100.0) == (WorkerState.ACTIVE, 0.0)
    assert tracker.observe("w", hb, now=104.0) == (WorkerState.ACTIVE, 4.0)  # same beat
    assert tracker.observe("w", hb, now=106.0) == (WorkerState.OFFLINE, 6.0)  # stuck
    hb2 = Heartbeat("w", WorkerState.SYNCING, 1, time=skewed + 2)
    assert tracker.observe("w", hb2, now=107.0) == (WorkerState.SYNCING, 0.0)
    assert tracker.observe("w", None, now=108.0) == (WorkerState.OFFLINE, 1.0)  # unreachable
    assert tracker.observe("new", None, now=108.0) == (WorkerState.OFFLINE, None)


@pytest.mark.parametrize("key,value", [("games_per_s", "fast"), ("pid", 1.5), ("paused", 1),
                                       ("time", float("nan")), ("generation", True),
                                       ("last_error", ["x"]), ("state", ["Active"])])
def test_heartbeat_with_a_wrong_type_is_a_format_error_naming_the_key(key, value):
    d = Heartbeat("w", WorkerState.ACTIVE, 7, time=1.0).to_dict()
    d[key] = value
    with pytest.raises(StatusFormatError, match=key):
        parse_heartbeat(json.dumps(d))


def test_nested_heartbeat_is_a_format_error_not_a_recursion_error():
    with pytest.raises(StatusFormatError):
        parse_heartbeat("[" * 100_000 + "]" * 100_000)


def test_only_a_regular_heartbeat_file_is_read(tmp_path):
    fifo = tmp_path / "status.json"
    os.mkfifo(fifo)  # opening it would block until a writer came
    t0 = time.monotonic()
    with pytest.raises(StatusFormatError, match="not a regular file"):
        read_heartbeat(fifo)
    assert time.monotonic() - t0 < 1.0
    fifo.unlink()
    target = tmp_path / "real.json"
    write_heartbeat(target, Heartbeat("w", WorkerState.ACTIVE, 1))
    fifo.symlink_to(target)
    with pytest.raises(StatusFormatError, match="not a regular file"):
        read_heartbeat(fifo)
    fifo.unlink()
    fifo.write_bytes(b" " * (1 << 20))
    with pytest.raises(StatusFormatError, match="over"):
        read_heartbeat(fifo)


def test_last_error_is_printable_in_the_status_file():
    snap = _snapshot()
    snap.workers[0].last_error = "\x1b[2J\x1b[31mboom\x1b[0m\x07 \x1b]0;pwned\x07done\x00\r!"
    text = render_status(snap)
    assert "\x1b" not in text and "\x07" not in text and "\x00" not in text
    assert "\r" not in text
    row = parse_status_text(text).workers[0]
    assert row.last_error.startswith("boom") and "done" in row.last_error
    assert "pwned" not in row.last_error


def test_played_games_show_beside_the_games_collected():
    snap = _snapshot()
    snap.workers[0].games, snap.workers[0].played = 0, 37
    text = render_status(snap)
    header = [ln for ln in text.splitlines() if ln.startswith("NAME")][0]
    assert header.index("GAMES") < header.index("PLAYED") < header.index("GAMES/S")
    back = parse_status_text(text).workers
    assert (back[0].games, back[0].played) == (0, 37) and back[1].played is None


def test_a_heartbeat_with_a_5000_digit_pid_is_a_format_error():
    from distributed.status import parse_heartbeat

    data = '{"name": "worker1", "state": "Active", "pid": ' + "9" * 5000 + "}"
    with pytest.raises(StatusFormatError, match="not JSON"):
        parse_heartbeat(data)
