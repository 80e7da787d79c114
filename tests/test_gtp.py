"""Our GTP engine, `python -m training.gtp`, driven as a real subprocess over pipes."""

import os
import subprocess
import sys

import pytest

from training.go.coords import BLACK, WHITE, from_gtp
from training.go.endgame import judged_score
from training.go.rules import Position
from training.play.players import RandomPlayer
from training.play.gtp_client import GtpClient, GtpEngineError, GtpError
from training.play.referee import play_game

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = [sys.executable, "-m", "training.gtp"]


@pytest.fixture
def engine():
    with GtpClient(ENGINE + ["--seed", "3"], cwd=REPO, name="azgo") as client:
        yield client


def test_identity_and_command_list(engine):
    assert engine.send("protocol_version") == "2"
    assert engine.send("name") == "azgo"
    assert engine.send("version")
    commands = engine.send("list_commands").split("\n")
    for c in ("protocol_version name version known_command list_commands quit boardsize "
              "clear_board komi play genmove undo showboard final_score").split():
        assert c in commands
        assert engine.send(f"known_command {c}") == "true"
    assert engine.send("known_command fly") == "false"


def test_raw_protocol_echoes_ids_and_ignores_comments_and_blank_lines():
    script = "\n# a comment\n42 name\n\n  7 boardsize 99 # too big\nwhat\n9 quit\n"
    out = subprocess.run(ENGINE, input=script, capture_output=True, text=True, cwd=REPO,
                         timeout=60).stdout
    assert out == "=42 azgo\n\n?7 unacceptable size\n\n? unknown command\n\n=9\n\n"


def test_boardsize_and_errors(engine):
    for bad in ("4", "20", "x"):
        with pytest.raises(GtpError):
            engine.send(f"boardsize {bad}")
    with pytest.raises(GtpError, match="unacceptable size"):
        engine.send("boardsize 25")
    engine.send("boardsize 19")
    engine.send("play black T19")
    with pytest.raises(GtpError, match="unknown command"):
        engine.send("teleport")
    with pytest.raises(GtpError, match="syntax error"):
        engine.send("play purple A1")
    with pytest.raises(GtpError):
        engine.send("komi lots")


def test_illegal_play_is_refused_and_leaves_the_board_unchanged(engine):
    engine.send("boardsize 5")
    engine.send("clear_board")
    for move in ("black B5", "white A5", "black A4"):  # black captures A5
        engine.send(f"play {move}")
    before = engine.send("showboard")
    for bad in ("white B5", "white Z9", "black A9"):
        with pytest.raises(GtpError):
            engine.send(f"play {bad}")
    assert engine.send("showboard") == before
    # suicide: white at A5 would have no liberty and capture nothing
    with pytest.raises(GtpError, match="illegal move"):
        engine.send("play white A5")
    assert engine.send("showboard") == before


def test_ko_recapture_is_refused(engine):
    engine.send("boardsize 5")
    for move in ("black B5", "white C5", "black A4", "white B4", "black B3", "white C3",
                 "black E1", "white D4", "black C4"):  # black takes the ko at C4
        engine.send(f"play {move}")
    with pytest.raises(GtpError, match="illegal move"):
        engine.send("play white B4")
    engine.send("play white E2")
    engine.send("play black D1")
    engine.send("play white B4")  # legal after moves elsewhere


def test_final_score_is_tromp_taylor_with_komi(engine):
    engine.send("boardsize 5")
    engine.send("komi 0.5")
    assert engine.send("final_score") == "W+0.5"
    engine.send("komi 0")
    assert engine.send("final_score") == "0"
    engine.send("komi 3.5")
    engine.send("play black C3")
    assert engine.send("final_score") == "B+21.5"


def test_undo_and_out_of_turn_play(engine):
    engine.send("boardsize 5")
    with pytest.raises(GtpError, match="cannot undo"):
        engine.send("undo")
    empty = engine.send("showboard")
    engine.send("play white C3")  # white first: GTP allows either color
    engine.send("play white D3")
    engine.send("undo")
    engine.send("undo")
    assert engine.send("showboard") == empty


def test_genmove_plays_legal_moves_until_two_passes(engine):
    engine.send("boardsize 5")
    pos = Position(5, max_moves=10_000)
    color = "black"
    while not pos.is_over():
        reply = engine.send(f"genmove {color}")
        move = from_gtp(reply, 5)
        pos.play(move)  # raises if the engine's move were illegal
        color = "white" if color == "black" else "black"
    assert engine.send("final_score") == pos.result()
    assert engine.send("genmove black") == "pass"  # the game is over


