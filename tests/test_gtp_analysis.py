"""Live analysis and the clock of our GTP engine, driven the way front-ends drive it: a real
`python -m training.gtp --model FILE` subprocess, its streamed lines parsed as Lizzie, Sabaki
and KaTrain parse them (`info move ... pv ...` groups, `ownership` floats, `play MOVE`)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time

import pytest

from training.go.coords import BLACK, WHITE, from_gtp
from training.play.clock import MIN_SECONDS, SAFETY_S, Clock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 5  # configs/tiny.yaml



class Stream:
    """The engine's stdout line by line, with a timeout (what a front-end reads)."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def line(self, timeout: float = 60.0) -> str:
        line = self.lines.get(timeout=timeout)
        assert line is not None, "the engine exited"
        return line

    def reply(self, command: str, timeout: float = 60.0) -> list[str]:
        """Send a command and read its whole reply (up to the blank line)."""
        self.send(command)
        out = [self.line(timeout)]
        while out[-1] != "":
            out.append(self.line(timeout))
        return out[:-1]

    def close(self) -> None:
        try:
            self.send("quit")
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


@pytest.fixture
def engine(tiny_model):
    stream = Stream([sys.executable, "-m", "training.gtp", "--model", tiny_model,
                     "--seconds-per-move", "0.3"])
    yield stream
    stream.close()


def parse_infos(line: str) -> tuple[list[dict], list[float] | None]:
    """A `kata-analyze` / `lz-analyze` line as the front-ends read it: groups that start at
    `info`, key-value pairs up to `pv`, the rest of the group the variation; an optional
    trailing `ownership` group of floats."""
    ownership = None
    if " ownership " in f" {line} ":
        line, _, rest = line.partition("ownership")
        ownership = [float(x) for x in rest.split()]
    groups = []
    for chunk in line.split("info ")[1:]:
        words = chunk.split()
        info: dict = {}
        while words:
            key = words.pop(0)
            if key == "pv":
                info["pv"] = words
                break
            info[key] = words.pop(0)
        groups.append(info)
    return groups, ownership


def test_lz_analyze_streams_until_the_next_command(engine):
    engine.reply("boardsize 5")
    engine.reply("clear_board")
    engine.reply("komi 0.5")
    engine.reply("play B C3")
    engine.send("lz-analyze W 10")  # Lizzie's form: colour and centiseconds
    assert engine.line() == "="
    seen = []
    deadline = time.monotonic() + 20
    while len(seen) < 3 and time.monotonic() < deadline:
        seen.append(engine.line())
    assert len(seen) == 3 and all(line.startswith("info move ") for line in seen)
    groups, ownership = parse_infos(seen[-1])
    assert ownership is None and groups
    for order, info in enumerate(groups):
        assert int(info["order"]) == order
        assert 0 <= int(info["winrate"]) <= 10000 and 0 <= int(info["prior"]) <= 10000
        assert int(info["lcb"]) <= int(info["winrate"])
        assert int(info["visits"]) >= 1
        assert info["pv"][0] == info["move"]
        assert from_gtp(info["move"], N) != from_gtp("C3", N)  # occupied: never suggested
    visits = [sum(int(i["visits"]) for i in parse_infos(line)[0]) for line in seen]
    assert visits == sorted(visits) and visits[-1] > visits[0]  # the search goes on
    # Any command ends the analysis: the stream ends with a blank line, then the reply.
    engine.send("name")
    rest = []
    while True:
        line = engine.line()
        rest.append(line)
        if line == "= azgo":
            break
    assert rest[-2] == "" and all(x.startswith("info") for x in rest[:-2])
    assert engine.line() == ""
    # The board is untouched: white is still to move, and C3 still black's.
    assert engine.reply("play W C3") == ["? illegal move"]


def test_kata_analyze_reports_scores_and_the_ownership_of_every_point(engine):
    engine.reply("boardsize 5")
    engine.reply("clear_board")
    engine.send("kata-analyze B interval 5 ownership true pvLength 3")
    assert engine.line() == "="
    line = engine.line()
    groups, ownership = parse_infos(line)
    assert groups and ownership is not None and len(ownership) == N * N
    assert all(-1 <= v <= 1 for v in ownership)
    for info in groups:
        assert 0 <= float(info["winrate"]) <= 1 and 0 <= float(info["prior"]) <= 1
        assert abs(float(info["utility"]) - (2 * float(info["winrate"]) - 1)) < 1e-4
        assert float(info["scoreLead"]) == float(info["scoreMean"])  # the tiny net has a head
        assert 1 <= len(info["pv"]) <= 3
    engine.send("")  # a raw newline ends it too
    while engine.line() != "":
        pass
    assert engine.reply("protocol_version") == ["= 2"]


