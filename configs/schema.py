"""The one typed config: frozen dataclasses loaded strictly from configs/config.yaml.

Every section of `config.yaml` is a dataclass here; the defaults live here and the comments in
`config.yaml` document each key once. `load_config(path)` parses the YAML, rejects unknown keys
(listing the valid ones), wrong types and out-of-range values, and raises `ConfigError` with the
file, the dotted key and what was expected, e.g.

    configs/config.yaml: distributed.workers[1].gpu_id must be between -1 and 1024, got -5

Parse once at an entry point and pass each part only its section (`cfg.mcts`, `cfg.distributed`).
This module holds the key tables and each section's checks; reading YAML into them, overrides
and dumping are `configs.loading`. It imports only the standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parent / "config.yaml"

WORKER_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
"""The one rule for a worker's (and a training node's) name: it is part of every batch file
name (`training.go.records.batch_name`), of remote paths and of log names."""


def is_worker_name(name: str) -> bool:
    """`name` matches WORKER_NAME_PATTERN (ASCII letters and digits, then also '-' and '_';
    at most 64 characters)."""
    return (0 < len(name) <= 64 and name.isascii() and name[0].isalnum()
            and all(c.isalnum() or c in "-_" for c in name))


class ConfigError(ValueError):
    """A config file or override that does not fit the schema."""


class Invalid(Exception):
    """Raised by section checks; becomes a ConfigError with the file and dotted key."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key
        self.message = message


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise Invalid(key, message)


def _range(obj: Any, name: str, lo: float | None = None, hi: float | None = None) -> None:
    value = getattr(obj, name)
    if value is None:
        return
    if lo is not None and hi is not None:
        _check(lo <= value <= hi, name, f"must be between {lo} and {hi}, got {value!r}")
    elif lo is not None:
        _check(value >= lo, name, f"must be >= {lo}, got {value!r}")
    elif hi is not None:
        _check(value <= hi, name, f"must be <= {hi}, got {value!r}")


