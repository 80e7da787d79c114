"""The policy/value network: a ResNet, its model files, and a fast batched evaluator.

Owns:
- `PolicyValueNet` (defined in `training.learn.resnet`: the ResNet, its heads and KataGo's
  options) as the rest of the project builds it: `net_from_config(cfg.net, board_size)`,
  `unwrap` (inside a DDP or torch.compile wrapper), `plain_state_dict`.
- Model files: `save_model(path, net, generation)` writes ONE `torch.save` dict holding a plain
  state dict (no `module.`/`_orig_mod.` prefixes), the net's own config and its generation,
  atomically (temp name + rename). `load_model(path)` rebuilds the net from that copy with
  `torch.load(weights_only=True)`; it also accepts a trainer checkpoint (the model inside).
- `make_evaluator(net, device)`: `evaluate(planes, legal=None) -> (priors, values)` (and the
  score head's scores with `score=True`) under
  `torch.inference_mode()`, as a frozen TorchScript trace (measured 1.5-2x faster than eager
  on this CPU, see `benchmarks/train.py --inference`), torch.compile, eager, or, from an
  ONNX export, ONNX Runtime or OpenVINO (optional packages; torch stays the reference).

Vocabulary: N is the board size; input planes C = 2 * history + 1 (for each of the last
`history` positions the stones of the side to move, then the opponent's; then a plane of ones
when black is to move, see training/go/features.py); a policy vector has N*N+1 entries.

This module must not: know about search, games, files other than model files, or
torch.distributed (only training/train/ddp.py touches that); set torch's thread count (the
caller does).
"""

from __future__ import annotations

import copy
import io
import logging
import os
import pickle
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn

from training.learn.resnet import PolicyValueNet

log = logging.getLogger(__name__)

MODEL_FORMAT = "azgo-model"
MODEL_VERSION = 1
_PREFIXES = ("module.", "_orig_mod.")

Evaluator = Callable[..., "tuple[np.ndarray, ...]"]


class ModelError(Exception):
    """A model or checkpoint file that cannot be read or does not describe a net."""


# ------------------------------------------------------------------------------- the network


def net_from_config(cfg_net: Any, board_size: int) -> PolicyValueNet:
    """A freshly initialised net from the config's `net` section and the board size."""
    return PolicyValueNet(
        board_size=board_size,
        blocks=cfg_net.blocks,
        filters=cfg_net.filters,
        history=cfg_net.history,
        value_hidden=cfg_net.value_hidden,
        global_pooling=cfg_net.global_pooling,
        ownership_head=cfg_net.ownership_head,
        score_head=cfg_net.score_head,
        opponent_policy_head=cfg_net.opponent_policy_head,
        liberties=cfg_net.liberties,
        soft_policy_head=cfg_net.soft_policy_head,
    )


