"""The end of a game as a judge scores it: dead stones, the score without them, clean-up, and
the model engine's pass in reply to a pass (`training.go.endgame`,
`training.play.players.NetPlayer`, the GTP commands `final_score`, `final_status_list`,
`kgs-genmove_cleanup`)."""

import os
import sys

import pytest

from training.go import endgame
from training.go.coords import BLACK, EMPTY, WHITE, from_gtp, to_gtp
from training.go.rules import Position, area_score, neighbors
from training.play.gtp_client import GtpClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 5


def board_of(rows: list[str]) -> tuple[int, ...]:
    """Rows top to bottom, `X` black, `O` white, `.` empty."""
    value = {"X": BLACK, "O": WHITE, ".": EMPTY}
    return tuple(value[c] for row in rows for c in row)


# Black walls off columns A-C, white holds D-E; one white stone lies dead in black's area.
INTRUDED = board_of([
    "..XO.",
    "..XO.",
    ".OXO.",
    "..XO.",
    "..XO.",
])
# What a trained net says of it: A-C are black's (the white stone on B3 too), D-E white's.
OWNERSHIP = [1.0 if c < 3 else -1.0 for r in range(N) for c in range(N)]


def test_the_intruder_is_dead_and_only_the_judged_count_sees_it():
    dead = endgame.dead_stones(INTRUDED, N, OWNERSHIP)
    assert dead == {from_gtp("B3", N)}
    assert area_score(INTRUDED, N) - 0.5 == 5 - 11 - 0.5  # Tromp-Taylor: A-B are no one's
    assert endgame.judged_score(INTRUDED, N, 0.5, dead) == 15 - 10 - 0.5


def test_a_group_is_dead_or_alive_as_a_whole():
    board = board_of([
        "XX...",
        ".....",
        ".....",
        ".....",
        ".....",
    ])
    ownership = [0.0] * (N * N)
    ownership[0], ownership[1] = -0.9, 0.3  # mean -0.3: the chain is white's
    assert endgame.dead_stones(board, N, ownership) == {0, 1}
    ownership[1] = 0.95  # mean +0.025: alive
    assert endgame.dead_stones(board, N, ownership) == set()


def test_fills_own_area_is_a_move_that_touches_no_opponent_stone_in_our_area():
    assert endgame.fills_own_area(INTRUDED, N, from_gtp("A1", N), BLACK, OWNERSHIP)
    assert not endgame.fills_own_area(INTRUDED, N, from_gtp("A3", N), BLACK, OWNERSHIP)  # B3
    assert not endgame.fills_own_area(INTRUDED, N, from_gtp("E1", N), BLACK, OWNERSHIP)
    assert endgame.fills_own_area(INTRUDED, N, from_gtp("E1", N), WHITE, OWNERSHIP)
    assert not endgame.fills_own_area(INTRUDED, N, from_gtp("C1", N), BLACK, OWNERSHIP)


def test_cleanup_captures_the_dead_stone_and_never_self_ataris_without_capturing():
    pos = Position(N, komi=0.5, board=INTRUDED, to_play=BLACK)
    dead = endgame.dead_stones(INTRUDED, N, OWNERSHIP)
    played = []
    while True:
        move = endgame.cleanup_move(pos.board, N, BLACK, dead & {
            p for p in range(N * N) if pos.board[p] == WHITE}, lambda p: pos.is_legal(p))
        if move is None:
            break
        assert any(pos.board[q] == WHITE for q in neighbors(N)[move])
        pos.play(move)
        played.append(to_gtp(move, N))
        pos.play(pos.pass_move)  # white has nothing to say
    assert pos.board[from_gtp("B3", N)] == EMPTY, played
    assert len(played) == 3  # B3 had three liberties
    assert pos.score() == 15 - 10 - 0.5  # Tromp-Taylor now agrees with the judgement


