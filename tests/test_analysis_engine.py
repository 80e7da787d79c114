"""`python -m training.analysis`: KataGo's JSON analysis protocol, driven as KaTrain drives
`katago analysis`: a real subprocess, JSON lines in, JSON lines out, parsed by json."""

from __future__ import annotations

import json
import math
import os
import queue
import subprocess
import sys
import threading

import pytest

from training.go.coords import from_gtp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 5  # configs/tiny.yaml



class Engine:
    def __init__(self, model: str, *extra: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "training.analysis", "--model", model,
             "--config", os.path.join(REPO, "configs", "tiny.yaml"), *extra],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1)
        self.answers: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.answers.put(json.loads(line))
        self.answers.put(None)

    def send(self, query: dict | str | bytes) -> None:
        if isinstance(query, bytes):
            self.proc.stdin.flush()
            self.proc.stdin.buffer.write(query + b"\n")
            self.proc.stdin.buffer.flush()
            return
        self.proc.stdin.write((query if isinstance(query, str) else json.dumps(query)) + "\n")
        self.proc.stdin.flush()

    def peak_rss_mb(self) -> float:
        """The engine's peak resident memory so far (Linux: VmHWM)."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM")

    def next(self, timeout: float = 120.0) -> dict:
        answer = self.answers.get(timeout=timeout)
        assert answer is not None, self.proc.stderr.read()
        return answer

    def close(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait(timeout=120)


@pytest.fixture
def engine(tiny_model):
    e = Engine(tiny_model)
    yield e
    if e.proc.poll() is None:
        e.close()


def query(qid: str, **fields) -> dict:
    base = {"id": qid, "moves": [["B", "C3"], ["W", "B2"]], "rules": "chinese", "komi": 0.5,
            "boardXSize": N, "boardYSize": N, "maxVisits": 40}
    base.update(fields)
    return base


def test_each_turn_gets_an_answer_with_move_infos_ownership_and_policy(engine):
    engine.send(query("q1", analyzeTurns=[0, 1, 2], includeOwnership=True, includePolicy=True))
    answers = {a["turnNumber"]: a for a in (engine.next() for _ in range(3))}
    assert sorted(answers) == [0, 1, 2]
    for turn, a in answers.items():
        assert a["id"] == "q1" and a["isDuringSearch"] is False
        root = a["rootInfo"]
        assert root["currentPlayer"] == ("B" if turn % 2 == 0 else "W")
        assert root["visits"] == 40  # exactly the budget asked
        assert sum(m["visits"] for m in a["moveInfos"]) == 40
        assert 0 <= root["winrate"] <= 1 and "scoreLead" in root
        orders = [m["order"] for m in a["moveInfos"]]
        assert orders == list(range(len(orders)))
        for m in a["moveInfos"]:
            assert m["pv"][0] == m["move"] and 0 <= m["lcb"] <= 1 and 0 <= m["prior"] <= 1
            assert m["scoreLead"] == m["scoreMean"]
        assert len(a["ownership"]) == N * N and all(-1 <= v <= 1 for v in a["ownership"])
        policy = a["policy"]
        assert len(policy) == N * N + 1
        assert abs(sum(p for p in policy if p >= 0) - 1) < 1e-3
    # Occupied points are illegal in the policy and never suggested.
    policy = answers[2]["policy"]
    for point in ("C3", "B2"):
        assert policy[from_gtp(point, N)] == -1
        assert point not in {m["move"] for m in answers[2]["moveInfos"]}


def test_bad_queries_get_an_error_naming_the_field_and_the_engine_goes_on(engine):
    engine.send("{not json")
    assert "error" in engine.next()
    cases = [
        (query("a", boardXSize=9, boardYSize=9), "boardXSize"),
        (query("b", moves=[["B", "C3"], ["W", "C3"]]), "moves"),
        (query("c", rules="japanese"), "rules"),
        (query("d", analyzeTurns=[7]), "analyzeTurns"),
        (query("e", maxVisits=0), "maxVisits"),
        (query("f", komi="seven"), "komi"),
        (query("g", moves=[["X", "C3"]]), "moves"),
        (query("h", reportDuringSearchEvery=-1), "reportDuringSearchEvery"),
    ]
    for q, field_name in cases:
        engine.send(q)
        answer = engine.next()
        assert answer["id"] == q["id"] and answer["field"] == field_name, answer
    engine.send(query("ok", maxVisits=10**6))  # clamped, with a warning first
    warning = engine.next()
    assert warning["id"] == "ok" and warning["field"] == "maxVisits" and "warning" in warning
    answer = engine.next()
    assert answer["id"] == "ok" and answer["rootInfo"]["visits"] == 1000
    engine.send({"id": "v", "action": "query_version"})
    assert engine.next()["version"].startswith("azgo")


def test_partial_reports_then_terminate(engine):
    engine.send(query("long", maxVisits=1000, reportDuringSearchEvery=0.05))
    first = engine.next()
    assert first["id"] == "long" and first["isDuringSearch"] is True
    engine.send({"id": "stop", "action": "terminate", "terminateId": "long"})
    final, ack = None, None
    for _ in range(200):
        a = engine.next()
        if a.get("action") == "terminate":
            ack = a
        elif a["id"] == "long" and not a["isDuringSearch"]:
            final = a
        if final and ack:
            break
    assert ack["terminateId"] == "long"
    assert final["rootInfo"]["visits"] < 1000  # answered with what it had


def test_queries_sent_together_are_all_answered_and_input_end_stops_it(tiny_model):
    e = Engine(tiny_model, "--slots", "4")
    for k in range(10):  # more than the slots: they wait their turn
        e.send(query(f"q{k}", maxVisits=16))
    ids = {e.next()["id"] for _ in range(10)}
    assert ids == {f"q{k}" for k in range(10)}
    assert e.close() == 0


def test_no_line_ends_the_engine_and_each_bad_one_gets_an_error_with_its_id(engine):
    """Lines that used to end the process (an OverflowError, a RecursionError, a TypeError, a
    reader thread dead on bad UTF-8), each answered `{"id", "error"}` with the id when the
    line has one; the engine answers the next good query and exits 0 at the end of input."""
    huge = "1" + "0" * 400  # a 400-digit integer: valid JSON, too large for a float
    engine.send(query("long", maxVisits=1000, reportDuringSearchEvery=0.05))
    assert engine.next()["isDuringSearch"] is True  # a search runs while the bad lines come
    bad = [
        ('{"id": "k", "komi": %s, "moves": []}' % huge, "k", "komi"),
        ('{"id": "r", "moves": [], "reportDuringSearchEvery": %s}' % huge, "r",
         "reportDuringSearchEvery"),
        ('{"id": "t", "action": "terminate", "terminateId": "long", "turnNumbers": 3}', "t",
         "turnNumbers"),
        ('{"id": "t2", "action": "terminate", "terminateId": "long", "turnNumbers": "12"}',
         "t2", "turnNumbers"),
        ("[" * 100_000 + "]" * 100_000, None, ""),
        ('{"id": "deep", "moves": ' + "[" * 50_000 + "]" * 50_000 + "}", None, ""),
        ("[1, 2]", None, ""),
        ('"a string"', None, ""),
        ("null", None, ""),
        ("{not json", None, ""),
        (b'{"id": "u", "moves": []}\xff\xfe', None, ""),
        ('{"id": "m", "moves": [["B", "C3"]], "maxVisits": %s}' % huge, "m", "maxVisits"),
        ('{"id": "a", "moves": [], "analyzeTurns": [%s]}' % huge, "a", "analyzeTurns"),
        ('{"id": "x", "moves": [], "boardXSize": %s}' % huge, "x", "boardXSize"),
    ]
    for line, qid, field_name in bad:
        engine.send(line)
        answer = engine.next()
        while answer.get("id") == "long" and "error" not in answer:  # its partial reports
            answer = engine.next()
        if field_name == "maxVisits":  # clamped with a warning, then answered
            assert answer["id"] == "m" and "warning" in answer, answer
            continue
        assert set(answer) >= {"id", "error"} and answer["id"] == qid, (line[:60], answer)
        assert answer["field"] == field_name, answer
    engine.send({"id": "stop", "action": "terminate", "terminateId": "long"})
    engine.send(query("fine", maxVisits=8))
    seen = set()
    while "fine" not in seen:
        a = engine.next()
        if a.get("id") == "fine":
            assert a["rootInfo"]["visits"] == 8
        seen.add(a.get("id"))
    assert "stop" in seen and engine.proc.poll() is None
    assert engine.close() == 0


def test_a_huge_line_is_refused_without_being_held_whole(engine):
    """A 64 MiB line (no newline for a long time) costs the engine a few MB, not 64+, and is
    answered with an error; the next query is answered."""
    engine.send(query("warm", maxVisits=8))
    assert engine.next()["id"] == "warm"
    before = engine.peak_rss_mb()
    chunk = "x" * (1 << 20)
    engine.proc.stdin.write('{"id": "big", "moves": "')
    for _ in range(64):
        engine.proc.stdin.write(chunk)
    engine.send('"}')
    answer = engine.next()
    assert answer["id"] is None and "at most" in answer["error"], answer
    grown = engine.peak_rss_mb() - before
    print(f"peak memory grown by a 64 MiB line: {grown:.1f} MB")
    assert grown < 24, grown
    engine.send(query("after", maxVisits=8))
    assert engine.next()["id"] == "after"


def _long_game(size: int, plies: int, seed: int = 0) -> list[list[str]]:
    """A legal game of `plies` moves (random points, a pass where none is found quickly,
    never two passes in a row)."""
    import random

    from training.go.coords import to_gtp
    from training.go.rules import Position

    rng = random.Random(seed)
    pos = Position(size, komi=7.5, max_moves=4 * size * size)
    out = []
    for _ in range(plies):
        move = pos.pass_move
        for _ in range(30):
            p = rng.randrange(size * size)
            if pos.is_legal(p):
                move = p
                break
        if move == pos.pass_move and pos.passes:
            move = next(p for p in range(size * size) if pos.is_legal(p))
        out.append(["B" if pos.to_play == 1 else "W", to_gtp(move, size)])
        pos.play(move)
    return out


def test_one_query_over_every_turn_of_a_long_game_holds_linear_memory(tmp_path):
    """A 19x19 game of 500 moves, every turn analysed in one query: the engine's memory grows
    by a few MB, not by a replayed position per turn (quadratic: 761 MB measured at 700 moves,
    about 3 GB for a whole 1,444-move game), and every turn is answered."""
    from configs import load_config
    from training.learn.net import net_from_config, save_model

    cfg = load_config(os.path.join(REPO, "configs", "tiny.yaml"))
    model = tmp_path / "model_000001.pt"
    save_model(model, net_from_config(cfg.net, 19), generation=1)
    moves = _long_game(19, 500)
    e = Engine(str(model), "--slots", "8")
    try:  # warm up on a few turns first: the net's first batches cost a fixed 45 MB
        e.send({"id": "warm", "moves": moves[:40], "rules": "chinese", "boardXSize": 19,
                "boardYSize": 19, "maxVisits": 1, "analyzeTurns": list(range(41))})
        assert {e.next()["id"] for _ in range(41)} == {"warm"}
        before = e.peak_rss_mb()
        e.send({"id": "all", "moves": moves, "rules": "chinese", "komi": 7.5,
                "boardXSize": 19, "boardYSize": 19, "maxVisits": 1,
                "analyzeTurns": list(range(len(moves) + 1))})
        turns = set()
        for _ in range(len(moves) + 1):
            a = e.next(timeout=300)
            assert a["id"] == "all" and "error" not in a, a
            turns.add(a["turnNumber"])
        assert turns == set(range(len(moves) + 1))
        grown = e.peak_rss_mb() - before
        print(f"peak memory grown by one query of {len(moves) + 1} turns: {grown:.1f} MB")
        assert grown < 30, grown
    finally:
        e.close()


def test_reports_during_a_long_search_come_every_interval_with_the_visits_growing(tiny_model):
    """KaTrain's deep analysis: `reportDuringSearchEvery` 0.1 on a search of 20,000 visits
    (`--max-visits 20000`): a report about every 0.1 s, each with more visits, until the
    user moves on (terminate) and the final answer comes with what was searched."""
    import time

    e = Engine(tiny_model, "--max-visits", "20000")
    try:
        e.send(query("deep", maxVisits=20_000, reportDuringSearchEvery=0.1))
        reports: list[tuple[float, int]] = []
        t0 = math.inf
        while time.monotonic() - t0 < 2.0:  # 2 s from the first report (after start-up)
            a = e.next()
            assert a["id"] == "deep" and a["isDuringSearch"] is True, a
            reports.append((time.monotonic(), a["rootInfo"]["visits"]))
            t0 = min(t0, reports[-1][0])
        e.send({"id": "stop", "action": "terminate", "terminateId": "deep"})
        final = e.next()
        while final.get("isDuringSearch"):
            final = e.next()
        visits = [v for _, v in reports]
        gaps = sorted(b[0] - a[0] for a, b in zip(reports, reports[1:]))
        print(f"{len(reports)} reports in 2 s, visits {visits[0]}..{visits[-1]}, "
              f"median gap {gaps[len(gaps) // 2]:.3f} s")
        assert len(reports) >= 8 and all(a < b for a, b in zip(visits, visits[1:])), visits
        assert 0.05 <= gaps[len(gaps) // 2] <= 0.2
        assert final["id"] == "deep" and visits[-1] <= final["rootInfo"]["visits"] < 20_000
    finally:
        e.close()
