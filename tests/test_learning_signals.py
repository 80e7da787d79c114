"""The learning signal end to end: what self-play searched is what the trainer learns from.

Guards for the path a sign or alignment bug would break (found by auditing a run that
stopped learning): the planes the search evaluated for a position equal the planes the
replay window builds for it bit for bit; the value target is the result from the side to
move's view; the policy target is the visit distribution of the search at that very position;
a real net trained through `trainer.train_round` on games black always wins says so for black
to move and the reverse for white; and the search scores game-ending passes by the rules from
the right side's view.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from configs import override
from training.go import fastgo
from training.go.features import planes as reference_planes
from training.go.features import write_planes
from training.go.records import BatchMeta, batch_name, random_record, write_batch
from training.go.rules import Position
from training.learn.replay_buffer import ReplayWindow
from training.search.mcts import Mcts
from training.search.selfplay import SelfPlay


def _stand_in(planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Priors uniform over legal moves; value tanh of the stone difference (side to move)."""
    priors = legal.astype(np.float32)
    priors /= priors.sum(axis=1, keepdims=True)
    diff = planes[:, 0].sum(axis=(1, 2)) - planes[:, 1].sum(axis=(1, 2))
    return priors, np.tanh(0.5 * diff).astype(np.float32)


def _uniform(planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    priors = legal.astype(np.float32)
    priors /= priors.sum(axis=1, keepdims=True)
    return priors, np.zeros(len(priors), np.float32)


def _whole_window(cfg, replay_dir, augment: bool) -> ReplayWindow:
    big = override(cfg, {"replay.min_positions": 100_000, "replay.max_positions": 100_000,
                         "replay.validation_fraction": 0.0})
    return ReplayWindow(replay_dir, big.replay, cfg.net.history, cfg.go.board_size,
                        augment=augment)


def test_self_play_positions_reach_the_window_unchanged(tiny_cfg, run_dir):
    """Per position: search planes == window planes, z = result x side to move, pi = visits."""
    cfg = override(tiny_cfg, {"self_play.resign_threshold": -1.0})
    h, n = cfg.net.history, cfg.go.board_size
    selfplay = SelfPlay(_stand_in, cfg.go, cfg.mcts, cfg.self_play, history=h, seed=3)
    records = []
    while len(records) < 6:
        records += selfplay.step()
    (run_dir / "replay").mkdir()
    write_batch(run_dir / "replay" / batch_name("w1", 0, 0), records,
                BatchMeta.from_records("w1", records, max_moves=cfg.go.max_moves))
    window = _whole_window(cfg, run_dir / "replay", augment=False)
    assert len(window) == sum(r.num_moves for r in records)
    planes, policy, value = window.batch(np.arange(len(window)))
    i = 0
    passes = 0
    for record in records:
        boards = fastgo.new_boards(1, n, cfg.go.komi, cfg.go.move_cap, h)
        position = Position(n, cfg.go.komi, max_moves=cfg.go.move_cap)
        for t, move in enumerate(record.moves.tolist()):
            searched = np.zeros_like(planes[i])
            write_planes(boards, 0, h, searched)
            assert np.array_equal(planes[i], searched), f"planes differ at move {t}"
            assert np.array_equal(planes[i], reference_planes(position, h))
            side = 1 if t % 2 == 0 else -1
            assert position.to_play == side
            assert value[i] == record.result * side, f"value target at move {t}"
            target = record.visits[t].astype(np.float32)
            np.testing.assert_allclose(policy[i], target / target.sum(), rtol=1e-6)
            assert record.visits[t][move] > 0, "the move played was not searched at that move"
            passes += move == n * n
            assert fastgo.play(boards, 0, move)
            position.play(move)
            i += 1
    assert passes > 0  # passes (same board twice in the history planes) were covered


@pytest.mark.parametrize("seed", [0, 1])
def test_a_net_trained_on_games_black_always_wins_says_so(tiny_cfg, run_dir, seed):
    """records -> window -> trainer -> evaluator keep the value's sign (side to move's view)."""
    from training.learn.net import load_model, make_evaluator
    from training.train.train_state import write_initial_model
    from training.train.round import train_round

    torch.set_num_threads(1)
    # komi -30.5 on 5x5: black wins every game whatever is played
    cfg = override(tiny_cfg, {"go.komi": -30.5, "training.batch_size": 64,
                              "training.lr_reference_batch": 64, "run.seed": seed})
    rng = np.random.default_rng(seed)
    records = [random_record(5, -30.5, rng, max_moves=cfg.go.move_cap) for _ in range(40)]
    assert all(r.result == 1 for r in records)
    write_initial_model(cfg, run_dir)
    (run_dir / "replay").mkdir()
    write_batch(run_dir / "replay" / batch_name("w1", 0, 0), records,
                BatchMeta.from_records("w1", records, max_moves=cfg.go.max_moves))
    result = train_round(cfg, run_dir, steps=40, progress=False)
    net, _ = load_model(result.model_path)
    evaluate = make_evaluator(net, jit=False)
    window = _whole_window(cfg, run_dir / "replay", augment=False)
    planes, _, z = window.batch(np.arange(len(window)))
    _, v = evaluate(planes)
    black = planes[:, -1, 0, 0] == 1
    assert np.all(z[black] == 1) and np.all(z[~black] == -1)
    assert v[black].mean() > 0.5 and v[~black].mean() < -0.5, (v[black].mean(), v[~black].mean())


def _searched(cfg, moves: list[int], simulations: int = 64) -> tuple[np.ndarray, float]:
    mcts = Mcts(1, cfg.go, cfg.mcts, history=cfg.net.history, simulations=simulations,
                reuse_tree=False)
    mcts.reset_game(0, moves, komi=cfg.go.komi)
    visits = mcts.search(_uniform, [0])[0]
    return visits, float(mcts.root_values([0])[0])


PASS = 25  # 5x5


@pytest.mark.parametrize("moves, winner_to_move", [
    ([12, PASS], "black"),  # black alone on the board owns it all: passing wins
    ([12, 6, PASS], "white"),  # 1 stone each, no territory, komi 0.5: passing wins for white
    ([12, 6, 18, PASS], "black"),  # black 2, white 1, komi 0.5: passing wins by 0.5
])
def test_a_pass_that_ends_a_won_game_is_found(tiny_cfg, moves, winner_to_move):
    visits, value = _searched(tiny_cfg, moves)
    assert int(np.argmax(visits)) == PASS, f"{winner_to_move} to move should pass and win"
    assert value > 0.2  # the mean over the root's visits: pass is +1, the others ~0


def test_a_pass_that_ends_a_lost_game_is_avoided(tiny_cfg):
    # black passed, white 6, black 12, white 7, black 24, white passes: black to move with
    # 2 stones to 2 and komi 0.5 against: passing now loses, any other move does not (yet)
    visits, value = _searched(tiny_cfg, [PASS, 6, 12, 7, 24, PASS])
    assert visits[PASS] <= 1 and int(np.argmax(visits)) != PASS
    assert value > -0.5


def _loves_pass(planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A net whose prior is nearly all on pass and whose value says nothing."""
    priors = legal.astype(np.float32) * 0.001
    priors[:, -1] = 1.0
    priors /= priors.sum(axis=1, keepdims=True)
    return priors, np.zeros(len(priors), np.float32)


def _own_eye(board: np.ndarray, p: int, color: int, n: int) -> bool:
    r, c = divmod(p, n)
    nbrs = [(r + dr, c + dc) for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))]
    return all(board[a * n + b] == color for a, b in nbrs if 0 <= a < n and 0 <= b < n)


def test_self_play_never_passes_first_while_a_real_move_is_left(tiny_cfg):
    """The pass collapse: a pass-loving prior made every self-play game [PASS, PASS]."""
    n = tiny_cfg.go.board_size
    selfplay = SelfPlay(_loves_pass, tiny_cfg.go, tiny_cfg.mcts, tiny_cfg.self_play,
                        history=tiny_cfg.net.history, seed=5)
    records = []
    while len(records) < 8:
        records += selfplay.step()
    for record in records:
        position = Position(n, tiny_cfg.go.komi, max_moves=tiny_cfg.go.move_cap)
        for t, move in enumerate(record.moves.tolist()):
            passed = t > 0 and record.moves[t - 1] == n * n
            if move == n * n and not passed:
                board = np.asarray(position.board)
                real = [p for p in range(n * n) if board[p] == 0 and position.is_legal(p)
                        and not _own_eye(board, p, position.to_play, n)]
                assert not real, f"passed first at move {t} with {real} left"
            if move == n * n:
                assert record.visits[t][n * n] > 0
            position.play(move)
    assert np.mean([r.num_moves for r in records]) > 10


def test_the_arena_keeps_the_full_rules(tiny_cfg):
    from training.search.selfplay import play_match

    pairs = play_match(_loves_pass, _loves_pass, 2, tiny_cfg.go, tiny_cfg.mcts, seed=1,
                       history=tiny_cfg.net.history, opening_moves=0)
    assert all(r.moves.tolist() == [25, 25] for r, _ in pairs)