def test_cleanup_does_not_fill_a_lone_liberty_into_self_atari():
    # Black's only dead target is the white pair on D5-E5; playing E4 would put black's new
    # stone in atari without capturing (the pair keeps D4).
    board = board_of([
        "XXXOO",
        "XXX..",
        "XXXXX",
        ".....",
        ".....",
    ])
    dead = {from_gtp("D5", N), from_gtp("E5", N)}
    move = endgame.cleanup_move(board, N, BLACK, dead, lambda p: board[p] == EMPTY)
    assert move in (from_gtp("D4", N), from_gtp("E4", N))
    after = list(board)
    after[move] = BLACK
    assert endgame.cleanup_move(tuple(after), N, BLACK, dead,
                                lambda p: after[p] == EMPTY) is not None  # then the capture


def test_final_status_lists_groups():
    dead = {from_gtp("B3", N)}
    assert endgame.final_status(INTRUDED, N, dead, "dead") == [[from_gtp("B3", N)]]
    alive = endgame.final_status(INTRUDED, N, dead, "alive")
    assert sorted(len(g) for g in alive) == [5, 5]
    assert endgame.final_status(INTRUDED, N, dead, "seki") == []
    with pytest.raises(ValueError):
        endgame.final_status(INTRUDED, N, dead, "undecided")


# -- the model engine ----------------------------------------------------------------------


def model_file(tmp_path, bias: float) -> str:
    """A tiny 5x5 model whose ownership head says: the side to move owns every point with
    confidence tanh(bias) (weights zero, bias set); policy and value stay random."""
    import torch

    from configs import load_config
    from training.learn.net import net_from_config, save_model

    cfg = load_config(os.path.join(REPO, "configs", "tiny.yaml"))
    net = net_from_config(cfg.net, cfg.go.board_size)
    with torch.no_grad():
        net.ownership_conv.weight.zero_()
        net.ownership_conv.bias.fill_(bias)
    path = tmp_path / f"model_{bias:+g}.pt"
    save_model(path, net, generation=1)
    return str(path)


def intruded_position() -> Position:
    """INTRUDED reached by real moves (black passes twice early on), white having just
    passed, black to move."""
    pos = Position(N, komi=0.5, max_moves=10_000)
    blacks = [p for p in range(N * N) if INTRUDED[p] == BLACK]
    whites = [p for p in range(N * N) if INTRUDED[p] == WHITE]
    black_moves = [pos.pass_move, pos.pass_move] + blacks
    white_moves = whites + [pos.pass_move]
    for b, w in zip(black_moves, white_moves):
        pos.play(b)
        pos.play(w)
    assert pos.board == INTRUDED and pos.to_play == BLACK and pos.moves[-1] == pos.pass_move
    return pos


def test_net_player_passes_after_a_pass_when_the_judged_board_is_won(tmp_path):
    from training.play.players import NetPlayer

    player = NetPlayer(model_file(tmp_path, 0.0), simulations=8)
    player.ownership = lambda position, color=None: OWNERSHIP  # a trained net's opinion
    pos = intruded_position()
    assert pos.score() < 0  # Tromp-Taylor: passing would lose
    assert player.genmove(pos, BLACK) == pos.pass_move
    # The C wall dead too: the board is lost. It plays on, but never into its own area.
    lost = [1.0 if c < 2 else -1.0 for r in range(N) for c in range(N)]
    player.ownership = lambda position, color=None: lost
    assert endgame.judged_score(INTRUDED, N, 0.5, endgame.dead_stones(INTRUDED, N, lost)) < 0
    for _ in range(5):
        move = player.genmove(pos, BLACK)
        assert move == pos.pass_move or not endgame.fills_own_area(
            pos.board, N, move, BLACK, lost)


