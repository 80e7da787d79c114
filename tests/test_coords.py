"""Tests for training.go.coords: flat index <-> point <-> GTP text, on several board sizes."""

import pytest

from training.go import coords
from training.go.coords import BLACK, WHITE


@pytest.mark.parametrize("n", [5, 9, 13, 19])
def test_gtp_round_trip_for_every_point_and_pass(n):
    for move in range(n * n + 1):
        assert coords.from_gtp(coords.to_gtp(move, n), n) == move


def test_gtp_row_1_is_the_bottom_row_and_letters_skip_i():
    assert coords.to_gtp(0, 9) == "A9"  # flat 0 = top-left
    assert coords.to_gtp(8 * 9, 9) == "A1"  # bottom-left
    assert coords.to_gtp(8 * 9 + 8, 9) == "J1"  # no "I"
    assert coords.from_gtp("d4", 9) == coords.to_flat((5, 3), 9)
    assert coords.from_gtp("T19", 19) == 18
    assert coords.from_gtp("PASS", 9) == 81 == coords.pass_move(9)


@pytest.mark.parametrize("text", ["I5", "K5", "A10", "A0", "Z1", "", "5A", "pas"])
def test_points_off_a_9x9_board_are_rejected(text):
    with pytest.raises(ValueError):
        coords.from_gtp(text, 9)


def test_flat_and_point_conversions():
    assert coords.to_flat((2, 3), 7) == 17
    assert coords.from_flat(17, 7) == (2, 3)
    assert coords.is_pass(49, 7) and not coords.is_pass(48, 7)
    with pytest.raises(ValueError):
        coords.from_flat(49, 7)
    with pytest.raises(ValueError):
        coords.to_flat((7, 0), 7)


def test_colors():
    assert coords.parse_color("B") == BLACK and coords.parse_color("white") == WHITE
    assert coords.color_name(WHITE) == "white"
    with pytest.raises(ValueError):
        coords.parse_color("red")
