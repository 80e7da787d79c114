"""PolicyValueNet shapes, masking, model files and the evaluator (real CPU nets)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from training.go.features import NUM_SYMMETRIES, transform_planes, transform_policy
from training.learn.net import (
    ModelError,
    PolicyValueNet,
    load_model,
    make_evaluator,
    net_from_config,
    model_payload,
    plain_state_dict,
    save_model,
)
from training.learn.replay_buffer import symmetry_permutations
from training.learn.resnet import global_pool


def _random_planes(net: PolicyValueNet, batch: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = net.board_size
    planes = (rng.random((batch, net.in_planes, n, n)) < 0.3).astype(np.float32)
    planes[:, -1] = rng.integers(0, 2, (batch, 1, 1))  # black-to-move plane: all ones or zeros
    return planes


def _trained_a_little(net: PolicyValueNet) -> PolicyValueNet:
    """Move BatchNorm statistics away from their defaults so save/load really has to copy."""
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(8, net.in_planes, net.board_size, net.board_size))
    return net.eval()


@pytest.fixture
def tiny_net(tiny_cfg) -> PolicyValueNet:
    torch.manual_seed(0)
    return _trained_a_little(net_from_config(tiny_cfg.net, tiny_cfg.go.board_size))


def test_output_shapes_and_value_range(tiny_net):
    n = tiny_net.board_size
    x = torch.from_numpy(_random_planes(tiny_net, 7))
    logits, value = tiny_net(x)
    assert tiny_net.in_planes == 2 * tiny_net.history + 1
    assert logits.shape == (7, n * n + 1)
    assert value.shape == (7,)
    assert torch.all(value.abs() <= 1.0)


def test_net_from_config_follows_the_net_section(tiny_cfg):
    net = net_from_config(tiny_cfg.net, 7)
    assert net.config == {
        "board_size": 7,
        "blocks": tiny_cfg.net.blocks,
        "filters": tiny_cfg.net.filters,
        "history": tiny_cfg.net.history,
        "value_hidden": tiny_cfg.net.value_hidden,
        "global_pooling": tiny_cfg.net.global_pooling,
        "ownership_head": tiny_cfg.net.ownership_head,
        "score_head": tiny_cfg.net.score_head,
        "opponent_policy_head": tiny_cfg.net.opponent_policy_head,
    }
    assert len(net.tower) == tiny_cfg.net.blocks


def test_priors_are_zero_on_illegal_moves_and_sum_to_one(tiny_net):
    evaluate = make_evaluator(tiny_net, jit=False)
    planes = _random_planes(tiny_net, 5)
    rng = np.random.default_rng(1)
    legal = rng.random((5, tiny_net.num_moves)) < 0.4
    legal[:, -1] = True  # pass is always legal
    priors, values = evaluate(planes, legal)
    assert priors.dtype == np.float32 and values.dtype == np.float32
    assert np.all(priors[~legal] == 0.0)
    assert np.all(priors[legal] > 0.0)
    np.testing.assert_allclose(priors.sum(axis=1), 1.0, atol=1e-5)
    assert np.all(np.abs(values) <= 1.0)


def test_without_legal_mask_priors_cover_every_move(tiny_net):
    priors, _ = make_evaluator(tiny_net, jit=False)(_random_planes(tiny_net, 3))
    np.testing.assert_allclose(priors.sum(axis=1), 1.0, atol=1e-5)
    assert np.all(priors > 0)


def test_an_unknown_inference_form_is_refused(tiny_net):
    with pytest.raises(ValueError, match="jit mode must be one of eager, trace"):
        make_evaluator(tiny_net, jit="tensorrt")


def test_evaluator_rejects_planes_of_the_wrong_shape(tiny_net):
    evaluate = make_evaluator(tiny_net, jit=False)
    with pytest.raises(ValueError, match=r"planes must be \[B, 5, 5, 5\]"):
        evaluate(np.zeros((2, 3, 5, 5), np.float32))


@pytest.mark.parametrize("form", ["trace", "onnx", "openvino"])
def test_each_inference_form_matches_eager_on_every_batch_size(tiny_net, form):
    """TorchScript, and ONNX Runtime and OpenVINO from the ONNX export (any batch size)."""
    eager = make_evaluator(tiny_net, jit=False)
    traced = make_evaluator(tiny_net, jit=form)
    assert traced.mode == form
    for batch in (1, 3, 16):
        planes = _random_planes(tiny_net, batch, seed=batch)
        legal = np.ones((batch, tiny_net.num_moves), bool)
        legal[:, ::3] = False
        p0, v0 = eager(planes, legal)
        p1, v1 = traced(planes, legal)
        np.testing.assert_allclose(p1, p0, atol=1e-5)
        np.testing.assert_allclose(v1, v0, atol=1e-5)


def test_max_batch_splits_calls_without_changing_results(tiny_net):
    planes = _random_planes(tiny_net, 10)
    p0, v0 = make_evaluator(tiny_net, jit=False)(planes)
    p1, v1 = make_evaluator(tiny_net, jit=False, max_batch=3)(planes)
    np.testing.assert_allclose(p1, p0, atol=1e-6)
    np.testing.assert_allclose(v1, v0, atol=1e-6)


@pytest.mark.parametrize("jit", [False, "trace"])
def test_compact_planes_give_the_same_priors_and_values(tiny_net, jit):
    """uint8 0/1 planes (the search's compact form) are widened inside the evaluator."""
    evaluate = make_evaluator(tiny_net, jit=jit)
    planes = _random_planes(tiny_net, 7, seed=3)
    legal = np.ones((7, tiny_net.num_moves), bool)
    legal[:, ::4] = False
    p0, v0 = evaluate(planes, legal)
    p1, v1 = evaluate(planes.astype(np.uint8), legal)
    np.testing.assert_array_equal(p1, p0)
    np.testing.assert_array_equal(v1, v0)


def test_evaluator_is_a_snapshot_of_the_net(tiny_net):
    planes = _random_planes(tiny_net, 2)
    evaluate = make_evaluator(tiny_net, jit=False)
    before = evaluate(planes)
    with torch.no_grad():
        for p in tiny_net.parameters():
            p.add_(1.0)
    after = evaluate(planes)
    np.testing.assert_array_equal(before[0], after[0])


@pytest.mark.parametrize("jit", [False, True, "onnx", "openvino"])
def test_load_weights_swaps_in_a_new_generation(tiny_net, tiny_cfg, jit):
    evaluate = make_evaluator(tiny_net, jit=jit)
    torch.manual_seed(1)
    newer = _trained_a_little(net_from_config(tiny_cfg.net, tiny_cfg.go.board_size))
    planes = _random_planes(tiny_net, 4)
    evaluate.load_weights(newer)
    p0, v0 = make_evaluator(newer, jit=False)(planes)
    p1, v1 = evaluate(planes)
    np.testing.assert_allclose(p1, p0, atol=1e-5)
    np.testing.assert_allclose(v1, v0, atol=1e-5)
    with pytest.raises(ValueError, match="same net config"):
        evaluate.load_weights(net_from_config(tiny_cfg.net, 7))


def test_save_then_load_gives_identical_outputs(tiny_net, tmp_path):
    path = tmp_path / "models" / "model_000003.pt"
    save_model(path, tiny_net, 3, meta={"games": 120})
    net, info = load_model(path)
    assert info.generation == 3 and info.meta == {"games": 120}
    assert info.config == tiny_net.config and info.board_size == tiny_net.board_size
    assert not net.training
    x = torch.from_numpy(_random_planes(tiny_net, 4))
    with torch.inference_mode():
        a, b = tiny_net(x), net(x)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)
    assert not list(path.parent.glob("*.tmp"))


