"""training.play.rating: the Wilson interval and the anchored pool fit, against closed forms."""

from __future__ import annotations

import math

import pytest

from training.play.rating import Result, fit, wilson


def test_wilson_interval_matches_its_closed_forms():
    z = 1.959963984540054
    lo, hi = wilson(0, 10)  # no wins: [0, z^2 / (n + z^2)]
    assert lo == 0.0 and hi == pytest.approx(z * z / (10 + z * z))
    lo, hi = wilson(10, 10)
    assert lo == pytest.approx(10 / (10 + z * z)) and hi == pytest.approx(1.0)
    lo, hi = wilson(5, 10)  # centred on 1/2
    assert lo + hi == pytest.approx(1.0) and lo == pytest.approx(0.2366, abs=1e-4)
    lo, hi = wilson(20, 40)
    assert hi - lo < 0.7634 - 0.2366  # more games, narrower
    assert wilson(0, 0) == (0.0, 1.0)
    assert wilson(3.5, 10)[0] < 0.35 < wilson(3.5, 10)[1]  # draws count half
    with pytest.raises(ValueError):
        wilson(11, 10)


def test_fit_keeps_the_anchor_and_rates_by_the_logistic_curve():
    even = fit([Result("a", "gnugo 1", 10, 20)], "gnugo 1", 100.0)
    assert even["gnugo 1"].elo == 100.0
    assert even["a"].elo == pytest.approx(100.0, abs=1e-6)
    assert even["a"].ci_low < 100 < even["a"].ci_high
    # 20 of 100: the maximum-likelihood difference is 400 log10(1/4); the prior moves it a bit
    weak = fit([Result("a", "gnugo 1", 20, 100)], "gnugo 1", 0.0)["a"]
    assert weak.elo == pytest.approx(400 * math.log10(0.25), abs=10)
    assert weak.ci_low < weak.elo < weak.ci_high < 0


def test_fit_rates_pool_members_through_shared_players_and_stays_finite_on_sweeps():
    results = [Result("gen 1", "gnugo 1", 5, 10), Result("gen 1", "random", 9, 10),
               Result("gen 2", "gnugo 1", 0, 10), Result("gen 2", "random", 10, 10)]
    r = fit(results, "gnugo 1", 0.0)
    assert set(r) == {"gnugo 1", "gen 1", "gen 2", "random"}
    assert r["random"].elo < r["gen 2"].elo < r["gen 1"].elo  # 0/10 vs level 1 is below 5/10
    assert all(math.isfinite(x.elo) and x.ci_low < x.elo < x.ci_high
               for name, x in r.items() if name != "gnugo 1")
    with pytest.raises(ValueError, match="anchor"):
        fit(results, "gnugo 10", 0.0)
