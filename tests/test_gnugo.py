"""Our rules against GNU Go 3.8 over GTP (`gnugo --mode gtp --positional-superko
--chinese-rules`), and GNU Go playing full games against our GTP engine.

1. Random games (uniform over our legal moves, pass included) are replayed move by move into
   GNU Go with `play`: every move must be accepted, after every move both engines must hold
   the same stones (`list_stones black/white`), and the set of points GNU Go calls legal for
   the side to move (`is_legal`, asked for every point, pipelined) must equal ours. GNU Go
   with --positional-superko implements the same ko rule as ours, so no difference is
   expected; the test asserts exact equality.
2. GNU Go plays whole games against `python -m training.gtp` through `training.play.referee`,
   which checks every move against our reference rules and that the other side accepts it.
3. GNU Go as the judge (`training.play.referee.judge_game`) of a hand-built settled position with a
   dead stone, and `training.play.gnugo` series: colours, seeds and openings as promised, every
   game judged.

Default run: a few dozen games per size; `AZGO_DIFF_GAMES=1000 pytest tests/test_gnugo.py`
plays that many per size up to 9x9 (a fifth on 13x13, a tenth on 19x19). In CI (CI=true) a
missing GNU Go fails these tests; elsewhere they are skipped with the reason.
"""

import os
import random
import sys

import pytest

from training.go import fastgo
from training.go.coords import BLACK, WHITE, from_gtp, to_gtp
from training.go.rules import Position
from training.play import gnugo as series
from training.play.gtp_client import GtpClient, find_gnugo
from training.play.referee import GameResult, judge_game, parse_score, play_game

pytestmark = pytest.mark.gnugo

DIFF_GAMES = int(os.environ.get("AZGO_DIFF_GAMES", "0"))
GAMES = {5: (60, 1), 7: (40, 1), 9: (25, 1), 13: (3, 5), 19: (1, 10)}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def gnugo_path():
    path = find_gnugo()
    if path is None:
        reason = "GNU Go not found on PATH or in /usr/games (apt-get install gnugo)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"GNU Go is required in CI: {reason}")
        pytest.skip(reason)
    return path


def gnugo(path: str, level: int = 1, seed: int = 1) -> GtpClient:
    return GtpClient([path, "--mode", "gtp", "--positional-superko", "--chinese-rules",
                      "--level", str(level), "--seed", str(seed)], name="gnugo")


def gnugo_stones(engine: GtpClient, n: int, color: str) -> set[int]:
    return {from_gtp(v, n) for v in engine.send(f"list_stones {color}").split()}


def replay_random_game(engine: GtpClient, n: int, rng: random.Random, stats: dict) -> None:
    engine.send(f"boardsize {n}")
    engine.send("clear_board")
    ours = fastgo.FastBoard(n)
    names = {BLACK: "black", WHITE: "white"}
    while not ours.is_over():
        color = names[ours.to_play]
        legal = set(ours.legal_moves().tolist()) - {n * n}
        replies = engine.send_many([f"is_legal {color} {to_gtp(p, n)}" for p in range(n * n)])
        theirs = {p for p, r in enumerate(replies) if r == "1"}
        assert theirs == legal, (
            f"{n}x{n} ply {ours.n_moves}: only ours {sorted(to_gtp(p, n) for p in legal - theirs)}"
            f", only GNU Go {sorted(to_gtp(p, n) for p in theirs - legal)}"
        )
        stats["legal_sets"] += 1
        move = rng.choice(sorted(legal | {n * n}))
        engine.send(f"play {color} {to_gtp(move, n)}")  # raises GtpError if refused
        ours.play(move)
        board = ours.board().ravel()
        black = {p for p in range(n * n) if board[p] == BLACK}
        white = {p for p in range(n * n) if board[p] == WHITE}
        assert gnugo_stones(engine, n, "black") == black, f"{n}x{n} ply {ours.n_moves}"
        assert gnugo_stones(engine, n, "white") == white, f"{n}x{n} ply {ours.n_moves}"
    stats["games"] += 1
    stats["moves"] += ours.n_moves