def test_a_game_two_passes_ended_goes_on_when_the_players_play_out_a_dispute(engine):
    engine.send("boardsize 5")
    engine.send("play black C3")
    engine.send("play white pass")
    engine.send("play black pass")
    assert engine.send("genmove white") == "pass"  # over: a plain genmove still passes
    reply = engine.send("kgs-genmove_cleanup white")  # the dispute: the game goes on
    assert reply not in ("pass", "resign")
    with pytest.raises(GtpError, match="illegal move"):
        engine.send(f"play black {reply}")  # white's stone is on the board
    engine.send("play black pass")
    engine.send("play white pass")  # over again
    free = "B2" if reply != "B2" else "D4"
    engine.send(f"play black {free}")  # a stone played after two passes reopens it too
    with pytest.raises(GtpError, match="illegal move"):
        engine.send(f"play white {free}")


def test_random_player_keeps_its_eyes_and_then_passes():
    board = [BLACK] * 25
    for p in (0, 12, 24):  # three single-point eyes of black
        board[p] = 0
    pos = Position(5, board=tuple(board), to_play=BLACK)
    assert RandomPlayer(0).genmove(pos, BLACK) == 25
    # white may play into them only where it is not suicide: nowhere here
    assert RandomPlayer(0).genmove(pos, WHITE) == 25


def test_two_of_our_engines_play_a_refereed_game():
    with GtpClient(ENGINE + ["--seed", "1"], cwd=REPO) as a, \
            GtpClient(ENGINE + ["--seed", "2"], cwd=REPO) as b:
        game = play_game(a, b, size=7, komi=7.5)
    assert game.end == "two passes" and game.moves[-2:] == ["pass", "pass"]
    assert set(game.engine_scores.values()) == {game.result}