def test_cleanup_answers_a_stone_with_the_search_and_a_pass_with_a_capture(tmp_path):
    """In a dispute played out, the opponent cleans up too, or attacks: its stone gets the
    search's answer (a capture of a dead stone first could let a living group die); a pass
    gets the capture. A capture stands in for a search move that passes or fills our area."""
    from training.play.players import NetPlayer

    player = NetPlayer(model_file(tmp_path, 0.0), simulations=8)
    player.ownership = lambda position, color=None: OWNERSHIP  # B3 is dead: A3, B2, B4 take it
    captures = {from_gtp(p, N) for p in ("A3", "B2", "B4")}
    answer = []  # the search's choice, set per case (the search itself: test_mcts)
    player.player.genmove = lambda moves, komi, **kw: answer[0]
    attacked = Position(N, komi=0.5, max_moves=10_000)
    for move in intruded_position().moves[:-1]:
        attacked.play(move)
    attacked.play(from_gtp("E1", N))  # white's last move is a stone, not a pass
    assert attacked.to_play == BLACK
    answer[:] = [from_gtp("E2", N)]
    assert player.genmove_cleanup(attacked, BLACK) == from_gtp("E2", N)
    answer[:] = [attacked.pass_move]
    assert player.genmove_cleanup(attacked, BLACK) in captures
    answer[:] = [from_gtp("A1", N)]  # inside our own area: worth nothing
    assert endgame.fills_own_area(attacked.board, N, answer[0], BLACK, OWNERSHIP)
    assert player.genmove_cleanup(attacked, BLACK) in captures
    answer[:] = [from_gtp("E2", N)]
    assert player.genmove_cleanup(intruded_position(), BLACK) in captures  # after a pass


def test_cleanup_without_a_capture_never_fills_its_own_area(tmp_path):
    """A lost side in a dispute played out used to search after the opponent's pass or
    stone, and a search of a lost board filled its own eyes until its groups died. Without a
    dead stone to take: after a pass, a pass when the judged board is won, else a neutral
    point or a pass (no search); after a stone, a search move that touches no opponent stone
    gives way to a neutral point or a pass, whatever the map says of its point, and a move
    that touches the opponent stands."""
    from training.play.players import NetPlayer

    player = NetPlayer(model_file(tmp_path, 0.0), simulations=8)
    alive = list(OWNERSHIP)
    alive[from_gtp("B3", N)] = -1.0  # the intruder lives: nothing to capture, black is lost
    player.ownership = lambda position, color=None: alive
    assert endgame.cleanup_move(INTRUDED, N, BLACK, set(), lambda p: True) is None
    assert endgame.judged_score(INTRUDED, N, 0.5, set()) < 0
    answer = []
    asked = []
    player.player.genmove = lambda moves, komi, **kw: asked.append(1) or answer[0]
    dame = {from_gtp(p, N) for p in ("B2", "B4")}  # between B3 and the C wall

    answer[:] = [from_gtp("A1", N)]
    assert player.genmove_cleanup(intruded_position(), BLACK) in dame
    assert not asked  # after a pass the search is not asked

    outside = Position(N, komi=0.5, max_moves=10_000)
    for move in intruded_position().moves[:-1]:
        outside.play(move)
    outside.play(from_gtp("E1", N))  # white's stone in its own area
    assert endgame.fills_own_area(outside.board, N, answer[0], BLACK, alive)
    assert player.genmove_cleanup(outside, BLACK) in dame
    answer[:] = [from_gtp("E2", N)]  # touches white: an answer to the stone
    assert player.genmove_cleanup(outside, BLACK) == from_gtp("E2", N)

    gone = [-1.0] * (N * N)  # a lost board: the map gives black's own area away too
    player.ownership = lambda position, color=None: gone
    answer[:] = [from_gtp("A1", N)]
    assert not endgame.fills_own_area(outside.board, N, answer[0], BLACK, gone)
    assert player.genmove_cleanup(outside, BLACK) == outside.pass_move

    player.ownership = lambda position, color=None: alive
    asked.clear()
    ahead = intruded_position()
    ahead.komi = -10.5  # the same board, won for black: a pass ends the dispute
    assert endgame.judged_score(INTRUDED, N, ahead.komi, set()) > 0
    assert player.genmove_cleanup(ahead, BLACK) == ahead.pass_move
    assert not asked


