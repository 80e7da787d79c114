"""CPU time per leaf of self-play's search with an instant stand-in net, against another commit.

    python3 benchmarks/leaf_cpu.py                     # this tree: gpu.yaml and config.yaml
    python3 benchmarks/leaf_cpu.py --against 29b8553^  # and that commit, in the same run

The net is a stand-in that returns fixed priors and values at once, so what is timed is the
search alone: walking the trees, playing the leaves' moves, their legal moves and input
planes, expanding and backing up, and the Python around them. Each measurement is a child
process: self-play of the config (its games, simulations, playout caps, history and liberty
planes; uint8 planes where the code has them, as the worker sends them), `--warmup` steps,
then `--chunks` windows of `--chunk-steps` steps, each giving the process's CPU time over the
leaves evaluated in it; the child reports the median window. With `--against REV`, REV's
tracked files are unpacked once into $TMPDIR/azgo-leaf-<commit> (its numba cache is kept
there; each tree reads its own copy of the config) and the two trees are measured in turn,
this tree first, `--rounds` times, so a drift of the machine's speed falls on both. Expect
about 2 minutes per child, plus numba's first compile of a tree. Time it on a quiet machine.

Prints one line per child and one JSON object last: per config, the medians over rounds
(`after`: this tree; `before`: REV) and `ratio` = before / after.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def child(args: argparse.Namespace) -> None:
    """One measurement of the tree first on this process's PYTHONPATH: one JSON line on
    stdout."""
    import numpy as np

    from configs import load_config
    from training.search.selfplay import SelfPlay

    from gpu_ceiling import FixedNet  # this script's folder, whichever tree is measured

    cfg = load_config(args.config)
    evaluate = FixedNet(cfg.go.board_size ** 2 + 1)
    kwargs = {"history": cfg.net.history, "seed": 1,
              "liberties": getattr(cfg.net, "liberties", False)}
    if "planes_dtype" in inspect.signature(SelfPlay).parameters:
        kwargs["planes_dtype"] = "uint8"
    sp = SelfPlay(evaluate, cfg.go, cfg.mcts, cfg.self_play, **kwargs)
    for _ in range(args.warmup):
        sp.step()
    windows = []
    for _ in range(args.chunks):
        leaves0, cpu0 = sp.mcts.evaluations, time.process_time()
        for _ in range(args.chunk_steps):
            sp.step()
        windows.append(1e6 * (time.process_time() - cpu0) / max(sp.mcts.evaluations - leaves0, 1))
    print(json.dumps({"leaf_cpu_us": float(np.median(windows)), "min_us": min(windows),
                      "planes": kwargs.get("planes_dtype", "float32")}))


def unpack(rev: str) -> Path:
    """REV's tracked files in a kept folder named by its commit."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", rev + "^{commit}"],
                            capture_output=True, text=True)
    if commit.returncode:
        sys.exit(f"leaf_cpu: --against {rev!r} is not a commit of {REPO}: "
                 f"{commit.stderr.strip()}")
    sha = commit.stdout.strip()
    tree = Path(tempfile.gettempdir()) / f"azgo-leaf-{sha[:12]}"
    if not (tree / "training").is_dir():
        part = Path(tempfile.mkdtemp(prefix=tree.name + ".", dir=tree.parent))
        archive = subprocess.Popen(["git", "-C", str(REPO), "archive", sha],
                                   stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(part)], stdin=archive.stdout, check=True)
        if archive.wait():
            sys.exit(f"leaf_cpu: git archive {sha} failed")
        os.rename(part, tree)
    return tree


def measure(args: argparse.Namespace, tree: Path, config: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child",
           "--config", config, "--warmup", str(args.warmup), "--chunks", str(args.chunks),
           "--chunk-steps", str(args.chunk_steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tree))
    if out.returncode:
        sys.exit(f"leaf_cpu: the child in {tree} on {config} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", default=None, metavar="REV",
                    help="a commit to measure in the same run (e.g. the code before a change)")
    ap.add_argument("--configs", nargs="+",
                    default=["configs/gpu.yaml", "configs/config.yaml"])
    ap.add_argument("--rounds", type=int, default=2, help="measurements of each tree per config")
    ap.add_argument("--warmup", type=int, default=150, help="steps before the timed windows")
    ap.add_argument("--chunks", type=int, default=12, help="timed windows; the median is kept")
    ap.add_argument("--chunk-steps", type=int, default=10, help="steps per timed window")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    trees = {"after": REPO}
    if args.against:
        trees["before"] = unpack(args.against)
    result: dict = {}
    for config in args.configs:
        for tree in trees.values():
            if not (tree / config).is_file():
                sys.exit(f"leaf_cpu: no config file {tree / config} (give --configs as paths "
                         f"inside the repository)")
        runs: dict = {name: [] for name in trees}
        for r in range(args.rounds):
            for name, tree in trees.items():
                row = measure(args, tree, str(tree / config))  # each tree's own copy
                runs[name].append(row["leaf_cpu_us"])
                _log(f"{config} {name} ({tree}) round {r + 1}: {row['leaf_cpu_us']:.2f} us "
                     f"per leaf (best window {row['min_us']:.2f}, {row['planes']} planes)")
        entry = {name: round(statistics.median(v), 2) for name, v in runs.items()}
        entry["runs"] = {name: [round(x, 2) for x in v] for name, v in runs.items()}
        if "before" in entry:
            entry["ratio"] = round(entry["before"] / entry["after"], 2)
        result[config] = entry
    if args.against:
        result["against"] = args.against
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