def test_model_file_is_a_plain_state_dict_loadable_with_weights_only(tiny_net, tmp_path):
    path = tmp_path / "m.pt"
    save_model(path, tiny_net, 0)
    payload = torch.load(path, weights_only=True)
    assert set(payload) >= {"state_dict", "config", "generation"}
    assert payload["state_dict"].keys() == tiny_net.state_dict().keys()


def test_wrapper_prefixes_are_stripped(tiny_net, tmp_path):
    class Wrapper(torch.nn.Module):  # what DDP and torch.compile look like to state_dict()
        def __init__(self, inner):
            super().__init__()
            self.module = inner

    wrapped = Wrapper(tiny_net)
    assert all(k.startswith("module.") for k in wrapped.state_dict())
    assert plain_state_dict(wrapped).keys() == tiny_net.state_dict().keys()
    save_model(tmp_path / "w.pt", wrapped, 1)
    net, _ = load_model(tmp_path / "w.pt")
    assert net.state_dict().keys() == tiny_net.state_dict().keys()


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "cannot read this model file"),
        (b"not a torch file at all" * 10, "cannot read this model file"),
    ],
)
def test_damaged_model_file_raises_model_error_naming_it(tmp_path, content, expected):
    path = tmp_path / "model_000001.pt"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=expected) as err:
        load_model(path)
    assert str(path) in str(err.value)