def test_genmove_analyze_thinks_aloud_then_plays(engine):
    engine.reply("boardsize 5")
    engine.reply("clear_board")
    reply = engine.reply("kata-genmove_analyze B 5")
    assert reply[0] == "="
    assert reply[-1].startswith("play ")
    assert all(line.startswith("info move ") for line in reply[1:-1])
    move = reply[-1].split()[1]
    assert engine.reply(f"play W {move}") == ["? illegal move"]  # black's stone is there
    reply = engine.reply("lz-genmove_analyze W")  # no interval: just the move
    assert reply[0] == "=" and reply[-1].startswith("play ") and len(reply) == 2


def test_the_random_engine_refuses_analysis_by_name():
    stream = Stream([sys.executable, "-m", "training.gtp", "--size", "5"])
    try:
        assert stream.reply("lz-analyze 10") == ["? analysis needs a model (--model FILE)"]
        assert stream.reply("kata-analyze B interval x") == [
            "? analysis needs a model (--model FILE)"]
        assert stream.reply("name") == ["= azgo"]
    finally:
        stream.close()


def test_a_bad_analysis_argument_is_a_syntax_error(engine):
    assert engine.reply("kata-analyze B interval soon")[0].startswith("? syntax error")
    assert engine.reply("lz-analyze B 10 maxmoves many")[0].startswith("? syntax error")
    assert engine.reply("name") == ["= azgo"]


def test_byo_yomi_moves_stay_inside_their_period(engine):
    """time_settings 0 1 1: one second a move. The engine keeps SAFETY_S in hand, so each
    genmove answers well inside the second (measured here, pipes included)."""
    engine.reply("boardsize 5")
    engine.reply("clear_board")
    assert engine.reply("time_settings 0 1 1") == ["="]
    times = []
    for k in range(6):
        color = "B" if k % 2 == 0 else "W"
        engine.reply(f"time_left {color} 1 1")
        t0 = time.monotonic()
        engine.reply(f"genmove {color}")
        times.append(time.monotonic() - t0)
    assert max(times) < 1.0, times
    assert engine.reply("time_settings 0 1 x")[0].startswith("? syntax error")
    assert engine.reply("time_left B -3 0")[0].startswith("? syntax error")
    assert engine.reply("kgs-time_settings byoyomi 0 2 3") == ["="]
    assert engine.reply("kgs-time_settings sudden 3")[0].startswith("? syntax error")


# -- what the front-ends send, to the engine a user starts (default flags and config) --------


@pytest.fixture(scope="module")
def default_process(tiny_model):
    stream = Stream([sys.executable, "-m", "training.gtp", "--model", tiny_model])
    yield stream
    stream.close()


@pytest.fixture
def default_engine(default_process):
    """`python -m training.gtp --model M`: the default --simulations (100) and config; one
    process for the module (a start costs seconds), each test on a new 5x5 game without a
    clock."""
    for command in ("boardsize 5", "clear_board", "kgs-time_settings none"):
        assert default_process.reply(command) == ["="], command
    return default_process


def _visits(line: str) -> int:
    return sum(int(info["visits"]) for info in parse_infos(line)[0])


