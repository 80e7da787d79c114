"""Self-play speed against the network-only limit, on this machine's CPU (or a GPU).

For each setting (board, net, simulations, games in flight) it measures, in one process:

- the limit: the same net's fastest inference here, a frozen TorchScript trace
  (`net.compile_for_inference(..., "trace")`), at its best batch size among --batches, in
  positions/s; divided by the simulations per move, that is the moves/s a search would reach
  if everything but the network were free;
- self-play: `SelfPlay` with `parallel_games` games and one network call per search step
  (the evaluator of `net.make_evaluator`, the one the workers use), timed over whole moves
  after a warm-up: moves/s, the share of the wall time spent outside evaluate()
  (search, rules, features, Python), and ratio = moves/s / limit, where the limit in moves/s
  is the positions/s limit over the mean simulations per move.

Each setting runs for each search in --searches: `puct` (AlphaZero), `gumbel` (Gumbel MuZero,
the same simulations) and `gumbel-pcr` / `puct-pcr` (playout cap randomization: a quarter of
the moves get the simulations, the rest a quarter of them), each against the same limit.

Then games per hour per core for 9x9 (moves/s * 3600 / moves per game, the game length
measured by the same random net at a few simulations with the same search): 1 process with 1
thread for every search, and for the first search 2 processes with 1 thread each (side by
side, one per core) and 1 process with 2 threads.

Nets have random weights (the speed does not depend on them; the game length a little).
Timings are only meaningful on a quiet machine: the figures of a busy one are lower.
The last line is one JSON object with `moves_per_s`, `limit_moves_per_s`, `ratio` and
`outside_net_share` for 9x9 at 100 simulations, and the other figures under `settings`
and `games_per_hour_per_core`.

`--liberties` times nets with the liberty planes (their features computed in every search);
`--form onnx` (or openvino, eager) runs the network, and its limit, in that inference form;
`--config configs/config.yaml` times one setting instead: that config's board, net (pooling,
liberties), search (PUCT or Gumbel, playout caps, fast simulations) and games in flight.

`--breakdown CONFIG` prints instead where a worker's self-play time goes (net, copies,
batching, search, features, moves and games, other) on that config's own self-play and
evaluator (`breakdown`), e.g. `--breakdown configs/gpu.yaml --device cuda` on a GPU.

Usage: python benchmarks/selfplay.py [--quick] [--seconds 15] [--sizes 9 7 19]
       [--searches puct gumbel gumbel-pcr] [--device cpu] [--no-processes] [--cache-stats]
       [--liberties] [--form trace] [--config configs/config.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from configs import GoConfig, MctsConfig, SelfPlayConfig
from numba import njit

from training.go.features import num_planes, write_planes
from training.learn.net import (
    INFERENCE_FORMS, PolicyValueNet, compile_for_inference, make_evaluator, resolve_device,
)
from training.search.selfplay import SelfPlay

HISTORY = 8
SEARCHES = ("puct", "gumbel", "gumbel-pcr", "puct-pcr")
PCR_FRACTION = 0.25


@dataclass(frozen=True)
class Setting:
    size: int
    blocks: int
    filters: int
    simulations: int
    parallel_games: int
    seconds: float
    search: str = "puct"
    liberties: bool = False  # 6 more input planes (net.liberties)
    global_pooling: bool = False
    fast: int = 0  # simulations of a fast search (playout caps); 0: a quarter of simulations
    full_fraction: float = PCR_FRACTION  # share of full searches with playout caps

    @property
    def name(self) -> str:
        return (f"{self.size}x{self.size} {self.blocks}x{self.filters} {self.simulations} sims "
                f"{self.search}")

    @property
    def fast_simulations(self) -> int:
        return self.fast or max(1, self.simulations // 4)

    def mcts_config(self) -> MctsConfig:
        """The search of this setting (see the module docstring)."""
        pcr = self.search.endswith("-pcr")
        return MctsConfig(
            simulations=self.simulations,
            algorithm="gumbel" if self.search.startswith("gumbel") else "puct",
            full_search_fraction=self.full_fraction if pcr else 1.0,
            fast_simulations=self.fast_simulations,
        )


def default_settings(seconds: float, quick: bool, sizes: list[int],
                     searches: tuple[str, ...] = ("puct",)) -> list[Setting]:
    table = {
        9: Setting(9, 6, 64, 100, 128, seconds),
        7: Setting(7, 6, 64, 100, 128, seconds / 2),
        # 19x19 with a larger net: fewer simulations and games, or one move takes minutes
        19: Setting(19, 10, 128, 32 if not quick else 16, 16, seconds / 2),
    }
    out = [replace(table[s], search=search) for s in sizes for search in searches]
    if quick:
        out = [replace(s, parallel_games=min(s.parallel_games, 64)) for s in out]
    return out


def config_setting(path: str, seconds: float) -> Setting:
    """The self-play of a config file: its board, net, search (PUCT or Gumbel, with or
    without playout caps), simulations and games in flight."""
    from configs import load_config

    cfg = load_config(path)
    if cfg.net.history != HISTORY:
        sys.exit(f"{path}: net.history {cfg.net.history}; this benchmark times history {HISTORY}")
    search = ("gumbel" if cfg.mcts.algorithm == "gumbel" else "puct") + (
        "-pcr" if cfg.mcts.full_search_fraction < 1 else "")
    return Setting(cfg.go.board_size, cfg.net.blocks, cfg.net.filters, cfg.mcts.simulations,
                   cfg.self_play.parallel_games, seconds, search, cfg.net.liberties,
                   cfg.net.global_pooling, cfg.mcts.fast_simulations,
                   cfg.mcts.full_search_fraction)


def make_net(s: Setting, device: torch.device) -> PolicyValueNet:
    torch.manual_seed(0)
    return PolicyValueNet(s.size, s.blocks, s.filters, HISTORY, 64, liberties=s.liberties,
                          global_pooling=s.global_pooling).to(device).eval()


def network_limit(
    fn, net: PolicyValueNet, device: torch.device, batches: list[int], window_s: float
) -> tuple[float, int]:
    """(best positions/s, its batch size) of the traced net `fn` over `batches`: the best of
    3 timed windows per batch size, so a moment of load elsewhere does not lower it."""
    best, best_batch = 0.0, batches[0]
    for batch in batches:
        x = torch.randn(batch, net.in_planes, net.board_size, net.board_size, device=device)
        with torch.inference_mode():
            for _ in range(3):
                fn(x)
            for _ in range(3):
                _sync(device)
                n, start = 0, time.perf_counter()
                while time.perf_counter() - start < window_s:
                    fn(x)
                    n += batch
                _sync(device)
                rate = n / (time.perf_counter() - start)
                if rate > best:
                    best, best_batch = rate, batch
    return best, best_batch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timed:
    """An evaluator that adds up the wall time spent inside it."""

    def __init__(self, evaluate):
        self.evaluate = evaluate
        self.seconds = 0.0
        self.positions = 0
        self.calls = 0

    def __call__(self, planes, legal):
        start = time.perf_counter()
        out = self.evaluate(planes, legal)
        self.seconds += time.perf_counter() - start
        self.positions += len(planes)
        self.calls += 1
        return out


def selfplay_speed(s: Setting, evaluate, seed: int = 0) -> dict:
    """Moves/s of SelfPlay, timed over whole moves of all games for at least s.seconds."""
    go = GoConfig(board_size=s.size, komi=7.5 if s.size >= 9 else 0.5)
    mcts = s.mcts_config()
    sp_cfg = SelfPlayConfig(
        parallel_games=s.parallel_games, batch_size=s.parallel_games, resign_threshold=-1.0
    )
    # warm-up on a small copy: numba cache load, the network's first calls at this batch size
    warm = replace(sp_cfg, parallel_games=2, batch_size=2)
    warm_mcts = replace(mcts, simulations=2, fast_simulations=1)
    SelfPlay(evaluate, go, warm_mcts, warm, history=HISTORY, liberties=s.liberties).step()
    evaluate(*_random_batch(s.parallel_games, s.size, s.liberties))
    timed = Timed(evaluate)
    sp = SelfPlay(timed, go, mcts, sp_cfg, history=HISTORY, liberties=s.liberties, seed=seed)
    start = time.perf_counter()
    while True:  # whole moves of every game, so the time per move is exact
        sp.step()
        elapsed = time.perf_counter() - start
        if elapsed >= s.seconds:
            break
    moves = sp.moves_played
    # With searches of different lengths (playout caps) step() ends with many searches half
    # done: count each as the share of its simulations done, or fast moves would be favoured
    tree = sp.mcts.tree
    done = float(np.sum(tree.sims_done / np.maximum(tree.sims_target, 1)))
    equivalent = moves + done
    cfg = s.mcts_config()
    f = cfg.full_search_fraction  # the expected simulations per move, not this window's draw
    sims_per_move = f * s.simulations + (1 - f) * cfg.fast_simulations
    return {
        "moves_per_s": equivalent / elapsed,
        "simulations_per_move": sims_per_move,
        "full_search_share": sp.full_searches / max(moves, 1),
        "outside_net_share": 1.0 - timed.seconds / elapsed,
        "evals_per_move": timed.positions / max(equivalent, 1),
        "mean_batch": timed.positions / max(timed.calls, 1),
        # the network's own speed inside self-play: compare with the limit (a gap here is
        # the machine, e.g. other processes, not the search)
        "net_positions_per_s_in_selfplay": timed.positions / max(timed.seconds, 1e-9),
        "seconds": elapsed,
        "moves": moves,
    }


def _random_batch(batch: int, size: int, liberties: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    c = num_planes(HISTORY, liberties)
    planes = (rng.random((batch, c, size, size)) < 0.3).astype(np.float32)
    return planes, np.ones((batch, size * size + 1), bool)


def game_length(s: Setting, evaluate, games: int) -> float:
    """Mean moves per game of the same net at 4 simulations with the setting's algorithm
    (game length, not speed)."""
    go = GoConfig(board_size=s.size, komi=7.5)
    sp_cfg = SelfPlayConfig(parallel_games=games, batch_size=games)
    mcts = replace(s.mcts_config(), simulations=4, full_search_fraction=1.0)
    sp = SelfPlay(evaluate, go, mcts, sp_cfg, history=HISTORY, liberties=s.liberties, seed=1)
    records = sp.play(max_games=games)
    return float(np.mean([r.num_moves for r in records]))


def child_main(args: argparse.Namespace) -> None:
    """One process of the games-per-hour figure: print moves/s as JSON."""
    torch.set_num_threads(args.threads)
    if args.config:
        s = replace(config_setting(args.config, args.seconds), parallel_games=args.parallel)
    else:
        s = Setting(9, 6, 64, 100, args.parallel, args.seconds, args.search, args.liberties)
    device = resolve_device(args.device)
    evaluate = make_evaluator(make_net(s, device), device, jit=args.form)
    print(json.dumps(selfplay_speed(s, evaluate, seed=args.child_seed)))


def run_children(args: argparse.Namespace, processes: int, threads: int, seconds: float,
                 search: str = "puct") -> float:
    """Total moves/s of `processes` side-by-side benchmark processes of `threads` threads."""
    cmd = [
        sys.executable, os.path.abspath(__file__), "--child", "--threads", str(threads),
        "--seconds", str(seconds), "--parallel", str(args.parallel), "--device", args.device,
        "--search", search, "--form", args.form, *(["--liberties"] if args.liberties else []),
        *(["--config", args.config] if args.config else []),
    ]
    procs = [
        subprocess.Popen(cmd + ["--child-seed", str(i)], stdout=subprocess.PIPE, text=True)
        for i in range(processes)
    ]
    total = 0.0
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"benchmark child process failed with exit code {p.returncode}")
        total += json.loads(out.strip().splitlines()[-1])["moves_per_s"]
    return total


def cache_stats(evaluate, seconds: float) -> dict:
    """How often a leaf's exact input planes were evaluated before in this run (any game):
    the most an evaluation cache could save, for the first 5 moves of the games and after
    (9x9, 100 simulations, 32 games, for at least `seconds`)."""
    seen: set[bytes] = set()
    counts = {"opening": [0, 0], "later": [0, 0]}
    phase = ["opening"]

    def counting(planes, legal):
        bucket = counts[phase[0]]
        for i in range(len(planes)):
            key = planes[i].tobytes()
            bucket[0] += key in seen
            bucket[1] += 1
            seen.add(key)
        return evaluate(planes, legal)

    go = GoConfig(board_size=9, komi=7.5)
    sp_cfg = SelfPlayConfig(parallel_games=32, batch_size=32, resign_threshold=-1.0)
    sp = SelfPlay(counting, go, MctsConfig(simulations=100), sp_cfg, history=HISTORY)
    start, moves = time.perf_counter(), 0
    while time.perf_counter() - start < seconds or moves < 6:
        phase[0] = "opening" if moves < 5 else "later"
        sp.step()
        moves += 1
    out = {f"{k}_hit_rate": round(h / max(n, 1), 4) for k, (h, n) in counts.items()}
    out["moves"] = moves
    return out


@njit(cache=False)
def _features_only(boards, games, history, out):
    """The input planes of `games` (root boards): what a leaf's features cost, alone."""
    for i in range(games.shape[0]):
        write_planes(boards, games[i], history, out[i % out.shape[0]])


