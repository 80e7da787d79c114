"""Playout cap randomization (`mcts.full_search_fraction` < 1), end to end: self-play marks
its fast searches, the batch file carries the marks (older batches read as all full), the
replay window gives those moves no policy target, and the trainer's policy loss skips them."""

from __future__ import annotations

import io

import numpy as np
import pytest

from configs import override
from training.go.records import (
    BatchError,
    BatchMeta,
    batch_name,
    decode_batch,
    encode_batch,
    load_batch,
    write_batch,
)
from training.learn.replay_buffer import ReplayWindow
from training.search.selfplay import SelfPlay
from tests.test_mcts import Counting, hashed, uniform

FULL_SIMS, FAST_SIMS = 8, 2


def pcr_cfg(tiny_cfg, algorithm: str = "puct", fraction: float = 0.25):
    return override(tiny_cfg, {
        "mcts.algorithm": algorithm, "mcts.simulations": FULL_SIMS,
        "mcts.full_search_fraction": fraction, "mcts.fast_simulations": FAST_SIMS,
        "mcts.reuse_tree": False,  # each search's visits are its own: sums tell its kind
        "self_play.resign_threshold": -1.0,
    })


def pcr_games(cfg, n_games: int, seed: int = 0, evaluate=uniform):
    sp = SelfPlay(evaluate, cfg.go, cfg.mcts, cfg.self_play, history=cfg.net.history,
                  seed=seed)
    return sp, sp.play(max_games=n_games)


@pytest.mark.parametrize("algorithm", ["puct", "gumbel"])
def test_the_share_of_full_searches_is_the_configured_fraction(tiny_cfg, algorithm):
    cfg = pcr_cfg(tiny_cfg, algorithm)
    sp, records = pcr_games(cfg, 30)
    full = np.concatenate([r.full_search for r in records])
    assert full.dtype == np.bool_ and len(full) > 800
    # binomial: sd = sqrt(.25 * .75 / 800) ~ 0.015
    assert abs(full.mean() - 0.25) < 0.05
    assert sp.full_searches >= full.sum()  # games still in progress count too
    if algorithm == "puct":  # without tree reuse a search's visits are its simulations
        visits = np.concatenate([r.visits for r in records]).sum(axis=1)
        assert (visits[full] == FULL_SIMS).all() and (visits[~full] == FAST_SIMS).all()


def test_every_move_is_a_full_search_by_default(tiny_cfg):
    _, records = pcr_games(override(tiny_cfg, {"self_play.resign_threshold": -1.0}), 4)
    assert all(r.full_search.all() for r in records)


def test_searches_of_both_lengths_keep_every_game_in_each_network_call(tiny_cfg):
    cfg = pcr_cfg(tiny_cfg)
    evaluate = Counting(uniform)
    sp = SelfPlay(evaluate, cfg.go, cfg.mcts, cfg.self_play, history=cfg.net.history)
    for _ in range(20):
        sp.step()
    games = cfg.self_play.parallel_games
    # a game whose (fast) search ends plays and searches on, so no call waits for the rest
    # (only leaves that end the game skip the network)
    assert np.mean(evaluate.batches) > 0.9 * games
    assert sp.moves_played >= 20 * games


def test_a_game_depends_only_on_its_seed_with_playout_caps(tiny_cfg):
    cfg = pcr_cfg(tiny_cfg, "gumbel")
    wide = override(cfg, {"self_play.parallel_games": 4, "self_play.batch_size": 3})
    narrow = override(cfg, {"self_play.parallel_games": 1, "self_play.batch_size": 1})
    _, a = pcr_games(wide, 8, seed=4, evaluate=hashed)
    _, b = pcr_games(narrow, 3, seed=4, evaluate=hashed)
    by_seed = {r.seed: r for r in a}
    common = [r for r in b if r.seed in by_seed]
    assert len(common) >= 2
    for r in common:
        np.testing.assert_array_equal(r.moves, by_seed[r.seed].moves)
        np.testing.assert_array_equal(r.visits, by_seed[r.seed].visits)
        np.testing.assert_array_equal(r.full_search, by_seed[r.seed].full_search)


# ------------------------------------------------------------------ batch files


def write_games(folder, records, seq: int = 0):
    meta = BatchMeta.from_records("w1", records)
    path = folder / batch_name("w1", meta.generation, seq)
    write_batch(path, records, meta)
    return path


