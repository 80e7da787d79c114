"""Batched PUCT search, tested with stand-in evaluators (no net) on the real rules engine.

The evaluators here read only what the project's contracts fix: `legal` (an occupied point is
never legal), the first input plane (the side to move's stones now) and the last one (ones
when black is to move), see training/learn/net.py and training/go/features.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from configs import GoConfig, MctsConfig
from training.go.coords import BLACK, from_gtp
from training.search.mcts import Mcts, choose_moves

N = 5
A = N * N
HISTORY = 2
GO = GoConfig(board_size=N, komi=0.5)
MCTS = MctsConfig(algorithm="puct", simulations=32, reuse_tree=True, full_search_fraction=1.0)


def uniform(planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Uniform priors over legal moves, value 0."""
    p = legal.astype(np.float32)
    return p / p.sum(1, keepdims=True), np.zeros(len(planes), np.float32)


def black_to_move(planes: np.ndarray) -> np.ndarray:
    return planes[:, -1].reshape(len(planes), -1).max(1) > 0.5


def winning_point(point: int):
    """A bandit: whoever has a stone on `point` wins (value +-1), else the value is 0."""

    def evaluate(planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        priors, _ = uniform(planes, legal)
        occupied = ~legal[:, point]
        mine = planes[:, 0].reshape(len(planes), -1)[:, point] > 0.5
        return priors, np.where(occupied, np.where(mine, 1.0, -1.0), 0.0).astype(np.float32)

    return evaluate


def hashed(planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic pseudo-random priors and values, a function of each position alone."""
    b = len(planes)
    priors = np.zeros(legal.shape, np.float32)
    values = np.zeros(b, np.float32)
    for i in range(b):
        key = int.from_bytes(
            np.packbits(np.concatenate([planes[i].ravel() > 0.5, legal[i]])).tobytes()[:64],
            "little",
        ) % (2**32)
        rng = np.random.default_rng(key)
        priors[i] = rng.random(legal.shape[1]).astype(np.float32) * legal[i]
        priors[i] /= priors[i].sum()
        values[i] = rng.uniform(-1, 1)
    return priors, values


class Counting:
    """Wraps an evaluator and records the batch size of every call."""

    def __init__(self, evaluate):
        self.evaluate = evaluate
        self.batches: list[int] = []

    def __call__(self, planes, legal):
        assert planes.dtype == np.float32 and planes.shape[1:] == (2 * HISTORY + 1, N, N)
        assert legal.dtype == np.bool_ and legal.shape == (len(planes), A + 1)
        self.batches.append(len(planes))
        return self.evaluate(planes, legal)


def test_the_winning_move_takes_most_visits():
    point = from_gtp("C3", N)
    mcts = Mcts(1, GO, MCTS, history=HISTORY, simulations=64)
    visits = mcts.search(winning_point(point))[0]
    assert visits.sum() == 64
    assert visits.argmax() == point
    assert visits[point] > 0.5 * 64
    assert mcts.root_values([0])[0] > 0.5


def test_visits_sum_to_simulations_and_values_stay_in_range():
    mcts = Mcts(3, GO, MCTS, history=HISTORY, simulations=40)
    rngs = [np.random.default_rng(i) for i in range(3)]
    visits = mcts.search(hashed, rngs=rngs)
    assert visits.tolist() and (visits.sum(1) == 40).all()
    t = mcts.tree
    for g in range(3):
        used = t.size[g]
        n = t.visits[g, :used]
        q = t.value_sum[g, :used][n > 0] / n[n > 0]
        assert np.all(np.abs(q) <= 1.0 + 1e-6)
        # N - 1 = the children's visits, at every expanded node (the root's evaluation and
        # each node's own first visit are the "- 1")
        for node in np.flatnonzero(t.first_child[g, :used] >= 0):
            first, k = t.first_child[g, node], t.n_children[g, node]
            assert t.visits[g, node] - 1 == t.visits[g, first : first + k].sum()
            assert abs(t.prior[g, first : first + k].sum() - 1.0) < 1e-4
    assert np.all(np.abs(mcts.root_values(range(3))) <= 1.0)


def test_one_network_call_per_step_and_batches_capped():
    evaluate = Counting(uniform)
    mcts = Mcts(6, GO, MCTS, history=HISTORY, simulations=10, batch_size=6)
    mcts.search(evaluate)
    # 1 root evaluation + 10 simulations, one call each (no terminal leaves this early)
    assert evaluate.batches == [6] * 11
    evaluate = Counting(uniform)
    mcts = Mcts(6, GO, MCTS, history=HISTORY, simulations=10, batch_size=4)
    mcts.search(evaluate)
    assert evaluate.batches == [4, 2] * 11


def test_batched_and_one_game_search_agree_on_a_fixed_seed():
    cfg = dataclasses.replace(MCTS, simulations=24)
    opening = [[], [from_gtp("C3", N)], [from_gtp("B2", N), from_gtp("D4", N)], []]
    batched = Mcts(4, GO, cfg, history=HISTORY, batch_size=3)
    for g, moves in enumerate(opening):
        batched.reset_game(g, moves)
    together = batched.search(hashed, rngs=[np.random.default_rng(7 + g) for g in range(4)])
    for g, moves in enumerate(opening):
        alone = Mcts(1, GO, cfg, history=HISTORY)
        alone.reset_game(0, moves)
        visits = alone.search(hashed, rngs=[np.random.default_rng(7 + g)])[0]
        np.testing.assert_array_equal(visits, together[g])


def test_root_noise_changes_the_search_and_depends_only_on_the_seed():
    cfg = dataclasses.replace(MCTS, simulations=48)
    quiet = Mcts(1, GO, cfg, history=HISTORY).search(hashed)[0]
    noisy = [Mcts(1, GO, cfg, history=HISTORY).search(hashed, rngs=[np.random.default_rng(s)])
             for s in (1, 1, 2)]
    np.testing.assert_array_equal(noisy[0], noisy[1])
    assert not np.array_equal(noisy[0], noisy[2])
    assert not np.array_equal(quiet, noisy[2][0])


def test_tree_reuse_keeps_the_subtree_and_adds_simulations():
    mcts = Mcts(1, GO, MCTS, history=HISTORY, simulations=50)
    visits = mcts.search(hashed)[0]
    move = int(visits.argmax())
    kept = int(visits[move])
    mcts.play(np.array([0]), np.array([move]))
    assert mcts.tree.visits[0, 0] == kept  # the child's visits, now the root's
    assert mcts.root_visits([0])[0].sum() == kept - 1
    after = mcts.search(hashed)[0]
    assert after.sum() == kept - 1 + 50


def _breadth_first(t, g: int, root: int) -> list[int]:
    """The nodes under `root` (included) in breadth-first order, children in block order."""
    order, i = [root], 0
    while i < len(order):
        first = int(t.first_child[g, order[i]])
        if first >= 0:
            order += range(first, first + int(t.n_children[g, order[i]]))
        i += 1
    return order


def _searched_then_child():
    mcts = Mcts(1, GO, MCTS, history=HISTORY, simulations=60)
    move = int(mcts.search(hashed)[0].argmax())
    t = mcts.tree
    first, k = int(t.first_child[0, 0]), int(t.n_children[0, 0])
    child = next(c for c in range(first, first + k) if t.move[0, c] == move)
    return mcts, move, _breadth_first(t, 0, child)


def test_a_kept_subtree_is_renumbered_breadth_first_with_every_field():
    mcts, move, order = _searched_then_child()
    t = mcts.tree
    fields = ("visits", "value_sum", "prior", "move", "n_children", "raw_value",
              "score_sum", "raw_score")
    want = {f: getattr(t, f)[0, order].copy() for f in fields}
    want["move"][0], want["prior"][0] = -1, 1.0  # a root has no move and all the prior
    expanded = [bool(t.first_child[0, n] >= 0) for n in order]
    assert len(order) > 20 and sum(expanded) > 3  # a subtree with some depth
    mcts.play(np.array([0]), np.array([move]))
    t, n = mcts.tree, len(order)
    assert t.size[0] == n
    for f in fields:
        np.testing.assert_array_equal(getattr(t, f)[0, :n], want[f], err_msg=f)
    assert [bool(t.first_child[0, i] >= 0) for i in range(n)] == expanded
    assert _breadth_first(t, 0, 0) == list(range(n))  # every block follows in order


@pytest.mark.parametrize("room", [0, -1])
def test_a_subtree_over_the_keep_limit_is_dropped_and_one_at_it_kept(room):
    mcts, move, order = _searched_then_child()
    mcts._keep_limit = len(order) + room
    mcts.play(np.array([0]), np.array([move]))
    assert mcts.tree.size[0] == (len(order) if room == 0 else 1)


def test_without_reuse_each_search_starts_fresh():
    mcts = Mcts(1, GO, MCTS, history=HISTORY, simulations=30, reuse_tree=False)
    move = int(mcts.search(hashed)[0].argmax())
    mcts.play(np.array([0]), np.array([move]))
    assert mcts.tree.size[0] == 1 and mcts.tree.visits[0, 0] == 0
    assert mcts.search(hashed)[0].sum() == 30


def test_game_over_leaves_are_scored_by_the_rules():
    # Black has the only stone and white passed: black passing ends the game, black winning.
    mcts = Mcts(1, GO, MCTS, history=HISTORY, simulations=100)
    mcts.reset_game(0, [from_gtp("C3", N), A])
    evaluate = Counting(uniform)
    visits = mcts.search(evaluate)[0]
    assert visits.argmax() == A and visits[A] > 50
    t = mcts.tree
    first, k = t.first_child[0, 0], t.n_children[0, 0]
    children = np.arange(first, first + k)
    pass_node = children[t.move[0, children] == A][0]
    assert t.value_sum[0, pass_node] == t.visits[0, pass_node]  # every visit a win, +1
    assert sum(evaluate.batches) < 1 + 100 - 50  # terminal leaves cost no evaluation


def test_a_finished_game_is_not_searched():
    mcts = Mcts(1, GO, MCTS, history=HISTORY)
    mcts.reset_game(0, [A, A])
    assert mcts.is_over(0)
    evaluate = Counting(uniform)
    assert mcts.search(evaluate)[0].sum() == 0
    assert evaluate.batches == []


def test_many_simulations_on_a_small_board_stay_within_the_tree_capacity():
    cfg = dataclasses.replace(MCTS, simulations=400)
    mcts = Mcts(2, GoConfig(board_size=5, komi=0.5, max_moves=12), cfg, history=HISTORY)
    for _ in range(12):
        if mcts.is_over(0):
            break
        visits = mcts.search(hashed)
        assert (visits.sum(1) >= 400).all()
        assert (mcts.tree.size <= mcts.tree.visits.shape[1]).all()
        mcts.play(np.arange(2), visits.argmax(1))


def test_illegal_moves_are_refused_with_a_clear_error():
    mcts = Mcts(1, GO, MCTS, history=HISTORY)
    with pytest.raises(ValueError, match="illegal"):
        mcts.reset_game(0, [3, 3])
    mcts.reset_game(0, [3])
    with pytest.raises(ValueError, match="illegal"):
        mcts.play(np.array([0]), np.array([3]))


def test_choose_moves_samples_by_visits_then_takes_the_most_visited():
    visits = np.array([[0, 10, 0, 90]] * 400)
    rngs = [np.random.default_rng(i) for i in range(400)]
    sampled = choose_moves(visits, rngs, np.ones(400, bool))
    assert set(sampled) == {1, 3}
    assert 0.8 < np.mean(sampled == 3) < 0.97
    best = choose_moves(visits, rngs, np.zeros(400, bool))
    assert (best == 3).all()


def test_black_moves_first_on_every_new_game():
    mcts = Mcts(2, GO, MCTS, history=HISTORY)
    assert mcts.to_play(0) == BLACK and mcts.to_play(1) == BLACK


# -- leaf batching: one position's search, several leaves per net call (virtual loss) --------

GUMBEL = dataclasses.replace(MCTS, algorithm="gumbel")


@pytest.mark.parametrize("cfg", [MCTS, GUMBEL], ids=["puct", "gumbel"])
def test_leaf_batch_sends_k_leaves_per_call_and_adds_exactly_the_simulations(cfg):
    evaluate = Counting(hashed)
    mcts = Mcts(1, GO, cfg, history=HISTORY, simulations=40, batch_size=8, leaf_batch=8,
                early_pass=False)
    visits = mcts.search(evaluate, rngs=[np.random.default_rng(3)])[0]
    # the fresh root alone, then 40 simulations in calls of 8 (no game ends this early)
    assert evaluate.batches == [1, 8, 8, 8, 8, 8]
    assert visits.sum() == 40
    t = mcts.tree
    used = t.size[0]
    n = t.visits[0, :used]
    assert np.all(np.abs(t.value_sum[0, :used][n > 0] / n[n > 0]) <= 1.0 + 1e-6)
    assert t.visits[0, 0] - 1 == visits.sum()
    for node in np.flatnonzero(t.first_child[0, :used] >= 0):
        first, k = t.first_child[0, node], t.n_children[0, node]
        # a leaf two walks of one call both reached is expanded once and visited twice
        assert t.visits[0, node] - 1 >= t.visits[0, first : first + k].sum()


@pytest.mark.parametrize("cfg", [MCTS, GUMBEL], ids=["puct", "gumbel"])
def test_every_virtual_loss_is_taken_back(cfg):
    def zero_values(planes, legal):
        priors, _ = hashed(planes, legal)
        return priors, np.zeros(len(planes), np.float32)

    mcts = Mcts(1, GO, cfg, history=HISTORY, simulations=64, batch_size=16, leaf_batch=16,
                early_pass=False)
    mcts.search(zero_values)
    t = mcts.tree
    assert t.visits[0, 0] == 65
    np.testing.assert_array_equal(t.value_sum[0, : t.size[0]], 0.0)  # every loss returned


@pytest.mark.parametrize("cfg", [MCTS, GUMBEL], ids=["puct", "gumbel"])
def test_leaf_batch_finds_the_winning_move(cfg):
    point = from_gtp("C3", N)
    mcts = Mcts(1, GO, cfg, history=HISTORY, simulations=64, batch_size=8, leaf_batch=8)
    visits = mcts.search(winning_point(point))[0]
    assert visits.sum() == 64
    assert visits[point] == visits.max() and int(mcts.select_moves([0])[0]) == point
    assert mcts.root_values([0])[0] > 0.1  # the losses in flight spread the visits more


def test_leaf_batch_searches_one_game_only():
    with pytest.raises(ValueError, match="one game"):
        Mcts(2, GO, MCTS, history=HISTORY, leaf_batch=4)


def test_the_gtp_player_batches_its_leaves_by_the_config():
    from training.play.players import MctsPlayer

    point = from_gtp("C3", N)
    evaluate = Counting(winning_point(point))
    player = MctsPlayer(evaluate, GO, dataclasses.replace(GUMBEL, leaf_batch=8), 32,
                        history=HISTORY)
    evaluate.batches.clear()  # the warm-up's searches
    assert player.genmove([], komi=0.5) == point
    assert max(evaluate.batches) == 8 and sum(evaluate.batches) == 1 + 32