BREAKDOWN = ("net", "copies", "batching", "search", "features", "moves and games", "other")


def breakdown(path: str, seconds: float, device: torch.device, dtype: str | None = None
              ) -> dict:
    """Where one worker's self-play time goes, on a config's own self-play (its board, net,
    history, search, games in flight, `net.inference` form and `net.inference_dtype` (or
    `dtype`), the evaluator a worker builds), timed for `seconds` after a warm-up. Shares of
    the wall time:

    - net: the inference form's forward (the device synchronised around it);
    - copies: planes and legal masks to the device, the mask, softmax and priors back;
    - batching: gathering the leaves of a search step into network calls (`Mcts._evaluate`
      less the evaluator);
    - search: the numba select (descent, leaf position) and backup kernels, the leaf
      features taken out;
    - features: the leaf input planes, timed apart on as many positions (they are written
      inside the select kernel);
    - moves and games: `SelfPlay` playing the searched moves, resignations, finished games'
      records, new games and their searches' start;
    - other: the rest (Python of the step loop, timers).
    Waiting has no row: one process waits for nothing but its net; a worker's pauses (a full
    outbox) and model loads (`benchmarks/switch.py`) are the daemon's, and on a shared GPU
    the wait for the chip is inside `net`.
    """
    from configs import load_config
    from training.learn.net import net_from_config
    from training.search import mcts as mcts_module

    cfg = load_config(path)
    torch.manual_seed(0)
    net = net_from_config(cfg.net, cfg.go.board_size).eval()
    timings: dict[str, float] = {}
    evaluate = make_evaluator(net, device, jit=cfg.net.inference,
                              max_batch=cfg.self_play.batch_size,
                              dtype=dtype or cfg.net.inference_dtype, timings=timings)
    sums = dict.fromkeys(("select", "backup", "mcts_evaluate", "features", "moves"), 0.0)
    probe = {"out": None}

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                sums[name] += time.perf_counter() - t0
        return wrapper

    def play(cfg_sp):
        return SelfPlay(evaluate, cfg.go, cfg.mcts, cfg_sp, history=cfg.net.history,
                        liberties=cfg.net.liberties, seed=3)

    # warm-up: numba caches, the form's first calls at this batch size
    play(replace(cfg.self_play, parallel_games=2, batch_size=2)).step()
    sp = play(cfg.self_play)
    sp.step()
    timings.clear()
    originals = (mcts_module._select, mcts_module._expand_backup, mcts_module.Mcts._evaluate,
                 SelfPlay._start_searches, SelfPlay._play_searched)
    mcts_module._select = timed("select", originals[0])
    mcts_module._expand_backup = timed("backup", originals[1])
    mcts_module.Mcts._evaluate = timed("mcts_evaluate", originals[2])
    SelfPlay._start_searches = timed("moves", originals[3])
    SelfPlay._play_searched = timed("moves", originals[4])
    m = sp.mcts
    out = np.zeros((64, *m._planes.shape[1:]), np.float32)
    _features_only(m.boards, np.zeros(1, np.int64), cfg.net.history, out)  # compiles it
    leaves, calls0, moves0 = 0, m.net_calls, sp.moves_played
    try:
        start, apart = time.perf_counter(), 0.0
        while time.perf_counter() - start - apart < seconds:
            before = m.evaluations
            sp.step()
            n = m.evaluations - before
            leaves += n
            t0 = time.perf_counter()  # the features of as many positions, timed apart
            _features_only(m.boards, np.arange(n, dtype=np.int64) % m.n_games,
                           cfg.net.history, out)
            dt = time.perf_counter() - t0
            sums["features"] += dt
            apart += dt
        wall = time.perf_counter() - start - apart
    finally:
        (mcts_module._select, mcts_module._expand_backup, mcts_module.Mcts._evaluate,
         SelfPlay._start_searches, SelfPlay._play_searched) = originals
    in_evaluator = sum(timings.values())
    shares = {
        "net": timings.get("net", 0.0),
        "copies": timings.get("copy_in", 0.0) + timings.get("copy_out", 0.0),
        "batching": sums["mcts_evaluate"] - in_evaluator,
        "search": sums["select"] + sums["backup"] - sums["features"],
        "features": sums["features"],
        "moves and games": sums["moves"],
    }
    shares["other"] = wall - sum(shares.values())
    return {"config": path, "device": str(device), "form": evaluate.mode,
            "dtype": str(evaluate.dtype).removeprefix("torch."), "seconds": wall,
            "positions_per_s": leaves / wall, "moves_per_s": (sp.moves_played - moves0) / wall,
            "mean_batch": leaves / max(m.net_calls - calls0, 1),
            "shares": {k: v / wall for k, v in shares.items()}}


