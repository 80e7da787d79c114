"""Training and inference throughput of the network on this machine.

Training (default): samples/s of real trainer rounds (`python -m training.trainer` on
synthetic samples, a 9x9 6-block 64-filter net (configs/gpu.yaml's) unless told otherwise)
for one process and for two DDP processes over Gloo on the CPU (torchrun, one thread each),
and, where CUDA is present, one GPU with and without mixed precision. Steady-state figures:
the first `--warmup-steps` steps of each run are left out. The last line is one JSON object
with `samples_per_s_1` and `samples_per_s_ddp2` (and `samples_per_s_gpu*` on a GPU). The
config's net (global pooling and the auxiliary heads, as set there) is compared in the same
run with the plain AlphaZero net on one thread (`samples_per_s_1_thread_plain`: no
pooling, policy and value heads only).

Beside self-play (`--beside-selfplay N`): samples/s of one trainer process alone, then with N
real self-play processes on the same cores (each in its own session, as local mode starts
them) at equal priority, then at `training.fleet.local_workers.WORKER_NICE` (`start_worker.py
--nice`). The JSON has `samples_per_s_alone`, `samples_per_s_beside_nice0` and
`samples_per_s_beside_niced`.

Cost of the net's options (`--heads-cost`): in one process and one thread, training steps of
the config's net (global pooling, auxiliary heads and their losses) and of the plain AlphaZero
net alternate, so that a busy machine slows both alike; the JSON has `samples_per_s_config`,
`samples_per_s_plain` and `inference_positions_per_s_{config,plain}` (batch 64, trace).

Inference (`--inference`): positions/s of `training.learn.net.make_evaluator` by batch size for
eager PyTorch, a frozen TorchScript trace, ONNX Runtime and OpenVINO (and torch.compile with
`--modes ... compile`), one thread; every form's output is checked against eager PyTorch on
the same batch first. The last line is a JSON object with every figure and the best form per
batch size.

Usage (after `pip install -e .`, which makes the project importable from anywhere):
    python benchmarks/train.py [--steps 30] [--batch-size 256] [--blocks 6 --filters 64]
    python benchmarks/train.py --beside-selfplay 2 --blocks 4 --filters 32 --steps 10
    python benchmarks/train.py --heads-cost --blocks 4 --filters 32 [--rounds 10]
    python benchmarks/train.py --inference [--batches 1 8 32 64 128] [--modes eager trace onnx]
Timings are only meaningful on a quiet machine (other processes take cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from configs import dump_config, load_config, override
from training.learn.net import INFERENCE_FORMS, PolicyValueNet, make_evaluator
from training.learn.samples import config_samples

REPO = Path(__file__).resolve().parent.parent


def _steady_samples_per_s(summary: dict, batch: int, warmup: int) -> float:
    times = summary["step_seconds"][warmup:] or summary["step_seconds"]
    return batch * len(times) / sum(times)


def run_trainer(cmd_prefix: list[str], cfg_path: Path, run_dir: Path, samples: Path,
                 steps: int, extra: list[str], env: dict | None = None) -> dict:
    cmd = [*cmd_prefix, "--config", str(cfg_path), "--run-dir", str(run_dir),
           "--samples", str(samples), "--steps", str(steps), "--checkpoint", "none",
           "--no-progress", "--log-level", "WARNING", *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


SELFPLAY_CHILD = """
import sys, torch
from configs import load_config
from training.learn.net import make_evaluator, net_from_config
from training.search.selfplay import SelfPlay
from training.worker import lower_priority
cfg, nice = load_config(sys.argv[1]), int(sys.argv[2])
if nice:
    lower_priority(nice)
torch.set_num_threads(1)
net = net_from_config(cfg.net, cfg.go.board_size).eval()
play = SelfPlay(make_evaluator(net, max_batch=cfg.self_play.batch_size), cfg.go, cfg.mcts,
                cfg.self_play, history=cfg.net.history)
print("ready", flush=True)
while True:
    play.step()
