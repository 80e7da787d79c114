"""Search processes through one net server, the CPU ceiling, and the net-only limit on a GPU.

    python3 benchmarks/gpu_ceiling.py --cpu-only [--quick]     # the rehearsal, 2 cores: ~2-3 min
    python3 benchmarks/gpu_ceiling.py [--out DIR]              # on a GPU box: < 9 minutes

Self-play is that of `--config` (configs/gpu.yaml: 9x9, 256 games and batch 256 a process,
Gumbel 100/25 simulations with playout caps, history 8 and liberty planes). Phases, each
appending one JSON line to OUT/ceiling.jsonl as it ends (a run cut short keeps what it
finished; OUT is `--out`, else $OUT, else benchmarks/out/gpu_ceiling_<time>):

- `leaf` (CPU ceiling): one process with an instant stand-in net (fixed priors and values,
  no compute): moves/s, leaves a move and `leaf_cpu_us`, the process's CPU time per leaf.
- `latency`: a stand-in net that sleeps `--latency-ms` a call whatever the batch (like a
  launch-bound GPU, without computing) behind one net server (`training.serve`), with 1,
  then 2, then 1 search processes again (`training.search_processes`; the two windows of one
  averaged, so a drift of the machine's speed counts alike): moves/s and the server's mean
  batch of each. On 2 cores two processes should give about twice the moves/s and twice the mean
  batch of one: the CPU is not the bottleneck, so the figure holds on a shared machine.
  Then `--latency-no-wait` (4) processes through a server without a gather wait:
  `no_wait_moves_ratio` is their moves/s over the two processes' in lockstep; then the
  same with `--lanes` (2) batches in the net at once, without and with the gather wait:
  `lanes_no_wait_moves_ratio` and `lanes_wait_moves_ratio`, over one lane without a wait.
  (The stand-in sleeps, so two lanes' calls overlap fully: an upper bound for a GPU, whose
  two batches share its units.)
- `cpu_choice` (`--cpu-only`): `--choice-config` (configs/config.yaml) self-play with its
  real net, 2 processes each with its own net against 2 search processes through one
  server on the CPU: the figure behind `self_play.net_server: auto` (off on a CPU).
On a GPU box (without `--cpu-only`) instead of `cpu_choice`:
- `net_limit`: the config's net alone in bf16 (`BucketEvaluator`) with and without CUDA
  graphs at batches 256 to 4096, uint8 planes copied in from pinned memory: positions/s.
- `ceiling_all`: the instant-net ceiling with every core running a process at once.
- `served`: `--served` (4 and 14) search processes through one server with the config's
  net (random weights) in bf16 with CUDA graphs: moves/s, positions/s, mean batch; then
  `--served-no-wait` (28) through one without a gather wait (`self_play.gather_wait_ms: 0`);
  each with one lane and with `--lanes` (2, `self_play.server_lanes`: batches in the net at
  once; a lane waits to gather only while another's batch is in the net).
  A server's clients step in lockstep when it waits for all of them: their searches and its
  net call take turns. With more processes than cores and no wait, some search while the
  net runs for the others (on 2 cores, a 3 ms stand-in: 4 processes at 0 ms gave 1.65x and
  1.82x the moves/s of 2 at 10 ms).
- `trainer` (also with `--cpu-only`, one short run): the real trainer (`python -m
  training.trainer` on synthetic samples of the config's net, its mixed precision) by total
  batch (`--train-batches`): the median step and samples/s alone, and at the config's batch
  beside the load of a self-play box (4 processes running the net in bf16, each its own CUDA
  context, and a niced busy loop on every other core): can the trainer keep
  `training.samples_per_new_sample` at the pace the box plays?

On a GPU the phases that need it run first (net_limit, trainer, served), then the CPU's
(leaf, latency, ceiling_all). Every phase checks the time left (`--budget-s`, 540 s) and is
skipped when it would not fit; the times it assumes are those measured on an H200 box.
The last line printed is one JSON object: `leaf_cpu_us`, `moves_per_s` and `mean_batch` by
search processes (latency stand-in), the ratios of two processes to one, and the other
phases' figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class FixedNet:
    """An instant stand-in net: slices of fixed peaked priors and fixed values."""

    def __init__(self, moves: int, size: int = 4096):
        rng = np.random.default_rng(0)
        logits = rng.normal(0, 2, moves)
        p = np.exp(logits - logits.max())
        self.priors = np.tile((p / p.sum()).astype(np.float32), (size, 1))
        self.values = rng.uniform(-0.3, 0.3, size).astype(np.float32)
        self.calls = 0
        self.positions = 0

    def __call__(self, planes, legal):
        b = len(planes)
        self.calls += 1
        self.positions += b
        return self.priors[:b], self.values[:b]


def _cfg(path: str):
    from configs import load_config

    return load_config(path)


# ------------------------------------------------------------------ child processes


def child_main(args: argparse.Namespace) -> None:
    """One self-play process (`--child fixed` or `own`): JSON of its window on stdout."""
    from training.search.selfplay import SelfPlay

    cfg = _cfg(args.config)
    moves = cfg.go.board_size ** 2 + 1
    if args.child == "fixed":
        evaluate = FixedNet(moves)
    else:
        import torch

        from training.learn.net import make_evaluator, net_from_config

        torch.set_num_threads(1)
        torch.manual_seed(0)
        evaluate = make_evaluator(net_from_config(cfg.net, cfg.go.board_size), "cpu",
                                  jit=cfg.net.inference, max_batch=cfg.self_play.batch_size)
    counted = {"calls": 0, "positions": 0}

    def counting(planes, legal):
        counted["calls"] += 1
        counted["positions"] += len(planes)
        return evaluate(planes, legal)

    warm = replace(cfg.self_play, parallel_games=2, batch_size=2)
    # compact planes, as the worker's self-play sends them
    SelfPlay(counting, cfg.go, replace(cfg.mcts, simulations=2, fast_simulations=1), warm,
             history=cfg.net.history, liberties=cfg.net.liberties, planes_dtype="uint8").step()
    sp = SelfPlay(counting, cfg.go, cfg.mcts, cfg.self_play, history=cfg.net.history,
                  liberties=cfg.net.liberties, seed=args.child_seed, planes_dtype="uint8")
    sp.step()  # the first step has the fresh roots' extra evaluations
    counted.update(calls=0, positions=0)
    moves0, cpu0, t0 = sp.moves_played, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        sp.step()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    n = counted["positions"]
    played = sp.moves_played - moves0
    print(json.dumps({"moves_per_s": played / wall, "leaves_per_move": n / max(played, 1),
                      "leaf_cpu_us": cpu / max(n, 1) * 1e6, "cpu_share": cpu / wall,
                      "mean_batch": n / max(counted["calls"], 1), "seconds": wall}))


def run_children(args: argparse.Namespace, kind: str, processes: int, seconds: float,
                 config: str) -> list[dict]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--config", config,
           "--seconds", str(seconds)]
    procs = [subprocess.Popen(cmd + ["--child-seed", str(i)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO) for i in range(processes)]
    out = []
    for p in procs:
        text, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"a {kind} self-play child exited with code {p.returncode}")
        out.append(json.loads(text.strip().splitlines()[-1]))
    return out


# -------------------------------------------------------------------- served self-play


def served(cfg, server, processes: int, seconds: float, warm_timeout_s: float = 240) -> dict:
    """moves/s (summed over the search processes) and the server's mean batch while
    `processes` search processes play through `server` for `seconds` after warming up."""
    from training.search.net_server import positions_of
    from training.search_processes import SearchProcesses

    pool = SearchProcesses(cfg, server, processes=processes, seed=11)
    try:
        deadline = time.monotonic() + warm_timeout_s
        while not all(s.get("moves", 0) > 0 for s in pool.child_stats()):
            pool.step()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{processes} search processes did not play a move in "
                                   f"{warm_timeout_s:.0f}s")
        first = pool.child_stats()
        b0, p0 = positions_of(server.slots)
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            pool.step()
        last = pool.child_stats()
        b1, p1 = positions_of(server.slots)
        wall = time.monotonic() - t0
        rates = [(b["moves"] - a["moves"]) / max(b["seconds"] - a["seconds"], 1e-9)
                 for a, b in zip(first, last)]
        leaves = sum(b["positions"] - a["positions"] for a, b in zip(first, last))
        moves = sum(b["moves"] - a["moves"] for a, b in zip(first, last))
        return {"processes": processes, "moves_per_s": sum(rates),
                "positions_per_s": (p1 - p0) / wall, "mean_batch": (p1 - p0) / max(b1 - b0, 1),
                "leaves_per_move": leaves / max(moves, 1), "seconds": wall}
    finally:
        pool.discard_unfinished()


@contextlib.contextmanager
def _serving(cfg, slots: int, **server_kw):
    """A started net server (`training.serve.ServerProcess`) with `slots` slots for `cfg`'s
    self-play, stopped on the way out."""
    from training.serve import ServerProcess

    server = ServerProcess(_layout(cfg, slots), **server_kw)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _layout(cfg, slots: int):
    from training.go.features import num_planes
    from training.search.net_server import SlotLayout

    return SlotLayout(slots, cfg.self_play.batch_size,
                      num_planes(cfg.net.history, cfg.net.liberties), cfg.go.board_size)


def _model_file(cfg, folder: Path) -> Path:
    import torch

    from training.learn.net import net_from_config, save_model

    torch.manual_seed(0)
    path = folder / "model_000000.pt"
    save_model(path, net_from_config(cfg.net, cfg.go.board_size), generation=0)
    return path


# ----------------------------------------------------------------------- the phases


def phase_leaf(args) -> dict:
    one = run_children(args, "fixed", 1, args.window_s, args.config)[0]
    return {"phase": "leaf", **one}


def phase_latency(args) -> dict:
    cfg = _cfg(args.config)
    latency_s = args.latency_ms / 1000.0
    with _serving(cfg, 2, stand_in_latency_s=latency_s,
                  gather_wait_s=args.gather_wait_ms / 1000.0) as server:
        # 1, 2, 1: a machine whose speed drifts during the phase moves both alike
        before = served(cfg, server, 1, args.window_s / 2)
        two = served(cfg, server, 2, args.window_s)
        after = served(cfg, server, 1, args.window_s / 2)
    one = {k: (before[k] + after[k]) / 2 for k in before}
    one["processes"] = 1
    by = {"1": one, "2": two}
    extra = args.latency_no_wait
    # more processes than cores through a server that runs what is ready at once, with
    # one batch in the net at a time, then with `--lanes`; then with the gather wait and
    # `--lanes` (a lane waits only while another's batch is in the net)
    lanes_n = args.lanes
    runs = [(0.0, 1, "_no_wait")]
    if lanes_n > 1:
        runs += [(0.0, lanes_n, f"_no_wait_{lanes_n}_lanes"),
                 (args.gather_wait_ms / 1000.0, lanes_n, f"_{lanes_n}_lanes")]
    for wait_s, lanes, suffix in runs if extra else ():
        if time.monotonic() + args.window_s + 20 > args.deadline:
            continue
        with _serving(cfg, extra, stand_in_latency_s=latency_s, gather_wait_s=wait_s,
                      lanes=lanes) as server:
            by[f"{extra}{suffix}"] = served(cfg, server, extra, args.window_s)
    out = {"phase": "latency", "latency_ms": args.latency_ms, "by_processes": by,
           "moves_ratio": two["moves_per_s"] / max(one["moves_per_s"], 1e-9),
           "batch_ratio": two["mean_batch"] / max(one["mean_batch"], 1e-9)}
    if f"{extra}_no_wait" in by:
        out["no_wait_moves_ratio"] = (by[f"{extra}_no_wait"]["moves_per_s"]
                                      / max(two["moves_per_s"], 1e-9))
        base = by[f"{extra}_no_wait"]["moves_per_s"]  # the lanes over one lane, no wait
        for name, key in (("lanes_no_wait_moves_ratio", f"{extra}_no_wait_{lanes_n}_lanes"),
                          ("lanes_wait_moves_ratio", f"{extra}_{lanes_n}_lanes")):
            if key in by:
                out[name] = by[key]["moves_per_s"] / max(base, 1e-9)
    return out


def phase_cpu_choice(args) -> dict:
    cfg = _cfg(args.choice_config)
    own = run_children(args, "own", 2, args.window_s, args.choice_config)
    with tempfile.TemporaryDirectory() as tmp, _serving(
            cfg, 2, model=_model_file(cfg, Path(tmp)), jit=cfg.net.inference,
            dtype=cfg.net.inference_dtype) as server:
        two = served(cfg, server, 2, args.window_s)
    own_total = sum(c["moves_per_s"] for c in own)
    return {"phase": "cpu_choice", "config": args.choice_config,
            "own_nets_moves_per_s": own_total, "served_moves_per_s": two["moves_per_s"],
            "served_mean_batch": two["mean_batch"], "faster": "own nets"
            if own_total >= two["moves_per_s"] else "net server"}


def phase_net_limit(args) -> dict:
    import torch

    from training.learn.net import net_from_config
    from training.serve import BucketEvaluator

    cfg = _cfg(args.config)
    torch.manual_seed(0)
    net = net_from_config(cfg.net, cfg.go.board_size)
    rows = []
    c = _layout(cfg, 1).channels
    n = cfg.go.board_size
    rng = np.random.default_rng(0)
    for graphs in (True, False):
        form = BucketEvaluator(net, "cuda", dtype="auto", max_positions=max(args.batches),
                               graphs=graphs)
        for batch in args.batches:
            planes = (rng.random((batch, c, n, n)) < 0.3).astype(np.uint8)
            legal = np.ones((batch, n * n + 1), bool)
            for _ in range(3):
                form(planes, legal)
            best = 0.0
            for _ in range(3):
                k, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < 0.3:
                    form(planes, legal)
                    k += 1
                best = max(best, k * batch / (time.perf_counter() - t0))
            rows.append({"graphs": graphs, "dtype": str(form.dtype).removeprefix("torch."),
                         "batch": batch, "positions_per_s": best,
                         "ms_per_call": batch / best * 1000})
            _log(f"net_limit graphs={graphs} batch={batch}: {best:,.0f} positions/s")
        del form
        torch.cuda.empty_cache()
    return {"phase": "net_limit", "rows": rows,
            "limit_positions_per_s": max(r["positions_per_s"] for r in rows)}


def phase_ceiling_all(args) -> dict:
    cores = os.cpu_count() or 1
    rows = run_children(args, "fixed", cores, args.window_s, args.config)
    return {"phase": "ceiling_all", "processes": cores,
            "moves_per_s": sum(r["moves_per_s"] for r in rows),
            "leaf_cpu_us": float(np.mean([r["leaf_cpu_us"] for r in rows]))}


def phase_served(args) -> dict:
    """`--served` search processes through one server at `--gather-wait-ms` (keyed "<n>"),
    then `--served-no-wait` through one that runs what is ready at once ("<n>_no_wait");
    each with one lane and with `--lanes` ("<n>_<lanes>_lanes", "<n>_no_wait_<lanes>_lanes")."""
    cfg = _cfg(args.config)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = _model_file(cfg, Path(tmp))
        runs = [(counts, wait_ms, lanes, suffix + (f"_{lanes}_lanes" if lanes > 1 else ""))
                for counts, wait_ms, suffix in ((args.served, args.gather_wait_ms, ""),
                                                (args.served_no_wait, 0.0, "_no_wait"))
                for lanes in sorted({1, args.lanes})]
        for counts, wait_ms, lanes, suffix in runs:
            if not counts:
                continue
            with _serving(cfg, max(counts), model=model, device="cuda:0", dtype="auto",
                          graphs="auto", gather_wait_s=wait_ms / 1000.0,
                          lanes=lanes) as server:
                for p in counts:
                    if time.monotonic() + args.window_s + 30 > args.deadline:
                        _log(f"served {p}{suffix}: skipped, out of time")
                        continue
                    out[f"{p}{suffix}"] = served(cfg, server, p, args.window_s)
                    _log(f"served {p}{suffix}: {out[f'{p}{suffix}']}")
    return {"phase": "served", "by_processes": out}


_NET_LOAD = """
import os, sys, torch
os.nice(10)
from configs import load_config
from training.go.features import num_planes
from training.learn.net import net_from_config
cfg = load_config(sys.argv[1])
net = net_from_config(cfg.net, cfg.go.board_size).to("cuda").eval()
x = torch.randn(1024, num_planes(cfg.net.history, cfg.net.liberties), cfg.go.board_size,
                cfg.go.board_size, device="cuda")