def print_breakdown(b: dict) -> None:
    print(f"{b['config']} on {b['device']} ({b['form']}, {b['dtype']}): "
          f"{b['positions_per_s']:.0f} net evaluations/s, {b['moves_per_s']:.1f} moves/s, "
          f"mean batch {b['mean_batch']:.0f}, {b['seconds']:.1f} s timed")
    print("| " + " | ".join(BREAKDOWN) + " |\n|" + "---|" * len(BREAKDOWN))
    print("| " + " | ".join(f"{b['shares'][k]:.1%}" for k in BREAKDOWN) + " |")
    print(json.dumps({**b, "shares": {k: round(v, 4) for k, v in b["shares"].items()}}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short timings (about a minute)")
    p.add_argument("--seconds", type=float, default=15.0, help="timed self-play per setting")
    p.add_argument("--sizes", type=int, nargs="+", default=[9, 7, 19], choices=[7, 9, 19])
    p.add_argument("--searches", nargs="+", default=["puct", "gumbel", "gumbel-pcr"],
                   choices=SEARCHES, help="searches to time at each size (the first is the "
                   "reference of the summary line)")
    p.add_argument("--batches", type=int, nargs="+", default=[32, 64, 128, 256])
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:0 ...")
    p.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    p.add_argument("--no-processes", action="store_true", help="skip the 2-process figure")
    p.add_argument(
        "--cache-stats", action="store_true", help="measure how often an evaluation cache hits"
    )
    p.add_argument("--config", default=None,
                   help="time one setting: this config's board, net, search and games in "
                   "flight (e.g. configs/config.yaml, the default run's self-play)")
    p.add_argument("--liberties", action="store_true",
                   help="nets with the 6 liberty planes (net.liberties), features included")
    p.add_argument("--form", default="trace", choices=list(INFERENCE_FORMS),
                   help="the network's inference form, in self-play and for the limit "
                   "(default trace: frozen TorchScript)")
    p.add_argument("--breakdown", default=None, metavar="CONFIG",
                   help="only print where a worker's self-play time goes for this config "
                   "(net, copies, batching, search, features, moves and games, other)")
    p.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"],
                   help="with --breakdown: the net's dtype instead of net.inference_dtype")
    p.add_argument("--parallel", type=int, default=128, help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--search", default="puct", choices=SEARCHES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child_main(args)
        return
    seconds = min(args.seconds, 8.0) if args.quick else args.seconds
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.breakdown:
        print_breakdown(breakdown(args.breakdown, seconds, device, args.dtype))
        return
    print(f"device={device} torch_threads={torch.get_num_threads()} cpus={os.cpu_count()} "
          f"form={args.form} liberties={args.liberties}")

    rows = []
    if args.config:
        settings = [config_setting(args.config, seconds)]
        args.searches = [settings[0].search]
    else:
        settings = [replace(s, liberties=args.liberties) for s in
                    default_settings(seconds, args.quick, args.sizes, tuple(args.searches))]
    for s in settings:
        net = make_net(s, device)
        fn = compile_for_inference(net, device, args.form)
        window = min(0.5, seconds / 16)
        # 19x19: a batch of 256 takes seconds on a CPU; self-play there uses far fewer games
        batches = [b for b in args.batches if b <= max(64, 2 * s.parallel_games)]
        limit, best_batch = network_limit(fn, net, device, batches or args.batches, window)
        evaluate = make_evaluator(net, device, jit=args.form)
        sp = selfplay_speed(s, evaluate)
        # once more after self-play, at the best batch size: the limit is the best seen
        limit = max(limit, network_limit(fn, net, device, [best_batch], window)[0])
        limit_moves = limit / sp["simulations_per_move"]
        row = {
            "setting": s.name,
            "size": s.size,
            "search": s.search,
            "simulations": s.simulations,
            "parallel_games": s.parallel_games,
            "limit_positions_per_s": limit,
            "limit_batch": best_batch,
            "limit_moves_per_s": limit_moves,
            "ratio": sp["moves_per_s"] / limit_moves,
            **sp,
        }
        rows.append(row)
        print(
            f"  {s.name:28s} games={s.parallel_games:4d}  net limit {limit:8.1f} pos/s "
            f"(batch {best_batch:3d}) = {limit_moves:7.2f} moves/s   self-play "
            f"{sp['moves_per_s']:7.2f} moves/s  ratio {row['ratio']:.2f}  outside net "
            f"{sp['outside_net_share']:.1%}  evals/move {sp['evals_per_move']:.1f}  batch "
            f"{sp['mean_batch']:.0f}  net inside "
            f"self-play {sp['net_positions_per_s_in_selfplay']:.1f} pos/s",
            flush=True,
        )

    per_core: dict[str, float] = {}
    by_search: dict[str, dict] = {}
    if 9 in args.sizes:
        print("\n9x9 games per hour per core (moves per game of the random net, same search):")
        for s9 in (s for s in settings if s.size == 9):
            nine = next(r for r in rows if r["size"] == 9 and r["search"] == s9.search)
            length = game_length(s9, make_evaluator(make_net(s9, device), device,
                                                    jit=args.form), 16)
            figures = {"moves_per_game": length,
                       "1_process_1_thread": nine["moves_per_s"] * 3600 / length}
            if s9.search == args.searches[0] and not args.no_processes and device.type == "cpu":
                child_s = seconds / 2
                args.parallel = nine["parallel_games"]
                two = run_children(args, 2, 1, child_s, s9.search)
                figures["2_processes_1_thread"] = two * 3600 / length / 2
                one_two = run_children(args, 1, 2, child_s, s9.search)
                figures["1_process_2_threads"] = one_two * 3600 / length / 2
            by_search[s9.search] = {"ratio": nine["ratio"], **figures}
            if s9.search == args.searches[0]:
                per_core = figures
            print(f"  {s9.search:12s} ({length:.0f} moves per game, ratio {nine['ratio']:.2f})"
                  + "".join(f"  {k} {v:.0f}" for k, v in figures.items()
                            if k != "moves_per_game"))

    extra = {}
    if args.cache_stats:
        net9 = make_net(Setting(9, 6, 64, 100, 64, seconds), device)
        extra["cache"] = cache_stats(make_evaluator(net9, device), seconds)
        print(f"\nevaluation cache: {extra['cache']}")

    print("\n| setting | games | sims/move | limit pos/s | limit moves/s | self-play moves/s | "
          "ratio | outside net |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['setting']} | {r['parallel_games']} | {r['simulations_per_move']:.1f} | "
            f"{r['limit_positions_per_s']:.0f} | {r['limit_moves_per_s']:.2f} | "
            f"{r['moves_per_s']:.2f} | {r['ratio']:.2f} | {r['outside_net_share']:.1%} |"
        )
    main_row = next((r for r in rows if r["size"] == 9), rows[0])
    print(json.dumps({
        "moves_per_s": round(main_row["moves_per_s"], 3),
        "limit_moves_per_s": round(main_row["limit_moves_per_s"], 3),
        "ratio": round(main_row["ratio"], 3),
        "outside_net_share": round(main_row["outside_net_share"], 4),
        "setting": main_row["setting"],
        "device": str(device),
        "form": args.form,
        "liberties": settings[0].liberties if args.config else args.liberties,
        "settings": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                     for r in rows],
        "games_per_hour_per_core": {k: round(v, 1) for k, v in per_core.items()},
        "searches": {name: {k: round(v, 3) for k, v in figs.items()}
                     for name, figs in by_search.items()},
        **extra,
    }))


if __name__ == "__main__":
    main()
