"""Where a lost game turned (training.play.endings) and the win rates it reads from SGF."""

from __future__ import annotations

import math

import numpy as np
import pytest

from training.go.sgf import from_sgf, game_sgf
from training.play.endings import LostGame, our_winrates, plot_lost_games, turning_point

NAN = math.nan


def test_the_turning_point_is_where_the_rate_went_below_half_for_good():
    ours = np.array([0.6, 0.6, 0.4, 0.6, 0.3, 0.2, 0.1])
    assert turning_point(ours, None, 81) == (4, "opening")  # the dip at 2 came back
    rising = np.r_[np.full(25, 0.7), np.full(15, 0.2)]
    assert turning_point(rising, None, 81) == (25, "middle")
    late = np.r_[np.full(30, 0.7), np.full(10, 0.2)]
    assert turning_point(late, None, 81) == (30, "endgame")  # the last quarter of 40 moves
    # the phases are shares of the moves before the opponent's first pass
    longer = np.r_[np.full(30, 0.7), np.full(20, 0.2)]
    assert turning_point(longer, None, 81) == (30, "middle")
    assert turning_point(longer, 38, 81) == (30, "endgame")


def test_a_net_still_ahead_at_their_pass_misjudged_the_game():
    ours = np.r_[np.full(30, 0.8), np.full(5, 0.1)]
    assert turning_point(ours, 30, 81) == (None, "misjudged")
    assert turning_point(np.full(10, NAN), None, 81) == (None, "misjudged")
    with_gaps = np.array([0.7, NAN, 0.3, NAN, 0.2])
    assert turning_point(with_gaps, None, 81) == (2, "opening")


def test_our_rate_is_blacks_or_its_complement():
    black = np.array([0.25, NAN, 0.75])
    np.testing.assert_array_equal(our_winrates(black, True, 3), black)
    np.testing.assert_array_equal(our_winrates(black, False, 3), [0.75, NAN, 0.25])
    assert np.isnan(our_winrates(None, True, 4)).all()


def test_sgf_win_rates_are_read_back_per_move():
    text = game_sgf(9, 7.0, [0, 10, 81, 20], "W+12", player_black="a", player_white="b",
                    winrates=[0.4, 0.35, None, 0.2])
    game = from_sgf(text)
    np.testing.assert_allclose(game.winrates, [0.4, 0.35, NAN, 0.2])
    assert from_sgf(game_sgf(9, 7.0, [0], "B+R", player_black="a",
                             player_white="b")).winrates is None
    with pytest.raises(ValueError, match="SBKV\\[high\\] is not a percentage"):
        from_sgf("(;SZ[9];B[aa]SBKV[high])")


def test_the_picture_has_a_panel_per_lost_game(tmp_path):
    games = [LostGame(f"g{k}", np.linspace(0.8, 0.1, 30), 28, 12, "middle", "W+20", k == 0)
             for k in range(7)]
    path = plot_lost_games(games, tmp_path / "endings.png", title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    wide = Image.open(path).size
    one = Image.open(plot_lost_games(games[:1], tmp_path / "one.png")).size
    assert wide[0] > 3 * one[0] and wide[1] > one[1]  # 6 panels a row, then a second row
    assert plot_lost_games([], tmp_path / "none.png").stat().st_size > 0