"""


def _start_selfplay(n: int, cfg_path: Path, nice: int) -> list[subprocess.Popen]:
    """n self-play processes, each in its own session like local-mode workers; returns once
    every one has compiled and started playing."""
    procs = [subprocess.Popen([sys.executable, "-c", SELFPLAY_CHILD, str(cfg_path), str(nice)],
                              cwd=REPO, stdout=subprocess.PIPE, text=True,
                              start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
             for _ in range(n)]
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError("a self-play process did not start")
    return procs


def bench_beside_selfplay(args: argparse.Namespace) -> dict:
    """One trainer alone, then beside N self-play processes at nice 0 and at WORKER_NICE."""
    from training.fleet.local_workers import WORKER_NICE

    cfg = override(load_config(args.config), {
        "go.board_size": args.board_size, "net.blocks": args.blocks,
        "net.filters": args.filters, "training.batch_size": args.batch_size,
        "training.warmup_steps": 0, "replay.validation_fraction": 0.0,
    })
    steps = args.steps + args.warmup_steps
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench_beside_") as tmp:
        tmp = Path(tmp)
        cfg_path = tmp / "config.yaml"
        cfg_path.write_text(dump_config(cfg))
        samples = tmp / "samples.npz"
        config_samples(cfg, max(args.batch_size * 8, 2048)).save(samples)
        trainer = [sys.executable, "-m", "training.trainer"]
        for key, nice in (("alone", None), ("beside_nice0", 0), ("beside_niced", WORKER_NICE)):
            procs = [] if nice is None else _start_selfplay(args.beside_selfplay, cfg_path, nice)
            try:
                summary = run_trainer(trainer, cfg_path, tmp / key, samples, steps, [],
                                       {"CUDA_VISIBLE_DEVICES": ""})
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
            rate = _steady_samples_per_s(summary, args.batch_size, args.warmup_steps)
            results[f"samples_per_s_{key}"] = rate
            print(f"  trainer {key}: {rate:,.0f} samples/s", file=sys.stderr)
    alone = results["samples_per_s_alone"]
    net = f"{cfg.go.board_size}x{cfg.go.board_size} {cfg.net.blocks}x{cfg.net.filters}"
    print(f"\nTrainer samples/s beside {args.beside_selfplay} self-play processes, {net} net, "
          f"batch {args.batch_size}, {os.cpu_count()} cores")
    for key, label in (("alone", "alone (baseline)"), ("beside_nice0", "beside, equal priority"),
                       ("beside_niced", f"beside, self-play at nice {WORKER_NICE}")):
        rate = results[f"samples_per_s_{key}"]
        print(f"  {label:<32} {rate:>8,.0f} samples/s  {rate / alone:5.2f}x of alone")
    return {"net": net, "batch_size": args.batch_size, "selfplay_processes":
            args.beside_selfplay, **{k: round(v, 1) for k, v in results.items()}}


def bench_training(args: argparse.Namespace) -> dict:
    cfg = load_config(args.config)
    cfg = override(cfg, {
        "go.board_size": args.board_size, "net.blocks": args.blocks,
        "net.filters": args.filters, "training.batch_size": args.batch_size,
        "training.warmup_steps": 0, "replay.validation_fraction": 0.0,
    })
    steps = args.steps + args.warmup_steps
    results: dict[str, float] = {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        tmp = Path(tmp)
        cfg_path = tmp / "config.yaml"
        cfg_path.write_text(dump_config(cfg))
        plain_path = tmp / "plain.yaml"
        plain_path.write_text(dump_config(override(cfg, {
            "net.global_pooling": False, "net.ownership_head": False, "net.score_head": False,
            "net.opponent_policy_head": False,
        })))
        samples = tmp / "samples.npz"
        count = max(args.batch_size * 8, 2048)
        config_samples(cfg, count).save(samples)
        one = [sys.executable, "-m", "training.trainer"]
        ddp2 = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node=2", "-m", "training.trainer"]
        cpu_env = {"CUDA_VISIBLE_DEVICES": ""}
        runs = [
            ("samples_per_s_1", "CPU, 1 process", one, [], {**cpu_env}),
            ("samples_per_s_1_thread", "CPU, 1 process, 1 thread", one, [],
             {**cpu_env, "OMP_NUM_THREADS": "1"}),
            ("samples_per_s_1_thread_plain", "CPU, 1 process, 1 thread, plain net", one, [],
             {**cpu_env, "OMP_NUM_THREADS": "1"}),
            ("samples_per_s_ddp2", "CPU, 2 DDP processes (gloo), 1 thread each", ddp2, [],
             {**cpu_env, "OMP_NUM_THREADS": "1"}),
        ]
        if torch.cuda.is_available():
            runs += [
                ("samples_per_s_gpu", "GPU, 1 process, float32", one, [], {}),
                ("samples_per_s_gpu_amp", "GPU, 1 process, mixed precision", one,
                 ["--mixed-precision"], {}),
            ]
            if torch.cuda.device_count() >= 2:
                runs.append(("samples_per_s_gpu_ddp2", "2 GPUs, DDP (nccl)", ddp2, [], {}))
        for key, label, prefix, extra, env in runs:
            t0 = time.perf_counter()
            path = plain_path if key.endswith("_plain") else cfg_path
            summary = run_trainer(prefix, path, tmp / key, samples, steps, extra, env)
            wall = time.perf_counter() - t0
            rate = _steady_samples_per_s(summary, args.batch_size, args.warmup_steps)
            results[key] = rate
            rows.append((label, rate, summary["loss"], wall))
            print(f"  {label}: {rate:,.0f} samples/s (run {wall:.1f}s)", file=sys.stderr)
    net = f"{cfg.go.board_size}x{cfg.go.board_size} {cfg.net.blocks}x{cfg.net.filters}"
    print(f"\nTraining throughput, {net} net, total batch {args.batch_size}, "
          f"{args.steps} timed steps after {args.warmup_steps} warm-up, cores {os.cpu_count()}")
    print(f"| {'run':<46} | {'samples/s':>10} | {'loss':>6} | {'wall s':>6} |")
    print(f"|{'-' * 48}|{'-' * 12}|{'-' * 8}|{'-' * 8}|")
    for label, rate, loss, wall in rows:
        print(f"| {label:<46} | {rate:>10,.0f} | {loss:>6.3f} | {wall:>6.1f} |")
    print(f"This config's net over the plain net (1 thread): "
          f"{results['samples_per_s_1_thread'] / results['samples_per_s_1_thread_plain']:.2f}x")
    if "samples_per_s_ddp2" in results:
        print(f"DDP speed-up over one process: "
              f"{results['samples_per_s_ddp2'] / results['samples_per_s_1']:.2f}x")
    return {"net": net, "batch_size": args.batch_size, "steps": args.steps, **{
        k: round(v, 1) for k, v in results.items()}}


def bench_heads_cost(args: argparse.Namespace) -> dict:
    """Training and inference speed of the config's net against the plain net, interleaved."""
    from training.learn.net import net_from_config
    from training.train.steps import loss_weights
    from training.train.steps import losses as _losses

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = override(load_config(args.config), {
        "go.board_size": args.board_size, "net.blocks": args.blocks,
        "net.filters": args.filters})
    plain_cfg = override(cfg, {"net.global_pooling": False, "net.ownership_head": False,
                               "net.score_head": False, "net.opponent_policy_head": False})
    nets = {"config": net_from_config(cfg.net, cfg.go.board_size).train(),
            "plain": net_from_config(plain_cfg.net, cfg.go.board_size).train()}
    data = config_samples(cfg, args.batch_size)
    batch = {k: torch.from_numpy(v) for k, v in data.samples(np.arange(len(data))).items()}
    weights = loss_weights(cfg.training)
    opts = {k: torch.optim.SGD(n.parameters(), lr=1e-3, momentum=0.9) for k, n in nets.items()}
    step_s: dict[str, list[float]] = {k: [] for k in nets}
    for _ in range(args.rounds):
        for key, net in nets.items():
            t0 = time.perf_counter()
            for _ in range(3):
                opts[key].zero_grad(set_to_none=True)
                p, v, _, aux = _losses(net, batch, None, "cpu")
                (p + v + sum(weights[k] * t for k, t in aux.items())).backward()
                opts[key].step()
            step_s[key].append((time.perf_counter() - t0) / 3)
    evaluators = {k: make_evaluator(n, "cpu") for k, n in nets.items()}
    planes = batch["planes"][:64].numpy()
    legal = np.ones((len(planes), planes.shape[-1] ** 2 + 1), bool)
    infer = {k: 0.0 for k in nets}
    for _ in range(args.rounds):
        for key, evaluate in evaluators.items():
            infer[key] = max(infer[key], _time_evaluator(evaluate, planes, legal, 0.1, 1))
    train = {k: args.batch_size / float(np.median(v)) for k, v in step_s.items()}
    print(f"\nThis config's net ({cfg.net}) against the plain net, 1 thread, interleaved "
          f"x{args.rounds}:")
    for key in nets:
        print(f"  {key:<7} training {train[key]:>7,.0f} samples/s   inference (batch 64, "
              f"{evaluators[key].mode}) {infer[key]:>7,.0f} positions/s")
    print(f"  ratio   training {train['config'] / train['plain']:.2f}x   inference "
          f"{infer['config'] / infer['plain']:.2f}x")
    return {"net": f"{cfg.go.board_size}x{cfg.go.board_size} {args.blocks}x{args.filters}",
            "batch_size": args.batch_size, "rounds": args.rounds,
            **{f"samples_per_s_{k}": round(v, 1) for k, v in train.items()},
            **{f"inference_positions_per_s_{k}": round(v) for k, v in infer.items()}}