def _choice(obj: Any, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    _check(value in choices, name, f"must be one of {', '.join(choices)}, got {value!r}")


@dataclass(frozen=True)
class GoConfig:
    board_size: int = 9
    """Board is board_size x board_size, 5 to 19."""
    komi: float = 7.0
    """Points added to white's area score (Tromp-Taylor area scoring)."""
    max_moves: int = 0
    """Game ends after this many moves (passes count); 0 means 2 * board_size**2."""

    def __post_init__(self) -> None:
        _range(self, "board_size", 5, 19)
        _range(self, "komi", -150, 150)
        _range(self, "max_moves", 0, 10_000)
        _check(self.komi * 2 == int(self.komi * 2), "komi", f"must be a multiple of 0.5, got {self.komi}")

    @property
    def move_cap(self) -> int:
        return self.max_moves or 2 * self.board_size**2


@dataclass(frozen=True)
class NetConfig:
    blocks: int = 4
    """Residual blocks (the user guide's --blocks)."""
    filters: int = 32
    """Convolution filters per layer (the user guide's --filters)."""
    history: int = 8
    """Past positions in the input: 2 * history + 1 input planes."""
    value_hidden: int = 64
    """Width of the value head's hidden layer."""
    global_pooling: bool = True
    """KataGo's global pooling bias in every other block from the 2nd and in the policy head."""
    ownership_head: bool = True
    """Train a head on the final owner of every point (a training-only output)."""
    score_head: bool = True
    """Train a head on the final area margin, komi included (a training-only output)."""
    opponent_policy_head: bool = True
    """Train a second policy on the opponent's reply (a training-only output)."""
    soft_policy_head: bool = True
    """Train a head on the soft policy target, the policy target raised to 1/4 (KataGo's
    auxiliary soft policy; weight training.soft_policy_weight; a training-only output)."""
    liberties: bool = True
    """Six more input planes: each side's stones in chains with 1, 2, 3+ liberties (KataGo's
    liberty features; a new net: runs started without them keep their models)."""
    inference: str = "auto"
    """How searches run the net (self-play, arena, GTP, analysis): auto (on a CPU ONNX Runtime
    when installed, else a TorchScript trace; on a GPU the trace), onnx, openvino, trace,
    compile or eager. Not part of the model: any value plays the same model."""
    inference_dtype: str = "auto"
    """The dtype self-play workers run the net in: auto (bfloat16 on a CUDA GPU that has it,
    float16 on an older one, float32 on a CPU), float32, bfloat16 or float16. The weights and
    inputs are cast; priors and values agree with float32 within the tolerances
    tests/test_net.py states. Not part of the model: any value plays the same model."""

    def __post_init__(self) -> None:
        _choice(self, "inference", ("auto", "onnx", "openvino", "trace", "compile", "eager"))
        _choice(self, "inference_dtype", ("auto", "float32", "bfloat16", "float16"))
        _range(self, "blocks", 1, 80)
        _range(self, "filters", 8, 1024)
        _range(self, "history", 1, 16)
        _range(self, "value_hidden", 8, 4096)


@dataclass(frozen=True)
class MctsConfig:
    simulations: int = 32
    """Simulations per move (new visits added to the root; a reused subtree keeps its visits)."""
    c_puct: float = 1.5
    """Exploration constant of PUCT."""
    dirichlet_total_alpha: float = 10.83
    """Root noise: alpha per legal move = this / number of legal moves (0.03 on 19x19)."""
    dirichlet_fraction: float = 0.25
    """Share of the root prior replaced by Dirichlet noise in self-play."""
    fpu_reduction: float = 0.2
    """Unvisited children start at the parent's value minus this (first-play urgency)."""
    reuse_tree: bool = True
    """Keep the chosen child's subtree for the next move."""
    algorithm: str = "gumbel"
    """Search: puct (AlphaZero: PUCT, Dirichlet root noise, visit-count policy targets) or
    gumbel (Gumbel MuZero: Gumbel-top-k root sampling, sequential halving, improved-policy
    targets; c_puct, fpu_reduction and dirichlet_* are then unused)."""
    gumbel_max_considered: int = 16
    """Gumbel: root moves sampled for sequential halving, m = min(legal, this, simulations)."""
    gumbel_c_visit: float = 50.0
    """Gumbel: sigma(q) = (gumbel_c_visit + max child visits) * gumbel_c_scale * q."""
    gumbel_c_scale: float = 1.0
    """Gumbel: scale of the normalised completed Q in sigma (see gumbel_c_visit)."""
    gumbel_q_normalization: str = "bounds"
    """Gumbel: Q to [0, 1] by the value bounds, (Q + 1) / 2, or minmax over a node's children
    (mctx's rescale: even a tiny Q difference then spans the whole scale)."""
    full_search_fraction: float = 0.25
    """Playout cap randomization (KataGo): share of self-play moves searched with
    `simulations` and trained as policy targets; the others get `fast_simulations`, no
    root noise, and train only the value. 1 = every move a full search."""
    fast_simulations: int = 8
    """Simulations of a fast search (used when full_search_fraction < 1)."""
    leaf_batch: int = 1
    """Searches of one position (the GTP engine, the analysis engine, the strength tool):
    leaves evaluated together in one net call, each walked with the ones before it counted
    as visits and virtual losses. 1: one leaf per call. Self-play batches across its games
    instead and ignores this."""
    score_utility_static: float = 0.0
    """KataGo's score utility, static part: each evaluation also counts
    this x 2/pi x atan(margin / 2N) (margin from the net's score head, or the rules' at a
    finished game), so a decided game is still played for points. 0 = off."""
    score_utility_dynamic: float = 0.0
    """Dynamic part: this x 2/pi x atan((margin - centre) / (score_utility_scale x N)), the
    centre the root's expected margin: moves that gain or lose points near the expected
    result count even when the game is won or lost. 0 = off."""
    score_utility_zero_weight: float = 0.2
    """Dynamic part: the centre is the root's margin pulled this share toward 0 (KataGo's
    dynamicScoreCenterZeroWeight)."""
    score_utility_scale: float = 0.75
    """Dynamic part: its width in points per board side (KataGo's dynamicScoreCenterScale)."""

    def __post_init__(self) -> None:
        _range(self, "simulations", 1, 100_000)
        _range(self, "c_puct", 0.0, 100.0)
        _range(self, "dirichlet_total_alpha", 0.0, 1000.0)
        _range(self, "dirichlet_fraction", 0.0, 1.0)
        _range(self, "fpu_reduction", 0.0, 2.0)
        _choice(self, "algorithm", ("puct", "gumbel"))
        _range(self, "gumbel_max_considered", 1, 1000)
        _range(self, "gumbel_c_visit", 0.0, 100_000.0)
        _range(self, "gumbel_c_scale", 0.0, 1000.0)
        _choice(self, "gumbel_q_normalization", ("bounds", "minmax"))
        _check(
            0.0 < self.full_search_fraction <= 1.0,
            "full_search_fraction",
            f"must be > 0 and <= 1 (some moves must be policy targets), "
            f"got {self.full_search_fraction!r}",
        )
        _range(self, "fast_simulations", 1, 100_000)
        _range(self, "leaf_batch", 1, 256)
        _range(self, "score_utility_static", 0.0, 1.0)
        _range(self, "score_utility_dynamic", 0.0, 1.0)
        _range(self, "score_utility_zero_weight", 0.0, 1.0)
        _range(self, "score_utility_scale", 0.2, 5.0)
        if self.full_search_fraction < 1.0:
            _check(
                self.fast_simulations <= self.simulations,
                "fast_simulations",
                f"must be <= mcts.simulations ({self.simulations}) when "
                f"full_search_fraction < 1, got {self.fast_simulations}",
            )

    @property
    def wants_score(self) -> bool:
        """Whether the search reads the net's score head (the score utility is on)."""
        return self.score_utility_static > 0.0 or self.score_utility_dynamic > 0.0


@dataclass(frozen=True)
class SelfPlayConfig:
    games_per_worker: int = 128
    """Games each worker contributes per generation; the coach trains a new generation once
    games_per_worker x active workers new games have arrived (weighted by load balancing)."""
    parallel_games: int = 64
    """Games one worker process searches at once (one batched network call per step)."""
    batch_size: int = 64
    """Most positions per network call."""
    simulations_ramp: int = 0
    """Generations over which a full search's simulations grow from mcts.fast_simulations
    to mcts.simulations (MiniZero's progressive simulation: cheap games while the net knows
    little); 0 = mcts.simulations from the start."""
    temperature_moves: int = 8
    """Moves sampled (puct: in proportion to visits; gumbel: the search's choice with its root
    noise); after that, the search's best move (the most visited; gumbel: without noise)."""
    resign_threshold: float = -0.9
    """Resign when a side's root value stays below this for `resign_moves` of its own moves
    in a row; -1 disables resignation."""
    resign_moves: int = 3
    """Own moves in a row below `resign_threshold` before a side resigns (KataGo's 3)."""
    resign_disabled_fraction: float = 0.1
    """Share of games where resignation is off, to measure false resignations."""
    soft_resign: bool = False
    """Instead of resigning, play the decided game out with fast searches only (KataGo's soft
    resignation): no game ends early, every game gets ownership and score targets and an
    ending the net learns the value of, and every decided game measures false resignations."""
    workers: int = 0
    """Local mode: self-play worker processes (the user guide's --workers); 0 = automatic:
    one per CPU core without GPUs, 2 to 4 per GPU with them."""
    workers_per_gpu: int = 0
    """Local mode: the most worker processes per GPU (--workers-per-gpu); 0 = no cap. Workers
    are spread evenly over the GPUs."""
    cpu_only: bool = False
    """Run self-play on the CPU even when GPUs are present."""
    threads_per_worker: int = 1
    """torch threads per worker process (one process per core with one thread is robust)."""
    early_pass: bool = False
    """Let self-play search pass while a real move is left (false: pass only after the
    opponent's pass or when every move fills an own eye; stops the pass collapse of small nets)."""
    worker_class: str = "training.worker:Worker"
    """The worker daemon class, as module:Class (a subclass of training.worker.Worker)."""
    net_server: bool | str = "auto"
    """One net server process per worker holds the net (`training.serve`, one CUDA context,
    bf16, CUDA graphs) and `search_processes` search processes send it their leaves through
    shared memory, one batch for all of them: true, false, or auto (on when the worker's
    device is a GPU; off on a CPU, where each process's own net is faster,
    `benchmarks/gpu_ceiling.py`)."""
    search_processes: int = 2
    """With the net server: the worker's search processes, each playing `parallel_games`
    games (about one per CPU core the worker may use)."""
    gather_wait_ms: float = 10.0
    """With the net server: how long it waits, with some requests in, for every other
    search process's before it runs the net. 10 gathers one batch from every process (2.0x
    the mean batch of one process, 1.8x its moves/s, for 2 processes on 2 cores); with more
    search processes than cores, 0 lets the net run for some while the others search (on 2
    cores and a net of 3 ms a call: 4 processes at 0 played 1.65x and 1.82x the moves/s of
    2 at 10 in two runs, `benchmarks/gpu_ceiling.py --cpu-only`)."""

    server_lanes: int = 0
    """With the net server: batches in the net at once (lanes: threads with their own
    evaluator, on a GPU their own CUDA stream; one gathers and copies while another's batch
    is in the net). 0 = automatic: 2 on a GPU, 1 on a CPU."""

    def __post_init__(self) -> None:
        _range(self, "simulations_ramp", 0, 1_000_000)
        _range(self, "games_per_worker", 1, 10**9)
        _range(self, "parallel_games", 1, 4096)
        _range(self, "batch_size", 1, 4096)
        _range(self, "temperature_moves", 0, 1000)
        _range(self, "resign_threshold", -1.0, 1.0)
        _range(self, "resign_moves", 1, 1000)
        _range(self, "resign_disabled_fraction", 0.0, 1.0)
        _range(self, "workers", 0, 1024)
        _range(self, "workers_per_gpu", 0, 64)
        _range(self, "threads_per_worker", 1, 256)
        _range(self, "search_processes", 1, 256)
        _range(self, "gather_wait_ms", 0.0, 1000.0)
        _range(self, "server_lanes", 0, 16)
        _check(isinstance(self.net_server, bool) or self.net_server == "auto", "net_server",
               f"must be true, false or auto, got {self.net_server!r}")
        module, _, cls = self.worker_class.partition(":")
        _check(
            bool(module) and cls.isidentifier() and all(p.isidentifier() for p in module.split(".")),
            "worker_class",
            f"must be module:Class, e.g. training.worker:Worker, got {self.worker_class!r}",
        )


@dataclass(frozen=True)
class ReplayConfig:
    min_positions: int = 10_000
    """The window never shrinks below this many positions (KataGo-style growing window)."""
    max_positions: int = 200_000
    """The window never grows beyond this many positions."""
    growth: float = 0.75
    """Window size = min_positions * (total_positions / min_positions) ** growth, capped."""
    validation_fraction: float = 0.05
    """Share of games held out for validation (chosen by a hash of the game id)."""
    policy_surprise_weight: float = 0.0
    """KataGo's policy surprise weighting: within each game, this share of its full-search
    positions' sampling frequency goes in proportion to how much the search surprised the
    net (KL of the policy target from the prior), the rest uniformly; 0 = off, KataGo 0.5."""

    fast_search_weight: float = 1.0
    """How often a fast search's position (a value target only, playout cap randomization) is
    sampled, against a full search's: 1 = as often, 0 = never (KataGo writes no row for
    them)."""

    search_value_weight: float = 0.0
    """The value target's share taken from the search's root value at the position, the rest
    from the game's result: 0 = the result alone (AlphaZero). 0.5 lost to 0 at equal time on
    7x7 (docs/PERFORMANCE.md): a fast search's root value is mostly the net's own."""

    def __post_init__(self) -> None:
        _range(self, "policy_surprise_weight", 0.0, 1.0)
        _range(self, "search_value_weight", 0.0, 1.0)
        _range(self, "fast_search_weight", 0.0, 1.0)
        _range(self, "min_positions", 1, 10**10)
        _range(self, "max_positions", 1, 10**10)
        _check(
            self.max_positions >= self.min_positions,
            "max_positions",
            f"must be >= replay.min_positions ({self.min_positions}), got {self.max_positions}",
        )
        _range(self, "growth", 0.0, 1.0)
        _range(self, "validation_fraction", 0.0, 0.5)


@dataclass(frozen=True)
class TrainingConfig:
    batch_size: int = 256
    """Total batch across all ranks (split evenly; the guides' --batch-size)."""
    batch_size_per_gpu: int = 0
    """If > 0: each rank's batch instead (total = this x ranks; 001/002's per-GPU batch)."""
    backend: str = "auto"
    """torch.distributed backend: auto (NCCL on CUDA, else Gloo), nccl or gloo."""
    lr: float = 0.02
    """Learning rate for the reference batch size lr_reference_batch."""
    lr_reference_batch: int = 256
    """The batch size at which lr applies; scaled from there by lr_scaling."""
    lr_scaling: str = "linear"
    """How lr follows the total batch: linear, sqrt or none."""
    warmup_steps: int = 100
    """Linear LR warmup at the start of a run."""
    lr_schedule: tuple[tuple[float, ...], ...] = ((12600.0, 0.1),)
    """LR drops: [[global_step, multiplier], ...], steps ascending; from each step on the LR is
    lr x its multiplier (minigo's and Leela Zero's piecewise-constant schedule); [] = constant.
    The default drops to a tenth at step 12,600 (generation 63 at 200 steps a round: 96
    minutes of the default on 2 CPU cores), measured in docs/PERFORMANCE.md."""
    lr_schedule_by_time: tuple[tuple[float, ...], ...] = ((0.8, 0.1),)
    """LR drops of a run with a time limit (run.hours), in place of lr_schedule:
    [[share of run.hours, multiplier], ...], shares ascending in (0, 1); a round that starts
    after that share of the hours trains at lr x its multiplier. The default: a tenth for the
    last fifth of the hours, wherever that falls in steps on the machine at hand; [] =
    lr_schedule applies."""
    momentum: float = 0.9
    weight_decay: float = 1e-4
    ema_decay: float = 0.995
    """Publish an exponential moving average of the weights instead of the weights
    themselves: after every optimizer step ema := decay x ema + (1 - decay) x weights (the
    batch norm statistics copied), kept in the checkpoint across rounds; early in a run the decay
    is at most (1 + step) / (10 + step). 0.995 averages over about the last 200 steps, a
    generation of the default (KataGo publishes such an average of its trainer's weights).
    0 = off: the weights as trained. The default: 0.99 measured against 0 at equal time, then
    0.995 against 0.99 in one-hour runs (docs/PERFORMANCE.md)."""
    mode: str = "rounds"
    """rounds: the coach starts a trainer process per generation (reads the window, trains
    steps_per_generation steps, writes the generation, exits). continuous: one long-lived
    trainer for the whole run keeps the net, optimizer and window in memory, takes in each
    batch as the coach admits it, trains at samples_per_new_sample and publishes a generation
    every steps_per_generation steps (or publish_interval_s); not with
    distributed.training_nodes."""
    samples_per_new_sample: float = 4.0
    """continuous: trained samples per new self-play sample (KataGo's samples per data); the
    trainer waits for new games rather than train the window beyond it."""
    min_window_positions: int = 0
    """continuous: training positions the window must hold before the first step (KataGo
    waits for a minimum of rows); the ratio's budget builds up meanwhile, so the first steps
    come at once when it is reached. 0 = train from the first total batch of positions."""
    publish_interval_s: float = 0.0
    """continuous: also publish a generation after this many seconds with at least one step
    (0 = every steps_per_generation steps only)."""
    steps_per_generation: int = 200
    """Optimizer steps per training round (one new generation); in continuous mode the steps
    between two published generations."""
    epochs: int = 0
    """If > 0, train this many passes over the window instead of steps_per_generation."""
    grad_accumulation: int = 1
    """Micro-batches per optimizer step (no_sync on all but the last)."""
    mixed_precision: bool = False
    """bf16/fp16 autocast on GPUs, bf16 on the CPU."""
    amp_dtype: str = "auto"
    """With mixed_precision: auto (bf16 where the GPU has it, else fp16), bf16, or fp16
    (with a GradScaler)."""
    gpus: int = 0
    """GPUs per node for training; 0 = all visible (CPU with Gloo when none)."""
    nodes: int = 1
    """Training nodes (the main node plus training_nodes from distributed)."""
    master_port: int = 12355
    """Rendezvous port of rank 0 for multi-process training."""
    timeout_s: float = 300.0
    """Process group timeout: a stuck or dead rank ends the round after this."""
    min_new_positions: int = 0
    """Also require this many new positions before a training round (0 = only games_per_worker)."""
    ownership_weight: float = 1.5
    """Loss weight of the ownership head (mean over points; KataGo: 1.5 / N^2 summed)."""
    score_weight: float = 0.05
    """Loss weight of the score head (Huber loss on the margin / N, delta 1)."""
    opponent_policy_weight: float = 0.15
    """Loss weight of the opponent's-reply policy head (KataGo: 0.15)."""
    soft_policy_weight: float = 8.0
    """Loss weight of the soft policy head, where the net has one (KataGo: 8)."""

    def __post_init__(self) -> None:
        _range(self, "batch_size", 1, 1 << 20)
        _range(self, "batch_size_per_gpu", 0, 1 << 20)
        _choice(self, "backend", ("auto", "nccl", "gloo"))
        _range(self, "lr", 0.0, 10.0)
        _range(self, "lr_reference_batch", 1, 1 << 20)
        _choice(self, "lr_scaling", ("linear", "sqrt", "none"))
        _choice(self, "amp_dtype", ("auto", "bf16", "fp16"))
        _range(self, "warmup_steps", 0, 10**9)
        last = -1.0
        for i, entry in enumerate(self.lr_schedule):
            key = f"lr_schedule[{i}]"
            _check(len(entry) == 2, key, f"must be [global_step, multiplier], got {list(entry)}")
            step, factor = entry
            _check(step == int(step) and step > last, key,
                   f"step must be a whole number above the entry before it, got {step:g}")
            _check(0.0 < factor <= 100.0, key, f"multiplier must be in (0, 100], got {factor:g}")
            last = step
        last = 0.0
        for i, entry in enumerate(self.lr_schedule_by_time):
            key = f"lr_schedule_by_time[{i}]"
            _check(len(entry) == 2, key,
                   f"must be [share of run.hours, multiplier], got {list(entry)}")
            share, factor = entry
            _check(last < share < 1.0, key, "share must be above the entry before it and "
                   f"below 1 (0.8: from 80% of run.hours on), got {share:g}")
            _check(0.0 < factor <= 100.0, key, f"multiplier must be in (0, 100], got {factor:g}")
            last = share
        _range(self, "momentum", 0.0, 1.0)
        _range(self, "weight_decay", 0.0, 1.0)
        _check(0.0 <= self.ema_decay < 1.0, "ema_decay",
               f"must be in [0, 1) (0.995: about the last 200 steps; 0 = off), got "
               f"{self.ema_decay!r}")
        _choice(self, "mode", ("rounds", "continuous"))
        _range(self, "samples_per_new_sample", 0.01, 10_000.0)
        _range(self, "min_window_positions", 0, 10_000_000)
        _range(self, "publish_interval_s", 0.0, 86400.0)
        _check(self.mode == "rounds" or self.epochs == 0, "epochs",
               "sets the length of a round (training.mode: rounds); training.mode continuous "
               "publishes every steps_per_generation steps: set epochs to 0")
        _range(self, "steps_per_generation", 1, 10**9)
        _range(self, "epochs", 0, 10**6)
        _range(self, "grad_accumulation", 1, 1024)
        _range(self, "gpus", 0, 1024)
        _range(self, "nodes", 1, 1024)
        _range(self, "master_port", 1, 65535)
        _range(self, "timeout_s", 1.0, 86400.0)
        _range(self, "min_new_positions", 0, 10**12)
        _range(self, "ownership_weight", 0.0, 100.0)
        _range(self, "score_weight", 0.0, 100.0)
        _range(self, "opponent_policy_weight", 0.0, 100.0)


@dataclass(frozen=True)
class EvaluationConfig:
    games: int = 20
    """Arena games between a new generation and the previous one (colours alternate)."""
    gating: str = "none"
    """Promote a new model: none (always), threshold (win rate >= gating_threshold) or sprt."""
    gating_threshold: float = 0.55
    """Win rate needed with gating: threshold."""
    sprt_elo0: float = 0.0
    """SPRT null hypothesis Elo difference (Leela Zero: 0)."""
    sprt_elo1: float = 35.0
    """SPRT alternative hypothesis Elo difference (Leela Zero: 35)."""
    simulations: int = 0
    """Simulations per move in the arena; 0 = mcts.simulations."""
    gnugo_level: int = 1
    """GNU Go level (0-10) for evaluation against GNU Go; 0 games means off."""
    gnugo_games: int = 0
    """Games against GNU Go per generation (0 = off)."""

    def __post_init__(self) -> None:
        _range(self, "games", 0, 100_000)
        _choice(self, "gating", ("none", "threshold", "sprt"))
        _range(self, "gating_threshold", 0.0, 1.0)
        _range(self, "sprt_elo0", -1000.0, 1000.0)
        _range(self, "sprt_elo1", -1000.0, 1000.0)
        _range(self, "simulations", 0, 100_000)
        _range(self, "gnugo_level", 0, 10)
        _range(self, "gnugo_games", 0, 100_000)


@dataclass(frozen=True)
class EngineConfig:
    max_visits: int = 20_000
    """Most simulations of one search of the GTP engine (python -m training.gtp) when a game
    clock or --seconds-per-move sets its time, and of one live analysis (lz-analyze,
    kata-analyze); it sizes the search tree, the engine's memory bound: about 50 MiB on 9x9 and
    221 MiB on 19x19 at 20,000. The engine's --max-simulations overrides it."""
    analysis_max_seconds: float = 0.0
    """A live analysis stops searching after this many seconds (0: it searches until the next
    command or max_visits)."""

    def __post_init__(self) -> None:
        _range(self, "max_visits", 1, 200_000)
        _range(self, "analysis_max_seconds", 0.0, 86_400.0)


@dataclass(frozen=True)
class WorkerSpec:
    host: str
    """Host name or address of the worker."""
    user: str
    """SSH user on the worker (key authentication only; no passwords in the config)."""
    name: str = ""
    """Name used in commands and status (default worker1, worker2, ... by position)."""
    port: int = 22
    key_path: str | None = None
    """Private key file; unset means the SSH agent and ~/.ssh default keys."""
    gpu_id: int = 0
    """GPU the worker's self-play uses; -1 for CPU. 0 (the default) is the first GPU, or the
    CPU on a host without one; a higher number must be a GPU the host has (preflight)."""
    remote_dir: str | None = None
    """Overrides distributed.remote_dir for this worker."""
    python: str | None = None
    """Overrides distributed.python for this worker."""

    def __post_init__(self) -> None:
        _check(bool(self.host.strip()), "host", "must not be empty")
        _check(bool(self.user.strip()), "user", "must not be empty")
        _range(self, "port", 1, 65535)
        _range(self, "gpu_id", -1, 1024)
        _check(
            not self.name or is_worker_name(self.name),
            "name",
            "may hold only letters, digits, '-' and '_' (ASCII, starting with a letter or "
            f"digit, at most 64: it is part of batch file names), got {self.name!r}",
        )


@dataclass(frozen=True)
class DistributedConfig:
    enabled: bool = False
    """Run self-play on the workers below over SSH (also: start_main.py --distributed)."""
    workers: tuple[WorkerSpec, ...] = ()
    """Self-play hosts: host, user, key_path, gpu_id (and optional name, port)."""
    compression: bool = True
    """zstd-compress models and game batches on the wire (false: zstd frames of stored
    blocks, no compression work; every reader reads both)."""
    compression_level: int = 3
    """zstd level, 1 (fast) to 22 (small)."""

    @property
    def wire_level(self) -> int:
        """The zstd level files are written at: `compression_level`, or 0 (raw, stored
        blocks in a zstd frame: no compression work, the same readers) when compression is
        off."""
        return self.compression_level if self.compression else 0
    batch_size: int = 100
    """Finished games per batch file a worker sends."""
    batch_max_wait_s: float = 10.0
    """A worker also sends a smaller batch once its oldest finished game has waited this long
    (fresh data for the trainer); 0 = only full batches."""
    sync_interval: int = 1
    """Games between a worker's rescans of its model folder besides its watcher's events (a
    newer model loads in a background thread and goes in at the games' next network call,
    the games in flight included)."""
    load_balancing: bool = True
    """Share each generation's games by worker_weights, or by measured speed when none given."""
    worker_weights: dict[str, float] = field(default_factory=dict)
    """Relative speed of each named worker, e.g. worker2: 2.0 for a 2x faster machine."""
    training_nodes: tuple[WorkerSpec, ...] = ()
    """Extra hosts that join DDP training (node_rank 1, 2, ... in this order)."""
    master_addr: str | None = None
    """The main node's address as the training nodes see it; unset: the client end of the SSH
    connection to the first node."""
    accept_new_host_keys: bool = False
    """Record the key of a host not yet in known_hosts (explicit choice; a changed key is
    always refused)."""
    known_hosts: str = "~/.ssh/known_hosts"
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 60.0
    transfer_timeout_s: float = 120.0
    retries: int = 3
    """Attempts after the first for a failed connection or transfer (exponential backoff)."""
    backoff_base_s: float = 1.0
    backoff_max_s: float = 30.0
    keepalive_s: float = 5.0
    heartbeat_interval_s: float = 2.0
    """How often workers write their heartbeat."""
    offline_after_s: float = 15.0
    """A worker whose heartbeat is older than this, or that cannot be reached, is Offline."""
    deploy: bool = True
    """Install this project's exact version on each worker (off for hosts prepared by hand)."""
    remote_dir: str = "~/azgo"
    """Folder on the workers for the project, models, outbox and logs."""
    python: str = "python3"
    """Python on the workers (full path avoids slow login shells)."""
    stop_grace_s: float = 10.0
    """Seconds between SIGTERM and SIGKILL when stopping a worker."""
    max_outbox_batches: int = 50
    """A worker pauses self-play when this many batches wait uncollected."""
    partial_batch_interval_s: float = 5.0
    """After a batch of fewer than batch_size games, the coach takes that worker's next batch
    no sooner than this (at most batch_max_wait_s, so an honest worker never waits); the
    rest wait in its outbox. Bounds what one-game batches sent as fast as possible cost."""
    max_rejected_batches: int = 20
    """Files the coach may reject from one worker (bad batches, junk, links, foreign names)
    before it stops collecting from it and shows it as Error with the reason."""
    poll_interval_s: float = 2.0
    """How often the coach polls workers for heartbeats and batches."""

    def __post_init__(self) -> None:
        _range(self, "compression_level", 1, 22)
        _range(self, "batch_size", 1, 100_000)
        _range(self, "sync_interval", 1, 10**9)
        _range(self, "batch_max_wait_s", 0.0, 86_400.0)
        for name in (
            "connect_timeout_s",
            "command_timeout_s",
            "transfer_timeout_s",
            "backoff_base_s",
            "backoff_max_s",
            "keepalive_s",
            "heartbeat_interval_s",
            "offline_after_s",
            "stop_grace_s",
            "poll_interval_s",
        ):
            _range(self, name, 0.01, 86400.0)
        _range(self, "retries", 0, 100)
        _range(self, "max_outbox_batches", 1, 10**6)
        _range(self, "max_rejected_batches", 1, 10**6)
        _range(self, "partial_batch_interval_s", 0.0, 3600.0)
        for name, weight in self.worker_weights.items():
            _check(
                isinstance(weight, (int, float)) and weight > 0 and math.isfinite(weight),
                f"worker_weights.{name}",
                f"must be a number > 0, got {weight!r}",
            )


@dataclass(frozen=True)
class LoggingConfig:
    level: str = "INFO"
    dir: str = "logs"
    """Folder of distributed_training.log and worker_<name>.log."""
    tensorboard: bool = False
    """Also write each generation's metrics as TensorBoard scalars to <run.dir>/tensorboard
    (needs `pip install tensorboard`)."""

    def __post_init__(self) -> None:
        _choice(self, "level", ("DEBUG", "INFO", "WARNING", "ERROR"))


@dataclass(frozen=True)
class RunConfig:
    dir: str = "runs/main"
    """Run folder on the main node: models, games, replay window, metrics, checkpoints."""
    iterations: int = 0
    """Stop after this many new generations (0 = run until stopped; --iterations)."""
    hours: float = 0.0
    """Stop once the run has run this many hours (0 = no limit; --hours). The hours of the
    coaches before a resume count, and those of the run a --from-run run goes on from. With
    it, training.lr_schedule_by_time places the LR drops."""
    seed: int = 0
    """Base seed; each worker and rank derives its own from it."""

    def __post_init__(self) -> None:
        _range(self, "iterations", 0, 10**9)
        _range(self, "hours", 0.0, 10**6)
        _range(self, "seed", 0, 2**31 - 1)


@dataclass(frozen=True)
class Config:
    go: GoConfig = field(default_factory=GoConfig)
    net: NetConfig = field(default_factory=NetConfig)
    mcts: MctsConfig = field(default_factory=MctsConfig)
    self_play: SelfPlayConfig = field(default_factory=SelfPlayConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        names = [w.name for w in self.distributed.workers + self.distributed.training_nodes]
        for i, name in enumerate(names):
            _check(
                name not in names[:i],
                "distributed.workers",
                f"worker names must be unique, {name!r} appears twice",
            )
        _check(self.training.mode == "rounds" or not self.distributed.training_nodes,
               "training.mode",
               "continuous runs one trainer on the main node and does not take "
               "distributed.training_nodes yet: set training.mode: rounds to train with "
               "training nodes, or empty distributed.training_nodes")
        known = {w.name for w in self.distributed.workers}
        for name in self.distributed.worker_weights:
            _check(
                name in known,
                f"distributed.worker_weights.{name}",
                f"names no worker; workers are: {', '.join(sorted(known)) or '(none)'}",
            )
