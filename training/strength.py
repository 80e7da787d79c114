"""How strong is each generation of a run: against generation 0 and against a random player.

    python -m training.strength [--config FILE] [--run-dir DIR] [--generations 0,4,8]
                                [--games 40] [--simulations N]

The coach's arena rates each generation against the one before it (a chain of small steps).
This tool answers the question a user asks after a run: did it learn? It plays

- every chosen generation against generation 0, through the coach's own arena
  (`training.arena.play_arena`: colours alternate, varied openings, fresh trees), with the
  Elo difference and its 95% interval (`training.elo`);
- every chosen generation against `training.gtp.RandomPlayer` (a uniformly random legal move
  that never fills its own eye), searching as in self-play: no noise, the most visited move,
  and no pass first while a real move is left when `self_play.early_pass` is false.

It prints a table, writes `strength.json` and draws `strength.png` (win rate against the
random player and Elo against generation 0, by generation) in the run folder. It reads the
run's models only; it never writes a model or a metrics row.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from configs import Config, ConfigError, load_config
from training.arena import MatchResult, play_arena
from training.coords import BLACK
from training.go import Position
from training.gtp import RandomPlayer
from training.mcts import Evaluate, Mcts
from training.model_store import list_models, model_stem
from training.net import load_model, make_evaluator, write_file_atomic

STRENGTH_JSON = "strength.json"
STRENGTH_PNG = "strength.png"


@dataclass
class Row:
    """One generation's results; W/D/L from that generation's point of view."""

    generation: int
    vs_gen0: tuple[int, int, int] | None  # None for generation 0 itself
    vs_gen0_elo: float | None
    vs_gen0_ci: tuple[float, float] | None
    vs_random: tuple[int, int, int]

    @property
    def random_win_rate(self) -> float:
        w, d, losses = self.vs_random
        return (w + d / 2) / max(1, w + d + losses)


def play_vs_random(evaluate: Evaluate, cfg: Config, games: int, seed: int, *,
                   simulations: int | None = None) -> MatchResult:
    """`games` games of a searching net against `RandomPlayer`, all at once.

    The net is black in games 0, 2, 4, ...; each random player has its own seed. Every net move
    is a fresh search (no tree reuse, no root noise), the most visited move is played. Games are
    played out and scored under our rules (area scoring, positional superko, move cap).
    """
    out = MatchResult()
    if games <= 0:
        return out
    go = cfg.go
    mcts = Mcts(games, go, cfg.mcts, history=cfg.net.history, batch_size=max(games, 8),
                simulations=simulations or cfg.evaluation.simulations or cfg.mcts.simulations,
                reuse_tree=False, early_pass=cfg.self_play.early_pass)
    positions = [Position(go.board_size, komi=go.komi, max_moves=go.move_cap)
                 for _ in range(games)]
    randoms = [RandomPlayer(seed * 100_003 + k) for k in range(games)]
    net_color = np.where(np.arange(games) % 2 == 0, BLACK, -BLACK)
    for g in range(games):
        mcts.reset_game(g, komi=go.komi)
    active = np.ones(games, bool)
    while active.any():
        live = np.flatnonzero(active)
        to_play = np.array([mcts.to_play(int(g)) for g in live])
        ours = live[to_play == net_color[live]]
        theirs = live[to_play != net_color[live]]
        moves = np.empty(len(live), np.int64)
        order = np.concatenate([ours, theirs])
        if len(ours):
            moves[: len(ours)] = np.argmax(mcts.search(evaluate, ours), axis=1)
        for i, g in enumerate(theirs, start=len(ours)):
            moves[i] = randoms[g].genmove(positions[g], positions[g].to_play)
        mcts.play(order, moves)
        for g, move in zip(order, moves):
            positions[g].play(int(move))
            if mcts.is_over(int(g)):
                active[g] = False
    for g in range(games):
        score = mcts.score(g)
        if score != positions[g].score():  # two rule engines disagree: never report that
            raise AssertionError(f"game {g}: fast rules score {score}, reference "
                                 f"{positions[g].score()}")
        won = bool((score > 0) == (net_color[g] == BLACK))
        out.draws += int(score == 0)
        out.wins += int(score != 0 and won)
        out.losses += int(score != 0 and not won)
    return out


def default_generations(available: Sequence[int], count: int = 5) -> list[int]:
    """Generation 0, the newest, and evenly spaced ones between: at most `count`."""
    if not available:
        return []
    picks = np.linspace(0, len(available) - 1, min(count, len(available)))
    return sorted({available[int(round(i))] for i in picks})


def model_path(run_dir: Path, generation: int) -> Path:
    return run_dir / "models" / f"{model_stem(generation)}.pt"


def measure(cfg: Config, run_dir: Path, generations: Sequence[int], games: int,
            simulations: int | None = None, *, log=print) -> list[Row]:
    """Play the matches of the table; `log` gets one line per result as it comes."""
    sims = simulations or cfg.evaluation.simulations or cfg.mcts.simulations

    def evaluator(g: int) -> Evaluate:
        net, _ = load_model(model_path(run_dir, g))
        return make_evaluator(net, max_batch=max(games, 8))

    base = evaluator(0)
    rows = []
    for g in generations:
        ev = base if g == 0 else evaluator(g)
        seed = cfg.run.seed * 1_000_003 + 7919 * (g + 1)
        rnd = play_vs_random(ev, cfg, games, seed, simulations=sims)
        row = Row(g, None, None, None, (rnd.wins, rnd.draws, rnd.losses))
        if g != 0:
            m = play_arena(ev, base, games, cfg, seed, simulations=sims)
            e = m.estimate()
            row.vs_gen0, row.vs_gen0_elo = (m.wins, m.draws, m.losses), e.elo
            row.vs_gen0_ci = (e.ci_low, e.ci_high)
        log(format_row(row))
        rows.append(row)
    return rows


def format_row(row: Row) -> str:
    w, d, losses = row.vs_random
    text = f"gen {row.generation:4d}  vs random W-D-L {w:3d}-{d}-{losses:<3d} " \
           f"({100 * row.random_win_rate:5.1f}%)"
    if row.vs_gen0 is not None:
        a, b, c = row.vs_gen0
        lo, hi = row.vs_gen0_ci
        text += f"   vs gen 0 W-D-L {a:3d}-{b}-{c:<3d} Elo {row.vs_gen0_elo:+5.0f} " \
                f"[{lo:+.0f}, {hi:+.0f}]"
    return text


def plot(rows: Sequence[Row], path: Path) -> None:
    """strength.png: win rate against the random player and Elo against generation 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.plot([r.generation for r in rows], [100 * r.random_win_rate for r in rows],
             marker="o", color="tab:purple")
    top.axhline(50, color="grey", lw=0.8, ls="--")
    top.set_ylim(0, 100)
    top.set_ylabel("% won vs random player")
    rated = [r for r in rows if r.vs_gen0_elo is not None]
    xs = [0] + [r.generation for r in rated]
    bottom.plot(xs, [0.0] + [r.vs_gen0_elo for r in rated], marker="o", color="tab:green")
    bottom.fill_between(xs, [0.0] + [r.vs_gen0_ci[0] for r in rated],
                        [0.0] + [r.vs_gen0_ci[1] for r in rated], alpha=0.2, color="tab:green")
    bottom.set_ylabel("Elo vs generation 0 (95% CI)")
    bottom.set_xlabel("generation")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    write_file_atomic(path, buf.getvalue())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m training.strength",
        description="play a run's generations against generation 0 and a random player")
    ap.add_argument("--config", default=None, help="config file (default: the run's copy, "
                    "else configs/config.yaml)")
    ap.add_argument("--run-dir", default=None, help="run folder (default: run.dir)")
    ap.add_argument("--generations", default=None,
                    help="comma list, e.g. 0,4,8 (default: 0, the newest and 3 between)")
    ap.add_argument("--games", type=int, default=40, help="games per match (default 40)")
    ap.add_argument("--simulations", type=int, default=None,
                    help="simulations per move (default: evaluation.simulations or "
                    "mcts.simulations)")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config)
        run_dir = Path(args.run_dir or cfg.run.dir)
        if args.config is None and (run_dir / "config.yaml").exists():
            cfg = load_config(run_dir / "config.yaml")  # the settings the run trained with
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    have = list_models(run_dir / "models")
    if 0 not in have:
        print(f"error: {model_path(run_dir, 0)} not found: no run in {run_dir} (start one with "
              "python start_main.py, or name it with --run-dir)", file=sys.stderr)
        return 2
    if args.generations:
        try:
            gens = sorted({int(x) for x in args.generations.split(",")})
        except ValueError:
            print(f"error: --generations {args.generations!r}: expected a comma list of "
                  "numbers, e.g. 0,4,8", file=sys.stderr)
            return 2
        missing = [g for g in gens if g not in have]
        if missing:
            print(f"error: no model for generation(s) {missing} in {run_dir / 'models'}; "
                  f"there are {have[0]}..{have[-1]}", file=sys.stderr)
            return 2
    else:
        gens = default_generations(have)
    if args.games < 2:
        print("error: --games must be at least 2 (colours alternate)", file=sys.stderr)
        return 2
    sims = args.simulations or cfg.evaluation.simulations or cfg.mcts.simulations
    print(f"{run_dir}: generations {gens}, {args.games} games per match, {sims} simulations "
          f"per move, {cfg.go.board_size}x{cfg.go.board_size} komi {cfg.go.komi}", flush=True)
    t0 = time.monotonic()
    rows = measure(cfg, run_dir, gens, args.games, sims,
                   log=lambda line: print(line, flush=True))
    seconds = time.monotonic() - t0
    report = {"run_dir": str(run_dir), "games": args.games, "simulations": sims,
              "seconds": round(seconds, 1), "rows": [asdict(r) for r in rows]}
    write_file_atomic(run_dir / STRENGTH_JSON, json.dumps(report, indent=1).encode())
    plot(rows, run_dir / STRENGTH_PNG)
    print(f"{seconds:.0f} s; wrote {run_dir / STRENGTH_JSON} and {run_dir / STRENGTH_PNG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
