"""Tests for training.go.features: the planes, numpy == njit, and the 8 symmetries."""

import random

import numpy as np
import pytest

from training.go import fastgo
from training.go.coords import from_gtp
from training.go.features import (
    NUM_SYMMETRIES,
    area_ownership,
    inverse,
    inverse_transform_planes,
    inverse_transform_policy,
    num_planes,
    planes,
    transform_planes,
    transform_policy,
    write_planes,
)
from training.go.rules import Position, area_score


def test_plane_layout_side_to_move_first_then_opponent_then_color():
    assert num_planes(8) == 17 and num_planes(1) == 3
    pos = Position(9)
    x = planes(pos)
    assert x.shape == (17, 9, 9) and x.dtype == np.float32
    assert not x[:16].any() and (x[16] == 1).all()
    pos.play(from_gtp("D4", 9))  # black; now white is to move
    x = planes(pos, history=2)
    assert x.shape == (5, 9, 9)
    assert not x[0].any()  # white stones now
    assert x[1, 5, 3] == 1 and x[1].sum() == 1  # black's D4 = row 5, col 3
    assert not x[2:4].any()  # one ply ago: the empty board
    assert not x[4].any()  # white to move
    pos.play(from_gtp("E5", 9))
    x = planes(pos, history=2)
    assert x[0, 5, 3] == 1 and x[1, 4, 4] == 1  # black to move: own D4, opponent E5
    assert x[2, 5, 3] == 1 and x[2].sum() == 1 and not x[3].any()
    assert (x[4] == 1).all()


@pytest.mark.parametrize("n,history", [(5, 8), (9, 8), (9, 3), (13, 1)])
def test_njit_planes_equal_numpy_planes_on_random_games(n, history):
    rng = random.Random(n * 100 + history)
    batch = np.full((3, num_planes(history), n, n), -7.0, np.float32)
    for _ in range(3):
        pos = Position(n)
        b = fastgo.new_boards(2, n)
        while not pos.is_over():
            write_planes(b, 0, history, batch[1])
            np.testing.assert_array_equal(batch[1], planes(pos, history))
            move = rng.choice(pos.legal_moves())
            pos.play(move)
            assert fastgo.play(b, 0, move)
    assert (batch[0] == -7).all() and (batch[2] == -7).all()  # only its own slot written


def test_liberty_planes_count_each_chains_liberties_for_both_sides():
    pos = Position(5)
    for move in ("A1", "B1", "C3", "E5", "C4"):  # white to move next
        pos.play(from_gtp(move, 5))
    x = planes(pos, history=1, liberties=True)
    assert x.shape == (num_planes(1, True), 5, 5) == (9, 5, 5)
    own, opp = x[3:6], x[6:9]  # white's chains, then black's; 1, 2, 3+ liberties

    def at(move: str) -> tuple[int, int]:
        p = from_gtp(move, 5)
        return p // 5, p % 5

    assert own[1][at("B1")] == 1 and own[1][at("E5")] == 1 and own.sum() == 2  # 2 each
    assert opp[0][at("A1")] == 1  # A1: only A2 left
    assert opp[2][at("C3")] == 1 and opp[2][at("C4")] == 1 and opp.sum() == 3  # 6 liberties


@pytest.mark.parametrize("n", [5, 9])
def test_liberty_planes_agree_in_all_three_implementations(n):
    from training.go.features import liberty_planes

    rng = random.Random(n)
    history = 2
    c = num_planes(history, liberties=True)
    out = np.full((c, n, n), -7.0, np.float32)
    b = fastgo.new_boards(1, n)
    nbrs = b.neighbors
    for _ in range(2):
        pos = Position(n)
        fastgo.reset(b, 0)
        while not pos.is_over():
            want = planes(pos, history, liberties=True)
            write_planes(b, 0, history, out)
            np.testing.assert_array_equal(out, want)
            stored = np.zeros((1, 6, n, n), np.float32)
            liberty_planes(np.asarray(pos.board, np.int8)[None], np.array([pos.to_play],
                           np.int8), nbrs, stored)
            np.testing.assert_array_equal(stored[0], want[2 * history + 1:])
            move = rng.choice(pos.legal_moves())
            pos.play(move)
            assert fastgo.play(b, 0, move)