def test_truncated_model_file_raises_model_error(tiny_net, tmp_path):
    path = tmp_path / "model_000001.pt"
    save_model(path, tiny_net, 1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="model_000001.pt"):
        load_model(path)


def test_file_with_pickled_objects_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"net": torch.nn.Linear(2, 2)}, path)  # a pickled module, not weights
    with pytest.raises(ModelError, match="other than tensors"):
        load_model(path)


def test_foreign_dict_is_not_a_model(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, path)
    with pytest.raises(ModelError, match="not a model file of this project"):
        load_model(path)


def test_missing_model_file_says_so(tmp_path):
    with pytest.raises(ModelError, match="no such model file"):
        load_model(tmp_path / "nope.pt")


@pytest.mark.slow
def test_compiled_evaluator_matches_eager_on_odd_batch_sizes(tiny_net):
    """torch.compile pads batches to powers of two; the padding must not leak into results."""
    eager = make_evaluator(tiny_net, jit=False)
    compiled = make_evaluator(tiny_net, jit="compile")
    assert compiled.mode == "compile"
    # the evaluator is built for batches of 8 and 1: 5 and 7 are padded with 3 rows and 1 row
    # into that graph (each compiled shape costs seconds to tens of seconds)
    for batch in (1, 5, 7):
        planes = _random_planes(tiny_net, batch, seed=batch)
        p0, v0 = eager(planes)
        p1, v1 = compiled(planes)
        np.testing.assert_allclose(p1, p0, atol=1e-5)
        np.testing.assert_allclose(v1, v0, atol=1e-5)
    # a new generation's weights go into the compiled graph without recompiling
    with torch.no_grad():
        for p in tiny_net.parameters():
            p.mul_(0.5)
    compiled.load_weights(tiny_net)
    planes = _random_planes(tiny_net, 5, seed=9)
    np.testing.assert_allclose(compiled(planes)[0], make_evaluator(tiny_net, jit=False)(planes)[0],
                               atol=1e-5)


# ------------------------------------------------------------------ auxiliary heads, pooling


def test_training_heads_have_their_shapes_and_leave_the_evaluator_outputs_alone(tiny_net):
    n = tiny_net.board_size
    x = torch.from_numpy(_random_planes(tiny_net, 3))
    with torch.no_grad():
        out = tiny_net(x, heads=True)
        logits, value = tiny_net(x)
    assert {k: tuple(t.shape) for k, t in out.items()} == {
        "policy": (3, n * n + 1), "value": (3,), "ownership": (3, n * n), "score": (3,),
        "opponent_policy": (3, n * n + 1),
    }
    torch.testing.assert_close(out["policy"], logits, rtol=0, atol=0)
    torch.testing.assert_close(out["value"], value, rtol=0, atol=0)


