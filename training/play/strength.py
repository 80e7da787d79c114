"""The strength table: each generation of a run against a fixed pool, and the pool's rating.

`measure` plays the matches of `python -m training.strength` (the command, its flags and
its files are described in training/strength.py): for every generation and budget, the
random player (`play_vs_random`, all games searched at once; `players.RandomPlayer`), GNU Go
levels, frozen pool models and outside GTP engines through `training.play.gnugo`'s series,
and generation 0 through the arena. `rate` fits every row and pool member jointly
(`training.play.rating`, anchored at `ANCHOR_ELO`); `format_row` and `plot` show the
table; `append_history`/`read_history` keep every evaluation of a run folder; `run_hours`
says how far into the run each generation was published.

It reads the run's models only; it never writes a model or a metrics row.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from configs import Config
from distributed.transfer import sha256_file, write_atomic
from training.go.coords import BLACK
from training.go.rules import Position
from training.learn.net import load_model, make_evaluator
from training.play import gnugo, rating
from training.play.arena import MatchResult, play_arena
from training.play.gnugo import gnugo_name, split_gnugo
from training.play.journal import Journal, series_key
from training.play.opponent import Engine, PoolModel
from training.play.players import NetWinrates, RandomPlayer
from training.play.referee import TimeControl
from training.run import metrics
from training.run.model_store import ModelStoreError, model_stem, read_manifest
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
            sgf_dir: Path | None = None, journal: Journal | None = None) -> list[Row]:
    """Play the matches of the table; `log` gets progress lines as results come, and with
    `sgf_dir` every game played through GTP is written there as SGF as it ends. With
    `journal` each such game is also appended to it as it ends, and a game it holds already
    (`Journal.done`) is read back instead of played."""
    if budgets is None:
        budgets = [Budget(simulations or cfg.evaluation.simulations or cfg.mcts.simulations)]
    gnugo_games = games if gnugo_games is None else gnugo_games
    evaluators: dict[int, Evaluate] = {}

    def evaluator(g: int) -> Evaluate:
        if g not in evaluators:
            net, _ = load_model(model_path(run_dir, g))
            evaluators[g] = make_evaluator(net, jit=cfg.net.inference, max_batch=max(games, 8),
                                           score=cfg.mcts.wants_score)
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
            series = _series_runner(cfg, ours, budget, row, jobs=jobs, log=log, sgf_dir=sgf_dir,
                                    judge=judge, journal=journal,
                                    model=sha256_file(model_path(run_dir, g)) if journal else "")

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
                    outcomes = series(e.name, e.command, gnugo_games, identity=e.command_line,
                                      **e.series_args)
                    row.vs_engines[e.name] = _series_summary(outcomes)
            log(format_row(row))
            rows.append(row)
    rate(rows)
    return rows


def _series_runner(cfg: Config, ours: gnugo.Engines, budget: Budget, row: Row, *, jobs: int,
                   log: Callable[[str], None], sgf_dir: Path | None,
                   judge: NetWinrates | None, journal: Journal | None = None,
                   model: str = "") -> Callable[..., list[gnugo.Outcome]]:
    """`series(name, opponent, n, bonus=0.0, identity="", **extra)`: a series of `row`'s
    player (`ours`, its model's sha256 `model`) against `opponent` through GTP, each game
    logged as it ends and, with `sgf_dir`, written there as SGF with `judge`'s win rates; with
    `journal`, appended to it, and the games it holds of the same series (`identity`: what
    else names the opponent, an outside engine's command line) read back, not played."""
    g = row.generation

    def series(name: str, opponent, n: int, bonus: float = 0.0, identity: str = "",
               **extra) -> list[gnugo.Outcome]:
        key = series_key(generation=g, model=model, budget=str(budget), opponent=name,
                         identity=identity, bonus=bonus, size=cfg.go.board_size,
                         komi=cfg.go.komi, seed=cfg.run.seed)

        def progress(outcome: gnugo.Outcome) -> None:
            log(f"  {row.player} vs {name}: {outcome.describe()}")
            if journal is not None:
                journal.add(key, outcome)
            if sgf_dir is not None and judge is not None:
                label = f"gen{g}_{budget}_vs_{name}_{outcome.spec.index + 1:03d}"
                file = sgf_dir / (label.replace(" ", "").replace("/", "per") + ".sgf")
                sgf_dir.mkdir(parents=True, exist_ok=True)
                sgf = outcome.to_sgf(f"azgo {row.player}", f"{name}",
                                     winrates=judge(outcome.moves))
                write_atomic(file, sgf.encode())

        specs = gnugo.schedule(n, cfg.go.board_size, cfg.run.seed)
        done = [journal.done(key, s) for s in specs] if journal is not None else []
        kept = {o.spec.index: o for o in done if o is not None}
        if kept:
            log(f"  {row.player} vs {name}: {len(kept)} of {n} games read back from "
                f"{journal.path}")
        played = gnugo.play_series(ours, opponent, [s for s in specs if s.index not in kept],
                                   size=cfg.go.board_size, komi=cfg.go.komi,
                                   komi_bonus=bonus, time_control=budget.time_control,
                                   jobs=jobs, on_game=progress, **extra)
        return sorted([*kept.values(), *played], key=lambda o: o.spec.index)

    return series


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
    _plot_win_rates(top, rows, budgets, opponents, colours, styles)
    _plot_rating(middle, rows, budgets, styles)
    middle.set_xlabel("generation")
    for ax in (top, middle):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if timed:
        _plot_hours(axes[-1], rows, timed, budgets, styles)
    if len(budgets) > 1:
        _plot_budgets(axes[2], rows, budgets, opponents, colours)
    metrics.save_png(fig, axes, path)


def _plot_win_rates(top, rows: Sequence[Row], budgets: list[Budget], opponents: list[str],
                    colours: list[str], styles: list[str]) -> None:
    """The top panel: win rates against each opponent by generation, with Wilson bands."""
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


def _plot_rating(middle, rows: Sequence[Row], budgets: list[Budget], styles: list[str]) -> None:
    """The second panel: the pool rating by generation, else the Elo against generation 0."""
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


def _plot_hours(ax, rows: Sequence[Row], timed: list[Row], budgets: list[Budget],
                styles: list[str]) -> None:
    """The rating against the hours of the run (what each hour bought)."""
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


def _plot_budgets(bottom, rows: Sequence[Row], budgets: list[Budget], opponents: list[str],
                  colours: list[str]) -> None:
    """The newest generation's win rates against thinking per move."""
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