with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    while True:
        net(x)
        torch.cuda.synchronize()
"""
_BUSY = "import os\nos.nice(10)\nwhile True:\n    pass\n"


def phase_trainer(args) -> dict:
    """The trainer's samples/s by total batch, alone, and at the config's batch beside a
    self-play box's load (GPU); on the CPU one short run at the config's batch."""
    try:
        from benchmarks.train import run_trainer
    except ModuleNotFoundError:  # run as a script without the repository on the path
        from train import run_trainer  # its sibling, benchmarks/train.py
    from configs import dump_config, override
    from training.learn.samples import config_samples

    cfg = _cfg(args.config)
    own = cfg.training.batch_size
    if args.cpu_only:
        runs, steps = [(own, False)], 4
    else:
        runs = [(b, False) for b in args.train_batches] + [(own, True)]
        steps = args.train_steps
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for batch, beside in runs:
            run_cfg = override(cfg, {"training.batch_size": batch, "training.warmup_steps": 0,
                                     "replay.validation_fraction": 0.0})
            cfg_path = tmp / f"config_{batch}.yaml"
            cfg_path.write_text(dump_config(run_cfg))
            samples = tmp / f"samples_{batch}.npz"
            if not samples.exists():
                config_samples(run_cfg, max(8 * batch, 2048)).save(samples)
            load = []
            try:
                if beside:
                    load = [subprocess.Popen([sys.executable, "-c", _NET_LOAD, str(cfg_path)],
                                             cwd=REPO) for _ in range(4)]
                    load += [subprocess.Popen([sys.executable, "-c", _BUSY])
                             for _ in range(max(0, (os.cpu_count() or 1) - 2))]
                    time.sleep(8)  # the net processes' CUDA contexts up and running
                summary = run_trainer([sys.executable, "-m", "training.trainer"], cfg_path,
                                      tmp / f"run_{batch}_{beside}", samples, steps + 3, [])
                seconds = summary["step_seconds"][3:]  # the first 3: warming up
            finally:
                for p in load:
                    p.kill()
                    p.wait()
            step = float(np.median(seconds))
            rows.append({"batch": batch, "beside_selfplay_load": beside,
                         "median_step_ms": step * 1000, "samples_per_s": batch / step})
            _log(f"trainer batch={batch}{' beside load' if beside else ''}: "
                 f"{step * 1000:.1f} ms a step, {batch / step:,.0f} samples/s")
    mine = [r for r in rows if r["batch"] == own]
    return {"phase": "trainer", "rows": rows, "config_batch": own,
            "samples_per_s": mine[-1]["samples_per_s"]}


# ------------------------------------------------------------------------------ main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpu-only", action="store_true", help="the rehearsal: no GPU phases")
    p.add_argument("--quick", action="store_true", help="shorter windows (~2 min on 2 cores)")
    p.add_argument("--config", default=str(REPO / "configs" / "gpu.yaml"))
    p.add_argument("--choice-config", default=str(REPO / "configs" / "config.yaml"))
    p.add_argument("--latency-ms", type=float, default=3.0)
    p.add_argument("--gather-wait-ms", type=float, default=10.0,
                   help="the server's wait for every search process's request")
    p.add_argument("--seconds", type=float, default=None, help="each phase's timed window")
    p.add_argument("--batches", type=int, nargs="+", default=[256, 1024, 2048, 4096])
    p.add_argument("--served", type=int, nargs="+", default=[4, 14])
    p.add_argument("--latency-no-wait", type=int, default=4,
                   help="latency phase: then this many search processes through a server "
                   "without a gather wait (0: not run)")
    p.add_argument("--served-no-wait", type=int, nargs="*", default=[28],
                   help="served phase: search processes through a server without a gather "
                   "wait (more processes than cores: the net runs while others search)")
    p.add_argument("--lanes", type=int, default=2,
                   help="latency and served phases: the no-wait servers again with this many "
                   "lanes (batches in the net at once; 1: not run)")
    p.add_argument("--train-batches", type=int, nargs="+", default=[256, 1024, 2048],
                   help="trainer phase: total batches timed alone (GPU)")
    p.add_argument("--train-steps", type=int, default=40,
                   help="trainer phase: timed steps a run (after 3 left out)")
    p.add_argument("--budget-s", type=float, default=540.0)
    p.add_argument("--phases", nargs="+", default=None,
                   help="run only these phases (warm, leaf, latency, cpu_choice, net_limit, "
                   "ceiling_all, served)")
    p.add_argument("--out", default=None)
    p.add_argument("--child", choices=("fixed", "own"), help=argparse.SUPPRESS)
    p.add_argument("--child-seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.seconds is None:
        args.seconds = 6.0 if args.quick else 15.0
    args.window_s = args.seconds
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child_main(args)
        return 0
    started = time.monotonic()
    args.deadline = started + args.budget_s
    out = Path(args.out or os.environ.get("OUT") or
               REPO / "benchmarks" / "out" / f"gpu_ceiling_{time.strftime('%Y%m%d_%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "ceiling.jsonl"
    # (name, function, seconds it needs: what each took on an H200 box, 16 cores, 15 s
    # windows, with some margin; warm is numba's compile, 33 s there the first time)
    cpu_phases = [("leaf", phase_leaf, 25),
                  ("latency", phase_latency, 60 + 3 * args.window_s)]
    if args.cpu_only:
        phases = [("warm", None, 40), *cpu_phases, ("cpu_choice", phase_cpu_choice, 60),
                  ("trainer", phase_trainer, 60)]
    else:
        phases = [("warm", None, 40), ("net_limit", phase_net_limit, 20),
                  ("trainer", phase_trainer, 20 + 15 * (len(args.train_batches) + 1)),
                  ("served", phase_served, 30 + 2 * (len(args.served)
                                                     + len(args.served_no_wait))
                   * (args.window_s + 10)),
                  *cpu_phases, ("ceiling_all", phase_ceiling_all, args.window_s + 10)]
    results: dict[str, dict] = {}
    for name, fn, needs_s in phases:
        if args.phases and name not in args.phases:
            continue
        if time.monotonic() + needs_s > args.deadline:
            _log(f"{name}: skipped, {args.deadline - time.monotonic():.0f}s left")
            continue
        t0 = time.monotonic()
        _log(f"{name} ...")
        try:
            if fn is None:  # numba's cache, once, before processes load it side by side
                run_children(args, "fixed", 1, 0.5, args.config)
                row = {"phase": "warm"}
            else:
                row = fn(args)
        except Exception as e:  # noqa: BLE001 - a failed phase is a row; the next ones run
            row = {"phase": name, "error": f"{type(e).__name__}: {e}"}
        row["phase_s"] = round(time.monotonic() - t0, 1)
        results[name] = row
        with open(jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
        _log(json.dumps(row))
    lat = results.get("latency", {})
    trainer = results.get("trainer", {})
    by = lat.get("by_processes", {})
    summary = {
        "leaf_cpu_us": results.get("leaf", {}).get("leaf_cpu_us"),
        "instant_moves_per_s_per_core": results.get("leaf", {}).get("moves_per_s"),
        "latency_ms": args.latency_ms,
        "moves_per_s": {k: v["moves_per_s"] for k, v in by.items()},
        "mean_batch": {k: v["mean_batch"] for k, v in by.items()},
        "moves_ratio": lat.get("moves_ratio"), "batch_ratio": lat.get("batch_ratio"),
        "no_wait_moves_ratio": lat.get("no_wait_moves_ratio"),
        "lanes_no_wait_moves_ratio": lat.get("lanes_no_wait_moves_ratio"),
        "lanes_wait_moves_ratio": lat.get("lanes_wait_moves_ratio"),
        "cpu_choice": results.get("cpu_choice"),
        "net_limit_positions_per_s": results.get("net_limit", {}).get("limit_positions_per_s"),
        "ceiling_all": results.get("ceiling_all"),
        "served": results.get("served", {}).get("by_processes"),
        "trainer_samples_per_s": trainer.get("samples_per_s"),
        "seconds": round(time.monotonic() - started, 1), "out": str(jsonl),
    }
    with open(jsonl, "a") as f:
        f.write(json.dumps({"phase": "summary", **summary}) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
