"""Tests for the reference rules, training.go.rules, from ASCII boards and GTP points
(minigo style).

Boards are written top row first: X black, O white, . empty.
"""

import pytest

from training.go.coords import BLACK, EMPTY, WHITE, from_gtp
from training.go.rules import IllegalMove, Position


def load_board(text: str) -> tuple[int, ...]:
    """ASCII rows (top row first) -> flat board tuple."""
    rows = [r.strip() for r in text.strip().splitlines()]
    assert all(len(r) == len(rows) for r in rows), "board must be square"
    return tuple({"X": BLACK, "O": WHITE, ".": EMPTY}[c] for r in rows for c in r)


def position(text: str, to_play: int = BLACK, komi: float = 0.5, **kw) -> Position:
    board = load_board(text)
    return Position(int(len(board) ** 0.5), komi=komi, board=board, to_play=to_play, **kw)


def play(pos: Position, *gtp_moves: str) -> Position:
    for m in gtp_moves:
        pos.play(from_gtp(m, pos.size))
    return pos


def assert_board(pos: Position, text: str):
    assert pos.board == load_board(text), f"\n{pos}"


def test_single_stone_capture_counts_and_empties_the_point():
    pos = position(
        """
        .....
        ..X..
        .XO..
        ..X..
        .....
        """
    )
    play(pos, "D3")
    assert_board(
        pos,
        """
        .....
        ..X..
        .X.X.
        ..X..
        .....
        """,
    )
    assert pos.captures == {BLACK: 1, WHITE: 0}


def test_multi_stone_capture_on_the_edge():
    pos = position(
        """
        OOO..
        XXX..
        .....
        .....
        .....
        """
    )
    play(pos, "D5")
    assert_board(
        pos,
        """
        ...X.
        XXX..
        .....
        .....
        .....
        """,
    )
    assert pos.captures[BLACK] == 3


def test_suicide_is_illegal_and_leaves_the_board_unchanged():
    pos = position(
        """
        .O...
        O....
        .....
        .....
        .....
        """
    )
    before = pos.board
    with pytest.raises(IllegalMove, match="suicide"):
        play(pos, "A5")
    assert pos.board == before and pos.to_play == BLACK and not pos.moves
    assert from_gtp("A5", 5) not in pos.legal_moves()


def test_multi_stone_suicide_is_illegal():
    pos = position(
        """
        X.O..
        XO...
        O....
        .....
        .....
        """
    )
    assert not pos.is_legal(from_gtp("B5", 5))


def test_a_move_without_liberties_that_captures_is_legal():
    pos = position(
        """
        .OX..
        OX...
        X....
        .....
        .....
        """
    )
    play(pos, "A5")  # no liberty of its own, but it captures B5 and A4
    assert pos.board[0] == BLACK and pos.captures[BLACK] == 2


def test_occupied_point_is_illegal():
    pos = play(Position(5), "C3")
    with pytest.raises(IllegalMove, match="occupied"):
        play(pos, "C3")


KO = """
    .XO..
    XO.O.
    .XO..
    .....
    .....
    """


def test_ko_recapture_is_illegal_for_one_move():
    pos = position(KO)
    play(pos, "C4")  # black takes the ko
    assert pos.captures[BLACK] == 1
    with pytest.raises(IllegalMove, match="superko"):
        play(pos, "B4")
    play(pos, "E1", "E2")  # a threat elsewhere and its answer
    play(pos, "B4")  # now white may retake
    assert pos.captures[WHITE] == 1


# Three kos: A (black takes at C8), B (white takes at C4), C (black takes at H8).
TRIPLE_KO = """
    .XO...XO.
    XO.O.XO.O
    .XO...XO.
    .........
    .OX......
    OX.X.....
    .OX......
    .........
    .........
    """