@pytest.mark.parametrize("n", sorted(GAMES))
def test_random_games_agree_with_gnugo_on_legal_moves_and_stones(gnugo_path, n):
    default, divisor = GAMES[n]
    games = max(1, DIFF_GAMES // divisor) if DIFF_GAMES else default
    rng = random.Random(n + 77)
    stats = {"games": 0, "moves": 0, "legal_sets": 0}
    with gnugo(gnugo_path) as engine:
        for _ in range(games):
            replay_random_game(engine, n, rng, stats)
    print(f"{n}x{n}: {stats}")
    assert stats["games"] == games


def our_engine(seed: int) -> GtpClient:
    return GtpClient([sys.executable, "-m", "training.gtp", "--seed", str(seed)], cwd=REPO,
                     name="azgo")


@pytest.mark.parametrize("size,gnugo_color", [(9, BLACK), (9, WHITE), (7, BLACK)])
def test_gnugo_plays_a_full_game_against_our_gtp_engine(gnugo_path, size, gnugo_color):
    with gnugo(gnugo_path, seed=size) as gg, our_engine(seed=size) as ours:
        black, white = (gg, ours) if gnugo_color == BLACK else (ours, gg)
        game = play_game(black, white, size=size, komi=7.5)
    assert game.end in ("two passes", "resignation", "move cap")
    assert len(game.moves) >= 10
    if game.end != "resignation":
        # replaying the refereed moves gives the same Tromp-Taylor result
        pos = Position(size, komi=7.5, max_moves=4 * size * size)
        for m in game.moves:
            pos.play(from_gtp(m, size))
        assert pos.result() == game.result
        assert game.engine_scores[f"{'white' if gnugo_color == BLACK else 'black'} azgo"] \
            == game.result  # our final_score is the referee's Tromp-Taylor count
    print(f"{size}x{size} gnugo {'black' if gnugo_color == BLACK else 'white'}: "
          f"{len(game.moves)} moves, {game.end}, {game.result}, {game.engine_scores}")


def settled_game(dead_white_stone: bool) -> list[str]:
    """9x9: a black wall on column F and a white wall on G (black owns A-F, 54 points, white
    G-J, 27), optionally with a lone white stone at B5 inside black's area, then two passes."""
    moves = []
    for row in range(1, 10):
        moves += [f"F{row}", f"G{row}"]
    if dead_white_stone:
        moves += ["pass", "B5"]
    return moves + ["pass", "pass"]


def area_result(moves: list[str], size: int, komi: float) -> tuple[float, str]:
    pos = Position(size, komi=komi, max_moves=4 * size * size)
    for m in moves:
        pos.play(from_gtp(m, size))
    return pos.score(), pos.result()


def test_judge_agrees_with_a_hand_built_settled_position(gnugo_path):
    with gnugo(gnugo_path, level=10) as judge:
        clean = judge_game(judge, 9, 7.5, settled_game(False))
        dead = judge_game(judge, 9, 7.5, settled_game(True))
    assert clean == "B+19.5"  # 54 - 27 - 7.5
    assert area_result(settled_game(False), 9, 7.5) == (19.5, "B+19.5")
    # The lone stone is dead: the judge removes it, the area count keeps it (and then the
    # whole region A-E touches white: nobody's), and names the other winner.
    assert dead == "B+19.5"
    score, result = area_result(settled_game(True), 9, 7.5)
    assert result == "W+26.5"  # black: 9 wall stones; white: 27 + 1
    game = GameResult(size=9, komi=7.5, moves=settled_game(True), score=score, result=result,
                      end="two passes", judgement=dead)
    assert game.disagrees
    assert parse_score(dead) == 19.5 and parse_score("W+0.5") == -0.5 and parse_score("0") == 0
    for bad in ("B+R", "W+", "B+-3", "resign", "B+nan"):
        with pytest.raises(ValueError):
            parse_score(bad)


# A GTP player that thinks argv[1] seconds a move, then passes, and calls the stones argv[2] dead;
# it never answers the command argv[3], if given (an outside engine whose count is a search
# longer than its timeout: KataGo's, 100 visits).
PASSING_ENGINE = """
import sys, time
for line in sys.stdin:
    words = line.split()
    if words and words[0].isdigit():
        words = words[1:]  # the command's id
    if not words:
        continue
    if words[0] == (sys.argv[3:] or [None])[0]:
        time.sleep(3600)
    if words[0] in ("genmove", "kgs-genmove_cleanup"):
        time.sleep(float(sys.argv[1]))
        print("= pass\\n", flush=True)
    elif words[0] == "final_status_list":
        print("= " + sys.argv[2] + "\\n", flush=True)
    elif words[0] == "final_score":
        print("= 0\\n", flush=True)
    elif words[0] == "quit":
        print("=\\n", flush=True)
        break
    else:
        print("=\\n", flush=True)
"""


def test_a_dispute_about_dead_stones_is_played_out_before_the_judge_counts(gnugo_path):
    """GNU Go (black) against a player that only passes and calls three stones of black's wall
    dead: at the two passes their dead stones differ, so the referee resumes the game with
    both on `kgs-genmove_cleanup`; GNU Go takes the lone white stone in its area off the
    board, and the judge and the Tromp-Taylor count of what comes of it agree."""
    opening = settled_game(True)[:-2]  # the walls, white's lone stone on B5, black to move
    claimer = [sys.executable, "-c", PASSING_ENGINE, "0", "F1 F2 F3"]
    with gnugo(gnugo_path, level=1, seed=3) as gg, GtpClient(claimer, name="claimer") as other, \
            gnugo(gnugo_path, level=10) as judge:
        game = play_game(gg, other, 9, 7.5, opening=opening, judge=judge, playout=True)
    print(game.moves, game.disputed_dead, game.judgement_at_passes, game.judgement)
    start = game.playout_from
    assert start is not None and game.moves[start - 2:start] == ["pass", "pass"]
    assert game.disputed_dead["white"] == ["F1", "F2", "F3"]
    assert not set(game.disputed_dead["black"]) & {"F1", "F2", "F3"}
    assert game.end == "two passes" and game.moves[-2:] == ["pass", "pass"]
    assert game.judgement_at_passes == "B+19.5"  # the judge removes B5 itself
    assert game.judgement == game.result == "B+19.5"  # B5 was taken: both counts agree
    pos = Position(9, komi=7.5, max_moves=4 * 81)
    for m in game.moves:
        pos.play_on(from_gtp(m, 9))
    assert pos.result() == game.result and pos.board[from_gtp("B5", 9)] == 0
    outcome = series.Outcome(series.GameSpec(0, tuple(opening), True, 3), game)
    assert outcome.points_at_passes == outcome.points == 1 and not outcome.wiped_out
    assert f"played out from move {start + 1}" in outcome.to_sgf("azgo", "claimer")
    assert outcome.to_json()["playout_from"] == start
    # Two GNU Go engines name the same dead stones: nothing to play out.
    with gnugo(gnugo_path, level=1, seed=1) as b, gnugo(gnugo_path, level=1, seed=2) as w, \
            gnugo(gnugo_path, level=10) as judge:
        game = play_game(b, w, 5, 0.5, judge=judge, playout=True)
    assert game.end in ("two passes", "resignation")
    assert game.playout_from is None and game.judgement_at_passes is None


@pytest.mark.parametrize("stalls_on", ["final_status_list", "final_score"])
def test_an_outside_engine_slow_to_count_is_judged_without_its_count(gnugo_path, stalls_on):
    """The untrusted player is never asked its own final_score; one that does not name its
    dead stones within its timeout leaves the game unplayed-out, judged as the passes left
    it, with the reason kept; either way the game (and the series) goes on."""
    opening = settled_game(True)[:-2]
    passer = [sys.executable, "-c", PASSING_ENGINE, "0", ""]
    staller = [sys.executable, "-c", PASSING_ENGINE, "0", "F1 F2 F3", stalls_on]
    with GtpClient(passer, name="passer") as b, \
            GtpClient(staller, timeout_s=1.0, name="staller") as w, \
            gnugo(gnugo_path, level=10) as judge:
        game = play_game(b, w, 9, 7.5, opening=opening, judge=judge, playout=True,
                         untrusted=w)
    assert game.end == "two passes" and game.judgement == "B+19.5"
    assert list(game.engine_scores) == ["black passer"]
    outcome = series.Outcome(series.GameSpec(0, tuple(opening), True, 3), game)
    if stalls_on == "final_status_list":
        assert game.playout_from is None and not game.disputed_dead
        assert game.playout_skipped.startswith("staller (white) did not name its dead stones")
        assert "no answer to 'final_status_list dead' within 1 s" in game.playout_skipped
        assert "not played out: staller" in outcome.describe()
        assert outcome.to_json()["playout_skipped"] == game.playout_skipped
    else:  # it named them (a dispute, played out), then was not asked to count
        assert game.playout_from is not None and game.playout_skipped is None
        assert game.disputed_dead == {"black": [], "white": ["F1", "F2", "F3"]}


def test_schedule_pairs_openings_alternates_colours_and_gives_distinct_seeds():
    specs = series.schedule(10, 9, seed=4)
    assert [s.we_are_black for s in specs] == [True, False] * 5
    assert len({s.seed for s in specs}) == 10
    for a, b in zip(specs[::2], specs[1::2]):
        assert a.opening == b.opening  # each opening once with each colour
    openings = {s.opening for s in specs}
    assert len(openings) == 5  # and the pairs differ
    for opening in openings:
        assert len(opening) == series.OPENING_STONES and len(set(opening)) == len(opening)
        for move in opening:  # off the first line
            assert move[0] not in "AJ" and move[1:] not in ("1", "9"), opening
    assert series.schedule(10, 9, seed=4) == specs  # reproducible
    assert series.schedule(10, 9, seed=5) != specs


def test_a_series_plays_the_schedule_and_gnugo_judges_every_game(gnugo_path):
    """Our random GTP player against GNU Go level 1 on 7x7, two games at once."""
    specs = series.schedule(4, 7, seed=1)
    commands = []

    def opponent(seed):
        argv = series.gnugo_command(1, seed)
        commands.append(argv)
        return argv

    ours = [sys.executable, "-m", "training.gtp", "--seed", "5"]
    seen = []
    outcomes = series.play_series(ours, opponent, specs, size=7, komi=7.5, jobs=2,
                                  on_game=seen.append)
    assert [o.spec for o in outcomes] == specs and len(seen) == 4
    assert sorted(int(c[c.index("--seed") + 1]) for c in commands) == [1, 2, 3, 4]
    for o in outcomes:
        colour = "black" if o.spec.we_are_black else "white"
        assert f"{colour} azgo" in o.game.engine_scores  # we played the colour we were given
        assert tuple(o.game.moves[: len(o.spec.opening)]) == o.spec.opening
        assert o.game.end in ("two passes", "move cap")
        judged = parse_score(o.game.judgement)
        assert o.points == (1 if (judged > 0) == o.spec.we_are_black else -1)
        record = o.to_json()
        assert record["judge"] == o.game.judgement and record["area"] == o.game.result
    w, d, losses = series.tally(outcomes)
    assert (w, d, losses) == (0, 0, 4), [o.describe() for o in outcomes]  # random vs GNU Go


# -- games under a clock -----------------------------------------------------------------------


def test_gnugo_plays_under_the_referees_clock(gnugo_path):
    """GNU Go takes `time_settings` and `time_left` only in whole seconds, as GTP says."""
    from training.play.referee import TimeControl

    with gnugo(gnugo_path, seed=1) as gg, our_engine(seed=1) as ours:
        game = play_game(gg, ours, 5, 0.5, time_control=TimeControl(0, 5, 1))
    assert game.end in ("two passes", "resignation") and max(game.think_max_s.values()) < 5


def test_the_referee_clock_counts_main_time_then_byo_yomi():
    from training.play.referee import GameClock, TimeControl

    clock = GameClock(TimeControl(10, 5, 2))
    assert clock.time_left() == (10, 0)
    assert clock.spend(9.5) and clock.time_left() == (0.5, 0)
    assert clock.spend(3.0)  # 0.5 s of main time, then 2.5 s of the first period
    assert clock.time_left() == (2.5, 1)
    assert clock.spend(2.0) and clock.time_left() == (5, 2)  # period done: a fresh one
    assert not clock.spend(5.1)  # over the period: the flag falls
    absolute = GameClock(TimeControl(1, 0, 0))
    assert absolute.spend(0.9) and not absolute.spend(0.2)


def test_a_slow_engine_loses_on_time_and_a_quick_one_never_does():
    from training.play.referee import TimeControl

    quick = [sys.executable, "-m", "training.gtp", "--size", "5", "--seed", "1"]
    slow = [sys.executable, "-c", PASSING_ENGINE, "1.0", ""]
    tc = TimeControl(0, 0.5, 1)  # half a second a move
    with GtpClient(quick, cwd=str(REPO), name="quick") as a, \
            GtpClient(slow, name="slow", timeout_s=30) as b:
        game = play_game(a, b, 5, 0.5, time_control=tc)
    assert game.end == "time" and game.result == "B+T" and game.winner == BLACK
    assert game.moves[-1] == "timeout" and game.think_max_s["white"] >= 1.0
    with GtpClient(quick, cwd=str(REPO), name="b") as a, \
            GtpClient(quick[:-1] + ["2"], cwd=str(REPO), name="w") as b:
        game = play_game(a, b, 5, 0.5, time_control=TimeControl(0, 2, 1))
    assert game.end == "two passes" and max(game.think_max_s.values()) < 2