def _time_evaluator(evaluate, planes: np.ndarray, legal: np.ndarray, min_time_s: float,
                    windows: int = 3) -> float:
    for _ in range(3):
        evaluate(planes, legal)
    best = 0.0
    for _ in range(windows):
        count, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < min_time_s:
            evaluate(planes, legal)
            count += len(planes)
        best = max(best, count / (time.perf_counter() - t0))
    return best


def bench_inference(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    net = PolicyValueNet(args.board_size, args.blocks, args.filters, args.history, 64,
                         global_pooling=args.global_pooling).eval()
    n, c = args.board_size, 2 * args.history + 1
    rng = np.random.default_rng(0)
    table: dict[str, dict[int, float]] = {}
    prep: dict[str, float] = {}
    errors: dict[str, float] = {}
    check = (rng.random((16, c, n, n)) < 0.3).astype(np.float32)
    reference = make_evaluator(net, "cpu", jit="eager")(check)
    for mode in args.modes:
        t0 = time.perf_counter()
        evaluate = make_evaluator(net, "cpu", jit=mode)
        if evaluate.mode != mode:
            sys.exit(f"{mode}: the form could not be built (see the warning above)")
        priors, values = evaluate(check)
        errors[mode] = float(max(np.abs(priors - reference[0]).max(),
                                 np.abs(values - reference[1]).max()))
        if errors[mode] > 1e-4:
            sys.exit(f"{mode}: outputs differ from eager PyTorch by {errors[mode]:.2g}")
        # compile builds one graph per padded batch size: count those builds as preparation
        for batch in args.batches if mode == "compile" else []:
            evaluate(np.zeros((batch, c, n, n), np.float32))
        prep[mode] = time.perf_counter() - t0
        table[mode] = {}
        for batch in args.batches:
            planes = (rng.random((batch, c, n, n)) < 0.3).astype(np.float32)
            legal = np.ones((batch, n * n + 1), bool)
            table[mode][batch] = _time_evaluator(evaluate, planes, legal, args.min_time_s)
            print(f"  {mode} batch {batch}: {table[mode][batch]:,.0f} positions/s",
                  file=sys.stderr)
    print(f"\nInference positions/s, {n}x{n} {args.blocks}x{args.filters} net"
          f"{' with global pooling' if args.global_pooling else ''}, "
          f"{args.threads} thread(s), make_evaluator (softmax over legal moves included)")
    head = "".join(f" | {b:>8}" for b in args.batches)
    print(f"| {'mode':<8}{head} | prep s | max error |")
    print(f"|{'-' * 10}" + f"|{'-' * 10}" * len(args.batches) + f"|{'-' * 8}|{'-' * 11}|")
    for mode in args.modes:
        cells = "".join(f" | {table[mode][b]:>8,.0f}" for b in args.batches)
        print(f"| {mode:<8}{cells} | {prep[mode]:>6.1f} | {errors[mode]:>9.1g} |")
    if "trace" in table:
        for mode in args.modes:
            ratios = "  ".join(f"{b}: {table[mode][b] / table['trace'][b]:.2f}x"
                               for b in args.batches)
            print(f"  {mode} / trace by batch: {ratios}")
    best = {b: max(args.modes, key=lambda m: table[m][b]) for b in args.batches}
    return {"net": f"{n}x{n} {args.blocks}x{args.filters}", "threads": args.threads,
            "positions_per_s": {m: {str(b): round(v) for b, v in t.items()}
                                for m, t in table.items()},
            "prep_s": {m: round(v, 2) for m, v in prep.items()},
            "max_error": errors,
            "best_mode": {str(b): m for b, m in best.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "configs" / "config.yaml"))
    ap.add_argument("--board-size", type=int, default=9)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--filters", type=int, default=64)
    ap.add_argument("--history", type=int, default=8, help="inference only (training: config)")
    ap.add_argument("--batch-size", type=int, default=256, help="training: total batch")
    ap.add_argument("--steps", type=int, default=20, help="training: timed steps per run")
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--inference", action="store_true", help="measure inference instead")
    ap.add_argument("--heads-cost", action="store_true",
                    help="the config's net against the plain net, interleaved in one process")
    ap.add_argument("--rounds", type=int, default=10, help="--heads-cost: alternations")
    ap.add_argument("--beside-selfplay", type=int, default=0, metavar="N",
                    help="trainer alone vs beside N self-play processes (nice 0, niced)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    ap.add_argument("--modes", nargs="+", default=["eager", "trace", "onnx", "openvino"],
                    choices=list(INFERENCE_FORMS))
    ap.add_argument("--threads", type=int, default=1, help="inference: torch threads")
    ap.add_argument("--global-pooling", action="store_true",
                    help="inference: a net with global pooling (training heads never run)")
    ap.add_argument("--min-time-s", type=float, default=0.5, help="inference: per window")
    args = ap.parse_args()
    if args.inference:
        summary = bench_inference(args)
    elif args.heads_cost:
        summary = bench_heads_cost(args)
    elif args.beside_selfplay:
        summary = bench_beside_selfplay(args)
    else:
        summary = bench_training(args)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
