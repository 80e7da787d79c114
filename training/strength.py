"""How strong is each generation of a run: against a fixed pool of players and generation 0.

    python -m training.strength [--config FILE] [--run-dir DIR] [--generations 0,4,8]
                                [--games 40] [--simulations 32,128 | --seconds-per-move 0.5,1]
                                [--gnugo 1,10] [--gnugo-games N] [--jobs 2]
                                [--pool-model FILE ...] [--opponent CMD [--opponent-name N]]

The coach's arena rates each generation against the one before it (a chain of small steps).
This tool answers the questions a user asks after a run: did it learn, and how strong is it?
For every chosen generation and every search budget it plays

- the random player (`training.gtp.RandomPlayer`: a uniformly random legal move that never
  fills its own eye), searching as in self-play: no noise, the most visited move, and no pass
  first while a real move is left when `self_play.early_pass` is false. With a simulations
  budget all games are searched at once and scored by our rules (both rule engines must
  agree); with a time budget they go through `training.play.gnugo` like the GNU Go games;
- GNU Go at each level of `--gnugo` (`10+5`: level 10 receiving 5 points, komi moved in its
  favour whichever colour it has: the rung above level 10) (`training.play.gnugo`: GNU Go 3.8
  with Chinese rules and
  positional superko, a `--seed` per game, each random opening played with both colours,
  GNU Go's `final_score` of the replayed final position as the judge, our area count
  beside it and the games where the two disagree counted);
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
`strength_games/<start time>/`, and draws `strength.png` (win rates with intervals and the
rating by generation, and by budget when several are given) in the run folder. It reads the
run's models only; it never writes a model or a metrics row.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from configs import Config, ConfigError, dump_config, load_config
from distributed.transfer import write_atomic
from training.go.coords import BLACK
from training.go.rules import Position
from training.gtp import RandomPlayer
from training.learn.net import load_model, make_evaluator
from training.play import gnugo, rating
from training.play.arena import MatchResult, play_arena
from training.play.gnugo import gnugo_name, parse_gnugo, split_gnugo  # noqa: F401 (API)
from training.play.gtp_client import GtpEngineError, GtpError, find_gnugo
from training.play.opponent import Engine, PoolModel, open_engine, pool_model
from training.play.players import NetWinrates
from training.play.referee import TimeControl
from training.run import metrics
from training.run.model_store import ModelStoreError, list_models, model_stem, read_manifest
from training.run.run_dir import RunDir
from training.search.mcts import Evaluate, Mcts

ANCHOR_ELO = 0.0
"""The rating of GNU Go level 1 (or the lowest level played): the fixed point of the scale."""
RANDOM = "random"


@dataclass(frozen=True)
class Budget:
    """Thinking per move: a number of simulations, or seconds, or a game clock (GTP's
    time_settings: main time, byo-yomi seconds, stones per period) kept by the referee."""

    simulations: int | None = None
    seconds_per_move: float | None = None
    time_settings: tuple[float, float, int] | None = None

    def __str__(self) -> str:
        if self.time_settings is not None:
            m, b, n = self.time_settings
            return f"clock {m:g}+{b:g}/{n}"
        if self.seconds_per_move is not None:
            return f"{self.seconds_per_move:g} s/move"
        return f"{self.simulations} sims"

    @property
    def time_control(self) -> TimeControl | None:
        return None if self.time_settings is None else TimeControl(*self.time_settings)


@dataclass
class Row:
    """One generation at one budget; W/D/L and win rates from that generation's view."""

    generation: int
    vs_gen0: tuple[int, int, int] | None  # None for generation 0 itself, or a time budget
    vs_gen0_elo: float | None
    vs_gen0_ci: tuple[float, float] | None
    vs_random: tuple[int, int, int]
    simulations: int | None = None
    seconds_per_move: float | None = None
    random_ci: tuple[float, float] | None = None
    vs_gnugo: dict[str, dict] = field(default_factory=dict)  # str(level) -> summary, games
    vs_models: dict[str, dict] = field(default_factory=dict)  # pool model name -> the same
    vs_engines: dict[str, dict] = field(default_factory=dict)  # outside engine label -> same
    rating: float | None = None
    rating_ci: tuple[float, float] | None = None
    hours: float | None = None  # of the run when it was published, stops left out (run_hours)
    time_settings: tuple[float, float, int] | None = None

    @property
    def budget(self) -> Budget:
        return Budget(self.simulations, self.seconds_per_move,
                      None if self.time_settings is None else tuple(self.time_settings))

    @property
    def player(self) -> str:
        return f"gen {self.generation} @ {self.budget}"

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
    mcts = Mcts(games, go, cfg.mcts, history=cfg.net.history, liberties=cfg.net.liberties,
                batch_size=max(games, 8),
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
            mcts.search(evaluate, ours)
            moves[: len(ours)] = mcts.select_moves(ours)  # Gumbel: its choice
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


def run_hours(run_dir: Path, generations: Sequence[int]) -> dict[int, float]:
    """Hours of the run at which each generation was published, the time the run was stopped
    left out.

    A generation's metrics row with `run_s` (the coach's own count, resumes and a --from-run
    source included) gives its hours as they are. Without it, the coach's `elapsed_s` counts
    from the coach's start: where it falls, the run was resumed, and the hours before are
    added on (up to the last generation before the stop; the minutes from there to the stop
    are not known). A
    generation without it (the last one of a stopped coach) gets the time since the generation
    before from the model manifests' `created`, as does a run without metrics; such a run's
    stops are counted in. Generations without a readable manifest are left out."""
    models = RunDir(run_dir).models
    try:
        rows = {int(r["generation"]): (metrics.seconds(r.get("elapsed_s")),
                                         metrics.seconds(r.get("run_s")))
                for r in metrics.read_metrics(run_dir)}
    except (metrics.MetricsError, TypeError, ValueError):
        rows = {}
    created: dict[int, float] = {}

    def made(g: int) -> float | None:
        if g not in created:
            try:
                created[g] = read_manifest(models / f"{model_stem(g)}.json").created
            except ModelStoreError:
                created[g] = 0.0
        return created[g] or None

    start = made(0)
    if start is None:
        return {}
    hours: dict[int, float] = {0: 0.0}
    offset, last_elapsed, last = 0.0, None, 0
    for g in range(1, max(generations, default=0) + 1):
        elapsed, run_s = rows.get(g, (None, None))
        if run_s is not None:
            hours[g] = run_s / 3600
            offset = run_s - elapsed if elapsed is not None else offset
            last_elapsed, last = elapsed if elapsed is not None else last_elapsed, g
        elif elapsed is not None:
            if last_elapsed is not None and elapsed < last_elapsed:
                offset = hours[last] * 3600  # a new coach: the run was resumed
            hours[g] = (offset + elapsed) / 3600
            last_elapsed, last = elapsed, g
        elif (c := made(g)) is not None and (before := made(last)) is not None and c >= before:
            hours[g] = hours[last] + (c - before) / 3600
            last = g
    return {g: hours[g] for g in generations if g in hours and made(g) is not None}


def model_path(run_dir: Path, generation: int) -> Path:
    return RunDir(run_dir).model(generation)


def _summary(w: int, d: int, losses: int) -> dict:
    n = w + d + losses
    lo, hi = rating.wilson(w + d / 2, n)
    return {"wdl": [w, d, losses], "win_rate": (w + d / 2) / n if n else None, "ci": [lo, hi]}


def measure(cfg: Config, run_dir: Path, generations: Sequence[int], games: int,
            simulations: int | None = None, *, budgets: Sequence[Budget] | None = None,
            gnugo_levels: Sequence[int | str] = (), gnugo_games: int | None = None,
            pool_models: Sequence[PoolModel] = (), engines: Sequence[Engine] = (),
            jobs: int = 1,
            config_path: Path | None = None, log: Callable[[str], None] = print,
            sgf_dir: Path | None = None) -> list[Row]:
    """Play the matches of the table; `log` gets progress lines as results come, and with
    `sgf_dir` every game played through GTP is written there as SGF as it ends."""
    if budgets is None:
        budgets = [Budget(simulations or cfg.evaluation.simulations or cfg.mcts.simulations)]
    gnugo_games = games if gnugo_games is None else gnugo_games
    evaluators: dict[int, Evaluate] = {}

    def evaluator(g: int) -> Evaluate:
        if g not in evaluators:
            net, _ = load_model(model_path(run_dir, g))
            evaluators[g] = make_evaluator(net, jit=cfg.net.inference, max_batch=max(games, 8))
        return evaluators[g]

    rows = []
    hours = run_hours(run_dir, generations)
    for g in generations:
        for budget in budgets:
            row = Row(g, None, None, None, (0, 0, 0), budget.simulations,
                      budget.seconds_per_move, hours=hours.get(g),
                      time_settings=budget.time_settings)
            seed = cfg.run.seed * 1_000_003 + 7919 * (g + 1)
            ours = gnugo.Engines(gnugo.engine_command(
                model_path(run_dir, g), simulations=budget.simulations,
                seconds_per_move=budget.seconds_per_move, config=config_path))

            judge = NetWinrates(model_path(run_dir, g), cfg.go) if sgf_dir is not None else None

            def series(name: str, opponent, n: int, bonus: float = 0.0,
                       **extra) -> list[gnugo.Outcome]:
                def progress(outcome: gnugo.Outcome) -> None:
                    log(f"  {row.player} vs {name}: {outcome.describe()}")
                    if sgf_dir is not None and judge is not None:
                        label = f"gen{g}_{budget}_vs_{name}_{outcome.spec.index + 1:03d}"
                        file = sgf_dir / (label.replace(" ", "").replace("/", "per") + ".sgf")
                        sgf_dir.mkdir(parents=True, exist_ok=True)
                        sgf = outcome.to_sgf(f"azgo {row.player}", f"{name}",
                                             winrates=judge(outcome.moves))
                        write_atomic(file, sgf.encode())

                specs = gnugo.schedule(n, cfg.go.board_size, cfg.run.seed)
                return gnugo.play_series(ours, opponent, specs, size=cfg.go.board_size,
                                         komi=cfg.go.komi, komi_bonus=bonus,
                                         time_control=budget.time_control, jobs=jobs,
                                         on_game=progress, **extra)

            with ours:
                if budget.simulations is not None:
                    rnd = play_vs_random(evaluator(g), cfg, games, seed,
                                         simulations=budget.simulations)
                    row.vs_random = (rnd.wins, rnd.draws, rnd.losses)
                else:
                    row.vs_random = gnugo.tally(series(RANDOM, gnugo.random_opponent(), games))
                row.random_ci = tuple(_summary(*row.vs_random)["ci"])
                if g != 0 and budget.simulations is not None:
                    m = play_arena(evaluator(g), evaluator(0), games, cfg, seed,
                                   simulations=budget.simulations)
                    e = m.estimate()
                    row.vs_gen0, row.vs_gen0_elo = (m.wins, m.draws, m.losses), e.elo
                    row.vs_gen0_ci = (e.ci_low, e.ci_high)
                for key in gnugo_levels:
                    level, bonus = split_gnugo(key)
                    outcomes = series(gnugo_name(key), gnugo.gnugo_opponent(level),
                                      gnugo_games, bonus)
                    row.vs_gnugo[str(key)] = _series_summary(outcomes)
                for pm in pool_models:
                    frozen = gnugo.engine_command(
                        pm.path, simulations=budget.simulations,
                        seconds_per_move=budget.seconds_per_move, config=config_path)
                    outcomes = series(pm.name, lambda seed, argv=frozen: argv, gnugo_games)
                    row.vs_models[pm.name] = _series_summary(outcomes)
                for e in engines:
                    outcomes = series(e.name, e.command, gnugo_games, **e.series_args)
                    row.vs_engines[e.name] = _series_summary(outcomes)
            log(format_row(row))
            rows.append(row)
    rate(rows)
    return rows


def _series_summary(outcomes: Sequence[gnugo.Outcome]) -> dict:
    """W/D/L, win rate and interval of a series judged by GNU Go, how its games ended, and
    every game."""
    summary = _summary(*gnugo.tally(outcomes))
    summary["disagreements"] = sum(o.game.disagrees for o in outcomes)
    summary["we_disagree"] = sum(o.we_agree is False for o in outcomes)
    summary["wipeouts"] = sum(o.wiped_out for o in outcomes)
    summary["time_losses"] = sum(o.game.end == "time" and o.points < 0 for o in outcomes)
    summary["forfeits"] = sum(o.game.end == "forfeit" for o in outcomes)
    summary["played_out"] = sum(o.game.playout_from is not None for o in outcomes)
    if summary["played_out"]:  # the same games judged at the first passes, without play-outs
        summary["at_first_passes"] = _summary(*gnugo.tally_at_passes(outcomes))
    summary["games"] = [o.to_json() for o in outcomes]
    return summary


def anchor_of(rows: Sequence[Row]) -> str | None:
    """The pool member fixed at ANCHOR_ELO: GNU Go level 1, else the lowest level played."""
    keys = sorted({k for r in rows for k in r.vs_gnugo}, key=split_gnugo)
    if not keys:
        return None
    return gnugo_name("1" if "1" in keys else keys[0])


def rate(rows: Sequence[Row]) -> dict[str, rating.Rating]:
    """Fill each row's pool rating (a joint fit, see the module docstring); returns the fit,
    pool members included ({} without GNU Go games)."""
    anchor = anchor_of(rows)
    if anchor is None:
        return {}
    results = []
    for r in rows:
        w, d, losses = r.vs_random
        results.append(rating.Result(r.player, RANDOM, w + d / 2, w + d + losses))
        for opponent, s in _pool_series(r):
            w, d, losses = s["wdl"]
            results.append(rating.Result(r.player, opponent, w + d / 2, w + d + losses))
    fitted = rating.fit(results, anchor, ANCHOR_ELO)
    for r in rows:
        rated = fitted[r.player]
        r.rating, r.rating_ci = rated.elo, (rated.ci_low, rated.ci_high)
    return fitted


def _pool_series(row: Row) -> list[tuple[str, dict]]:
    """(pool name, summary) of every series of `row` judged by GNU Go: GNU Go levels, then
    pool models."""
    return ([(gnugo_name(k), s) for k, s in row.vs_gnugo.items()]
            + list(row.vs_models.items()) + list(row.vs_engines.items()))


def format_row(row: Row) -> str:
    w, d, losses = row.vs_random
    lo, hi = row.random_ci or (0.0, 1.0)
    text = (f"gen {row.generation:4d} {str(row.budget):>12}  vs random W-D-L "
            f"{w:3d}-{d}-{losses:<3d} ({100 * row.random_win_rate:5.1f}% "
            f"[{100 * lo:.0f}, {100 * hi:.0f}])")
    for opponent, s in _pool_series(row):
        a, b, c = s["wdl"]
        text += (f"   vs {opponent} {a}-{b}-{c} ({100 * s['win_rate']:.1f}% "
                 f"[{100 * s['ci'][0]:.0f}, {100 * s['ci'][1]:.0f}])")
        if s["disagreements"]:
            text += f" {s['disagreements']} judged otherwise by area"
        if s.get("we_disagree"):
            text += f", {s['we_disagree']} by our own count"
        if s.get("wipeouts"):
            text += f", {s['wipeouts']} with all our stones dead"
        if s.get("time_losses"):
            text += f", {s['time_losses']} lost on time"
        if s.get("forfeits"):
            text += f", {s['forfeits']} forfeited (an illegal or unreadable move)"
        if s.get("played_out"):
            a, b, c = s["at_first_passes"]["wdl"]
            text += (f", {s['played_out']} disputes about dead stones played out (judged at "
                     f"the first passes instead: {a}-{b}-{c}, "
                     f"{100 * s['at_first_passes']['win_rate']:.1f}%)")
    if row.vs_gen0 is not None:
        a, b, c = row.vs_gen0
        lo, hi = row.vs_gen0_ci
        text += f"   vs gen 0 W-D-L {a:3d}-{b}-{c:<3d} Elo {row.vs_gen0_elo:+5.0f} " \
                f"[{lo:+.0f}, {hi:+.0f}]"
    if row.rating is not None:
        text += f"   rating {row.rating:+.0f} [{row.rating_ci[0]:+.0f}, {row.rating_ci[1]:+.0f}]"
    if row.hours is not None:
        text += f"   ({row.hours:.2f} h into the run)"
    return text


def _opponents(rows: Sequence[Row]) -> list[str]:
    keys = sorted({k for r in rows for k in r.vs_gnugo}, key=split_gnugo)
    models = sorted({k for r in rows for k in r.vs_models})
    engines = sorted({k for r in rows for k in r.vs_engines})
    return [RANDOM] + [gnugo_name(k) for k in keys] + models + engines


def _win_rate(row: Row, opponent: str) -> tuple[float, float, float] | None:
    """(win rate, low, high) in % of `row` against `opponent`, or None if not played."""
    if opponent == RANDOM:
        lo, hi = row.random_ci or (0.0, 1.0)
        return 100 * row.random_win_rate, 100 * lo, 100 * hi
    s = dict(_pool_series(row)).get(opponent)
    if s is None or s["win_rate"] is None:
        return None
    return 100 * s["win_rate"], 100 * s["ci"][0], 100 * s["ci"][1]


def plot(rows: Sequence[Row], path: Path) -> None:
    """strength.png: win rates (Wilson 95% bands) and the rating (or Elo against generation
    0) by generation, by budget when there are several, and the rating against the run's
    wall time when the models say when they were made (what each hour of the run bought)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    budgets = list(dict.fromkeys(r.budget for r in rows))
    opponents = _opponents(rows)
    timed = [r for r in rows if r.rating is not None and r.hours is not None]
    panels = 2 + (len(budgets) > 1) + bool(timed)
    fig, axes = plt.subplots(panels, 1, figsize=(7, 3 * panels))
    top, middle = axes[0], axes[1]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    for i, opponent in enumerate(opponents):
        for j, budget in enumerate(budgets):
            points = [(r.generation, _win_rate(r, opponent)) for r in rows if r.budget == budget]
            points = [(g, w) for g, w in points if w is not None]
            if not points:
                continue
            xs = [g for g, _ in points]
            label = f"vs {opponent}" + (f", {budget}" if len(budgets) > 1 else "")
            colour = colours[i % len(colours)]
            top.plot(xs, [w[0] for _, w in points], marker="o", color=colour,
                     ls=styles[j % len(styles)], label=label)
            top.fill_between(xs, [w[1] for _, w in points], [w[2] for _, w in points],
                             alpha=0.12, color=colour)
    top.axhline(50, color="grey", lw=0.8, ls="--")
    top.set_ylim(0, 100)
    top.set_ylabel("% won (95% CI)")
    top.set_xlabel("generation")
    top.legend(fontsize="small")
    rated = [r for r in rows if r.rating is not None]
    if rated:
        for j, budget in enumerate(budgets):
            mine = [r for r in rated if r.budget == budget]
            xs = [r.generation for r in mine]
            middle.plot(xs, [r.rating for r in mine], marker="o", ls=styles[j % len(styles)],
                        color="tab:green", label=str(budget))
            middle.fill_between(xs, [r.rating_ci[0] for r in mine],
                                [r.rating_ci[1] for r in mine], alpha=0.15, color="tab:green")
        middle.axhline(ANCHOR_ELO, color="grey", lw=0.8, ls="--")
        middle.set_ylabel(f"Elo, {anchor_of(rows)} = {ANCHOR_ELO:g}")
        if len(budgets) > 1:
            middle.legend(fontsize="small")
    else:
        chained = [r for r in rows if r.vs_gen0_elo is not None and r.budget == budgets[0]]
        xs = [0] + [r.generation for r in chained]
        middle.plot(xs, [0.0] + [r.vs_gen0_elo for r in chained], marker="o",
                    color="tab:green")
        middle.fill_between(xs, [0.0] + [r.vs_gen0_ci[0] for r in chained],
                            [0.0] + [r.vs_gen0_ci[1] for r in chained], alpha=0.2,
                            color="tab:green")
        middle.set_ylabel("Elo vs generation 0 (95% CI)")
    middle.set_xlabel("generation")
    for ax in (top, middle):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if timed:
        ax = axes[-1]
        for j, budget in enumerate(budgets):
            mine = sorted((r for r in timed if r.budget == budget), key=lambda r: r.hours)
            xs = [r.hours for r in mine]
            ax.plot(xs, [r.rating for r in mine], marker="o", ls=styles[j % len(styles)],
                    color="tab:purple", label=str(budget))
            ax.fill_between(xs, [r.rating_ci[0] for r in mine], [r.rating_ci[1] for r in mine],
                            alpha=0.15, color="tab:purple")
            for r in mine:
                ax.annotate(f"gen {r.generation}", (r.hours, r.rating), fontsize="x-small",
                            textcoords="offset points", xytext=(3, 3))
        ax.axhline(ANCHOR_ELO, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("hours of the run (stops left out)")
        ax.set_ylabel(f"Elo, {anchor_of(rows)} = {ANCHOR_ELO:g}")
        if len(budgets) > 1:
            ax.legend(fontsize="small")
    if len(budgets) > 1:
        bottom = axes[2]
        newest = max(r.generation for r in rows)
        mine = {r.budget: r for r in rows if r.generation == newest}
        xs = list(range(len(budgets)))
        for i, opponent in enumerate(opponents):
            rates = [_win_rate(mine[b], opponent) if b in mine else None for b in budgets]
            pts = [(x, w) for x, w in zip(xs, rates) if w is not None]
            if pts:
                colour = colours[i % len(colours)]
                bottom.errorbar([x for x, _ in pts], [w[0] for _, w in pts],
                                yerr=[[w[0] - w[1] for _, w in pts], [w[2] - w[0] for _, w in pts]],
                                marker="o", color=colour, capsize=3, label=f"vs {opponent}")
        bottom.set_xticks(xs, [str(b) for b in budgets])
        bottom.set_ylim(0, 100)
        bottom.set_ylabel(f"% won, generation {newest}")
        bottom.set_xlabel("thinking per move")
        bottom.legend(fontsize="small")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    write_atomic(path, buf.getvalue())


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


def append_history(path: Path, report: dict) -> None:
    """Add one evaluation to the history: one JSON line, appended and synced; earlier lines
    are never rewritten (strength.json holds only the newest)."""
    line = json.dumps(report, separators=(",", ":")) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def read_history(path: Path) -> list[dict]:
    """Every evaluation of the history file, oldest first (a torn last line is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


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


def main(argv: Sequence[str] | None = None) -> int:
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
    ap.add_argument("--endings", default=None, metavar="DIR",
                    help="only explain how the games in DIR (strength_games/<time>) ended: "
                    "lost in play or in the ending, by GNU Go's judgement at the opponent's "
                    "first pass and at the end")
    args = ap.parse_args(argv)
    if args.endings is not None:
        counts = gnugo.explain_endings(Path(args.endings))
        print(json.dumps(counts))
        return 0
    try:
        cfg = load_config(args.config)
        paths = RunDir(args.run_dir or cfg.run.dir)
        run_dir = paths.root
        if args.config is None and paths.config.exists():
            cfg = load_config(paths.config)  # the settings the run trained with
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
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
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    budgets = [Budget(simulations=n) for n in sims]
    budgets += [Budget(seconds_per_move=t) for t in seconds]
    if clock is not None:  # the engine's own budget when no clock applies: a period's share
        share = clock[1] / clock[2] if clock[1] > 0 and clock[2] > 0 else 1.0
        budgets.append(Budget(seconds_per_move=max(0.05, share), time_settings=clock))
    if not budgets:
        budgets = [Budget(cfg.evaluation.simulations or cfg.mcts.simulations)]
    if (levels or seconds or clock or frozen or engines) and find_gnugo() is None:
        print("error: GNU Go not found on PATH or in /usr/games (apt-get install gnugo); --gnugo,"
              " --pool-model, --opponent and --seconds-per-move need it (it judges those games)",
              file=sys.stderr)
        return 2
    have = list_models(paths.models)
    if not have:
        print(f"error: no model in {paths.models}: no run in {run_dir} (start one with "
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
            print(f"error: no model for generation(s) {missing} in {paths.models}; "
                  f"there are {have[0]}..{have[-1]}", file=sys.stderr)
            return 2
    else:
        gens = default_generations(have)
    if 0 not in have and any(b.simulations is not None for b in budgets) and gens != [0]:
        # at a simulation budget each generation plays generation 0; at a time budget it
        # does not (a model copied from another machine can be rated alone)
        print(f"error: {model_path(run_dir, 0)} not found: at a simulation budget every "
              "generation plays generation 0; copy it there, or rate by time alone "
              "(--seconds-per-move or --time-settings)", file=sys.stderr)
        return 2
    if args.games < 2:
        print("error: --games must be at least 2 (colours alternate)", file=sys.stderr)
        return 2
    gnugo_games = args.games if args.gnugo_games is None else args.gnugo_games
    if (levels or frozen or engines) and gnugo_games < 2:
        print("error: --gnugo-games must be at least 2 (colours alternate)", file=sys.stderr)
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
    sgf_dir = paths.strength_games(stamp)
    with tempfile.TemporaryDirectory(prefix="azgo-strength-") as tmp:
        config_path = Path(tmp) / "config.yaml"  # the GTP engines' search settings
        config_path.write_text(dump_config(cfg))
        try:
            rows = measure(cfg, run_dir, gens, args.games, budgets=budgets, gnugo_levels=levels,
                           gnugo_games=gnugo_games, pool_models=frozen, engines=engines,
                           jobs=jobs, config_path=config_path,
                           log=lambda line: print(line, flush=True), sgf_dir=sgf_dir)
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
    print("\n".join(format_row(r) for r in rows))
    if anchor is not None:
        pool = ", ".join(f"{n} {r.elo:+.0f} [{r.ci_low:+.0f}, {r.ci_high:+.0f}]"
                         for n, r in fitted.items() if not n.startswith("gen "))
        print(f"pool ratings ({anchor} = {ANCHOR_ELO:g}): {pool}")
    print(f"{seconds_taken:.0f} s; wrote {paths.strength_json}, {paths.strength_png}, a line of "
          f"{paths.strength_history}" + (f" and the games in {sgf_dir}" if sgf_dir.exists()
                                         else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
