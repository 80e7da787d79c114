"""Equal-compute learning comparison: which config learns the most in the same wall time.

Each variant is the base config with a few keys changed (`name:section.key=value,...`). Every
variant runs the real pipeline (`start_main.py`, local mode) for the same wall time on this
machine, one after the other (never side by side: they would halve each other), in its own run
folder under `--out`. A stopped variant resumes where it stopped, so a long comparison can be
run in pieces. Then the newest generation of every variant plays

  - every other variant's newest generation (round robin, colours alternated, varied openings,
    one common search for all nets so that only what was learned differs), and
  - GNU Go at `--gnugo-level` (an opponent we did not write, judged by GNU Go's final_score),

and every newest net is scored on the same positions: the held-out games (`replay.
validation_fraction`, which no variant trains on) of all the variants together, up to
`--held-out` positions of each, spread over its run: policy cross-entropy and top-1 accuracy
against the search's visits, value MSE against the result. Each run's own training loss is
measured on its own games, which a stronger net makes harder to predict; these are not.

The table (score with a Wilson 95% interval, Elo from the round robin, the common held-out
losses) is printed and written to `learning.json`, with `learning.png`.

    python3 benchmarks/learning.py --board 7 --minutes 10 \\
        --variant puct:mcts.algorithm=puct,net.ownership_head=false \\
        --variant gumbel:mcts.algorithm=gumbel,mcts.full_search_fraction=0.25
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from configs import load_config
from training.learn.net import load_model, make_evaluator
from training.learn.replay_buffer import ReplayWindow
from training.learn.samples import fetch_batch
from training.play import rating
from training.play.arena import play_arena, play_gnugo
from training.run.model_store import list_models, model_stem
from training.train.steps import losses

REPO = Path(__file__).resolve().parent.parent


def parse_variant(text: str) -> tuple[str, dict[str, object]]:
    """`name:section.key=value,...` -> (name, {"section.key": value}); values are YAML."""
    name, _, rest = text.partition(":")
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise SystemExit(f"--variant {text!r}: start with a name (letters, digits, - and _)")
    changes: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key.count(".") != 1:
            raise SystemExit(f"--variant {text!r}: {item!r} is not section.key=value")
        changes[key] = yaml.safe_load(value)
    return name, changes


def write_config(base: Path, changes: dict[str, object], run_dir: Path, path: Path) -> None:
    """The base config with `changes`, its run folder set; checked by load_config."""
    data = yaml.safe_load(base.read_text()) or {}
    for key, value in changes.items():
        section, name = key.split(".")
        data.setdefault(section, {})[name] = value
    data.setdefault("run", {})["dir"] = str(run_dir)
    data["run"]["iterations"] = 0
    data.setdefault("logging", {})["dir"] = str(run_dir / "logs")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    load_config(path)  # a wrong key fails here, naming the file and the key


def run_for(config: Path, run_dir: Path, seconds: float, log_dir: Path) -> float:
    """Run the pipeline on `config` until it has had `seconds` of wall time in all (a stopped
    run resumes; `elapsed_s.txt` in the run folder keeps the total). Returns the total."""
    done_file = run_dir / "elapsed_s.txt"
    done = float(done_file.read_text()) if done_file.exists() else 0.0
    left = seconds - done
    if left <= 1:
        return done
    log_dir.mkdir(parents=True, exist_ok=True)
    status = log_dir / "status.txt"
    cmd = [sys.executable, str(REPO / "start_main.py"), "--config", str(config),
           "--no-watch", "--status-file", str(status)]
    start = time.monotonic()
    with open(log_dir / "stdout.txt", "ab") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        shown = None
        try:
            while proc.poll() is None and time.monotonic() - start < left:
                time.sleep(1.0)
                used = done + time.monotonic() - start
                line = (run_dir.name, newest(run_dir), int(used // 60))
                if line != shown:  # a line per new generation or minute
                    print(f"  {run_dir.name}: {used / 60:5.1f} of {seconds / 60:.1f} min, "
                          f"generation {line[1]}, {games_in(run_dir)} games", flush=True)
                    shown = line
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=180)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    total = done + min(time.monotonic() - start, left)
    done_file.write_text(f"{total:.1f}\n")
    return total


def newest(run_dir: Path) -> int:
    models = list_models(run_dir / "models")
    return max(models) if models else -1


def model_file(run_dir: Path, generation: int) -> Path:
    return run_dir / "models" / f"{model_stem(generation)}.pt"


def games_in(run_dir: Path) -> int:
    ledger = run_dir / "ledger.jsonl"
    if not ledger.exists():
        return 0
    total = 0
    for line in ledger.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("status") == "ingested":
            total += int(entry.get("games", 0))
    return total


def elo_of(score: float, games: int) -> float:
    s = min(max(score, 0.5 / games), 1 - 0.5 / games)
    return -400 * math.log10(1 / s - 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, default=REPO / "configs" / "config.yaml")
    p.add_argument("--variant", action="append", required=True,
                   help="name:section.key=value,... (repeat; at least two)")
    p.add_argument("--board", type=int, default=None, help="go.board_size for every variant")
    p.add_argument("--komi", type=float, default=None, help="go.komi (default 9 on 7x7)")
    p.add_argument("--minutes", type=float, default=10.0, help="wall time per variant")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "learning")
    p.add_argument("--games", type=int, default=40, help="games per head-to-head pair")
    p.add_argument("--simulations", type=int, default=64, help="the common play-time search")
    p.add_argument("--gnugo-level", type=int, default=1)
    p.add_argument("--gnugo-games", type=int, default=20, help="0: no GNU Go games")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--eval-only", action="store_true", help="do not run; evaluate what is there")
    p.add_argument("--held-out", type=int, default=2048,
                   help="held-out positions of each run in the common loss (0: none)")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    if len(variants) < 2:
        p.error("give at least two --variant")
    args.out.mkdir(parents=True, exist_ok=True)
    common: dict[str, object] = {}
    if args.board:
        common["go.board_size"] = args.board
        default_komi = 9.0 if args.board == 7 else 7.0
        common["go.komi"] = args.komi if args.komi is not None else default_komi
    elif args.komi is not None:
        common["go.komi"] = args.komi
    # The coach's own arena is left out: it is the same for every variant and costs CPU time
    # that the comparison is about.
    common["evaluation.games"] = 0
    common["evaluation.gnugo_games"] = 0

    runs = {}
    for name, changes in variants:
        run_dir = args.out / name
        config = args.out / f"{name}.yaml"
        write_config(args.base, {**common, **changes}, run_dir, config)
        runs[name] = (run_dir, config)
        if not args.eval_only:
            print(f"{name}: {args.minutes:.1f} min of the pipeline ({config})")
            run_for(config, run_dir, args.minutes * 60, args.out / "logs" / name)

    table = {}
    for name, (run_dir, config) in runs.items():
        g = newest(run_dir)
        elapsed = run_dir / "elapsed_s.txt"
        table[name] = {"generation": g, "games": games_in(run_dir),
                       "minutes": float(elapsed.read_text()) / 60 if elapsed.exists() else None,
                       "changes": dict(dict(variants)[name]), "vs": {}}
        print(f"{name}: generation {g}, {table[name]['games']} games")

    # One common search for every net: the base config's, PUCT, fixed simulations.
    first_cfg = load_config(runs[variants[0][0]][1])
    eval_cfg = dataclasses.replace(first_cfg,
                                   mcts=dataclasses.replace(first_cfg.mcts, algorithm="puct"))
    evaluators = {}
    for name, (run_dir, _) in runs.items():
        net, _ = load_model(model_file(run_dir, table[name]["generation"]))
        evaluators[name] = make_evaluator(net, max_batch=max(args.games, 8))
    names = list(runs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            m = play_arena(evaluators[a], evaluators[b], args.games, eval_cfg, seed=1234,
                           simulations=args.simulations)
            lo, hi = rating.wilson(m.wins + 0.5 * m.draws, m.games)
            table[a]["vs"][b] = {"w": m.wins, "d": m.draws, "l": m.losses, "score": m.score,
                                 "ci": [lo, hi]}
            table[b]["vs"][a] = {"w": m.losses, "d": m.draws, "l": m.wins,
                                 "score": 1 - m.score, "ci": [1 - hi, 1 - lo]}
            print(f"{a} vs {b}: {m.wins}-{m.draws}-{m.losses} ({m.score:.2f}, "
                  f"95% [{lo:.2f}, {hi:.2f}]), Elo {elo_of(m.score, m.games):+.0f}")
    if args.gnugo_games:
        for name, (run_dir, config) in runs.items():
            cfg = load_config(config)
            r = play_gnugo(eval_cfg if cfg.go == eval_cfg.go else cfg,
                           model_file(run_dir, table[name]["generation"]), args.gnugo_games,
                           args.gnugo_level, simulations=args.simulations, jobs=args.jobs)
            lo, hi = r.interval()
            table[name]["gnugo"] = {"level": args.gnugo_level, "w": r.wins, "d": r.draws,
                                    "l": r.losses, "score": r.score, "ci": [lo, hi],
                                    "disagreements": r.disagreements}
            print(f"{name} vs GNU Go level {args.gnugo_level}: {r.wins}-{r.draws}-{r.losses}"
                  f" ({r.score:.2f}, 95% [{lo:.2f}, {hi:.2f}])")
    if args.held_out:
        for name, row in held_out_losses(runs, table, args.held_out).items():
            table[name]["held_out"] = row
            print(f"{name} on every variant's held-out positions ({row['positions']}): policy "
                  f"loss {row['policy_loss']:.3f}, accuracy {row['accuracy']:.3f}, value MSE "
                  f"{row['value_mse']:.3f}")
    out = {"board": first_cfg.go.board_size, "komi": first_cfg.go.komi,
           "minutes": args.minutes, "simulations": args.simulations, "variants": table}
    (args.out / "learning.json").write_text(json.dumps(out, indent=1))
    print(markdown(out))
    plot(out, args.out / "learning.png")
    print(f"wrote {args.out / 'learning.json'} and {args.out / 'learning.png'}")
    return 0


def held_out_positions(run_dir: Path, config, history: int, liberties: bool,
                       most: int) -> dict[str, torch.Tensor] | None:
    """Up to `most` held-out positions of one run (`config`: its config file, or the loaded
    config), evenly spread from its oldest held-out game to its newest, with the input planes
    of a net of `history` and `liberties`."""
    cfg = load_config(config) if isinstance(config, (str, Path)) else config
    window = ReplayWindow(run_dir / "replay", cfg.replay, history=history,
                          board_size=cfg.go.board_size, augment=False, liberties=liberties)
    view = window.validation
    if len(view) == 0:
        return None
    idx = np.unique(np.linspace(0, len(view) - 1, min(most, len(view))).astype(np.int64))
    return fetch_batch(view, idx.tolist())


@torch.no_grad()
def held_out_losses(runs: dict, table: dict, most: int) -> dict[str, dict]:
    """Each variant's newest net on the held-out positions of every variant together (built
    with that net's own input planes): policy loss, top-1 accuracy and value MSE."""
    result = {}
    positions_of: dict[tuple, dict[str, torch.Tensor] | None] = {}  # nets with the same planes
    for name, (run_dir, _) in runs.items():
        net, info = load_model(model_file(run_dir, table[name]["generation"]))
        history = int(info.config.get("history", 8))
        liberties = bool(info.config.get("liberties", False))
        sums, positions, targets = np.zeros(3), 0, 0
        for other_dir, other_config in runs.values():
            key = (str(other_dir), history, liberties)
            if key not in positions_of:
                positions_of[key] = held_out_positions(other_dir, other_config, history,
                                                       liberties, most)
            batch = positions_of[key]
            if batch is None:
                continue
            for lo in range(0, len(batch["value"]), 256):
                part = {k: t[lo:lo + 256] for k, t in batch.items()}
                p_loss, v_loss, correct, _ = losses(net, part, None, "cpu")
                rows = len(part["value"])
                with_policy = int((part["policy"].sum(dim=1) > 0).sum())
                # losses() gives means over the rows with a policy target (policy) and over
                # all rows (value); accuracy is scaled to all rows
                sums += [p_loss.item() * with_policy, correct.item() * with_policy / rows,
                         v_loss.item() * rows]
                positions += rows
                targets += with_policy
        if positions:
            result[name] = {"positions": positions,
                            "policy_loss": float(sums[0] / max(targets, 1)),
                            "accuracy": float(sums[1] / max(targets, 1)),
                            "value_mse": float(sums[2] / positions)}
    return result


