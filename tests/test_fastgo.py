"""The fast engine (training.go.fastgo) against the reference rules (training.go.rules).

Random games are played in both engines at once; at every ply they must agree on the set of
legal moves, the board, the captures and, at the end, the score. The default run plays a
few hundred games in all; `AZGO_DIFF_GAMES=5000 pytest tests/test_fastgo.py` plays 5000
games per size up to 9x9 (and a tenth of that on 13x13, a fiftieth on 19x19).
"""

import os
import random

import numpy as np
import pytest
from numba import njit

from tests.test_go import TRIPLE_KO, load_board
from training.go import fastgo
from training.go.coords import BLACK, from_gtp
from training.go.rules import IllegalMove, Position

DIFF_GAMES = int(os.environ.get("AZGO_DIFF_GAMES", "0"))
# board size -> random games in the default run, and the divisor applied to AZGO_DIFF_GAMES
GAMES = {5: (150, 1), 7: (60, 1), 9: (40, 1), 13: (4, 10), 19: (1, 50)}


def games_for(n: int) -> int:
    default, divisor = GAMES[n]
    return max(1, DIFF_GAMES // divisor) if DIFF_GAMES else default


def compare_random_game(n: int, komi: float, rng: random.Random) -> int:
    """Play one uniformly random game in both engines, asserting agreement; returns its plies."""
    ref = Position(n, komi=komi)
    fast = fastgo.FastBoard(n, komi=komi)
    while True:
        expected = ref.legal_moves()
        got = fast.legal_moves().tolist()
        assert got == expected, f"{n}x{n} ply {len(ref.moves)}: {set(got) ^ set(expected)}"
        if not expected:
            break
        move = rng.choice(expected)
        ref.play(move)
        fast.play(move)
        assert np.array_equal(fast.board(), ref.board_array())
    assert fast.is_over() and ref.is_over()
    assert fast.captures == (ref.captures[BLACK], ref.captures[-BLACK])
    assert fast.score() == ref.score()
    assert fast.moves == ref.moves
    return len(ref.moves)


@pytest.mark.parametrize("n", sorted(GAMES))
def test_fast_engine_matches_reference_on_random_games(n):
    rng = random.Random(1000 + n)
    plies = 0
    for i in range(games_for(n)):
        plies += compare_random_game(n, komi=rng.choice([0.0, 0.5, 5.5, 7.5]), rng=rng)
    assert plies > 0
    print(f"{n}x{n}: {games_for(n)} games, {plies} plies agree")


def test_short_move_cap_and_two_passes_end_the_game():
    fast = fastgo.FastBoard(5, max_moves=3)
    for m in (0, 1, 2):
        fast.play(m)
    assert fast.is_over() and fast.legal_moves().size == 0 and not fast.is_legal(25)
    fast = fastgo.FastBoard(5)
    fast.play(25)
    fast.play(25)
    assert fast.is_over()
    with pytest.raises(IllegalMove):
        fast.play(3)


def play_setup(b, g, board, to_play):
    """Reach a set-up position by playing its stones (with passes as needed)."""
    n = fastgo.board_size(b)
    blacks = [p for p, c in enumerate(board) if c == 1]
    whites = [p for p, c in enumerate(board) if c == -1]
    while blacks or whites:
        for stones in (blacks, whites):
            assert fastgo.play(b, g, stones.pop() if stones else n * n)
    if b.info[g, fastgo.TO_PLAY] != to_play:
        assert fastgo.play(b, g, n * n)


def test_triple_ko_cycle_is_stopped_by_superko_in_the_fast_engine():
    b = fastgo.new_boards(2, 9)
    play_setup(b, 0, load_board(TRIPLE_KO), BLACK)
    for m in ("C8", "C4", "H8", "B8", "B4"):
        assert fastgo.play(b, 0, from_gtp(m, 9)), m
    g8 = from_gtp("G8", 9)
    assert not fastgo.is_legal(b, 0, g8)
    mask = np.zeros(82, np.bool_)
    fastgo.legal_mask(b, 0, mask)
    assert not mask[g8] and mask[81]
    assert not fastgo.play(b, 0, g8)


def test_games_in_one_boards_array_are_independent_and_copy_is_a_row_copy():
    b = fastgo.new_boards(3, 7, komi=0.5)
    fastgo.seed(5)
    fastgo.random_playout(b, 0)
    assert fastgo.is_over(b, 0) and not fastgo.is_over(b, 1)
    assert not b.stones[1].any()
    fastgo.reset(b, 0)
    for m in (24, 25, 17):
        fastgo.play(b, 0, m)
    fastgo.copy_game(b, 0, 2)
    assert fastgo.play(b, 2, 18)
    assert b.stones[0, 18] == 0 and b.stones[2, 18] == -1
    assert b.info[0, fastgo.N_MOVES] == 3 and b.info[2, fastgo.N_MOVES] == 4
    # the copy carries the superko history too: replay the same game in both rows
    ref = Position(7, komi=0.5)
    for m in b.moves[2, :4]:
        ref.play(int(m))
    mask = np.zeros(50, np.bool_)
    fastgo.legal_mask(b, 2, mask)
    assert np.flatnonzero(mask).tolist() == ref.legal_moves()


def test_is_legal_agrees_with_legal_mask_and_random_playout_scores_like_the_reference():
    b = fastgo.new_boards(1, 9)
    fastgo.seed(11)
    for _ in range(20):
        fastgo.reset(b, 0)
        result = fastgo.random_playout(b, 0)
        ref = Position(9)
        for m in b.moves[0, : b.info[0, fastgo.N_MOVES]]:
            ref.play(int(m))
        assert result == ref.score() and ref.is_over()
    fastgo.reset(b, 0)
    mask = np.zeros(82, np.bool_)
    for m in (40, 41, 31, 50, 49, 39, 32, 30):
        fastgo.play(b, 0, m)
        fastgo.legal_mask(b, 0, mask)
        assert [fastgo.is_legal(b, 0, p) for p in range(82)] == mask.tolist()
    assert not fastgo.is_legal(b, 0, -1) and not fastgo.is_legal(b, 0, 82)


@njit(cache=True)
def _njit_caller(b, g):
    """The search's use: call the engine from inside other njit code."""
    mask = np.zeros(b.stones.shape[1] + 1, np.bool_)
    fastgo.play(b, g, 40)
    fastgo.copy_game(b, g, g + 1)
    fastgo.play(b, g + 1, 41)
    return fastgo.legal_mask(b, g + 1, mask), fastgo.score(b, g + 1)


def test_engine_functions_are_callable_from_other_njit_code():
    b = fastgo.new_boards(2, 9, komi=7.5)
    count, result = _njit_caller(b, 0)
    assert count == 80 and result == 0 - 7.5
