"""training.ema_decay: the published model is an average of the weights over the steps."""

from __future__ import annotations

import pytest
import torch

from configs import ConfigError, override
from training.learn.net import load_model, net_from_config, net_from_payload
from training.learn.samples import config_samples
from training.run.run_dir import RunDir
from training.train.round import train_round
from training.train.steps import ema_decay_at
from training.train.train_state import load_checkpoint, seed_everything

DECAY = 0.5


@pytest.fixture
def samples(tiny_cfg):
    data = config_samples(tiny_cfg, 512, seed=0)
    data.validation = config_samples(tiny_cfg, 64, seed=1)  # validated: the average is
    return data


def _published(run_dir, generation: int) -> dict[str, torch.Tensor]:
    return load_model(RunDir(run_dir).model(generation))[0].state_dict()


def _trained(run_dir, generation: int) -> dict[str, torch.Tensor]:
    ckpt = load_checkpoint(RunDir(run_dir).checkpoint(generation))
    return net_from_payload(ckpt["model"], "checkpoint").state_dict()


def _mix(a: dict, b: dict, name: str, step: int) -> torch.Tensor:
    """The average after global step `step`: `a` the average before, `b` the weights after."""
    decay = ema_decay_at(DECAY, step)
    return decay * a[name] + (1 - decay) * b[name]


def test_the_model_is_the_average_carried_from_round_to_round(tiny_cfg, run_dir, samples):
    cfg = override(tiny_cfg, {"training.ema_decay": DECAY})
    seed_everything(cfg.run.seed)  # the fresh net a first round starts from
    start = net_from_config(cfg.net, cfg.go.board_size).state_dict()
    train_round(cfg, run_dir, dataset=samples, steps=1, progress=False)
    train_round(cfg, run_dir, dataset=samples, steps=1, progress=False)
    w1, w2 = _trained(run_dir, 1), _trained(run_dir, 2)
    m1, m2 = _published(run_dir, 1), _published(run_dir, 2)
    params = [n for n, _ in net_from_config(cfg.net, cfg.go.board_size).named_parameters()]
    assert params and not all(torch.equal(w1[n], m1[n]) for n in params)
    for name in params:
        torch.testing.assert_close(m1[name], _mix(start, w1, name, step=1))
        # the second round goes on from the saved average, not from the trained weights
        torch.testing.assert_close(m2[name], _mix(m1, w2, name, step=2))
    for name in set(w2) - set(params):  # batch norm statistics: copied as they are
        assert torch.equal(m2[name], w2[name]), name


def test_without_it_the_model_is_the_trained_weights(tiny_cfg, run_dir, samples):
    train_round(tiny_cfg, run_dir, dataset=samples, steps=2, progress=False)
    trained, published = _trained(run_dir, 1), _published(run_dir, 1)
    assert all(torch.equal(trained[n], published[n]) for n in trained)
    assert load_checkpoint(RunDir(run_dir).checkpoint(1))["ema"] is None


def test_a_run_that_turns_it_on_starts_the_average_at_its_weights(tiny_cfg, run_dir, samples):
    train_round(tiny_cfg, run_dir, dataset=samples, steps=1, progress=False)
    cfg = override(tiny_cfg, {"training.ema_decay": DECAY})
    train_round(cfg, run_dir, dataset=samples, steps=1, progress=False)
    w1, w2, m2 = _trained(run_dir, 1), _trained(run_dir, 2), _published(run_dir, 2)
    for name, _ in net_from_config(cfg.net, cfg.go.board_size).named_parameters():
        torch.testing.assert_close(m2[name], _mix(w1, w2, name, step=2))


def test_the_decay_grows_from_the_first_step_to_the_configured_one():
    decays = [ema_decay_at(0.99, step) for step in range(1, 3000)]
    assert decays[0] == pytest.approx(2 / 11)  # the first step: mostly the new weights
    assert all(a <= b for a, b in zip(decays, decays[1:]))
    assert decays[500] < 0.99 and decays[-1] == 0.99  # (1 + t) / (10 + t) reaches 0.99 at t = 890
    assert ema_decay_at(0.5, 10**6) == 0.5 and ema_decay_at(0.0, 5) == 0.0


@pytest.mark.parametrize("value", [1.0, -0.1])
def test_a_decay_outside_zero_to_one_is_refused_by_name(tiny_cfg, value):
    with pytest.raises(ConfigError, match="ema_decay"):
        override(tiny_cfg, {"training.ema_decay": value})