def test_net_player_ownership_is_blacks_view_whoever_is_to_move(tmp_path):
    from training.play.players import NetPlayer

    player = NetPlayer(model_file(tmp_path, 3.0), simulations=8)
    pos = intruded_position()
    black_to_move = player.ownership(pos)
    assert min(black_to_move) > 0.99
    white_to_move = player.ownership(pos, WHITE)  # GTP may ask white: black passed
    assert max(white_to_move) < -0.99


def gtp(model: str) -> GtpClient:
    return GtpClient([sys.executable, "-m", "training.gtp", "--model", model,
                      "--simulations", "4"], cwd=REPO, timeout_s=120, name="azgo")


def setup_intruded(engine: GtpClient) -> None:
    engine.send("komi 0.5")
    for p in range(N * N):
        if INTRUDED[p] != EMPTY:
            engine.send(f"play {'black' if INTRUDED[p] == BLACK else 'white'} {to_gtp(p, N)}")


def test_gtp_final_score_and_status_list_remove_the_dead_stones(tmp_path):
    # The net gives every point to the side to move: with black to move, white is all dead.
    with gtp(model_file(tmp_path, 3.0)) as engine:
        setup_intruded(engine)
        engine.send("play white pass")
        def groups(status: str) -> set[frozenset[str]]:
            reply = engine.send(f"final_status_list {status}")
            return {frozenset(line.split()) for line in reply.split("\n") if line}

        assert groups("dead") == {frozenset({"B3"}), frozenset(f"D{r}" for r in range(1, 6))}
        assert groups("alive") == {frozenset(f"C{r}" for r in range(1, 6))}
        assert engine.send("final_status_list seki") == ""
        assert engine.send("final_score") == "B+24.5"
    # The random player calls nothing dead: Tromp-Taylor.
    with GtpClient([sys.executable, "-m", "training.gtp", "--size", "5"], cwd=REPO,
                   name="azgo") as engine:
        setup_intruded(engine)
        assert engine.send("final_status_list dead") == ""
        assert engine.send("final_score") == "W+6.5"


def test_gtp_genmove_cleanup_captures_dead_stones_before_it_passes(tmp_path):
    # The net calls every white stone dead: black captures the intruder on B3, and stops
    # short of the D wall's last two liberties (each a self-atari that captures nothing).
    with gtp(model_file(tmp_path, 3.0)) as engine:
        setup_intruded(engine)
        pos = Position(N, komi=0.5, board=INTRUDED, to_play=BLACK, max_moves=10_000)
        engine.send("play white pass")
        pos.play(pos.pass_move, WHITE)
        for _ in range(40):
            reply = engine.send("kgs-genmove_cleanup black")
            move = from_gtp(reply, N)
            if move == pos.pass_move:
                break
            assert any(pos.board[q] == WHITE for q in neighbors(N)[move]), reply
            pos.play(move, BLACK)
            engine.send("play white pass")
            pos.play(pos.pass_move, WHITE)
        assert move == pos.pass_move
        assert pos.board[from_gtp("B3", N)] == EMPTY  # the intruder is captured
        assert all(pos.board[from_gtp(f"D{r}", N)] == WHITE for r in range(1, 6))


def test_the_search_sees_stones_set_up_out_of_turn(tmp_path):
    """Handicap stones arrive as `play B ...` twice in a row: the search must replay them as
    black's, with a white pass between, not as alternating colours."""
    from training.play.players import NetPlayer

    player = NetPlayer(model_file(tmp_path, 0.0), simulations=8)
    pos = Position(N, komi=0.5, max_moves=10_000)
    pos.play(from_gtp("B2", N), BLACK)
    pos.play(from_gtp("D4", N), BLACK)  # out of turn: white to move now
    assert pos.alternating_moves(WHITE) == [from_gtp("B2", N), N * N, from_gtp("D4", N)]
    assert pos.alternating_moves(BLACK) == [from_gtp("B2", N), N * N, from_gtp("D4", N), N * N]
    move = player.genmove(pos, WHITE)
    root = [int(v) for v in player.player.mcts.boards.stones[0]]
    assert root == list(pos.board)  # the searched board is the true one, both stones black
    assert pos.is_legal(move, WHITE)