def test_model_flag_with_a_missing_file_fails_clearly():
    proc = subprocess.run(ENGINE + ["--model", "no_such_model.pt", "--simulations", "8"],
                          input="", capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode != 0
    assert "--model no_such_model.pt: no such file" in proc.stderr


@pytest.mark.slow
def test_model_flag_plays_legal_moves_with_a_tiny_network(tmp_path, tiny_cfg):
    from training.learn.net import net_from_config, save_model

    size = tiny_cfg.go.board_size
    path = tmp_path / "model_000001.pt"
    save_model(path, net_from_config(tiny_cfg.net, size), generation=1)
    with GtpClient(ENGINE + ["--model", str(path), "--simulations", "4"], cwd=REPO,
                   timeout_s=120) as engine:
        pos = Position(size, max_moves=10_000)
        for color in ("black", "white", "black", "white"):
            move = from_gtp(engine.send(f"genmove {color}"), size)
            pos.play(move)  # raises if the engine's move were illegal
        # The model's count leaves out the stones its ownership map calls dead.
        dead = {from_gtp(v, size) for v in engine.send("final_status_list dead").split()}
        assert dead <= {p for p in range(size * size) if pos.board[p] != 0}
        score = judged_score(pos.board, size, pos.komi, dead)
        assert engine.send("final_score") == (
            "0" if score == 0 else f"B+{score:g}" if score > 0 else f"W+{-score:g}")


def test_client_times_out_on_a_silent_engine_and_reports_a_dead_one():
    silent = GtpClient([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=0.5)
    with pytest.raises(GtpEngineError, match="no answer"):
        silent.send("name")
    assert silent.returncode is not None  # killed
    dead = GtpClient([sys.executable, "-c", "pass"], timeout_s=10)
    with pytest.raises(GtpEngineError):
        dead.send("name")
    dead.close()


def test_absurd_komi_is_refused_and_the_random_engine_stays_up(engine):
    engine.send("boardsize 5")
    engine.send("komi 2.5")
    for bad in ("nan", "inf", "-inf", "1e300", "400"):
        with pytest.raises(GtpError, match="komi must be a finite number"):
            engine.send(f"komi {bad}")
    assert engine.send("final_score") == "W+2.5"  # the komi before the refusals
    assert from_gtp(engine.send("genmove black"), 5) is not None



def test_nan_komi_then_genmove_keeps_a_model_engine_up(tiny_model):
    """`komi nan` used to reach the search's config check and kill the engine at genmove."""
    with GtpClient(ENGINE + ["--model", tiny_model, "--simulations", "4"], cwd=REPO,
                   timeout_s=120) as engine:
        for bad in ("nan", "inf", "1e300"):
            with pytest.raises(GtpError, match="komi"):
                engine.send(f"komi {bad}")
            assert from_gtp(engine.send("genmove black"), 5) is not None
            assert engine.returncode is None
        engine.send("komi 6.3")  # legal GTP, though no config would accept it
        pos = Position(5, max_moves=10_000)
        engine.send("clear_board")
        for color in ("black", "white"):
            pos.play(from_gtp(engine.send(f"genmove {color}"), 5))
        assert engine.returncode is None


def test_seconds_per_move_is_used_and_not_exceeded(tiny_model):
    """Measured over the real engine: each genmove takes about the budget, searching many
    chunks (not one fixed search), and never much longer."""
    import time

    budget = 0.4
    with GtpClient(ENGINE + ["--model", tiny_model, "--seconds-per-move", str(budget)],
                   cwd=REPO, timeout_s=120) as engine:
        engine.send("boardsize 5")
        times = []
        for color in ("black", "white", "black", "white"):
            t0 = time.perf_counter()
            engine.send(f"genmove {color}")
            times.append(time.perf_counter() - t0)
    print(f"genmove seconds at a {budget} s budget: {[round(t, 3) for t in times]}")
    assert all(0.6 * budget <= t <= budget + 0.25 for t in times), times


@pytest.mark.parametrize("algorithm", ["puct", "gumbel"])
def test_mcts_player_timed_search_uses_the_time_in_one_search(tiny_cfg, algorithm):
    import time
    from dataclasses import replace

    import numpy as np

    from training.play.players import MctsPlayer

    tiny_cfg = replace(tiny_cfg, mcts=replace(tiny_cfg.mcts, algorithm=algorithm))

    def evaluate(planes, legal):  # uniform priors, a little work per call like a small net
        time.sleep(0.001)
        priors = legal.astype(np.float32)
        return priors / priors.sum(1, keepdims=True), np.zeros(len(planes), np.float32)

    player = MctsPlayer(evaluate, tiny_cfg.go, tiny_cfg.mcts, history=tiny_cfg.net.history,
                        seconds_per_move=0.5)
    player.warm_up()
    for _ in range(3):
        t0 = time.perf_counter()
        move = player.genmove([], 0.5)
        took = time.perf_counter() - t0
        assert 0 <= move <= 25
        assert 0.3 <= took <= 0.5 + 0.15, took
        assert player.last_simulations >= 4 * player.chunk
        assert player.last_seconds == pytest.approx(took, abs=0.05)
    visits = player.mcts.root_visits([0])[0]
    assert visits.sum() == player.last_simulations
    if algorithm == "gumbel":
        # one sequential halving over the whole time: the last root moves it kept hold most
        # of the visits (chunks of 16 simulations, each a halving of its own, gave the 16
        # considered moves one visit each per chunk, all alike)
        considered = np.sort(visits[visits > 0])
        assert considered[-1] >= 4 * np.median(considered), considered
    fixed = MctsPlayer(evaluate, tiny_cfg.go, tiny_cfg.mcts, 16, history=tiny_cfg.net.history)
    fixed.genmove([], 0.5)
    assert fixed.last_simulations == 16
    with pytest.raises(ValueError, match="seconds_per_move"):
        MctsPlayer(evaluate, tiny_cfg.go, tiny_cfg.mcts, history=2, seconds_per_move=0)


def test_live_analysis_reads_the_search_that_genmove_plays(tiny_cfg):
    """A genmove with analysis (lz-genmove_analyze) runs the search a plain genmove runs and
    reads it every chunk; open-ended analysis (lz-analyze) runs searches that each double the
    visits, so they gather on few moves. (Chunks of 16 simulations, each a sequential halving
    of its own, played another move and left the 16 considered moves with equal visits.)"""
    import threading
    from dataclasses import replace

    import numpy as np

    from training.play.players import MctsPlayer

    tiny_cfg = replace(tiny_cfg, mcts=replace(tiny_cfg.mcts, algorithm="gumbel"))
    history = tiny_cfg.net.history

    def evaluate(planes, legal):  # uneven priors and values, a function of the position
        priors = np.empty(legal.shape, np.float32)
        values = np.empty(len(planes), np.float32)
        for i, x in enumerate(planes):
            rng = np.random.default_rng(int.from_bytes(np.packbits(x > 0).tobytes()[-8:], "little"))
            priors[i] = rng.random(legal.shape[1]) ** 4 * legal[i]
            values[i] = rng.uniform(-0.8, 0.8)
        return priors / priors.sum(1, keepdims=True), values

    moves = [12, 6]
    player = MctsPlayer(evaluate, tiny_cfg.go, tiny_cfg.mcts, 256, history=history)
    plain = player.genmove(moves, 0.5)
    plain_visits = player.mcts.root_visits([0])[0].copy()
    seen = []
    move = player.genmove(moves, 0.5, on_chunk=lambda: seen.append(
        int(player.mcts.root_visits([0])[0].sum())))
    assert move == plain
    assert np.array_equal(player.mcts.root_visits([0])[0], plain_visits)
    assert len(seen) >= 256 // player.chunk - 1 and seen == sorted(seen), seen

    stop = threading.Event()
    player.analyze(moves, 0.5, stop, lambda: None)  # to a full tree: 256 simulations
    visits = player.mcts.root_visits([0])[0]
    assert visits.sum() == player.last_simulations == 256
    considered = np.sort(visits[visits > 0])
    assert considered[-1] >= 4 * np.median(considered), considered

    stop_after_three = threading.Event()
    calls = []

    def on_chunk():  # the GTP engine sets stop when the next command comes
        calls.append(int(player.mcts.tree.sims_done[0]))
        if len(calls) == 3:
            stop_after_three.set()

    player.analyze(moves, 0.5, stop_after_three, on_chunk)
    assert len(calls) == 3 and player.last_simulations < 256, calls  # stopped where it was


def test_a_clock_makes_the_simulations_a_floor_and_the_cap_holds(tiny_cfg):
    """Under a clock (`genmove(seconds=..., limit=...)`) the search thinks for the time, past
    the simulations of a move; a budget too short for them still gets them while the clock's
    limit allows; `max_simulations` caps it all."""
    import time

    import numpy as np

    from training.play.players import MctsPlayer

    def evaluate(planes, legal):  # a little work per call, like a small net
        time.sleep(0.002)
        priors = legal.astype(np.float32)
        return priors / priors.sum(1, keepdims=True), np.zeros(len(planes), np.float32)

    player = MctsPlayer(evaluate, tiny_cfg.go, tiny_cfg.mcts, 32, history=tiny_cfg.net.history,
                        max_simulations=20_000)
    player.warm_up()
    player.genmove([], 0.5)
    assert player.last_simulations == 32  # no clock: the move's budget
    t0 = time.perf_counter()
    player.genmove([], 0.5, seconds=0.4, limit=1.0)
    took = time.perf_counter() - t0
    assert player.last_simulations > 2 * 32 and 0.25 <= took <= 0.6, (player.last_simulations,
                                                                       took)
    t0 = time.perf_counter()
    player.genmove([], 0.5, seconds=0.01, limit=5.0)  # a floor of 32 past the 0.01 s
    assert player.last_simulations >= 32 and time.perf_counter() - t0 < 2.0
    t0 = time.perf_counter()
    player.genmove([], 0.5, seconds=0.01, limit=0.05)  # the limit wins over the floor
    assert player.last_simulations < 32 and time.perf_counter() - t0 < 0.3
    capped = MctsPlayer(evaluate, tiny_cfg.go, tiny_cfg.mcts, 8, history=tiny_cfg.net.history,
                        max_simulations=40)
    capped.genmove([], 0.5, seconds=1.0)
    assert capped.last_simulations == 40


def test_an_analysis_stops_at_its_time_bound_and_at_its_visits_bound(tiny_cfg):
    """`engine.analysis_max_seconds` and `engine.max_visits` end an analysis that no command
    stops (a front-end left open)."""
    import threading
    import time

    import numpy as np

    from training.play.players import MctsPlayer

    def evaluate(planes, legal):
        time.sleep(0.002)
        priors = legal.astype(np.float32)
        return priors / priors.sum(1, keepdims=True), np.zeros(len(planes), np.float32)

    player = MctsPlayer(evaluate, tiny_cfg.go, tiny_cfg.mcts, 8, history=tiny_cfg.net.history,
                        max_simulations=20_000)
    t0 = time.perf_counter()
    player.analyze([12], 0.5, threading.Event(), lambda: None, seconds=0.3)
    took = time.perf_counter() - t0
    assert 0.2 <= took <= 0.6 and 8 < player.last_simulations < 20_000, took
    small = MctsPlayer(evaluate, tiny_cfg.go, tiny_cfg.mcts, 8, history=tiny_cfg.net.history,
                       max_simulations=100)
    small.analyze([12], 0.5, threading.Event(), lambda: None)
    assert small.last_simulations == 100


def test_a_huge_or_binary_line_is_answered_and_the_engine_goes_on():
    """A 32 MiB line is read on in pieces and refused (the engine's memory grows by a few
    MB, not 32+); bytes that are not UTF-8 are an unknown command, not the end."""
    import time

    proc = subprocess.Popen(ENGINE + ["--size", "5"], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def peak_mb() -> float:
        with open(f"/proc/{proc.pid}/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) / 1024

    def reply() -> bytes:
        out = b""
        while not out.endswith(b"\n\n"):
            out += proc.stdout.read1(4096)
        return out

    try:
        proc.stdin.write(b"name\n")
        proc.stdin.flush()
        assert reply() == b"= azgo\n\n"
        before = peak_mb()
        chunk = b"x" * (1 << 20)
        proc.stdin.write(b"play B ")
        for _ in range(32):
            proc.stdin.write(chunk)
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        assert reply().startswith(b"? command line longer than")
        grown = peak_mb() - before
        assert grown < 16, grown
        proc.stdin.write(b"\xff\xfe play\n7 name\n")
        proc.stdin.flush()
        time.sleep(0.2)
        out = reply()
        while out.count(b"\n\n") < 2:
            out += reply()
        assert out == b"? unknown command\n\n=7 azgo\n\n", out
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
