"""Gumbel MuZero search (`mcts.algorithm: gumbel`), with plain numbers and known-answer
evaluators on the real rules engine, in the spirit of mctx's policy tests.

Hand-made trees below set a root (node 0) with three children (nodes 1-3) directly in the
search's arrays, so the numbers of Gumbel's formulas can be checked one by one.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from configs import GoConfig, MctsConfig
from training.go.coords import from_gtp
from training.search.mcts import (Mcts, _completed_sigma, _improved_policy, _pick_child_gumbel,
                                   halving_schedule)
from tests.test_mcts import Counting, hashed, uniform, winning_point

N = 5
A = N * N
HISTORY = 2
GO = GoConfig(board_size=N, komi=0.5)
GUMBEL = MctsConfig(algorithm="gumbel", simulations=16, reuse_tree=True,
                    full_search_fraction=1.0)
MINMAX = dataclasses.replace(GUMBEL, gumbel_q_normalization="minmax")


def schedule(m: int, n: int) -> list[int]:
    out = np.zeros(n, np.int32)
    halving_schedule(m, n, out)
    return out.tolist()


# ------------------------------------------------------------------ sequential halving


def test_halving_schedule_matches_mctx():
    # mctx/_src/tests/seq_halving_test.py, the same cases
    assert schedule(8, 24) == [0] * 8 + [1] * 4 + [2] * 4 + [3, 3, 4, 4, 5, 5, 6, 6]
    assert schedule(8, 47) == (
        [0] * 8 + [1] * 4 + [2] * 4 + [3] * 4
        + [4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15,
           16, 16, 17]
    )
    assert schedule(8, 2) == [0, 0]
    assert schedule(8, 13) == [0] * 8 + [1] * 4 + [2]
    assert schedule(7, 24) == [0] * 7 + [1, 1, 1, 2, 2, 2] + [3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8]
    assert schedule(0, 16) == list(range(16))
    assert schedule(1, 16) == list(range(16))


def assert_visits_follow_schedule(new_visits: np.ndarray, m: int, n: int) -> None:
    """Simulation i goes to a child with schedule[i] visits, so for every v the children
    with more than v visits are as many as the simulations that found v."""
    sched = np.array(schedule(m, n))
    assert new_visits.sum() == n
    for v in range(n):
        assert (new_visits > v).sum() == (sched == v).sum(), v


@pytest.mark.parametrize("sims,max_considered,m", [(24, 8, 8), (4, 16, 4), (64, 16, 16),
                                                   (64, 100, A + 1), (2, 16, 2)])
def test_root_visits_follow_the_halving_schedule(sims, max_considered, m):
    # m = min(legal moves, max_considered, simulations); the empty 5x5 board has A + 1 moves
    cfg = dataclasses.replace(GUMBEL, gumbel_max_considered=max_considered)
    mcts = Mcts(1, GO, cfg, history=HISTORY, simulations=sims)
    visits = mcts.search(hashed, rngs=[np.random.default_rng(3)])[0]
    assert mcts.tree.considered[0] == m
    assert_visits_follow_schedule(visits, m, sims)


def test_a_reused_root_halves_over_the_new_visits():
    mcts = Mcts(1, GO, GUMBEL, history=HISTORY, simulations=24)
    mcts.search(hashed, rngs=[np.random.default_rng(0)])
    move = mcts.select_moves([0])
    mcts.play(np.array([0]), move)
    before = mcts.root_visits([0])[0]
    assert before.sum() > 0  # the chosen child's subtree was kept
    after = mcts.search(hashed, rngs=[np.random.default_rng(1)])[0]
    assert after.sum() == before.sum() + 24
    assert_visits_follow_schedule(after - before, min(16, 24), 24)


# ------------------------------------------------------------------ hand-made tree


def hand_tree(cfg: MctsConfig) -> Mcts:
    """Root value 0.2 (net); children: priors 0.5, 0.3, 0.2; visits 2, 1, 0; Q 0.5, -0.5."""
    mcts = Mcts(1, GO, cfg, history=HISTORY)
    t = mcts.tree
    t.first_child[0, 0], t.n_children[0, 0], t.size[0] = 1, 3, 4
    t.visits[0, 0], t.raw_value[0, 0] = 4, 0.2
    t.move[0, 1:4] = [0, 1, 2]
    t.prior[0, 1:4] = [0.5, 0.3, 0.2]
    t.visits[0, 1:4] = [2, 1, 0]
    t.value_sum[0, 1:4] = [1.0, -0.5, 0.0]
    t.first_child[0, 1:4] = -1
    return mcts


# mixed value = (raw + sum N * sum_visited(P Q) / sum_visited(P)) / (sum N + 1)
#             = (0.2 + 3 * (0.5 * 0.5 + 0.3 * -0.5) / 0.8) / 4 = 0.14375
MIXED = 0.14375
COMPLETED = np.array([0.5, -0.5, MIXED])
BY_BOUNDS = (COMPLETED + 1) / 2  # [0.75, 0.25, 0.571875]
BY_MINMAX = np.array([1.0, 0.0, (MIXED + 0.5) / 1.0])  # (Q - min) / (max - min)


@pytest.mark.parametrize("minmax,normalised", [(False, BY_BOUNDS), (True, BY_MINMAX)])
def test_completed_q_of_an_unvisited_child_is_the_mixed_value(minmax, normalised):
    mcts = hand_tree(GUMBEL)
    sigma = np.zeros(3, np.float32)
    _completed_sigma(mcts.tree, 0, 0, np.float32(50.0), np.float32(1.0), minmax, sigma)
    # sigma = (c_visit + max N) * c_scale * normalised completed Q
    np.testing.assert_allclose(sigma, (50 + 2) * 1.0 * normalised, rtol=1e-5)
    assert sigma[2] == pytest.approx(52 * (0.571875 if not minmax else 0.64375), rel=1e-5)


@pytest.mark.parametrize("cfg,normalised,first", [(GUMBEL, BY_BOUNDS, 0.52753),
                                                  (MINMAX, BY_MINMAX, 0.55434)])
def test_improved_policy_equals_the_hand_computed_one(cfg, normalised, first):
    mcts = hand_tree(dataclasses.replace(cfg, gumbel_c_visit=1.0, gumbel_c_scale=0.1))
    sigma = (1 + 2) * 0.1 * normalised  # bounds: [0.225, 0.075, 0.1715625]
    weights = np.array([0.5, 0.3, 0.2]) * np.exp(sigma)  # softmax(log prior + sigma)
    expected = weights / weights.sum()
    target = mcts.policy_targets([0])[0]
    np.testing.assert_allclose(target[:3], expected, rtol=1e-5)
    assert target[3:].sum() == 0
    assert expected[0] == pytest.approx(first, abs=1e-4)


def test_the_default_c_visit_sharpens_the_target_with_the_value_gap():
    # c_visit 50, c_scale 1, bounds: sigma differs by 52 * (0.75 - 0.571875) = 9.26 between
    # the best child and the unvisited one: nearly all mass on the best
    target = hand_tree(GUMBEL).policy_targets([0])[0]
    assert target[0] > 0.999 and target[1] < 1e-9


def test_with_equal_values_the_improved_policy_is_the_prior():
    mcts = hand_tree(GUMBEL)
    mcts.tree.value_sum[0, 1:4] = [0.4, 0.2, 0.0]  # Q = 0.2 = the root's value everywhere
    np.testing.assert_allclose(mcts.policy_targets([0])[0][:3], [0.5, 0.3, 0.2], rtol=1e-5)


def test_the_final_choice_is_among_the_most_visited_with_noise_only_when_sampling():
    mcts = hand_tree(GUMBEL)
    t = mcts.tree
    t.raw_value[0, 0] = 0.0
    t.visits[0, 1:4] = [1, 1, 0]  # children 1 and 2 survived the halving, child 3 did not
    t.value_sum[0, 1:4] = 0.0  # equal values: the choice is g + logit
    t.gumbel[0, :3] = [0.0, 5.0, 50.0]
    assert mcts.select_moves([0], sample=np.array([False]))[0] == 0  # the higher prior
    assert mcts.select_moves([0], sample=np.array([True]))[0] == 1  # the noise decides
    t.gumbel[0, :3] = 0.0
    t.visits[0, 1:4] = [1, 2, 0]
    assert mcts.select_moves([0], sample=np.array([True]))[0] == 1  # the most visited


def test_non_root_visits_come_to_follow_the_improved_policy():
    # all values 0: the improved policy is the prior, and argmax(pi - N / (1 + sum N))
    # hands out visits in its proportions
    mcts = hand_tree(GUMBEL)
    t = mcts.tree
    t.raw_value[0, 0] = 0.0
    t.visits[0, 1:4] = 0
    t.value_sum[0, 1:4] = 0.0
    picks = []
    for _ in range(100):
        child = _pick_child_gumbel(t, 0, 0, np.float32(50.0), np.float32(1.0), False)
        t.visits[0, child] += 1
        picks.append(child - 1)
    # scores pi - N / (1 + sum N): [.5, .3, .2], [0, .3, .2], [.17, -.03, .2], [.25, .05, -.05]
    assert picks[:4] == [0, 1, 2, 0]
    assert np.abs(t.visits[0, 1:4] - [50, 30, 20]).max() <= 1


# ------------------------------------------------------------------ known answers


def favourite_and_winner(favourite: int, winner: int):
    """Priors 0.5 on `favourite`, 0.4 on `winner`, the rest spread over the other legal
    moves; whoever holds `winner` wins (value +-1), any other position is even (0)."""
    win = winning_point(winner)

    def evaluate(planes, legal):
        _, values = win(planes, legal)
        priors = legal * np.float32(0.1 / (legal.sum(1, keepdims=True) - 2))
        priors[:, favourite] = np.where(legal[:, favourite], 0.5, 0.0)
        priors[:, winner] = np.where(legal[:, winner], 0.4, 0.0)
        return priors.astype(np.float32), values

    return evaluate


FAVOURITE, WINNER = from_gtp("B2", N), from_gtp("C3", N)


@pytest.mark.parametrize("sims", [2, 3, 4, 5, 6, 7, 8])
def test_without_noise_the_search_finds_the_winning_move_in_2_to_8_simulations(sims):
    evaluate = favourite_and_winner(FAVOURITE, WINNER)
    mcts = Mcts(1, GO, GUMBEL, history=HISTORY, simulations=sims)
    mcts.search(evaluate)
    assert mcts.select_moves([0])[0] == WINNER
    assert mcts.root_values([0])[0] > 0
    # the network alone (its prior) would play the favourite; the target moves to the winner
    target = mcts.policy_targets([0])[0]
    assert target.argmax() == WINNER and target[WINNER] > 0.9


@pytest.mark.parametrize("sims", [2, 8])
def test_with_noise_the_search_mostly_finds_the_winning_move(sims):
    evaluate = favourite_and_winner(FAVOURITE, WINNER)
    found = 0
    for seed in range(40):
        mcts = Mcts(1, GO, GUMBEL, history=HISTORY, simulations=sims)
        mcts.search(evaluate, rngs=[np.random.default_rng(seed)])
        found += mcts.select_moves([0], sample=np.array([True]))[0] == WINNER
    # a uniform choice finds it 1 time in 26; Gumbel-top-2 sampling of these priors about
    # 4 in 5, top-8 nearly always
    assert found >= (28 if sims == 2 else 38)


def test_final_choice_with_noise_follows_the_noise_among_the_survivors():
    # values all 0: the choice is g + logit among the children halving kept; with the
    # root's noise g it differs between seeds, without it (g = 0) it is the highest prior
    # among them
    picks = set()
    for seed in range(12):
        mcts = Mcts(1, GO, dataclasses.replace(GUMBEL, simulations=4), history=HISTORY)
        mcts.search(uniform, rngs=[np.random.default_rng(seed)])
        picks.add(int(mcts.select_moves([0], sample=np.array([True]))[0]))
    assert len(picks) > 3


# ------------------------------------------------------------------ batching and seeds


def test_gumbel_batched_and_one_game_search_agree_on_a_fixed_seed():
    opening = [[], [from_gtp("C3", N)], [from_gtp("B2", N), from_gtp("D4", N)], []]
    batched = Mcts(4, GO, GUMBEL, history=HISTORY, batch_size=3)
    for g, moves in enumerate(opening):
        batched.reset_game(g, moves)
    rngs = [np.random.default_rng(7 + g) for g in range(4)]
    together = batched.search(hashed, rngs=rngs)
    targets = batched.policy_targets(range(4))
    chosen = batched.select_moves(range(4), sample=np.ones(4, bool))
    for g, moves in enumerate(opening):
        alone = Mcts(1, GO, GUMBEL, history=HISTORY)
        alone.reset_game(0, moves)
        visits = alone.search(hashed, rngs=[np.random.default_rng(7 + g)])[0]
        np.testing.assert_array_equal(visits, together[g])
        np.testing.assert_array_equal(alone.policy_targets([0])[0], targets[g])
        assert alone.select_moves([0], sample=np.array([True]))[0] == chosen[g]


def test_gumbel_noise_depends_only_on_the_seed():
    def run(seed):
        mcts = Mcts(1, GO, GUMBEL, history=HISTORY)
        visits = mcts.search(hashed, rngs=[np.random.default_rng(seed)])[0]
        return visits, mcts.policy_targets([0])[0]

    (v1, p1), (v2, p2), (v3, _) = run(5), run(5), run(6)
    np.testing.assert_array_equal(v1, v2)
    np.testing.assert_array_equal(p1, p2)
    assert not np.array_equal(v1, v3)


def test_targets_are_distributions_over_legal_moves_and_values_stay_in_range():
    mcts = Mcts(3, GO, GUMBEL, history=HISTORY, simulations=40)
    mcts.reset_game(1, [from_gtp("C3", N), from_gtp("B2", N)])
    visits = mcts.search(hashed, rngs=[np.random.default_rng(i) for i in range(3)])
    assert (visits.sum(1) == 40).all()
    targets = mcts.policy_targets(range(3))
    np.testing.assert_allclose(targets.sum(1), 1.0, rtol=1e-5)
    assert targets[1, from_gtp("C3", N)] == 0 and targets[1, from_gtp("B2", N)] == 0
    assert (targets[0] > 0).sum() == A + 1  # every legal move keeps some mass
    assert np.all(np.abs(mcts.root_values(range(3))) <= 1.0)
    t = mcts.tree
    for g in range(3):
        for node in np.flatnonzero(t.first_child[g, : t.size[g]] >= 0):
            first, k = t.first_child[g, node], t.n_children[g, node]
            assert t.visits[g, node] - 1 == t.visits[g, first : first + k].sum()


def test_one_network_call_per_step_as_with_puct():
    evaluate = Counting(uniform)
    mcts = Mcts(6, GO, dataclasses.replace(GUMBEL, simulations=10), history=HISTORY,
                batch_size=6)
    mcts.search(evaluate)
    assert evaluate.batches == [6] * 11


def test_searches_of_different_lengths_in_one_batch():
    mcts = Mcts(3, GO, GUMBEL, history=HISTORY)
    visits = mcts.search(hashed, rngs=[np.random.default_rng(i) for i in range(3)],
                         simulations=[16, 2, 40])
    assert visits.sum(1).tolist() == [16, 2, 40]
    assert mcts.tree.considered.tolist() == [16, 2, 16]


def test_puct_select_moves_is_the_most_visited_or_a_visit_sample():
    mcts = Mcts(2, GO, MctsConfig(algorithm="puct", simulations=32), history=HISTORY)
    visits = mcts.search(hashed)
    np.testing.assert_array_equal(mcts.select_moves([0, 1]), visits.argmax(1))
    np.testing.assert_allclose(mcts.policy_targets([0])[0], visits[0] / 32)


def _reference_pick(t, node: int, c_visit: float, c_scale: float, minmax: bool
                    ) -> tuple[int, np.ndarray]:
    """The rule as defined: argmax over every child of pi'(a) - N(a) / (1 + sum N), pi' the
    whole improved policy (`_improved_policy`); returns the node and every child's score."""
    first, k = int(t.first_child[0, node]), int(t.n_children[0, node])
    pi = np.zeros(k + 1, np.float32)
    _improved_policy(t, 0, node, c_visit, c_scale, minmax, pi)
    n = t.visits[0, first:first + k].astype(np.float64)
    scores = pi[:k].astype(np.float64) - n / (1.0 + n.sum())
    return first + int(np.argmax(scores)), scores