def test_global_pooling_is_mean_scaled_mean_and_max_and_ignores_symmetries():
    x = torch.zeros(1, 2, 9, 9)
    x[0, 0, 2, 3] = 8.1
    x[0, 1] = -1.0
    pooled = global_pool(x)
    torch.testing.assert_close(pooled, torch.tensor([[0.1, -1.0, -0.05, 0.5, 8.1, -1.0]]))
    y = torch.randn(4, 6, 7, 7)
    for s in range(NUM_SYMMETRIES):
        moved = torch.from_numpy(transform_planes(y.numpy(), s))
        torch.testing.assert_close(global_pool(moved), global_pool(y), rtol=1e-6, atol=1e-6)


def _symmetrised(net: PolicyValueNet) -> PolicyValueNet:
    """Average each 3x3 kernel over the 8 symmetries and the value head's weights over the
    points' images: every layer then commutes with the symmetries, so the whole net must too
    (global pooling and 1x1 convs need nothing)."""
    perms = symmetry_permutations(net.board_size)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3):
                w = m.weight.numpy()
                mean = np.mean([transform_planes(w, s) for s in range(NUM_SYMMETRIES)], axis=0)
                m.weight.copy_(torch.from_numpy(mean))
        w = net.value_fc1.weight.numpy()
        net.value_fc1.weight.copy_(torch.from_numpy(np.mean([w[:, p] for p in perms], axis=0)))
    return net


def _symmetry_errors(net: PolicyValueNet, x: np.ndarray) -> dict[str, float]:
    """The largest deviation from equivariance (policies, ownership) or invariance (value,
    score) of each head over the 8 symmetries."""
    n = net.board_size
    with torch.no_grad():
        base = net(torch.from_numpy(x), heads=True)
        worst = dict.fromkeys(base, 0.0)
        for s in range(NUM_SYMMETRIES):
            out = net(torch.from_numpy(transform_planes(x, s)), heads=True)
            for key, t in out.items():
                ref = base[key].numpy()
                if key in ("policy", "opponent_policy"):
                    ref = transform_policy(ref, s)
                elif key == "ownership":
                    ref = transform_planes(ref.reshape(-1, n, n), s).reshape(len(x), -1)
                worst[key] = max(worst[key], float(np.abs(t.numpy() - ref).max()))
    return worst


def test_a_pooled_net_is_equivariant_under_the_eight_symmetries(tiny_cfg):
    torch.manual_seed(3)
    net = _trained_a_little(net_from_config(tiny_cfg.net, 7))
    assert net.global_pooling and any(hasattr(b, "pool_fc") for b in net.tower)
    x = _random_planes(net, 6, seed=4)
    assert max(_symmetry_errors(net, x).values()) > 1e-3  # a random net is not symmetric
    errors = _symmetry_errors(_symmetrised(net), x)
    assert max(errors.values()) < 1e-4, errors


def test_a_model_file_from_before_the_new_heads_still_loads(tmp_path):
    torch.manual_seed(0)
    old = _trained_a_little(PolicyValueNet(5, 2, 16, 2, 16))  # the options default to off
    payload = model_payload(old, 4)
    for key in ("global_pooling", "ownership_head", "score_head", "opponent_policy_head"):
        del payload["config"][key]  # what older versions wrote
    path = tmp_path / "model_000004.pt"
    torch.save(payload, path)
    net, info = load_model(path)
    assert info.generation == 4 and not net.global_pooling and not net.ownership_head
    x = torch.from_numpy(_random_planes(net, 3))
    with torch.no_grad():
        torch.testing.assert_close(net(x)[0], old(x)[0], rtol=0, atol=0)
        assert set(net(x, heads=True)) == {"policy", "value"}


