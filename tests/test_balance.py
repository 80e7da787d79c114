"""Load balancing in plain numbers (`training.fleet.balance`): small hand-computed cases."""

from __future__ import annotations

import pytest

from training.fleet import balance

W12 = ["worker1", "worker2"]


def test_speed_is_smoothed_over_heartbeats_and_the_first_reading_taken_as_is():
    assert balance.smoothed_speed(0.0, 2.0) == 2.0
    assert balance.smoothed_speed(1.0, 2.0) == pytest.approx(0.7 * 1.0 + 0.3 * 2.0)  # 1.3
    assert balance.smoothed_speed(1.3, 2.0) == pytest.approx(1.51)


def test_configured_weights_win_and_unlisted_workers_weigh_one():
    names = ["a", "b", "c"]
    for load_balancing in (True, False):
        assert balance.weights(names, {"a": 1.0, "b": 2.0}, load_balancing,
                               {"a": 9.0, "b": 9.0, "c": 9.0}) == {"a": 1.0, "b": 2.0, "c": 1.0}


def test_without_configured_weights_the_weight_is_the_measured_speed():
    assert balance.weights(W12, {}, True, {"worker1": 1.0, "worker2": 3.0}) == {
        "worker1": 1.0, "worker2": 3.0}
    # one worker not measured yet (no reading, or below the floor): equal weights meanwhile
    assert balance.weights(W12, {}, True, {"worker1": 1.0}) == {"worker1": 1.0, "worker2": 1.0}
    assert balance.weights(W12, {}, True, {"worker1": 1.0, "worker2": 0.0005}) == {
        "worker1": 1.0, "worker2": 1.0}
    # load balancing off: everyone 1.0 whatever the speeds
    assert balance.weights(W12, {}, False, {"worker1": 1.0, "worker2": 3.0}) == {
        "worker1": 1.0, "worker2": 1.0}


def test_only_configured_weights_with_load_balancing_cap():
    assert balance.capped(True, {"worker1": 2.0})
    assert not balance.capped(True, {})
    assert not balance.capped(False, {"worker1": 2.0})


def test_a_generation_needs_games_per_worker_for_each_active_worker_at_least_one():
    assert balance.generation_target(20, 2) == 40
    assert balance.generation_target(20, 1) == 20
    assert balance.generation_target(20, 0) == 20  # nobody active: training never waits on 0


def test_weights_set_each_workers_share_of_a_generation():
    w = {"worker1": 1.0, "worker2": 2.0}
    # G = 40: shares 40/3 = 13.33 and 80/3 = 26.67, rounded up
    assert balance.quotas(W12, W12, w, {"worker1": 0, "worker2": 0}, 40) == {
        "worker1": 14, "worker2": 27}
    # worker2 ahead of its share (30 > 26.67) waits; worker1 (5 of 13.33) may deliver 9 more
    assert balance.quotas(W12, W12, w, {"worker1": 5, "worker2": 30}, 40) == {
        "worker1": 9, "worker2": 0}
    # both past their share (14/13.33, 30/26.67): k = 2 opens the next round for both, in the
    # same ratio: ceil(26.67) - 14 = 13 and ceil(53.33) - 30 = 24
    assert balance.quotas(W12, W12, w, {"worker1": 14, "worker2": 30}, 40) == {
        "worker1": 13, "worker2": 24}
    # worker2 Offline: G = 20 is all worker1's (20 - 14 = 6), worker2 is not capped
    assert balance.quotas(W12, ["worker1"], w, {"worker1": 14, "worker2": 30}, 20) == {
        "worker1": 6, "worker2": None}


def test_caps_are_ceilings_of_fractional_shares():
    # G = 10 with weights 1 and 2: 3.33 and 6.67 -> 4 and 7 (the caps may sum above G)
    assert balance.quotas(W12, W12, {"worker1": 1.0, "worker2": 2.0},
                          {"worker1": 0, "worker2": 0}, 10) == {"worker1": 4, "worker2": 7}


def test_a_slow_heavy_worker_makes_the_others_wait():
    names = ["a", "b", "c"]
    w = {"a": 1.0, "b": 1.0, "c": 2.0}
    # G = 60: shares 15, 15, 30
    assert balance.quotas(names, names, w, {"a": 0, "b": 0, "c": 0}, 60) == {
        "a": 15, "b": 15, "c": 30}
    # b is at 3 of 15 (fill 0.2): a and c, at their shares, wait for it
    assert balance.quotas(names, names, w, {"a": 15, "b": 3, "c": 30}, 60) == {
        "a": 0, "b": 12, "c": 0}


def test_without_weights_or_active_workers_nothing_is_capped():
    collected = {"worker1": 5, "worker2": 30}
    assert balance.quotas(W12, W12, None, collected, 40) == {"worker1": None, "worker2": None}
    assert balance.quotas(W12, [], {"worker1": 1.0, "worker2": 2.0}, collected, 20) == {
        "worker1": None, "worker2": None}


def test_shares_of_the_games_collected_this_generation():
    assert balance.shares({"worker1": 30, "worker2": 10}) == {"worker1": 0.75, "worker2": 0.25}
    assert balance.shares({"worker1": 0, "worker2": 0}) == {"worker1": 0.0, "worker2": 0.0}
    assert balance.shares({}) == {}