@pytest.mark.parametrize("cfg", [GUMBEL, MINMAX], ids=["bounds", "minmax"])
def test_the_child_rule_picks_what_the_whole_improved_policy_picks(cfg):
    """Below the root the rule takes a log and an exp per visited child only (the unvisited
    ones share sigma); at every expanded node of real searches (600 nodes, fixed seeds) it
    picks the child the rule's definition over every child picks, or one whose score is
    within 1e-6 of it (float32 rounding in the definition's softmax)."""
    cfg = dataclasses.replace(cfg, simulations=64)
    c_visit, c_scale = np.float32(cfg.gumbel_c_visit), np.float32(cfg.gumbel_c_scale)
    checked = same = 0
    for seed in range(12):
        mcts = Mcts(1, GO, cfg, history=HISTORY)
        rng = np.random.default_rng(seed)
        for _ in range(3):  # a few moves in, so that trees are reused and deeper
            mcts.search(hashed, rngs=[rng])
            mcts.play(np.array([0]), mcts.select_moves([0]))
        mcts.search(hashed, rngs=[rng])
        t = mcts.tree
        for node in range(1, int(t.size[0])):
            if t.first_child[0, node] < 0 or t.n_children[0, node] == 0:
                continue
            got = _pick_child_gumbel(t, 0, node, c_visit, c_scale, cfg.gumbel_q_normalization
                                     == "minmax")
            want, scores = _reference_pick(t, node, c_visit, c_scale,
                                           cfg.gumbel_q_normalization == "minmax")
            first = int(t.first_child[0, node])
            checked += 1
            same += got == want
            assert scores[got - first] >= scores[want - first] - 1e-6, (seed, node)
    print(f"child rule: {same} of {checked} nodes pick the same child as the definition")
    assert checked >= 600 and same >= checked - 2, (checked, same)