def test_lizzie_analysis_deepens_past_the_move_budget_until_the_next_command(default_engine):
    """Lizzie's start-up and analysis: `lz-analyze B 10` (every 0.1 s), then a user who
    watches for 4 s: at least 10 info lines, the visits growing far past the 100 simulations
    a move gets. (It used to print one line after 100 simulations, then nothing.)"""
    engine = default_engine
    assert engine.reply("name") == ["= azgo"]
    assert engine.reply("version")[0].startswith("= ")
    assert engine.reply("protocol_version") == ["= 2"]
    for command in ("boardsize 5", "komi 0.5", "clear_board", "play B C3", "play W B2"):
        assert engine.reply(command) == ["="], command
    engine.send("lz-analyze B 10")
    t0 = time.monotonic()
    assert engine.line() == "="
    time.sleep(max(0.0, 4.0 - (time.monotonic() - t0)))
    engine.send("play B D4")  # the user plays a move: the analysis ends first
    lines = []
    while True:
        line = engine.line()
        if line == "":
            break
        lines.append(line)
    assert engine.line() == "=" and engine.line() == ""  # then the play's own reply
    assert len(lines) >= 10 and all(x.startswith("info move ") for x in lines), lines[:3]
    visits = [_visits(x) for x in lines]
    print(f"lz-analyze B 10 for 4 s: {len(lines)} info lines, visits {visits[0]}..{visits[-1]}")
    assert all(a < b for a, b in zip(visits, visits[1:])), visits
    assert visits[-1] > 10 * 100, visits  # far past the move budget
    engine.send("kata-analyze W interval 10")  # Sabaki's form, on the new position
    assert engine.line() == "="
    first = _visits(engine.line())
    assert _visits(engine.line()) > first
    engine.send("")  # a raw newline stops it
    while engine.line() != "":
        pass
    assert engine.reply("name") == ["= azgo"]


def test_sabaki_genmove_analyze_shows_the_search_of_the_move_it_plays(default_engine):
    """`kata-genmove_analyze B 10` (Sabaki's engine-plays-with-analysis): at least one info
    line, the analysis of the search that chose the move, then its `play`. (It used to answer
    `play` alone: the 100 simulations were done before the first interval.)"""
    engine = default_engine
    engine.reply("boardsize 5")
    engine.reply("clear_board")
    reply = engine.reply("kata-genmove_analyze B 10")
    assert reply[0] == "=" and reply[-1].startswith("play "), reply
    infos = reply[1:-1]
    assert infos and all(x.startswith("info move ") for x in infos), reply
    move = reply[-1].split()[1]
    groups, _ = parse_infos(infos[-1])
    assert groups[0]["move"] == move  # order 0: the move it plays
    assert sum(int(g["visits"]) for g in groups) == 100  # the whole search: --simulations
    reply = engine.reply("lz-genmove_analyze W 10")
    assert reply[-1].startswith("play ") and len(reply) >= 3, reply


def test_under_a_clock_a_move_thinks_for_its_share_not_the_move_budget(default_engine):
    """gogui / CGOS: `time_settings 0 2 1` (2 s a move) with `time_left` before each move:
    each genmove thinks between 0.5 and 2 s, measured at the front-end (it used to answer in
    about 0.05 s, capped by the 100 simulations of a move)."""
    engine = default_engine
    engine.reply("boardsize 5")
    engine.reply("clear_board")
    assert engine.reply("time_settings 0 2 1") == ["="]
    times = []
    for k in range(4):
        color = "B" if k % 2 == 0 else "W"
        if k >= 2:  # the first moves on the engine's own count, then the controller's
            assert engine.reply(f"time_left {color} 2 1") == ["="]
        t0 = time.monotonic()
        (answer,) = engine.reply(f"genmove {color}")
        times.append(time.monotonic() - t0)
        assert answer.startswith("= ")
    print(f"genmove seconds under time_settings 0 2 1: {[round(t, 2) for t in times]}")
    assert all(0.5 <= t <= 2.0 for t in times), times
    reply = engine.reply("kata-genmove_analyze B 20")  # with analysis: the same clock
    assert reply[-1].startswith("play ") and len(reply) >= 4, reply


