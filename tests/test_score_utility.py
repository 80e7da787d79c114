"""The search's score utility (KataGo's), with stand-in evaluators on the real rules engine.

The evaluators return a third output, the score: margin / N from the side to move's view.
They read what the project's contracts fix: `legal`, the first input plane (the side to
move's stones) and the last (ones when black is to move).
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from configs import GoConfig, MctsConfig, override
from configs.schema import ConfigError
from training.go.coords import from_gtp
from training.search.mcts import Mcts, _rescore, _score_center, _score_term

N = 5
A = N * N
HISTORY = 2
GO = GoConfig(board_size=N, komi=0.5)
PUCT = MctsConfig(algorithm="puct", simulations=32, reuse_tree=True, full_search_fraction=1.0)
GUMBEL = dataclasses.replace(PUCT, algorithm="gumbel")
TREE_FIELDS = ("visits", "value_sum", "prior", "move", "first_child", "n_children", "size",
               "raw_value", "score_sum", "raw_score", "score_center")


def with_utility(cfg: MctsConfig, static: float = 0.0, dynamic: float = 0.0) -> MctsConfig:
    return dataclasses.replace(cfg, score_utility_static=static, score_utility_dynamic=dynamic)


def _key(planes: np.ndarray, legal: np.ndarray, i: int) -> int:
    bits = np.packbits(np.concatenate([planes[i].ravel() > 0.5, legal[i]]))
    return int.from_bytes(bits.tobytes()[:64], "little") % (2**32)


def hashed(values: bool = True, scores: bool = True, spread: float = 5.0):
    """Deterministic pseudo-random priors, values (or 0) and scores (in [-spread, spread]),
    a function of each position alone; without `scores`, two outputs."""

    def evaluate(planes, legal):
        b = len(planes)
        priors = np.zeros(legal.shape, np.float32)
        v = np.zeros(b, np.float32)
        s = np.zeros(b, np.float32)
        for i in range(b):
            rng = np.random.default_rng(_key(planes, legal, i))
            priors[i] = rng.random(legal.shape[1]).astype(np.float32) * legal[i]
            priors[i] /= priors[i].sum()
            v[i] = rng.uniform(-1, 1) if values else 0.0
            s[i] = rng.uniform(-spread, spread)
        return (priors, v, s) if scores else (priors, v)

    return evaluate


def even_but_for_points(point: int):
    """Every position is even (value 0): only the score tells moves apart, and a stone on
    `point` is worth 3 (margin / N) to whoever holds it."""

    def evaluate(planes, legal):
        b = len(planes)
        priors = legal.astype(np.float32)
        priors /= priors.sum(1, keepdims=True)
        occupied = ~legal[:, point]
        mine = planes[:, 0].reshape(b, -1)[:, point] > 0.5
        scores = np.where(occupied, np.where(mine, 3.0, -3.0), 0.0).astype(np.float32)
        return priors, np.zeros(b, np.float32), scores

    return evaluate


def _tree(mcts: Mcts) -> dict[str, np.ndarray]:
    return {f: getattr(mcts.tree, f).copy() for f in TREE_FIELDS}


def _play_a_few(cfg: MctsConfig, evaluate, moves: int = 4, games: int = 2) -> Mcts:
    mcts = Mcts(games, GO, cfg, history=HISTORY, simulations=24, early_pass=False)
    for _ in range(moves):
        mcts.search(evaluate)
        mcts.play(np.arange(games), mcts.select_moves(np.arange(games)))
    mcts.search(evaluate)
    return mcts


# ------------------------------------------------------------------------------- the formula


def test_the_term_is_katagos_formula_in_margin_per_board_side():
    assert _score_term(2.0, 1, 0.0, 1.0, 0.0, 0.75) == pytest.approx(0.5)  # 2/pi atan(1)
    assert _score_term(-2.0, 1, 0.0, 1.0, 0.0, 0.75) == pytest.approx(-0.5)
    assert _score_term(1e6, 1, 0.0, 0.3, 0.4, 0.75) == pytest.approx(0.7, abs=1e-5)
    # the dynamic part is 0 at the centre, seen from the root's side (odd depths) and from
    # the other side (even depths, where the centre is the opposite margin)
    assert _score_term(1.5, 1, 1.5, 0.0, 1.0, 0.75) == 0.0
    assert _score_term(-1.5, 2, 1.5, 0.0, 1.0, 0.75) == 0.0
    assert _score_term(1.5 + 0.75, 3, 1.5, 0.0, 1.0, 0.75) == pytest.approx(0.5)
    assert _score_term(0.0, 1, 0.0, 0.0, 0.0, 0.75) == 0.0
    assert _score_term(np.nan, 1, 0.0, 1.0, 1.0, 0.75) == 0.0
    assert _score_term(np.inf, 1, 0.0, 1.0, 1.0, 0.75) == 0.0


def test_the_centre_is_the_root_margin_pulled_toward_zero_by_at_most_the_scale():
    assert _score_center(1.0, 0.2, 0.75) == pytest.approx(0.8)
    assert _score_center(-1.0, 0.2, 0.75) == pytest.approx(-0.8)
    assert _score_center(10.0, 0.2, 0.75) == pytest.approx(9.25)
    assert _score_center(10.0, 0.0, 0.75) == pytest.approx(10.0)


@pytest.mark.parametrize("key,value", [("score_utility_static", 1.5),
                                       ("score_utility_dynamic", -0.1),
                                       ("score_utility_zero_weight", 2.0),
                                       ("score_utility_scale", 0.1)])
def test_out_of_range_settings_are_refused_by_name(tiny_cfg, key, value):
    with pytest.raises(ConfigError, match=rf"mcts\.{key}.*between"):
        override(tiny_cfg, {f"mcts.{key}": value})


# ------------------------------------------------------------------------------- the search


@pytest.mark.parametrize("cfg", [PUCT, GUMBEL], ids=["puct", "gumbel"])
def test_off_the_scores_change_nothing(cfg):
    """Weights 0: an evaluator with scores and its twin without give the same trees."""
    with_scores = _play_a_few(cfg, hashed())
    without = _play_a_few(cfg, hashed(scores=False))
    a, b = _tree(with_scores), _tree(without)
    for f in TREE_FIELDS:
        np.testing.assert_array_equal(a[f], b[f], err_msg=f)
    np.testing.assert_array_equal(a["score_sum"], 0.0)


@pytest.mark.parametrize("cfg", [PUCT, GUMBEL], ids=["puct", "gumbel"])
@pytest.mark.parametrize("static,dynamic", [(0.3, 0.0), (0.0, 0.3)],
                         ids=["static", "dynamic"])
def test_moves_of_equal_value_are_told_apart_by_points(cfg, static, dynamic):
    """Every move has the same value; on, the search takes the point worth 3; off, it has no
    reason to (ties go to the first move). No FPU reduction: every root move is tried."""
    point = from_gtp("C3", N)
    evaluate = even_but_for_points(point)
    cfg = dataclasses.replace(cfg, fpu_reduction=0.0)
    on = Mcts(1, GO, with_utility(cfg, static, dynamic), history=HISTORY, simulations=64)
    visits = on.search(evaluate)[0]
    assert int(on.select_moves([0])[0]) == point
    assert visits[point] == visits.max()
    off = Mcts(1, GO, cfg, history=HISTORY, simulations=64)
    off.search(evaluate)
    assert int(off.select_moves([0])[0]) != point


@pytest.mark.parametrize("cfg", [PUCT, GUMBEL], ids=["puct", "gumbel"])
@pytest.mark.parametrize("leaf_batch", [1, 16])
def test_reported_win_rates_stay_the_mean_of_the_values(cfg, leaf_batch):
    """Values 0, scores of up to 5 points a side: the utility moves W, not the win rates."""
    mcts = Mcts(1, GO, with_utility(cfg, 0.2, 0.3), history=HISTORY, simulations=48,
                batch_size=leaf_batch, leaf_batch=leaf_batch, early_pass=False)
    mcts.search(hashed(values=False))
    t = mcts.tree
    used = t.size[0]
    assert np.abs(t.value_sum[0, :used]).max() > 0.5  # the utility did reach W
    np.testing.assert_allclose(t.value_sum[0, :used], t.score_sum[0, :used], atol=1e-4)
    assert mcts.root_values([0])[0] == pytest.approx(0.0, abs=1e-6)
    children = mcts.root_children(0)
    assert children and all(q == pytest.approx(0.0, abs=1e-6) for _, _, q, _, _ in children)


def test_a_finished_game_counts_the_rules_margin():
    # Black has the only stone and white passed: black's pass ends the game, black 24.5
    # ahead (25 points, komi 0.5), white to move in the finished position: -4.9 a side.
    static = 0.3
    mcts = Mcts(1, GO, with_utility(PUCT, static), history=HISTORY, simulations=100)
    mcts.reset_game(0, [from_gtp("C3", N), A])
    mcts.search(hashed(values=False, spread=0.0))
    t = mcts.tree
    first, k = t.first_child[0, 0], t.n_children[0, 0]
    children = np.arange(first, first + k)
    node = children[t.move[0, children] == A][0]
    n = int(t.visits[0, node])
    u = static * 2 / np.pi * np.arctan(-4.9 / 2)
    assert n > 10
    assert t.raw_score[0, node] == pytest.approx(-4.9)
    # white's value -1 plus its term, seen from black, who moved into the node
    assert t.value_sum[0, node] == pytest.approx(n * (1 - u), rel=1e-5)
    assert t.score_sum[0, node] == pytest.approx(-n * u, rel=1e-5)


@pytest.mark.parametrize("cfg", [PUCT, GUMBEL], ids=["puct", "gumbel"])
def test_every_virtual_loss_is_taken_back_and_none_reaches_the_score(cfg):
    def scores_only(planes, legal):
        priors, _, _ = hashed()(planes, legal)
        return priors, np.zeros(len(planes), np.float32), np.ones(len(planes), np.float32)

    mcts = Mcts(1, GO, with_utility(cfg, 0.5), history=HISTORY, simulations=64,
                batch_size=16, leaf_batch=16, early_pass=False)
    mcts.search(scores_only)
    t = mcts.tree
    used = t.size[0]
    assert t.visits[0, 0] == 65
    # every leaf's term is +-0.5 * 2/pi * atan(1/2), so W is all score, no loss left over
    np.testing.assert_allclose(t.value_sum[0, :used], t.score_sum[0, :used], atol=1e-4)
    assert np.abs(t.score_sum[0, 0]) > 0


def test_an_evaluator_without_scores_counts_them_as_zero(caplog):
    cfg = with_utility(PUCT, 0.3, 0.3)
    with caplog.at_level(logging.WARNING, logger="training.search.mcts"):
        on = _play_a_few(cfg, hashed(scores=False))
    off = _play_a_few(PUCT, hashed(scores=False))
    for f in ("visits", "value_sum", "first_child"):
        np.testing.assert_array_equal(getattr(on.tree, f), getattr(off.tree, f), err_msg=f)
    assert sum("returns no scores" in r.getMessage() for r in caplog.records) == 1


# ------------------------------------------------------------------- the dynamic centre


def _parents(t, g: int) -> np.ndarray:
    parent = np.full(t.size[g], -1)
    for node in range(t.size[g]):
        first = t.first_child[g, node]
        if first >= 0:
            parent[first : first + t.n_children[g, node]] = node
    return parent


def _expected_score_sums(t, g: int, center: float, static: float, dynamic: float,
                         scale: float) -> np.ndarray:
    """W's score part of every node from its definition: each evaluated node's term, backed
    up along its path to the root with a sign flip per ply (every node here was evaluated
    once: no finished games, no full tree)."""
    size = t.size[g]
    parent = _parents(t, g)
    depth = np.ones(size, int)
    for node in range(1, size):
        depth[node] = depth[parent[node]] + 1
    out = np.zeros(size)
    for node in range(size):
        if t.visits[g, node] == 0:
            continue
        u = _score_term(float(t.raw_score[g, node]), depth[node], center, static, dynamic,
                        scale)
        sign, at = -1.0, node
        while at >= 0:
            out[at] += sign * u
            sign, at = -sign, parent[at]
    return out


def test_a_kept_subtree_is_rescored_to_its_new_root_centre():
    static, dynamic, scale = 0.1, 0.3, 0.75
    cfg = with_utility(PUCT, static, dynamic)
    evaluate = hashed()
    mcts = Mcts(1, GO, cfg, history=HISTORY, simulations=80, early_pass=False)
    mcts.search(evaluate)
    t = mcts.tree
    size = t.size[0]
    # the fresh tree: its centre is from its root's score, and W's score part is the sum of
    # the terms below each node (this checks the reference against the backups themselves)
    assert t.score_center[0] == pytest.approx(_score_center(float(t.raw_score[0, 0]), 0.2,
                                                            scale))
    np.testing.assert_allclose(
        t.score_sum[0, :size],
        _expected_score_sums(t, 0, float(t.score_center[0]), static, dynamic, scale),
        atol=1e-4)
    before = float(t.score_center[0])
    move = int(mcts.select_moves([0])[0])
    mcts.play(np.array([0]), np.array([move]))
    t = mcts.tree
    assert t.score_center[0] == pytest.approx(-before)  # the same centre, the other side's
    size = t.size[0]
    assert size > 20
    own = t.visits[0, :size].astype(int)
    for node in range(size):
        first = t.first_child[0, node]
        if first >= 0:
            own[node] -= t.visits[0, first : first + t.n_children[0, node]].sum()
    assert set(own[t.visits[0, :size] > 0]) == {1}  # one evaluation each, as assumed above
    pure = t.value_sum[0, :size] - t.score_sum[0, :size]
    raw = t.raw_value[0, :size].copy()
    mcts.start_search([0])  # the kept root's own score moves the centre
    t = mcts.tree
    center = _score_center(float(t.raw_score[0, 0]), 0.2, scale)
    assert abs(center + before) > 1e-3 and t.score_center[0] == pytest.approx(center)
    np.testing.assert_allclose(t.score_sum[0, :size],
                               _expected_score_sums(t, 0, center, static, dynamic, scale),
                               atol=1e-4)
    np.testing.assert_allclose(t.value_sum[0, :size] - t.score_sum[0, :size], pure, atol=1e-4)
    expanded = t.first_child[0, :size] >= 0
    assert not np.allclose(t.raw_value[0, :size][expanded], raw[expanded], atol=1e-4)
    # and back: the arrays return to what they were (up to float32 rounding)
    _rescore(t, 0, np.float32(-before), np.float32(static), np.float32(dynamic),
             np.float32(scale))
    np.testing.assert_allclose(t.raw_value[0, :size], raw, atol=1e-4)
    while mcts.is_searching():
        mcts.step([evaluate])
    assert mcts.root_visits([0])[0].sum() == t.visits[0, 0] - 1


def test_the_gtp_player_reads_the_utility_from_the_config(tiny_cfg, tmp_path):
    """The config's keys reach the player's search, and its evaluator returns scores."""
    import torch

    from training.learn.net import net_from_config, save_model
    from training.play.players import NetPlayer

    torch.manual_seed(0)
    cfg = dataclasses.replace(tiny_cfg, mcts=with_utility(tiny_cfg.mcts, 0.1, 0.3))
    path = tmp_path / "model_000001.pt"
    save_model(path, net_from_config(cfg.net, cfg.go.board_size), 1)
    player = NetPlayer(path, 16, cfg)
    mcts = player.player.mcts
    assert mcts.wants_score and mcts._score[1] == np.float32(0.3)
    planes = np.zeros((1, mcts._planes.shape[1], cfg.go.board_size, cfg.go.board_size),
                      np.float32)
    legal = np.ones((1, cfg.go.board_size ** 2 + 1), bool)
    assert len(player.player.evaluate(planes, legal)) == 3
