"""Elo estimates, confidence intervals, chained ratings and Leela Zero's SPRT."""

from __future__ import annotations

import math

import numpy as np
import pytest

from training.play.elo import chain, elo_from_score, estimate, score_from_elo, sprt


def test_even_results_are_zero_elo_with_a_symmetric_interval():
    e = estimate(50, 0, 50)
    assert e.elo == pytest.approx(0.0)
    assert e.ci_low == pytest.approx(-e.ci_high)
    # 100 games at 50%: stderr 0.05 -> score 0.402..0.598 -> about +-70 Elo
    assert e.ci_high == pytest.approx(elo_from_score(0.5 + 1.96 * 0.05), rel=1e-3)


def test_known_score_maps_to_known_elo():
    assert elo_from_score(0.75) == pytest.approx(190.85, abs=0.01)
    assert score_from_elo(elo_from_score(0.64)) == pytest.approx(0.64)
    e = estimate(70, 10, 20)
    assert e.score == pytest.approx(0.75)
    assert e.elo == pytest.approx(190.85, abs=0.01)
    assert e.ci_low < e.elo < e.ci_high


def test_draws_narrow_the_interval():
    wide = estimate(30, 0, 30)
    narrow = estimate(15, 30, 15)
    assert narrow.elo == pytest.approx(0.0)
    assert narrow.ci_half_width < wide.ci_half_width


def test_a_clean_sweep_stays_finite_and_positive():
    e = estimate(10, 0, 0)
    assert math.isfinite(e.elo) and e.elo > 300
    assert e.ci_low < e.elo <= e.ci_high and e.ci_low > 0  # Wilson: a sweep is evidence
    assert estimate(0, 0, 10).elo == pytest.approx(-e.elo)


def test_more_games_shrink_the_interval():
    assert estimate(600, 0, 400).ci_half_width < estimate(60, 0, 40).ci_half_width


def test_interval_covers_the_truth_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    true_elo, covered = 100.0, 0
    p = score_from_elo(true_elo)
    for _ in range(400):
        wins = int(rng.binomial(200, p))
        e = estimate(wins, 0, 200 - wins)
        covered += e.ci_low <= true_elo <= e.ci_high
    assert 0.91 <= covered / 400 <= 0.985


def test_chained_ratings_add_differences_and_widen_the_interval():
    first = estimate(60, 0, 40)
    rating, lo, hi = chain(0.0, 0.0, first)
    assert rating == pytest.approx(first.elo)
    second = estimate(55, 0, 45)
    rating2, lo2, hi2 = chain(rating, (hi - lo) / 2, second)
    assert rating2 == pytest.approx(first.elo + second.elo)
    assert (hi2 - lo2) > (hi - lo)


def test_sprt_accepts_a_much_stronger_player_and_rejects_an_equal_one():
    strong = sprt(80, 0, 20, elo0=0, elo1=35)
    assert strong.decision == "H1"
    assert strong.upper == pytest.approx(math.log(0.95 / 0.05))
    equal = sprt(300, 0, 300, elo0=0, elo1=35)
    assert equal.decision == "H0"
    assert equal.lower == pytest.approx(math.log(0.05 / 0.95))
    assert sprt(6, 0, 4).decision == "continue"


def test_sprt_errors_are_near_alpha_and_beta_in_simulation():
    """Play sequential tests against players exactly at elo0 and at elo1 (no draws)."""
    rng = np.random.default_rng(1)

    def run(true_elo: float) -> str:
        p = score_from_elo(true_elo)
        w = l_ = 0
        while True:
            if rng.random() < p:
                w += 1
            else:
                l_ += 1
            decision = sprt(w, 0, l_, 0, 35).decision
            if decision != "continue" or w + l_ > 5000:
                return decision

    trials = 150
    false_pass = sum(run(0.0) == "H1" for _ in range(trials)) / trials
    false_fail = sum(run(35.0) == "H0" for _ in range(trials)) / trials
    assert false_pass < 0.12 and false_fail < 0.12, (false_pass, false_fail)