def test_asking_for_more_history_than_the_boards_keep_fails():
    b = fastgo.new_boards(1, 5, history=2)
    with pytest.raises(AssertionError):
        write_planes(b, 0, 3, np.zeros((7, 5, 5), np.float32))


def test_the_eight_symmetries_are_distinct_and_invert():
    x = np.arange(2 * 5 * 5, dtype=np.float32).reshape(2, 5, 5)
    images = {transform_planes(x, s).tobytes() for s in range(NUM_SYMMETRIES)}
    assert len(images) == 8
    for s in range(NUM_SYMMETRIES):
        np.testing.assert_array_equal(inverse_transform_planes(transform_planes(x, s), s), x)
        assert transform_planes(transform_planes(x, s), inverse(s)).tobytes() == x.tobytes()
    policy = np.random.default_rng(0).random((3, 26))
    for s in range(NUM_SYMMETRIES):
        t = transform_policy(policy, s)
        assert (t[:, 25] == policy[:, 25]).all()
        np.testing.assert_array_equal(inverse_transform_policy(t, s), policy)


def test_policy_and_planes_move_together_and_rules_are_symmetric():
    n = 7
    rng = random.Random(3)
    pos = Position(n)
    for _ in range(40):
        pos.play(rng.choice(pos.legal_moves()))
    for s in range(NUM_SYMMETRIES):
        def move_image(m, s=s):
            onehot = np.zeros(n * n + 1)
            onehot[m] = 1
            return int(np.argmax(transform_policy(onehot, s)))

        twin = Position(n)
        for m in pos.moves:
            twin.play(move_image(m))
        np.testing.assert_array_equal(planes(twin), transform_planes(planes(pos), s))
        assert sorted(move_image(m) for m in pos.legal_moves()) == twin.legal_moves()
        assert twin.score() == pos.score()


def _board(rows: str) -> np.ndarray:
    """An ASCII board (X black, O white, . empty), one row per line, as int8 [N*N]."""
    lines = rows.split()
    return np.array([{"X": 1, "O": -1, ".": 0}[c] for line in lines for c in line], np.int8)


def test_ownership_of_a_settled_position_with_dame():
    board = _board("""
        .X.O.
        XX.OO
        .X.O.
        XX.OO
        .X.OO
    """)
    # column 2 is one empty region touching both colours: dame; the rest is settled
    expected = _board("""
        XX.OO
        XX.OO
        XX.OO
        XX.OO
        XX.OO
    """)
    owner = area_ownership(board, 5)
    assert owner.dtype == np.int8
    np.testing.assert_array_equal(owner, expected)
    assert owner.sum() == area_score(tuple(board.tolist()), 5) == 0


def test_ownership_of_an_empty_board_is_nobodys_and_of_one_stone_is_all_its():
    np.testing.assert_array_equal(area_ownership(np.zeros(25, np.int8), 5), 0)
    one = np.zeros(25, np.int8)
    one[12] = -1
    np.testing.assert_array_equal(area_ownership(one, 5), -1)


def test_ownership_sums_to_the_area_score_on_random_final_boards_in_one_call():
    rng = random.Random(11)
    boards = []
    for _ in range(40):
        pos = Position(7)
        for _ in range(rng.randrange(10, 70)):
            if pos.is_over():
                break
            pos.play(rng.choice(pos.legal_moves()))
        boards.append(np.array(pos.board, np.int8))
    batch = np.stack(boards).reshape(4, 10, 49)  # any leading shape
    owner = area_ownership(batch, 7)
    assert owner.shape == batch.shape
    for board, own in zip(batch.reshape(-1, 49), owner.reshape(-1, 49)):
        assert own.sum() == area_score(tuple(board.tolist()), 7)
        np.testing.assert_array_equal(own[board != 0], board[board != 0])
        assert set(np.unique(own)) <= {-1, 0, 1}