def unwrap(net: nn.Module) -> PolicyValueNet:
    """The PolicyValueNet inside a DDP (`.module`) or torch.compile (`._orig_mod`) wrapper."""
    while True:
        if isinstance(net, PolicyValueNet):
            return net
        inner = getattr(net, "module", None)
        if inner is None:
            inner = getattr(net, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            raise TypeError(f"not a PolicyValueNet or a wrapper of one: {type(net).__name__}")
        net = inner


def plain_state_dict(net: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict on CPU, without `module.`/`_orig_mod.` prefixes of wrappers."""
    out = {}
    for key, value in net.state_dict().items():
        changed = True
        while changed:
            changed = False
            for prefix in _PREFIXES:
                if key.startswith(prefix):
                    key = key[len(prefix) :]
                    changed = True
        out[key] = value.detach().to("cpu").clone()
    return out


# ----------------------------------------------------------------------------- model files


@dataclass(frozen=True)
class ModelInfo:
    """What a model file says about itself besides the weights."""

    path: str
    generation: int
    config: dict[str, Any]
    """PolicyValueNet constructor arguments (board_size, blocks, filters, history, ...)."""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def board_size(self) -> int:
        return int(self.config["board_size"])


def model_payload(net: nn.Module, generation: int, meta: dict | None = None) -> dict:
    """The dict a model file holds (also embedded in trainer checkpoints under "model")."""
    inner = unwrap(net)
    return {
        "format": MODEL_FORMAT,
        "version": MODEL_VERSION,
        "generation": int(generation),
        "config": dict(inner.config),
        "state_dict": plain_state_dict(inner),
        "meta": {k: _plain(v) for k, v in (meta or {}).items()},
    }


def _plain(value: Any) -> Any:
    """numpy/torch scalars -> Python numbers, so that weights_only loading accepts them."""
    if isinstance(value, (np.generic, torch.Tensor)) and getattr(value, "ndim", 0) == 0:
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def save_bytes(obj: Any) -> bytes:
    """`torch.save` of `obj` into bytes (to hand to an atomic writer)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def save_model(
    path: str | os.PathLike, net: nn.Module, generation: int, meta: dict | None = None
) -> None:
    """Write the net (plain state dict + its config + generation) atomically to `path`.

    `meta` must hold only plain data (str, int, float, bool, lists/dicts of them) so that the
    file stays loadable with `weights_only=True`.
    """
    from distributed.transfer import write_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, save_bytes(model_payload(net, generation, meta)))


_LOAD_ERRORS = (
    OSError, EOFError, RuntimeError, ValueError, KeyError, pickle.UnpicklingError,
    zipfile.BadZipFile,
)


def load_payload(path: str | os.PathLike, what: str = "model") -> dict:
    """`torch.load(weights_only=True)` of a file written by this project, or ModelError."""
    path = Path(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ModelError(f"{path}: no such {what} file; check the path") from None
    except _LOAD_ERRORS as e:  # torch raises many types for a damaged or foreign file
        first_line = (str(e).strip().splitlines() or [""])[0][:120]
        if isinstance(e, pickle.UnpicklingError):
            first_line = "holds objects other than tensors and plain data"
        raise ModelError(
            f"{path}: cannot read this {what} file ({type(e).__name__}: {first_line}); it is "
            "damaged, truncated or not a file written by this project (weights_only load): "
            "delete it or copy it again"
        ) from e
    if not isinstance(obj, dict):
        raise ModelError(f"{path}: not a {what} file of this project (got {type(obj).__name__})")
    return obj


def _check_payload(payload: Any, path: Path) -> None:
    if not isinstance(payload, dict) or payload.get("format") != MODEL_FORMAT:
        raise ModelError(
            f"{path}: not a model file of this project (format {MODEL_FORMAT!r} missing); "
            "pass a models/model_<gen>.pt or checkpoints/checkpoint_<gen>.pt file"
        )
    if payload.get("version") != MODEL_VERSION:
        raise ModelError(
            f"{path}: model file version {payload.get('version')!r}, this code reads "
            f"version {MODEL_VERSION}; use a matching version of the project"
        )
    for key in ("generation", "config", "state_dict"):
        if key not in payload:
            raise ModelError(f"{path}: model file lacks {key!r}; it is damaged, write it again")


NET_LIMITS = {"board_size": (5, 19), "blocks": (1, 80), "filters": (1, 1024),
              "history": (1, 32), "value_hidden": (1, 4096)}
"""The net configs a model file may ask for: checked before anything is allocated (a file
asking for 16,384 filters would take about 10 GB per layer)."""


def check_net_config(config: Any, path: Path) -> None:
    """ModelError unless `config` is a dict whose sizes are integers within NET_LIMITS."""
    if not isinstance(config, dict):
        raise ModelError(f"{path}: the net config is not a mapping")
    for key, (lo, hi) in NET_LIMITS.items():
        v = config.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise ModelError(f"{path}: net config {key} = {v!r:.40} is outside {lo}..{hi}; "
                             "the file is damaged or not from this project")


def finite_weights(net: nn.Module, buffers: bool = True) -> bool:
    """Every floating-point parameter (and buffer, unless `buffers` is False) of `net` is
    finite: no NaN, no inf."""
    net = unwrap(net)
    tensors = net.state_dict().values() if buffers else net.parameters()
    with torch.no_grad():
        return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


def _check_shapes(want: dict, weights: Any, config: dict, path: Path) -> None:
    """ModelError unless `weights` holds exactly the tensors of `want`'s names and shapes: a
    small file whose config asks for a huge net is refused before the net is built."""
    if not isinstance(weights, dict):
        raise ModelError(f"{path}: the weights are not a mapping; the file is damaged")
    for key in sorted(set(want) | set(weights)):
        got = weights.get(key)
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else None
        if key not in want or shape != tuple(want[key].shape):
            expected = tuple(want[key].shape) if key in want else "no such tensor"
            raise ModelError(f"{path}: the weights do not fit the net config {config!r}: "
                             f"{key!r:.80} is {shape}, the config makes {expected}")


def net_from_payload(payload: dict, path: str | os.PathLike = "<model>") -> PolicyValueNet:
    """Rebuild a PolicyValueNet from a model payload dict (config + state dict); ModelError
    for a config out of range (before any allocation) or a non-finite weight."""
    path = Path(path)
    _check_payload(payload, path)
    check_net_config(payload["config"], path)
    try:
        with torch.device("meta"):  # shapes only: nothing is allocated yet
            shapes = PolicyValueNet(**payload["config"]).state_dict()
    except (TypeError, AssertionError) as e:
        raise ModelError(f"{path}: bad net config {payload['config']!r}: {e}") from e
    _check_shapes(shapes, payload["state_dict"], payload["config"], path)
    net = PolicyValueNet(**payload["config"])  # as large as the weights the file holds
    try:
        net.load_state_dict(payload["state_dict"], strict=True)
    except RuntimeError as e:
        raise ModelError(
            f"{path}: the weights do not fit the net config {payload['config']!r}: {e}"
        ) from e
    if not finite_weights(net):
        raise ModelError(f"{path}: a weight is NaN or infinite; the model is unusable")
    return net


def load_model(
    path: str | os.PathLike, device: str | torch.device | int = "cpu"
) -> tuple[PolicyValueNet, ModelInfo]:
    """Load a model file (or the model inside a trainer checkpoint) onto one device.

    Returns the net in eval mode and its ModelInfo. A missing, damaged or foreign file raises
    ModelError naming the file and what to do.
    """
    path = Path(path)
    payload = load_payload(path)
    if payload.get("format") != MODEL_FORMAT and isinstance(payload.get("model"), dict):
        payload = payload["model"]  # a trainer checkpoint: the model payload is inside
    net = net_from_payload(payload, path)
    net.to(resolve_device(device)).eval()
    info = ModelInfo(
        path=str(path),
        generation=int(payload["generation"]),
        config=dict(payload["config"]),
        meta=dict(payload.get("meta") or {}),
    )
    return net, info


# ------------------------------------------------------------------------------- evaluation


def resolve_device(device: str | torch.device | int | None) -> torch.device:
    """"cpu", "cuda", "cuda:1", "mps", a torch.device, or a GPU id (int; -1 means CPU)."""
    if device is None:
        return torch.device("cpu")
    if isinstance(device, int):
        return torch.device("cpu") if device < 0 else torch.device(f"cuda:{device}")
    return torch.device(device)


_AUTOCAST = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
             "float16": torch.float16}


def _autocast_dtype(value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    if value in _AUTOCAST:
        return _AUTOCAST[value]
    raise ValueError(f"autocast_dtype must be bf16, fp16 or a torch dtype, got {value!r}")


INFERENCE_DTYPES = ("auto", "float32", "bfloat16", "float16")
"""The dtypes an evaluator may run the net in (`net.inference_dtype`)."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def inference_dtype(name: Any, device: str | torch.device | int = "cpu") -> torch.dtype:
    """The dtype an evaluator on `device` runs the net in for `name` (`net.inference_dtype`):
    "float32", "bfloat16", "float16", a torch dtype, None (float32) or "auto": bfloat16 on a
    CUDA device that supports it (float16 on an older one), float32 elsewhere (on a CPU the
    float32 forms, ONNX Runtime and the trace, are the fast ones; torch's bf16 convolutions
    there are slower)."""
    if name is None:
        return torch.float32
    if isinstance(name, torch.dtype):
        if name not in _DTYPES.values():
            raise ValueError(f"inference dtype must be float32, bfloat16 or float16, got {name}")
        return name
    if name == "auto":
        dev = resolve_device(device)
        if dev.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if name not in _DTYPES:
        raise ValueError(f"inference dtype must be one of {', '.join(INFERENCE_DTYPES)}, "
                         f"got {name!r}")
    return _DTYPES[name]


INFERENCE_FORMS = ("eager", "trace", "compile", "onnx", "openvino")
_CPU_ONLY = frozenset({"onnx", "openvino"})


def automatic_form(device: torch.device) -> str:
    """The fastest form measured here for `device` (benchmarks/train.py --inference): ONNX
    Runtime on a CPU when it and onnx are installed (1.4-2.1x the trace for the default net),
    else the frozen TorchScript trace."""
    import importlib.util

    if device.type == "cpu" and all(importlib.util.find_spec(m) is not None
                                    for m in ("onnx", "onnxruntime")):
        return "onnx"
    return "trace"


def _form_for(mode: str, device: torch.device) -> str:
    """`mode`, or the TorchScript trace for a CPU-only form on another device."""
    if mode in _CPU_ONLY and device.type != "cpu":
        log.info("%s runs on the CPU only; a TorchScript trace on %s", mode, device)
        return "trace"
    return mode


class WithScore(nn.Module):
    """`net` whose forward also returns the score head's output (`forward(x, score=True)`):
    the form the evaluator builds when the search asks for scores."""

    def __init__(self, net: PolicyValueNet):
        super().__init__()
        self.net = net
        self.in_planes = net.in_planes
        self.board_size = net.board_size

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.net(x, score=True)


def onnx_bytes(net: nn.Module, example: torch.Tensor) -> bytes:
    """`net.forward` as an ONNX graph (inputs "planes", outputs "logits" and "value", and
    "score" for a `WithScore`), any batch size, by torch's TorchScript-based exporter (it
    needs the onnx package)."""
    outputs = ["logits", "value"] + (["score"] if isinstance(net, WithScore) else [])
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, (example,), buffer, dynamo=False, opset_version=17,
            input_names=["planes"], output_names=outputs,
            dynamic_axes={name: {0: "batch"} for name in ["planes", *outputs]},
        )
    return buffer.getvalue()


def _onnxruntime_form(net: nn.Module, example: torch.Tensor):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # idle threads must not spin between calls: the search runs on the same cores
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(onnx_bytes(net, example), options,
                                   providers=["CPUExecutionProvider"])

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.from_numpy(out) for out in session.run(None, {"planes": x.numpy()}))

    return forward


def _openvino_form(net: nn.Module, example: torch.Tensor):
    import openvino as ov

    core = ov.Core()
    model = core.read_model(onnx_bytes(net, example), b"")
    compiled = core.compile_model(model, "CPU", {
        "INFERENCE_NUM_THREADS": torch.get_num_threads(), "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
    })
    request = compiled.create_infer_request()

    outputs = len(compiled.outputs)

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        request.infer({0: x.numpy()})
        return tuple(torch.from_numpy(request.get_output_tensor(i).data.copy())
                     for i in range(outputs))

    return forward


def compile_for_inference(
    net: nn.Module, device: torch.device, mode: str, example_batch: int = 8
) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """`net` (a `PolicyValueNet` or a `WithScore`, eval mode, on `device`) as `mode`:
    "trace" (frozen TorchScript), "compile",
    "onnx" (ONNX Runtime), "openvino" (OpenVINO) or "eager". The last two run on the CPU
    only and need their packages (onnx and onnxruntime are dependencies; openvino is
    optional: `pip install -e .[openvino]`). Falls back to eager with a logged warning when
    building the form fails."""
    if mode not in INFERENCE_FORMS:
        raise ValueError(f"jit mode must be one of {', '.join(INFERENCE_FORMS)}, got {mode!r}")
    if mode == "eager":
        return net
    mode = _form_for(mode, device)
    weights = next(net.parameters(), None)
    example = torch.zeros(
        example_batch, net.in_planes, net.board_size, net.board_size, device=device,
        dtype=weights.dtype if weights is not None else torch.float32,
    )
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            # torch 2.9+ marks TorchScript deprecated; it is still the fastest form measured
            # here for this net on CPU (benchmarks/train.py --inference), so keep it quietly.
            warnings.simplefilter("ignore", DeprecationWarning)
            if mode == "trace":
                fn = torch.jit.freeze(torch.jit.trace(net, example, check_trace=False))
            elif mode == "compile":
                fn = torch.compile(net, dynamic=False)
            elif mode == "onnx":
                fn = _onnxruntime_form(net, example)
            else:
                fn = _openvino_form(net, example)
            fn(example)  # the first call builds (and for compile, checks) the graph
            fn(example[:1])
        return fn
    except Exception as e:  # noqa: BLE001 - any failure here means: use eager instead
        log.warning("%s of the net failed (%s: %s); using eager PyTorch", mode,
                    type(e).__name__, e)
        return net


def make_evaluator(
    net: nn.Module,
    device: str | torch.device | int = "cpu",
    *,
    jit: bool | str = True,
    autocast_dtype: Any = None,
    max_batch: int | None = None,
    dtype: Any = None,
    timings: dict[str, float] | None = None,
    score: bool = False,
) -> Evaluator:
    """A batched evaluator over a private eval-mode copy of `net` on `device`.

    `evaluate(planes, legal=None) -> (priors, values)`, or with `score`
    `(priors, values, scores)`:
      planes float32 or uint8 (0/1) [B, C, N, N]; legal bool [B, N*N+1] or None.
      priors float32 [B, N*N+1]: softmax over the legal moves (zeros elsewhere), or over all
      moves when `legal` is None; values float32 [B] in [-1, 1], side to move's view;
      scores float32 [B], the score head's margin / N from the side to move's view (zeros
      for a net without the head), for the search's score utility.
    `jit`: True or "auto" (`automatic_form`: ONNX Runtime on a CPU where installed, else
    the trace; a config passes `net.inference`), "trace" (frozen TorchScript: ~0.1 s to
    build, 1.1-1.3x eager on this CPU),
    "compile" (torch.compile: ~30 s to build per evaluator, batches padded to powers of two;
    up to 1.3x trace at batch >= 32 here), "onnx" (ONNX Runtime) or "openvino" (OpenVINO),
    CPU only, from an ONNX export of the net (`benchmarks/train.py --inference` compares
    them), False or "eager". `evaluate.mode` tells which form is in use (a form that cannot
    be built falls back to eager with a warning).
    `autocast_dtype` ("bf16", "fp16" or a dtype) applies on GPUs only. `max_batch` splits
    larger inputs into several network calls.
    `dtype` (`inference_dtype`: "auto", "float32", "bfloat16", "float16"; None is float32):
    the weights and inputs are cast to it and the form is built in it (KataGo's half-precision
    self-play); priors and values come back float32, the softmax in float32. ONNX Runtime and
    OpenVINO run float32 only: another dtype on a CPU uses the trace. `evaluate.dtype` tells
    which dtype is in use.
    `timings` (a dict): each call adds its seconds to "copy_in" (numpy to a tensor on the
    device), "net" (the form's forward) and "copy_out" (mask, softmax, back to numpy), the
    device synchronised between them (`benchmarks/selfplay.py --breakdown`); None: no timing.
    """
    dev = resolve_device(device)
    model = _private_copy(net, dev)
    autocast = _gpu_autocast(autocast_dtype, dev)
    mode, run_dtype = _form_and_dtype(model, dev, jit, dtype, autocast)
    target = WithScore(model).eval() if score else model
    forms = {"fn": compile_for_inference(target, dev, mode)}
    if forms["fn"] is target:
        mode = "eager"
    n, c = model.board_size, model.in_planes
    moves = model.num_moves
    limit = max_batch or 1 << 30
    _forward = _forward_of(forms, mode, run_dtype, autocast, dev)

    def evaluate(
        planes: np.ndarray, legal: np.ndarray | None = None
    ) -> tuple[np.ndarray, ...]:
        if planes.ndim != 4 or planes.shape[1:] != (c, n, n):
            raise ValueError(f"planes must be [B, {c}, {n}, {n}], got {list(planes.shape)}")
        batch = planes.shape[0]
        if legal is not None and legal.shape != (batch, moves):
            raise ValueError(f"legal must be [{batch}, {moves}], got {list(legal.shape)}")
        priors = np.empty((batch, moves), dtype=np.float32)
        values = np.empty(batch, dtype=np.float32)
        out = (priors, values, np.empty(batch, dtype=np.float32)) if score else (priors, values)
        if timings is not None:
            return _timed_evaluate(_forward, dev, limit, timings, planes, legal, out)
        with torch.inference_mode():
            for lo in range(0, batch, limit):
                hi = min(batch, lo + limit)
                logits, v, *rest = _forward(_planes_in(planes[lo:hi], dev))
                if legal is not None:
                    mask = torch.from_numpy(np.ascontiguousarray(legal[lo:hi], dtype=bool))
                    logits = logits.masked_fill(~mask.to(dev), float("-inf"))
                p = torch.softmax(logits, dim=1)
                priors[lo:hi] = torch.nan_to_num(p, nan=0.0).cpu().numpy()
                values[lo:hi] = v.cpu().numpy()
                if score:
                    out[2][lo:hi] = rest[0].cpu().numpy()
        return out

    evaluate.mode = mode  # type: ignore[attr-defined]
    evaluate.dtype = run_dtype  # type: ignore[attr-defined]
    evaluate.device = dev  # type: ignore[attr-defined]
    evaluate.score = score  # type: ignore[attr-defined]
    evaluate.load_weights = _weight_loader(  # type: ignore[attr-defined]
        model, target, forms, mode, dev)
    return evaluate


def _planes_in(planes: np.ndarray, dev: torch.device) -> torch.Tensor:
    """float32 planes on `dev`. Compact 0/1 planes (uint8, the search's) travel as they are
    and are widened there: a quarter of the bytes through a GPU's copy engine."""
    if planes.dtype == np.uint8:
        return torch.from_numpy(np.ascontiguousarray(planes)).to(dev, non_blocking=True).float()
    x = torch.from_numpy(np.ascontiguousarray(planes, dtype=np.float32))
    return x.to(dev, non_blocking=True)


def _private_copy(net: nn.Module, dev: torch.device) -> nn.Module:
    """An eval-mode copy of `net` on `dev` whose parameters take no gradient."""
    model = copy.deepcopy(unwrap(net)).to(dev).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _gpu_autocast(autocast_dtype: Any, dev: torch.device) -> torch.dtype | None:
    """The autocast dtype asked for, on a GPU; None on a CPU (logged)."""
    autocast = _autocast_dtype(autocast_dtype)
    if autocast is not None and dev.type not in ("cuda", "mps"):
        log.info("autocast %s ignored on %s (GPUs only)", autocast, dev)
        autocast = None
    return autocast


def _form_and_dtype(model: nn.Module, dev: torch.device, jit: bool | str, dtype: Any,
                    autocast: torch.dtype | None) -> tuple[str, torch.dtype]:
    """(the form `jit` asks for that can run here, the dtype the net runs in); `model` is cast
    to that dtype."""
    mode = {True: "auto", False: "eager"}.get(jit, jit)  # type: ignore[arg-type]
    if mode == "auto":
        mode = automatic_form(dev)
    mode = _form_for(mode, dev)
    run_dtype = inference_dtype(dtype, dev)
    if run_dtype != torch.float32:
        model.to(run_dtype)
        if mode in _CPU_ONLY:
            log.info("%s runs float32 only; a TorchScript trace in %s", mode, run_dtype)
            mode = "trace"
    if autocast is not None and mode == "trace":
        # TorchScript freezing does not keep autocast regions; eager under autocast on a GPU
        # is network-bound anyway.
        mode = "eager"
    return mode, run_dtype


def _forward_of(forms: dict, mode: str, run_dtype: torch.dtype, autocast: torch.dtype | None,
                dev: torch.device) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """The evaluator's forward pass: `forms["fn"]` (swapped by `load_weights`) in `run_dtype`,
    under autocast, or padded to a power of two for torch.compile; its outputs (logits,
    values and, from a `WithScore`, scores) float32."""

    def _forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        fn = forms["fn"]
        if run_dtype != torch.float32:
            x = x.to(run_dtype)
        if autocast is not None:
            with torch.autocast(device_type=dev.type, dtype=autocast):
                outs = fn(x)
            return tuple(o.float() for o in outs)
        if mode == "compile":
            # torch.compile(dynamic=False) recompiles for every new batch size and falls back
            # to eager after a few; padding to powers of two keeps the shapes to a handful.
            rows = x.shape[0]
            padded = 1 << (rows - 1).bit_length()
            if padded != rows:
                x = torch.cat([x, x.new_zeros((padded - rows, *x.shape[1:]))])
                return tuple(o[:rows].float() for o in fn(x))
        return tuple(o.float() for o in fn(x))

    return _forward


def _timed_evaluate(forward: Callable, dev: torch.device, limit: int, timings: dict[str, float],
                    planes: np.ndarray, legal: np.ndarray | None,
                    out: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """`make_evaluator`'s `evaluate` with its phases timed into `timings`: `forward` is the
    evaluator's form, `limit` its largest batch; fills `out` (priors, values[, scores])."""
    priors, values = out[0], out[1]
    import time

    def sync() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter()

    with torch.inference_mode():
        for lo in range(0, planes.shape[0], limit):
            hi = min(planes.shape[0], lo + limit)
            t0 = sync()
            x = _planes_in(planes[lo:hi], dev)
            mask = None if legal is None else torch.from_numpy(
                np.ascontiguousarray(legal[lo:hi], dtype=bool)).to(dev)
            t1 = sync()
            logits, v, *rest = forward(x)
            t2 = sync()
            if mask is not None:
                logits = logits.masked_fill(~mask, float("-inf"))
            p = torch.softmax(logits, dim=1)
            priors[lo:hi] = torch.nan_to_num(p, nan=0.0).cpu().numpy()
            values[lo:hi] = v.cpu().numpy()
            if len(out) > 2:
                out[2][lo:hi] = rest[0].cpu().numpy()
            t3 = time.perf_counter()
            for key, dt in (("copy_in", t1 - t0), ("net", t2 - t1), ("copy_out", t3 - t2)):
                timings[key] = timings.get(key, 0.0) + dt
    return out


def _weight_loader(model: nn.Module, target: nn.Module, forms: dict, mode: str,
                   dev: torch.device) -> Callable[[nn.Module], None]:
    """The evaluator's `load_weights`: new weights into `model`, the form of `target` (the
    model, or a `WithScore` of it) rebuilt where the weights are inlined."""

    def load_weights(new_net: nn.Module) -> None:
        """Swap in the weights of `new_net` (same net config) without rebuilding from scratch.

        Eager and torch.compile forms keep their graphs (weights are inputs of the compiled
        graph: no recompilation); the frozen trace has its weights inlined and is re-traced
        (~0.1 s).
        """
        source = unwrap(new_net)
        if source.config != model.config:
            raise ValueError(f"load_weights needs the same net config: evaluator has "
                             f"{model.config}, new net has {source.config}")
        with torch.no_grad():
            model.load_state_dict(plain_state_dict(source))
        if mode in ("trace", *_CPU_ONLY):  # weights inlined: build again
            forms["fn"] = compile_for_inference(target, dev, mode)

    return load_weights