def test_triple_ko_cycle_is_stopped_by_positional_superko():
    pos = position(TRIPLE_KO)
    start = pos.board
    # each move takes a ko that was NOT taken by the previous move, so simple ko allows all
    play(pos, "C8", "C4", "H8", "B8", "B4")
    assert pos.captures == {BLACK: 3, WHITE: 2}
    g8 = from_gtp("G8", 9)
    assert not pos.is_legal(g8)  # it would recreate the starting board
    with pytest.raises(IllegalMove, match="superko"):
        pos.play(g8)
    # take back black's B4: with the B ko left to white, G8 is an ordinary ko capture
    pos.undo()
    play(pos, "J1", "G8")  # after a move elsewhere the board differs from the start
    assert pos.board != start


def test_pass_repeats_the_board_but_is_always_legal():
    pos = position(KO)
    play(pos, "C4", "pass", "pass")  # the game ends, no superko complaint about passes
    assert pos.is_over() and pos.boards[-1] == pos.boards[-2] == pos.boards[-3]


SEKI = """
    X.OX.
    X.OX.
    OOXX.
    .....
    .....
    """


def test_seki_shared_liberties_count_for_nobody():
    pos = position(SEKI, komi=0.5)
    # black stones 6, white 4; B5/B4 touch both colors and the big region touches both
    assert pos.score() == 6 - 4 - 0.5
    assert pos.result() == "B+1.5"
    # playing a shared liberty is legal but puts the player's own group in atari
    play(pos, "B5")
    play(pos, "B4")  # white captures the three black stones
    assert pos.captures[WHITE] == 3


def test_tromp_taylor_area_score():
    assert Position(5, komi=7.5).score() == -7.5
    pos = play(Position(5, komi=7.5), "C3")
    assert pos.score() == 25 - 7.5 and pos.result() == "B+17.5"
    pos = position(
        """
        .X.O.
        .X.O.
        .X.O.
        .X.O.
        .X.O.
        """,
        komi=0,
    )
    assert pos.score() == 0 and pos.result() == "0"
    pos.komi = 0.5
    assert pos.result() == "W+0.5"


def test_two_passes_end_the_game():
    pos = play(Position(5), "pass", "C3", "pass")
    assert not pos.is_over()
    play(pos, "pass")
    assert pos.is_over() and pos.legal_moves() == []
    with pytest.raises(IllegalMove, match="over"):
        play(pos, "A1")


def test_move_cap_ends_the_game_and_defaults_to_twice_the_points():
    assert Position(9).max_moves == 162
    pos = play(Position(5, max_moves=3), "A1", "B1", "C1")
    assert pos.is_over() and pos.legal_moves() == []


def test_undo_restores_board_captures_turn_and_superko_history():
    pos = position(KO)
    start = pos.board
    play(pos, "C4")
    assert not pos.is_legal(from_gtp("B4", 5))
    assert pos.undo() == from_gtp("C4", 5)
    assert pos.board == start and pos.to_play == BLACK and pos.captures[BLACK] == 0
    play(pos, "pass", "pass")
    assert pos.is_over()
    pos.undo()
    assert not pos.is_over() and pos.passes == 1
    pos.undo()
    assert pos.moves == [] and pos.boards == [start]
    with pytest.raises(IndexError):
        pos.undo()


def test_legal_moves_on_the_empty_board_are_every_point_and_pass():
    pos = Position(7)
    assert pos.legal_moves() == list(range(50))


def test_illegal_move_names_the_point_and_the_reason():
    pos = play(Position(9), "D4")
    with pytest.raises(IllegalMove) as e:
        play(pos, "D4")
    assert "D4" in str(e.value) and e.value.reason == "point is occupied"


def test_sizes_outside_5_to_19_are_refused():
    with pytest.raises(ValueError):
        Position(4)
    with pytest.raises(ValueError):
        Position(20)


def test_copy_is_independent_and_out_of_turn_play_hands_the_turn_over():
    pos = play(Position(5), "C3")
    twin = pos.copy()
    play(twin, "D3")
    assert pos.board[from_gtp("D3", 5)] == EMPTY and len(pos.moves) == 1
    pos.play(from_gtp("B2", 5), color=BLACK)  # black again, as a GTP controller may ask
    assert pos.to_play == WHITE and pos.board[from_gtp("B2", 5)] == BLACK
    pos.undo()  # back to white's turn, as before the out-of-turn move
    assert pos.to_play == WHITE and pos.board[from_gtp("B2", 5)] == EMPTY