def test_a_game_resumed_after_two_passes_is_searched_without_them(tmp_path):
    """A dispute about dead stones played out (KGS's cleanup phase, the referee's play-out):
    the game goes on after two passes, and the search replays it without the pair, which
    would end its own game."""
    from training.go.rules import IllegalMove
    from training.play.players import NetPlayer

    pos = Position(N, komi=0.5, max_moves=10_000)
    with pytest.raises(ValueError):
        pos.resume()  # a running game
    pos.play(from_gtp("B2", N))
    pos.play(pos.pass_move)
    pos.play(pos.pass_move)
    with pytest.raises(IllegalMove):
        pos.play(from_gtp("D4", N))
    pos.resume()
    pos.play(from_gtp("D4", N))  # white plays on
    assert pos.alternating_moves(BLACK) == [from_gtp("B2", N), N * N, N * N, from_gtp("D4", N)]
    assert pos.searchable_moves(BLACK) == [from_gtp("B2", N), from_gtp("D4", N)]
    player = NetPlayer(model_file(tmp_path, 0.0), simulations=8)
    move = player.genmove(pos, BLACK)
    root = [int(v) for v in player.player.mcts.boards.stones[0]]
    assert root == list(pos.board) and pos.is_legal(move, BLACK)
    capped = Position(N, komi=0.5, max_moves=2)
    capped.play(capped.pass_move)
    capped.play(capped.pass_move)
    with pytest.raises(ValueError):
        capped.resume()  # over at the move cap: nothing to resume
    replayed = Position(N, komi=0.5, max_moves=10_000)
    for move in pos.moves:  # a record with the dispute played out replays move by move
        replayed.play_on(move)
    assert list(replayed.board) == list(pos.board) and replayed.to_play == pos.to_play
    with pytest.raises(ValueError):
        capped.play_on(from_gtp("B2", N))


def test_a_command_that_fails_inside_answers_and_the_engine_stays_up():
    from training.gtp import GtpEngine

    class Broken:
        def genmove(self, position, color):
            raise RuntimeError("boom")

    engine = GtpEngine(Broken(), 5)
    assert engine.handle("7 genmove b") == "?7 internal error in genmove: RuntimeError\n\n"
    assert engine.handle("8 name") == "=8 azgo\n\n"


def test_dame_move_is_a_neutral_point_between_living_stones():
    board = board_of([
        "..X.O",
        "..X.O",
        "..X.O",
        "..XXO",
        "..XOO",
    ])
    dame = endgame.dame_move(board, N, BLACK, set(), lambda p: board[p] == EMPTY)
    assert dame in {from_gtp(v, N) for v in ("D5", "D4", "D3")}  # between the two walls
    assert endgame.dame_move(board, N, BLACK, {from_gtp(v, N) for v in ("E5", "E4", "E3",
                                                                        "E2", "E1", "D1")},
                             lambda p: board[p] == EMPTY) is None  # white is all dead


def test_passes_out_of_turn_never_end_the_replayed_game():
    pos = Position(N, komi=0.5, max_moves=10_000)
    pos.play(from_gtp("B2", N), BLACK)
    pos.play(pos.pass_move, BLACK)  # black passes out of turn
    assert pos.alternating_moves(BLACK) == [from_gtp("B2", N), N * N]
    assert pos.alternating_moves(WHITE) == [from_gtp("B2", N)]
    pos.play(from_gtp("C3", N), BLACK)  # and plays again
    replay = pos.alternating_moves(WHITE)
    assert replay == [from_gtp("B2", N), N * N, from_gtp("C3", N)]
    assert all(not (a == b == N * N) for a, b in zip(replay, replay[1:]))