def test_max_simulations_caps_a_clocked_move_and_the_analysis(tiny_model):
    """The user's cap (--max-simulations) holds under a clock and in analysis."""
    engine = Stream([sys.executable, "-m", "training.gtp", "--model", tiny_model,
                     "--simulations", "16", "--max-simulations", "64"])
    try:
        engine.reply("boardsize 5")
        engine.reply("time_settings 0 2 1")
        t0 = time.monotonic()
        reply = engine.reply("kata-genmove_analyze B 1")
        assert time.monotonic() - t0 < 1.0
        assert sum(int(g["visits"]) for g in parse_infos(reply[-2])[0]) == 64, reply
        engine.send("lz-analyze W 1")
        assert engine.line() == "="
        time.sleep(1.5)
        engine.send("name")
        lines = []
        while (line := engine.line()) != "":
            lines.append(line)
        assert engine.line() == "= azgo" and _visits(lines[-1]) == 64, lines[-1:]
    finally:
        engine.close()
    bad = subprocess.run([sys.executable, "-m", "training.gtp", "--model", tiny_model,
                          "--simulations", "100", "--max-simulations", "50"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--max-simulations must be from --simulations" in bad.stderr


# -- the clock's arithmetic ----------------------------------------------------------------


def test_no_settings_or_no_limit_leaves_the_engine_its_own_budget():
    clock = Clock()
    assert clock.budget(BLACK, 9, 0) is None
    clock.settings(0, 5, 0)  # GTP: byo-yomi time with 0 stones means no time limit
    assert clock.budget(BLACK, 9, 0) is None
    clock.kgs_settings("none", [])
    assert clock.budget(WHITE, 9, 30) is None


def test_main_time_is_spread_over_the_moves_still_expected():
    clock = Clock()
    clock.settings(300, 0, 0)  # absolute: 5 minutes
    early = clock.budget(BLACK, 9, 0)
    assert early == pytest.approx(300 / (0.4 * 81))
    clock.time_left(BLACK, 20, 0)
    late = clock.budget(BLACK, 9, 80)
    assert late == pytest.approx(20 / 10)  # never over fewer than MIN_MOVES_LEFT moves
    clock.time_left(BLACK, 0.3, 0)
    assert clock.budget(BLACK, 9, 80) == MIN_SECONDS  # nearly out: the shortest search


def test_the_clock_limit_is_the_most_a_move_may_take_without_losing():
    clock = Clock()
    clock.settings(0, 2, 1)  # 2 s a move
    budget, limit = clock.allowance(BLACK, 9, 0)
    assert budget == pytest.approx(1.0)  # half a period: the main time is empty
    assert limit == pytest.approx(2 - SAFETY_S - 0.2)  # the period, less the margins
    clock.time_left(BLACK, 2, 1)
    assert clock.allowance(BLACK, 9, 0) == (pytest.approx(1.3), pytest.approx(1.3))
    clock.settings(60, 0, 0)  # absolute
    budget, limit = clock.allowance(WHITE, 9, 0)
    assert budget == clock.budget(WHITE, 9, 0) and limit == pytest.approx(60 - SAFETY_S)
    clock.settings(0, 5, 0)
    assert clock.allowance(BLACK, 9, 0) is None


def test_byo_yomi_budget_keeps_a_safety_margin_and_the_clock_counts_down():
    clock = Clock()
    clock.settings(10, 5, 1)
    main = clock.budget(BLACK, 9, 0)
    assert main == pytest.approx(10 / (0.4 * 81) + 0.5 * 5)  # part of a period on top
    clock.spent(BLACK, 10.0)  # main time used up exactly
    clock.spent(BLACK, 1.0)  # into byo-yomi: a fresh period after the stone
    clock.time_left(WHITE, 5, 1)
    assert clock.budget(WHITE, 9, 40) == pytest.approx(5 - SAFETY_S - 0.5)
    clock.time_left(WHITE, 12, 3)  # Canadian: 12 s for 3 stones
    assert clock.budget(WHITE, 9, 40) == pytest.approx(4 - SAFETY_S - 0.4)
    with pytest.raises(ValueError):
        clock.settings(float("nan"), 0, 0)
    with pytest.raises(ValueError):
        clock.time_left(BLACK, float("inf"), 0)


def test_gogui_analyze_commands_draw_the_policy_and_the_ownership(engine):
    engine.reply("boardsize 5")
    engine.reply("clear_board")
    engine.reply("play B C3")
    menu = engine.reply("gogui-analyze_commands")
    assert menu[0] == "= gfx/Policy/azgo-policy" and menu[1] == "gfx/Ownership/azgo-ownership"
    (policy,) = engine.reply("azgo-policy")
    words = policy.split()
    assert words[:2] == ["=", "LABEL"] and len(words) > 2
    points = words[2::2]
    assert "C3" not in points and all(from_gtp(p, N) < N * N for p in points)
    assert all(0 <= int(v) <= 100 for v in words[3::2])
    (ownership,) = engine.reply("azgo-ownership")
    words = ownership.split()
    assert words[:2] == ["=", "INFLUENCE"] and len(words[2:]) == 2 * N * N
    assert all(-1 <= float(v) <= 1 for v in words[3::2])
    random_engine = Stream([sys.executable, "-m", "training.gtp", "--size", "5"])
    try:
        assert random_engine.reply("gogui-analyze_commands") == ["="]
        assert random_engine.reply("azgo-policy")[0].startswith("? the policy needs a model")
    finally:
        random_engine.close()