def markdown(out: dict) -> str:
    names = list(out["variants"])
    head = "| variant | minutes | generation | games | " + " | ".join(
        f"vs {n}" for n in names) + " | vs GNU Go | held-out policy loss, accuracy, value MSE |"
    lines = [head, "|" + "---|" * (len(names) + 6)]
    for n, row in out["variants"].items():
        cells = []
        for other in names:
            v = row["vs"].get(other)
            cells.append("-" if v is None else
                         f"{v['w']}-{v['d']}-{v['l']} [{v['ci'][0]:.2f}, {v['ci'][1]:.2f}]")
        g = row.get("gnugo")
        gn = ("-" if g is None else
              f"{g['w']}-{g['d']}-{g['l']} [{g['ci'][0]:.2f}, {g['ci'][1]:.2f}]")
        minutes = "-" if row["minutes"] is None else f"{row['minutes']:.1f}"
        h = row.get("held_out")
        held = ("-" if h is None else
                f"{h['policy_loss']:.3f}, {h['accuracy']:.3f}, {h['value_mse']:.3f}")
        lines.append(f"| {n} | {minutes} | {row['generation']} | {row['games']} | "
                     + " | ".join(cells) + f" | {gn} | {held} |")
    return "\n".join(lines)


def plot(out: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(out["variants"])
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(names), 3.6))
    width = 0.8 / max(1, len(names))
    opponents = names + ["GNU Go"]
    for i, n in enumerate(names):
        row = out["variants"][n]
        xs, ys, lo, hi = [], [], [], []
        for j, o in enumerate(opponents):
            v = row.get("gnugo") if o == "GNU Go" else row["vs"].get(o)
            if v is None:
                continue
            xs.append(j + (i - (len(names) - 1) / 2) * width)
            ys.append(v["score"])
            lo.append(v["score"] - v["ci"][0])
            hi.append(v["ci"][1] - v["score"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=n)
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(opponents)), [f"vs {o}" for o in opponents])
    ax.set_ylim(0, 1)
    ax.set_ylabel("score (95% interval)")
    ax.set_title(f"{out['board']}x{out['board']}, {out['minutes']:.0f} min each, "
                 f"{out['simulations']} simulations a move in play")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
