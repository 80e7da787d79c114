"""The net in bfloat16 and float16 for self-play (`net.inference_dtype`) against float32.

A randomly initialised net gives nearly uniform priors, on which any two evaluators agree on
nothing that matters; this net's BatchNorm scales are raised until its priors are as peaked
as a trained net's (the mean top prior is about 0.55), and it reads positions of random games
with the default config's features (9x9, history 8, liberty planes).

Stated tolerances, on 64 such positions (measured on the CPU: bf16 0.012 and 0.017, fp16
0.002 and 0.004):
- bfloat16 (8 bits of mantissa): every prior within 0.03 of float32's, every value within
  0.05, the top move the same on at least 95% of the positions;
- float16: priors within 0.01, values within 0.01, the top move the same on 95%.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from configs import ConfigError, load_config
from training.go.features import planes as position_planes
from training.go.rules import Position
from training.learn.net import inference_dtype, make_evaluator, net_from_config

TOLERANCES = {"bfloat16": (0.03, 0.05), "float16": (0.01, 0.01)}
TOP_MOVE_AGREEMENT = 0.95


@pytest.fixture(scope="module")
def default_cfg():
    return load_config(None)


@pytest.fixture(scope="module")
def peaked_net(default_cfg):
    torch.manual_seed(0)
    net = net_from_config(default_cfg.net, default_cfg.go.board_size)
    net.train()
    with torch.no_grad():
        for _ in range(3):  # BatchNorm statistics of real activations
            net(torch.randn(8, net.in_planes, net.board_size, net.board_size))
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.mul_(2.5)
    return net.eval()


@pytest.fixture(scope="module")
def positions(default_cfg):
    rng = np.random.default_rng(0)
    n = default_cfg.go.board_size
    planes, legal = [], []
    for _ in range(64):
        pos = Position(n, komi=default_cfg.go.komi)
        for _ in range(int(rng.integers(0, 50))):
            moves = [m for m in pos.legal_moves() if m != n * n] or [n * n]
            pos.play(int(rng.choice(moves)))
        planes.append(position_planes(pos, default_cfg.net.history, default_cfg.net.liberties))
        mask = np.zeros(n * n + 1, bool)
        mask[pos.legal_moves()] = True
        legal.append(mask)
    return np.stack(planes), np.stack(legal)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("jit", ["trace", "eager"])
def test_half_precision_agrees_with_float32(peaked_net, positions, dtype, jit):
    planes, legal = positions
    p32, v32 = make_evaluator(peaked_net, jit="eager")(planes, legal)
    assert p32.max(axis=1).mean() > 0.4, "the net must be peaked for the test to mean much"
    half = make_evaluator(peaked_net, jit=jit, dtype=dtype)
    assert half.dtype == getattr(torch, dtype) and half.mode == jit
    p, v = half(planes, legal)
    assert p.dtype == np.float32 and v.dtype == np.float32
    prior_tol, value_tol = TOLERANCES[dtype]
    assert np.abs(p - p32).max() <= prior_tol
    assert np.abs(v - v32).max() <= value_tol
    assert (p.argmax(axis=1) == p32.argmax(axis=1)).mean() >= TOP_MOVE_AGREEMENT
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-5)  # the softmax is float32
    assert not p[~legal].any()


def test_float16_is_closer_than_bfloat16(peaked_net, positions):
    """More mantissa bits, smaller differences: the comparison measures precision."""
    planes, legal = positions
    p32, _ = make_evaluator(peaked_net, jit="trace")(planes, legal)
    errors = {d: np.abs(make_evaluator(peaked_net, jit="trace", dtype=d)(planes, legal)[0]
                        - p32).max() for d in ("bfloat16", "float16")}
    assert 0 < errors["float16"] < errors["bfloat16"]


def test_auto_is_float32_on_the_cpu_and_onnx_keeps_its_form(peaked_net, positions):
    assert inference_dtype("auto", "cpu") == torch.float32
    assert inference_dtype(None) == torch.float32
    evaluate = make_evaluator(peaked_net, jit="onnx", dtype="auto")
    assert evaluate.dtype == torch.float32 and evaluate.mode == "onnx"
    # ONNX Runtime runs float32 only: a half-precision evaluator on the CPU uses the trace
    assert make_evaluator(peaked_net, jit="onnx", dtype="bfloat16").mode == "trace"


def test_load_weights_keeps_the_dtype(peaked_net, positions, default_cfg):
    planes, legal = positions
    evaluate = make_evaluator(net_from_config(default_cfg.net, 9).eval(), jit="trace",
                              dtype="bfloat16")
    evaluate.load_weights(peaked_net)
    p, _ = evaluate(planes, legal)
    p_ref, _ = make_evaluator(peaked_net, jit="trace", dtype="bfloat16")(planes, legal)
    np.testing.assert_allclose(p, p_ref, atol=1e-6)


def test_an_unknown_dtype_is_refused(peaked_net, tmp_path):
    with pytest.raises(ValueError, match="inference dtype must be one of"):
        make_evaluator(peaked_net, jit="eager", dtype="int8")
    path = tmp_path / "config.yaml"
    path.write_text("net:\n  inference_dtype: half\n")
    with pytest.raises(ConfigError, match="inference_dtype"):
        load_config(path)
