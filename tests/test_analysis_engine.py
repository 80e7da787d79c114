"""`python -m training.analysis`: KataGo's JSON analysis protocol, driven as KaTrain drives
`katago analysis`: a real subprocess, JSON lines in, JSON lines out, parsed by json."""

from __future__ import annotations

import json
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

    def send(self, query: dict | str) -> None:
        self.proc.stdin.write((query if isinstance(query, str) else json.dumps(query)) + "\n")
        self.proc.stdin.flush()

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
