"""Policy surprise weighting (KataGo), end to end: self-play measures how much each full
search's policy target surprised the net, the batch file carries it (older batches read as no
surprise, forged values are refused), and the replay window samples surprising positions more
often (`replay.policy_surprise_weight`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from configs import override
from distributed.transfer import compress_bytes
from training.go.records import BatchError, BatchMeta, decode_batch, encode_batch, load_batch
from training.learn.replay_buffer import ReplayWindow
from training.search.selfplay import policy_surprise
from tests.test_mcts import hashed
from tests.test_playout_cap import npz_without, pcr_cfg, pcr_games, write_games


def test_surprise_is_the_kl_of_the_target_from_the_prior():
    targets = np.array([[1, 0, 0], [1, 1, 0], [2, 2, 0]], np.float32)
    priors = np.array([[0.5, 0.5, 0], [0.5, 0.5, 0], [0.25, 0.25, 0.5]], np.float32)
    np.testing.assert_allclose(policy_surprise(targets, priors),
                               [math.log(2), 0.0, math.log(2)], rtol=1e-6)
    # a target on a move the prior gave nothing is bounded, not infinite
    assert 20 < policy_surprise(np.array([[0, 1.0]]), np.array([[1.0, 0]]))[0] < 21


@pytest.mark.parametrize("algorithm", ["puct", "gumbel"])
def test_self_play_records_the_surprise_of_full_searches(tiny_cfg, algorithm):
    _, records = pcr_games(pcr_cfg(tiny_cfg, algorithm), 6, evaluate=hashed)
    for r in records:
        assert r.surprise.dtype == np.float16 and len(r.surprise) == r.num_moves
        assert (r.surprise[~r.full_search] == 0).all()
        assert (r.surprise >= 0).all() and np.isfinite(r.surprise).all()
    full = np.concatenate([r.surprise[r.full_search] for r in records])
    assert (full > 0).mean() > 0.5  # a search moves its target away from the prior


def test_the_surprise_travels_in_the_batch_and_forged_values_are_refused(tiny_cfg, run_dir):
    _, records = pcr_games(pcr_cfg(tiny_cfg, "gumbel"), 4, evaluate=hashed)
    back = load_batch(write_games(run_dir, records)).records
    for a, b in zip(records, back):
        np.testing.assert_array_equal(a.surprise, b.surprise)
    raw = encode_batch(records, BatchMeta.from_records("w1", records))
    older = decode_batch(compress_bytes(npz_without(raw, "surprise")))
    assert all((r.surprise == 0).all() and len(r.surprise) == r.num_moves
               for r in older.records)
    moves = sum(r.num_moves for r in records)
    full = np.concatenate([r.full_search for r in records])
    for bad, what in ((np.full(moves, np.nan, np.float16), "not finite"),
                      (np.full(moves, -1, np.float16), "outside"),
                      (np.full(moves, 99, np.float16), "outside"),
                      (np.where(full, 0, 1).astype(np.float16), "fast search carries")):
        with pytest.raises(BatchError, match=what):
            decode_batch(compress_bytes(npz_without(raw, "", surprise=bad)))


def _window(cfg, replay, weight: float, fast: float = 1.0) -> ReplayWindow:
    replay_cfg = dataclasses.replace(cfg.replay, policy_surprise_weight=weight,
                                     fast_search_weight=fast, validation_fraction=0.0,
                                     min_positions=10**6, max_positions=10**6)
    return ReplayWindow(replay, replay_cfg, cfg.net.history, augment=False)


def test_the_window_samples_surprising_positions_more_often(tiny_cfg, run_dir):
    cfg = override(pcr_cfg(tiny_cfg, "gumbel", fraction=1.0), {"self_play.parallel_games": 4})
    _, records = pcr_games(cfg, 8, evaluate=hashed)
    replay = run_dir / "replay"
    replay.mkdir()
    write_games(replay, records)
    plain = _window(cfg, replay, 0.0)
    positions = sum(r.num_moves for r in records)
    assert len(plain) == plain.num_positions == positions  # off: each position once
    weighted = _window(cfg, replay, 0.5)
    assert weighted.num_positions == positions
    assert abs(len(weighted) - positions) < 0.1 * positions  # the count is kept on average
    # how often each position is sampled, against its surprise
    surprise = np.concatenate([r.surprise for r in records]).astype(np.float64)
    counts = np.bincount(weighted._rows, minlength=positions)
    top = surprise >= np.quantile(surprise, 0.9)
    low = surprise <= np.quantile(surprise, 0.5)
    assert counts[top].mean() > 1.5 * counts[low].mean()
    # a sample is the position it maps to, planes and targets alike
    i = int(np.flatnonzero(weighted._rows == int(np.argmax(surprise)))[0])
    np.testing.assert_array_equal(weighted.batch([i])[1], plain.batch([int(np.argmax(
        surprise))])[1])
    # the same rows on every rank (built again from the same files)
    np.testing.assert_array_equal(_window(cfg, replay, 0.5)._rows, weighted._rows)
    stats = weighted.stats()
    assert stats.train_positions == positions


def test_policy_surprise_weight_is_a_checked_config_key(tiny_cfg):
    from configs import ConfigError

    assert override(tiny_cfg, {"replay.policy_surprise_weight": 0.5}).replay \
        .policy_surprise_weight == 0.5
    with pytest.raises(ConfigError, match="policy_surprise_weight"):
        override(tiny_cfg, {"replay.policy_surprise_weight": 1.5})



def test_a_sidecar_from_before_the_surprise_reads_as_none(tiny_cfg, run_dir):
    """Run folders made before the surprise array keep their sidecars: no rebuild, and the
    weighting leaves their positions once each."""
    from training.learn.replay_buffer import sidecar_dir

    cfg = pcr_cfg(tiny_cfg, "gumbel", fraction=1.0)
    _, records = pcr_games(cfg, 3, evaluate=hashed)
    replay = run_dir / "replay"
    replay.mkdir()
    write_games(replay, records)
    _window(cfg, replay, 0.0)  # builds the sidecar
    (npy,) = sidecar_dir(replay).glob("*/surprise.npy")
    npy.unlink()
    older = _window(cfg, replay, 0.5)
    assert len(older) == older.num_positions == sum(r.num_moves for r in records)
    assert not npy.exists()  # read as zeros, not rebuilt


@pytest.mark.parametrize("fast", [0.0, 0.5])
def test_fast_search_positions_are_sampled_at_their_weight(tiny_cfg, run_dir, fast):
    """`replay.fast_search_weight`: 0 samples only full searches (KataGo writes no row for a
    fast search), 0.5 about half of the fast ones, each once."""
    _, records = pcr_games(pcr_cfg(tiny_cfg, "gumbel"), 6, evaluate=hashed)
    replay = run_dir / "replay"
    replay.mkdir()
    write_games(replay, records)
    window = _window(pcr_cfg(tiny_cfg, "gumbel"), replay, 0.0, fast)
    full = np.concatenate([r.full_search for r in records])
    counts = np.bincount(window._rows, minlength=len(full))
    assert (counts[full] == 1).all() and (counts[~full] <= 1).all()
    assert abs(counts[~full].mean() - fast) < 0.1
    policy = window.batch(np.arange(len(window)))[1]
    assert (policy.sum(axis=1) > 0).mean() == pytest.approx(full.sum() / len(window))
