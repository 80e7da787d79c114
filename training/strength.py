"""How strong is each generation of a run: against a fixed pool of players and generation 0.

    python -m training.strength [--config FILE] [--run-dir DIR] [--generations 0,4,8]
                                [--games 40] [--simulations 32,128 | --seconds-per-move 0.5,1]
                                [--gnugo 1,10] [--gnugo-games N] [--jobs 2]
                                [--pool-model FILE ...] [--opponent CMD [--opponent-name N]]
                                [--resume strength_games/<time>]

The coach's arena rates each generation against the one before it (a chain of small steps).
This tool answers the questions a user asks after a run: did it learn, and how strong is it?
For every chosen generation and every search budget it plays

- the random player (`training.play.players.RandomPlayer`: a uniformly random legal move
  that never fills its own eye), searching as in self-play: no noise, the most visited move,
  and no pass first while a real move is left when `self_play.early_pass` is false. With a
  simulations budget all games are searched at once and scored by our rules (both rule
  engines must agree); with a time budget they go through `training.play.gnugo` like the GNU
  Go games;
- GNU Go at each level of `--gnugo` (`10+5`: level 10 receiving 5 points, komi moved in its
  favour whichever colour it has: the rung above level 10) (`training.play.gnugo`: GNU Go 3.8
  with Chinese rules and positional superko, a `--seed` per game, each random opening played
  with both colours, GNU Go's `final_score` of the replayed final position as the judge, our
  area count beside it and the games where the two disagree counted);
- frozen models of `--pool-model FILE` (a generation of this run or another, kept fixed):
  our GTP engine on that model at the same budget, in the same series as GNU Go (openings,
  colours, the judge); each is a pool member named `model <first 8 hex of its sha256>`, so
  the same file is the same anchor in every evaluation and every run;
- outside GTP engines of `--opponent "CMD"` (KataGo, another GNU Go level, ...), played and
  judged in the same series as untrusted players (`training.play.opponent`: bounded answers,
  a forfeit for an illegal move) and rated in the same pool, each labelled by
  `--opponent-name` or its GTP name and version;
- generation 0, through the coach's own arena (`training.play.arena.play_arena`), with the Elo
  difference and its 95% interval (`training.play.elo`), for simulations budgets.

Budgets: `--simulations 32,128,512` and/or `--seconds-per-move 0.5,1` (a time budget: the
engine's timed search, `training.play.players.MctsPlayer`); each is its own player, so
strength against thinking time is one curve. Win rates carry Wilson 95% intervals. The
**rating** is a joint fit (`training.play.rating`) of every (generation, budget) against the pool:
the random player, the GNU Go levels and the pool models played, with GNU Go level 1 anchored at
`ANCHOR_ELO` = 0 (the lowest level played when 1 is not), so a rating reads "Elo above
GNU Go 3.8 level 1 on this board and komi". Without GNU Go games there is no rating.

It prints the results as they come (one line per GNU Go game, one per match) and a table,
writes `strength.json` (every row, every GNU Go game: the judge's score and dead stones, our
engine's own count, whether the judge found every stone of ours dead), appends the same
report as one line to `strength_history.jsonl` (every evaluation ever run on the folder;
nothing there is rewritten), keeps every game played through GTP as SGF in
`strength_games/<start time>/` with a line per game in its `games.jsonl` as the game ends
(`--resume` that folder, with the same flags, to go on with a cut evaluation: its games are
read back, the rest played; `training.play.journal`), and draws `strength.png` (win rates
with intervals and the rating by generation, and by budget when several are given) in the
run folder. It reads the run's models only; it never writes a model or a metrics row.

This module is the command (its flags, their checks, the files it writes); the table itself
(`measure`, the rating, `plot`, the history) is `training.play.strength`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from configs import Config, ConfigError, dump_config, load_config
from distributed.transfer import write_atomic
from training.play import gnugo
from training.play.gnugo import gnugo_name, parse_gnugo, split_gnugo  # noqa: F401 (API)
from training.play.gtp_client import GtpEngineError, GtpError, find_gnugo
from training.play.journal import Journal, JournalError
from training.play.opponent import open_engine, pool_model
from training.play.strength import (ANCHOR_ELO, Budget, anchor_of, append_history,
                                     default_generations, format_row, measure, model_path, plot,
                                     rate)
from training.run import metrics
from training.run.model_store import list_models
from training.run.run_dir import RunDir


def _time_settings(text: str | None) -> tuple[float, float, int] | None:
    """`--time-settings 0,5,1` -> (0.0, 5.0, 1): main seconds, byo-yomi seconds, stones."""
    if text is None:
        return None
    parts = text.split(",")
    try:
        m, b, n = float(parts[0]), float(parts[1]), int(parts[2])
    except (ValueError, IndexError):
        m = b = n = -1
    if len(parts) != 3 or not (math.isfinite(m) and math.isfinite(b)) or min(m, b, n) < 0 \
            or (m == 0 and (b == 0 or n == 0)):
        raise ValueError(f"--time-settings {text!r}: expected MAIN,BYO_SECONDS,BYO_STONES as "
                         "GTP's time_settings, e.g. 0,5,1 (5 seconds a move)")
    return m, b, n


def _numbers(text: str | None, kind: type, flag: str) -> list:
    """A comma list of positive numbers from a flag, or [] when it is not given."""
    if text is None:
        return []
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{flag} {text!r}: expected a comma list of positive numbers, "
                         f"e.g. {'32,128' if kind is int else '0.5,1'}")
    return values



def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m training.strength",
        description="play a run's generations against a random player, GNU Go and generation 0")
    ap.add_argument("--config", default=None, help="config file (default: the run's copy, "
                    "else configs/config.yaml)")
    ap.add_argument("--run-dir", default=None, help="run folder (default: run.dir)")
    ap.add_argument("--generations", default=None,
                    help="comma list, e.g. 0,4,8 (default: 0, the newest and 3 between)")
    ap.add_argument("--games", type=int, default=40,
                    help="games per match against the random player and generation 0 "
                    "(default 40)")
    ap.add_argument("--simulations", default=None,
                    help="simulations per move, or a comma list to sweep, e.g. 32,128,512 "
                    "(default: evaluation.simulations or mcts.simulations)")
    ap.add_argument("--seconds-per-move", default=None,
                    help="seconds per move (a time budget), or a comma list, e.g. 0.5,1")
    ap.add_argument("--time-settings", default=None, metavar="MAIN,BYO,STONES",
                    help="also play the GNU Go games under a game clock kept by the referee "
                    "(GTP time_settings, e.g. 0,5,1: 5 seconds a move); a fallen flag loses")
    ap.add_argument("--gnugo", default=None,
                    help="GNU Go levels to play, e.g. 1,10; 10+5: level 10 receiving 5 "
                    "points, a rung above level 10 (default: none)")
    ap.add_argument("--gnugo-games", type=int, default=None,
                    help="games per GNU Go level (default: --games)")
    ap.add_argument("--pool-model", action="append", default=[], metavar="FILE",
                    help="a model file kept fixed as a pool member (a generation of this run "
                    "or another), played at each budget like a GNU Go level and rated in the "
                    "pool; repeatable")
    ap.add_argument("--opponent", action="append", default=[], metavar="CMD",
                    help="the command line of any GTP engine (e.g. \"katago gtp -model M "
                    "-config C\"), played and judged like a GNU Go level; repeatable")
    ap.add_argument("--opponent-name", action="append", default=[], metavar="NAME",
                    help="the label of the --opponent of the same place (default: its GTP "
                    "name and version)")
    ap.add_argument("--opponent-timeout", type=float, default=60.0, metavar="SECONDS",
                    help="the longest an --opponent may take to answer (its first answer "
                    "includes its start-up; default 60); longer is an error naming it")
    ap.add_argument("--jobs", type=int, default=None,
                    help="games against GNU Go played at once (default: the CPU count)")
    ap.add_argument("--resume", default=None, metavar="DIR",
                    help="go on with a cut evaluation: DIR is its strength_games/<time> folder; "
                    "the games of its games.jsonl are read back, the others played (give the "
                    "same flags)")
    ap.add_argument("--endings", default=None, metavar="DIR",
                    help="only explain how the games in DIR (strength_games/<time>) ended: "
                    "lost in play or in the ending, by GNU Go's judgement at the opponent's "
                    "first pass and at the end, and where our net saw each lost game turn "
                    "(DIR/endings.png, a panel per lost game)")
    return ap


def _config(args: argparse.Namespace) -> tuple[Config, RunDir]:
    """The config (the run's own copy when --config is not given) and the run folder."""
    cfg = load_config(args.config)
    paths = RunDir(args.run_dir or cfg.run.dir)
    if args.config is None and paths.config.exists():
        cfg = load_config(paths.config)  # the settings the run trained with
    return cfg, paths


def _flags(args: argparse.Namespace, cfg: Config) -> tuple:
    """(simulations, seconds per move, clock, GNU Go levels, pool models, engines) from the
    flags; ValueError naming the flag otherwise."""
    sims = _numbers(args.simulations, int, "--simulations")
    seconds = _numbers(args.seconds_per_move, float, "--seconds-per-move")
    clock = _time_settings(args.time_settings)
    levels = parse_gnugo(args.gnugo)
    frozen = [pool_model(f, cfg.go.board_size) for f in args.pool_model]
    if len(args.opponent_name) > len(args.opponent) or not args.opponent_timeout > 0:
        raise ValueError("--opponent-name needs an --opponent each; --opponent-timeout "
                         "must be positive")
    engines = [open_engine(c, n, args.opponent_timeout) for c, n in zip(
        args.opponent, args.opponent_name + [None] * len(args.opponent))]
    if len({e.name for e in engines}) < len(engines):
        raise ValueError("two --opponent engines with one label: set --opponent-name")
    return sims, seconds, clock, levels, frozen, engines


def _budgets(cfg: Config, sims: list, seconds: list,
             clock: tuple[float, float, int] | None) -> list[Budget]:
    """One budget per simulations and seconds value, and one for the clock."""
    budgets = [Budget(simulations=n) for n in sims]
    budgets += [Budget(seconds_per_move=t) for t in seconds]
    if clock is not None:  # the engine's own budget when no clock applies: a period's share
        share = clock[1] / clock[2] if clock[1] > 0 and clock[2] > 0 else 1.0
        budgets.append(Budget(seconds_per_move=max(0.05, share), time_settings=clock))
    if not budgets:
        budgets = [Budget(cfg.evaluation.simulations or cfg.mcts.simulations)]
    return budgets


def _generations(args: argparse.Namespace, paths: RunDir, budgets: list[Budget],
                 needs_gnugo: bool, pooled: bool) -> tuple[list[int], int]:
    """(the generations to rate, games per GNU Go level or pool member), each checked
    against the flags and the run's models; ValueError saying what to do otherwise."""
    run_dir = paths.root
    if needs_gnugo and find_gnugo() is None:
        raise ValueError("GNU Go not found on PATH or in /usr/games (apt-get install gnugo); "
                         "--gnugo, --pool-model, --opponent and --seconds-per-move need it (it "
                         "judges those games)")
    have = list_models(paths.models)
    if not have:
        raise ValueError(f"no model in {paths.models}: no run in {run_dir} (start one with "
                         "python start_main.py, or name it with --run-dir)")
    if args.generations:
        try:
            gens = sorted({int(x) for x in args.generations.split(",")})
        except ValueError:
            raise ValueError(f"--generations {args.generations!r}: expected a comma list of "
                             "numbers, e.g. 0,4,8") from None
        missing = [g for g in gens if g not in have]
        if missing:
            raise ValueError(f"no model for generation(s) {missing} in {paths.models}; "
                             f"there are {have[0]}..{have[-1]}")
    else:
        gens = default_generations(have)
    if 0 not in have and any(b.simulations is not None for b in budgets) and gens != [0]:
        # at a simulation budget each generation plays generation 0; at a time budget it
        # does not (a model copied from another machine can be rated alone)
        raise ValueError(f"{model_path(run_dir, 0)} not found: at a simulation budget every "
                         "generation plays generation 0; copy it there, or rate by time alone "
                         "(--seconds-per-move or --time-settings)")
    if args.games < 2:
        raise ValueError("--games must be at least 2 (colours alternate)")
    gnugo_games = args.games if args.gnugo_games is None else args.gnugo_games
    if pooled and gnugo_games < 2:
        raise ValueError("--gnugo-games must be at least 2 (colours alternate)")
    return gens, gnugo_games


def _print_results(rows, fitted: dict, anchor: str | None, seconds_taken: float,
                   paths: RunDir, sgf_dir: Path) -> None:
    """The table, the pool's ratings and the files written."""
    print("\n".join(format_row(r) for r in rows))
    if anchor is not None:
        pool = ", ".join(f"{n} {r.elo:+.0f} [{r.ci_low:+.0f}, {r.ci_high:+.0f}]"
                         for n, r in fitted.items() if not n.startswith("gen "))
        print(f"pool ratings ({anchor} = {ANCHOR_ELO:g}): {pool}")
    print(f"{seconds_taken:.0f} s; wrote {paths.strength_json}, {paths.strength_png}, a line of "
          f"{paths.strength_history}" + (f" and the games in {sgf_dir}" if sgf_dir.exists()
                                         else ""))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.endings is not None:
        folder = Path(args.endings)
        if not folder.is_dir():
            print(f"error: --endings {folder}: not a folder (give one of the strength tool's "
                  "strength_games/<time> folders)", file=sys.stderr)
            return 2
        counts = gnugo.explain_endings(folder, plot=folder / "endings.png")
        print(json.dumps(counts))
        return 0
    try:
        cfg, paths = _config(args)
        run_dir = paths.root
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        sims, seconds, clock, levels, frozen, engines = _flags(args, cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    budgets = _budgets(cfg, sims, seconds, clock)
    try:
        gens, gnugo_games = _generations(
            args, paths, budgets, bool(levels or seconds or clock or frozen or engines),
            bool(levels or frozen or engines))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    jobs = args.jobs or os.cpu_count() or 1
    print(f"{run_dir}: generations {gens}, budgets {', '.join(map(str, budgets))}, "
          f"{args.games} games per match" + (f", GNU Go levels {levels} ({gnugo_games} games "
                                             f"each, {jobs} at once)" if levels else "") +
          "".join(f", {m.name} = {m.path}" for m in frozen) +
          "".join(f", {e.name} = {e.command_line}" for e in engines) +
          f", {cfg.go.board_size}x{cfg.go.board_size} komi {cfg.go.komi}", flush=True)
    t0 = time.monotonic()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    sgf_dir = paths.strength_games(stamp) if args.resume is None else Path(args.resume)
    try:
        journal = Journal(sgf_dir, resume=args.resume is not None)
    except JournalError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if journal.games:
        print(f"{journal.games} games read back from {journal.path}", flush=True)
    with tempfile.TemporaryDirectory(prefix="azgo-strength-") as tmp:
        config_path = Path(tmp) / "config.yaml"  # the GTP engines' search settings
        config_path.write_text(dump_config(cfg))
        try:
            rows = measure(cfg, run_dir, gens, args.games, budgets=budgets, gnugo_levels=levels,
                           gnugo_games=gnugo_games, pool_models=frozen, engines=engines,
                           jobs=jobs, config_path=config_path,
                           log=lambda line: print(line, flush=True), sgf_dir=sgf_dir,
                           journal=journal)
        except (GtpEngineError, GtpError) as e:  # an engine overran or refused a setting
            print(f"error: {e}", file=sys.stderr)
            return 1
    fitted = rate(rows)
    seconds_taken = time.monotonic() - t0
    anchor = anchor_of(rows)
    report = {"started": stamp, "command": "python -m training.strength " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "run_dir": str(run_dir), "board_size": cfg.go.board_size, "komi": cfg.go.komi,
              "games": args.games,
              "gnugo_games": gnugo_games if levels or frozen or engines else 0,
              "pool_models": {m.name: str(m.path) for m in frozen},
              "opponents": {e.name: e.command_line for e in engines},
              "budgets": [asdict(b) for b in budgets],
              "simulations": budgets[0].simulations,
              "anchor": None if anchor is None else {"player": anchor, "elo": ANCHOR_ELO},
              "pool": {name: asdict(r) for name, r in fitted.items()
                       if not name.startswith("gen ")},
              "seconds": round(seconds_taken, 1), "rows": [asdict(r) for r in rows]}
    write_atomic(paths.strength_json, json.dumps(report, indent=1).encode())
    append_history(paths.strength_history, report)
    plot(rows, paths.strength_png)
    if paths.metrics_json.exists():
        metrics.plot_progress(run_dir)  # the pool rating beside the arena's chained Elo
    _print_results(rows, fitted, anchor, seconds_taken, paths, sgf_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