def test_the_flags_round_trip_through_a_batch_file(tiny_cfg, run_dir):
    _, records = pcr_games(pcr_cfg(tiny_cfg), 4)
    back = load_batch(write_games(run_dir, records)).records
    for a, b in zip(records, back):
        assert b.full_search.dtype == np.bool_
        np.testing.assert_array_equal(a.full_search, b.full_search)


def npz_without(raw: bytes, drop: str, **replace) -> bytes:
    with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != drop}
    arrays.update(replace)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_a_batch_without_flags_reads_as_all_full_and_bad_flags_are_refused(tiny_cfg):
    from distributed.transfer import compress_bytes

    _, records = pcr_games(pcr_cfg(tiny_cfg), 3)
    raw = encode_batch(records, BatchMeta.from_records("w1", records))
    older = decode_batch(compress_bytes(npz_without(raw, "full_search")))
    assert all(r.full_search.all() and len(r.full_search) == r.num_moves
               for r in older.records)
    moves = sum(r.num_moves for r in records)
    as_int = npz_without(raw, "", full_search=np.ones(moves, np.int8))
    with pytest.raises(BatchError, match="full_search has dtype int8"):
        decode_batch(compress_bytes(as_int))
    short = npz_without(raw, "", full_search=np.ones(moves - 1, np.bool_))
    with pytest.raises(BatchError, match="full_search has shape"):
        decode_batch(compress_bytes(short))


# ------------------------------------------------------------------ training data


def test_fast_search_moves_have_no_policy_target_in_the_window(tiny_cfg, run_dir):
    cfg = override(pcr_cfg(tiny_cfg), {
        "replay.validation_fraction": 0.0, "replay.min_positions": 10**6,
        "replay.max_positions": 10**6,
    })
    _, records = pcr_games(cfg, 6)
    replay = run_dir / "replay"
    replay.mkdir()
    write_games(replay, records)
    window = ReplayWindow(replay, cfg.replay, cfg.net.history, augment=False)
    full = np.concatenate([r.full_search for r in records])
    assert len(window) == len(full)  # every game, in order
    s = window.samples(np.arange(len(window)))
    sums = s["policy"].sum(axis=1)
    np.testing.assert_allclose(sums[full], 1.0, rtol=1e-5)
    assert (sums[~full] == 0).all()
    # the opponent's reply teaches its policy only where the reply was a full search
    nxt = np.append(full[1:], False)
    assert (s["opponent_policy_mask"][~nxt] == 0).all()
    assert np.isfinite(s["value"]).all() and (np.abs(s["value"]) <= 1).all()


def test_the_policy_loss_skips_rows_without_a_target(tiny_cfg):
    torch = pytest.importorskip("torch")
    from training.learn.net import net_from_config
    from training.train.steps import losses as _losses

    torch.manual_seed(0)
    net = net_from_config(tiny_cfg.net, tiny_cfg.go.board_size).eval()  # no batch statistics
    rng = np.random.default_rng(0)
    n, c = tiny_cfg.go.board_size, 2 * tiny_cfg.net.history + 1
    planes = torch.from_numpy((rng.random((8, c, n, n)) < 0.3).astype(np.float32))
    policy = torch.from_numpy(rng.dirichlet(np.ones(n * n + 1), size=8).astype(np.float32))
    value = torch.zeros(8)
    masked = policy.clone()
    masked[4:] = 0.0  # rows 4..7: fast searches
    _, v_all, _, _ = _losses(net, {"planes": planes, "policy": policy, "value": value},
                             None, "cpu")
    p_half, v_half, correct, _ = _losses(
        net, {"planes": planes, "policy": masked, "value": value}, None, "cpu")
    p_first, v_first, correct_first, _ = _losses(
        net, {"planes": planes[:4], "policy": policy[:4], "value": value[:4]}, None, "cpu")
    # the mean over the rows with a target (a mean over all rows would halve it)
    assert p_half.item() == pytest.approx(p_first.item(), rel=1e-5)
    assert v_half.item() == v_all.item()  # every row trains the value
    # accuracy: the same share of correct rows over the rows that have a target
    assert correct.item() / 8 == pytest.approx(correct_first.item() / 4)
