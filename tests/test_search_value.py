"""The value target mixed with the search's root value (`replay.search_value_weight`): the
training samples' value is (1 - w) * the game's result + w * the root value self-play
recorded at that position; validation keeps the result, and a sidecar written before it
kept the root values reads as no value (the result alone)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from training.learn.replay_buffer import ReplayWindow
from training.learn.sidecars import sidecar_dir
from tests.test_mcts import hashed
from tests.test_playout_cap import pcr_cfg, pcr_games, write_games


def _window(cfg, replay, weight: float, validation: float = 0.0) -> ReplayWindow:
    replay_cfg = dataclasses.replace(cfg.replay, search_value_weight=weight,
                                     validation_fraction=validation,
                                     min_positions=10**6, max_positions=10**6)
    return ReplayWindow(replay, replay_cfg, cfg.net.history, augment=False)


def _values(window) -> np.ndarray:
    return window.batch(np.arange(len(window)))[2]


@pytest.fixture
def replay(tiny_cfg, run_dir):
    _, records = pcr_games(pcr_cfg(tiny_cfg, "gumbel"), 6, evaluate=hashed)
    folder = run_dir / "replay"
    folder.mkdir()
    write_games(folder, records)
    return folder, records


def test_the_value_target_mixes_the_result_with_the_root_value(tiny_cfg, replay):
    folder, records = replay
    result = _values(_window(tiny_cfg, folder, 0.0))
    assert set(np.unique(result)) <= {-1.0, 0.0, 1.0}
    searched = _values(_window(tiny_cfg, folder, 1.0))
    recorded = np.concatenate([r.values for r in records]).astype(np.float32)
    # every position's target is its own root value (the same values, position for position)
    np.testing.assert_array_equal(np.sort(searched), np.sort(recorded))
    assert not np.array_equal(searched, result)
    half = _values(_window(tiny_cfg, folder, 0.5))
    np.testing.assert_allclose(half, 0.5 * result + 0.5 * searched, atol=1e-6)
    # the samples' dict, what the trainer fetches, carries the same target
    window = _window(tiny_cfg, folder, 0.5)
    np.testing.assert_allclose(window.samples(np.arange(len(window)))["value"], half)


def test_validation_keeps_the_result(tiny_cfg, replay):
    folder, _ = replay
    window = _window(tiny_cfg, folder, 1.0, validation=0.5)
    assert len(window.validation) > 0 and len(window) > 0
    held_out = _values(window.validation)
    assert set(np.unique(held_out)) <= {-1.0, 0.0, 1.0}
    assert not set(np.unique(_values(window))) <= {-1.0, 0.0, 1.0}


def test_a_sidecar_without_root_values_trains_on_the_result(tiny_cfg, replay):
    folder, _ = replay
    result = _values(_window(tiny_cfg, folder, 0.0))
    removed = list(sidecar_dir(folder).glob("*/values.npy"))
    assert removed  # the sidecar was built with them
    for path in removed:
        path.unlink()
    np.testing.assert_array_equal(_values(_window(tiny_cfg, folder, 1.0)), result)