def test_a_small_file_asking_for_a_huge_net_is_refused_before_the_net_is_built(tmp_path):
    """A model file with a tiny net's weights and a config of 80 blocks x 1,024 filters (in
    range, key by key: about 6 GB of weights if built) is refused by its shapes, in a process
    limited to 3 GB of address space."""
    import subprocess
    import sys

    from tests.conftest import REPO

    script = f"""
import resource, time
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import torch
from configs import load_config
from training.learn.net import ModelError, load_model, net_from_config, save_model
cfg = load_config({str(REPO / "configs" / "tiny.yaml")!r})
save_model({str(tmp_path / "m.pt")!r}, net_from_config(cfg.net, cfg.go.board_size), generation=1)
data = torch.load({str(tmp_path / "m.pt")!r}, weights_only=True)
data["config"].update(blocks=80, filters=1024, board_size=19)
torch.save(data, {str(tmp_path / "huge.pt")!r})
t0 = time.monotonic()
try:
    load_model({str(tmp_path / "huge.pt")!r})
except ModelError as e:
    print("refused", round(time.monotonic() - t0, 2), e)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, cwd=str(REPO))
    assert run.returncode == 0 and run.stdout.startswith("refused"), run.stderr[-2000:]
    assert "the weights do not fit the net config" in run.stdout
    assert "1024" in run.stdout.split("the config makes")[-1]


# ------------------------------------------------------------------ scores for the search


@pytest.mark.parametrize("form", [False, "trace", "onnx", "openvino"])
def test_an_evaluator_asked_for_scores_returns_the_score_head_in_every_form(tiny_net, form):
    """The search's score utility reads the score head through the evaluator: the same
    priors and values as without it, and the head's output as the third."""
    if form == "openvino":
        pytest.importorskip("openvino")
    plain = make_evaluator(tiny_net, jit=False)
    scored = make_evaluator(tiny_net, jit=form, score=True)
    assert scored.mode == (form or "eager") and scored.score
    for batch in (1, 3, 16):
        planes = _random_planes(tiny_net, batch, seed=batch)
        legal = np.ones((batch, tiny_net.num_moves), bool)
        legal[:, ::3] = False
        p0, v0 = plain(planes, legal)
        p1, v1, s1 = scored(planes, legal)
        with torch.no_grad():
            want = tiny_net(torch.from_numpy(planes), heads=True)["score"].numpy()
        np.testing.assert_allclose(p1, p0, atol=1e-5)
        np.testing.assert_allclose(v1, v0, atol=1e-5)
        np.testing.assert_allclose(s1, want, atol=1e-5)
        assert s1.dtype == np.float32
    assert np.ptp(s1) > 1e-4  # the 16 scores are not one number (a zero or constant column)
    assert len(plain(_random_planes(tiny_net, 2))) == 2  # not asked: two outputs, as before


@pytest.mark.parametrize("jit", [False, "trace", "onnx"])
def test_a_scoring_evaluator_keeps_its_scores_across_new_weights_and_timings(tiny_net, tiny_cfg,
                                                                            jit):
    timings: dict[str, float] = {}
    evaluate = make_evaluator(tiny_net, jit=jit, score=True)
    timed = make_evaluator(tiny_net, jit=jit, score=True, timings=timings)
    torch.manual_seed(1)
    newer = _trained_a_little(net_from_config(tiny_cfg.net, tiny_cfg.go.board_size))
    evaluate.load_weights(newer)
    timed.load_weights(newer)
    planes = _random_planes(tiny_net, 4)
    with torch.no_grad():
        want = newer(torch.from_numpy(planes), heads=True)["score"].numpy()
    np.testing.assert_allclose(evaluate(planes)[2], want, atol=1e-5)
    np.testing.assert_allclose(timed(planes)[2], want, atol=1e-5)
    assert timings["net"] > 0


def test_a_net_without_a_score_head_scores_zero(tmp_path):
    torch.manual_seed(0)
    net = _trained_a_little(PolicyValueNet(5, 2, 16, 2, 16))
    assert not net.score_head
    planes = _random_planes(net, 3)
    for jit in (False, "onnx"):
        priors, values, scores = make_evaluator(net, jit=jit, score=True)(planes)
        np.testing.assert_array_equal(scores, 0.0)
        np.testing.assert_allclose(values, make_evaluator(net, jit=False)(planes)[1], atol=1e-5)
