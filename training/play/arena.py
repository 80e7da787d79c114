"""Evaluation: a new generation against the previous one (gating, Elo) and against GNU Go.

Owns:
- `play_arena(new, old, games, cfg, seed)`: games between two evaluators through the batched
  search (`selfplay.play_match`): colours alternate, the first `OPENING_MOVES` moves of each
  game are sampled from its own seed (varied openings), every move is a fresh search (no tree
  reuse, no noise). Returns the W/D/L of the new model.
- `decide(...)`: `cfg.evaluation.gating`: none (always promote), threshold (score >=
  gating_threshold) or sprt (Leela Zero's SPRT, elo0/elo1, alpha = beta = 0.05; games are
  played in rounds until it decides or `evaluation.games` are played; undecided -> threshold).
- `evaluate_generation(cfg, run_dir, generation)`: the coach's call after a training round:
  the new model against the newest promoted one (the newest model with a manifest), its
  chained Elo with a 95% CI, an optional GNU Go match, and the metrics row columns.
- `play_gnugo(...)`: games against GNU Go at a level through `training.play.gnugo` (varied
  openings, a GNU Go seed per game, GNU Go's judgement of the final position), our side
  played by the GTP engine process (`python -m training.gtp --model FILE`:
  `training.play.players.NetPlayer` inside `training.gtp.GtpEngine`).

Vocabulary: W/D/L are from the new (or our) model's point of view; Elo as in training.play.elo.
This module must not train, write models, or publish anything (the coach does), nor play GTP
itself: its only GTP engine is the `python -m training.gtp` process.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from configs import Config, dump_config, load_config
from training.learn.net import load_model, make_evaluator
from training.play import elo, gnugo, rating
from training.run import metrics
from training.run.model_store import model_stem
from training.search.selfplay import play_match

log = logging.getLogger(__name__)

OPENING_MOVES = 4
"""Moves at the start of an arena game sampled in proportion to visits (varied openings)."""
SPRT_ROUNDS = 4
"""With gating sprt, evaluation.games are played in up to this many rounds."""


@dataclass
class MatchResult(elo.WinsDrawsLosses):
    """W/D/L of player A (the new model, or ours against GNU Go), counted as games end."""

    wins: int = 0
    draws: int = 0
    losses: int = 0

    def add(self, other: "MatchResult") -> None:
        self.wins += other.wins
        self.draws += other.draws
        self.losses += other.losses

    def estimate(self) -> elo.EloEstimate:
        return elo.estimate(self.wins, self.draws, self.losses)


@dataclass
class ArenaResult:
    """The outcome of evaluating one generation (the coach reads `promote` and `elo`)."""

    generation: int
    opponent: int | None
    match: MatchResult = field(default_factory=MatchResult)
    promote: bool = True
    reason: str = ""
    elo_diff: float | None = None
    elo: float | None = None
    elo_ci_low: float | None = None
    elo_ci_high: float | None = None
    sprt_llr: float | None = None
    gnugo: GnugoResult | None = None
    seconds: float = 0.0


def _outcome(result: int, a_was_black: bool) -> int:
    """+1 if A won, -1 if A lost, 0 for a draw; `result` is +1 when black won."""
    if result == 0:
        return 0
    return 1 if (result > 0) == a_was_black else -1


def play_arena(evaluate_new: Any, evaluate_old: Any, games: int, cfg: Config, seed: int,
               *, simulations: int | None = None) -> MatchResult:
    """`games` games new vs old at once (colours alternate, varied openings, fresh trees)."""
    sims = simulations or cfg.evaluation.simulations or cfg.mcts.simulations
    pairs = play_match(
        evaluate_new, evaluate_old, games, cfg.go, cfg.mcts, seed,
        history=cfg.net.history, liberties=cfg.net.liberties, opening_moves=OPENING_MOVES,
        simulations=sims,
        batch_size=max(cfg.self_play.batch_size, games),
    )
    out = MatchResult()
    for record, a_black in pairs:
        o = _outcome(int(record.result), a_black)
        out.wins += o > 0
        out.losses += o < 0
        out.draws += o == 0
    return out


def decide(match: MatchResult, ev_cfg: Any) -> tuple[str, float | None]:
    """("promote" | "reject" | "continue", SPRT LLR or None) under evaluation.gating."""
    if ev_cfg.gating == "none":
        return "promote", None
    if ev_cfg.gating == "threshold":
        return ("promote" if match.score >= ev_cfg.gating_threshold else "reject"), None
    test = elo.sprt(match.wins, match.draws, match.losses, ev_cfg.sprt_elo0, ev_cfg.sprt_elo1)
    verdict = {"H1": "promote", "H0": "reject"}.get(test.decision, "continue")
    return verdict, test.llr


def _opponent(models_dir: Path, generation: int,
              rated: set[int] | None = None) -> int | None:
    """The newest promoted generation below `generation` (a manifest marks promotion);
    without manifests, the newest model file below it. With `rated` (gating none, where the
    arena only rates), the newest promoted one among those, so that every link of the Elo
    chain is a measured one: a generation published while the arena rated another has no
    rating of its own."""
    from training.run.model_store import list_manifests, list_models

    files = [g for g in list_models(models_dir) if g < generation]
    published = [g for g in list_manifests(models_dir) if g in files]
    measured = [g for g in published if rated is not None and g in rated]
    if measured:
        return measured[-1]
    if published:
        return published[-1]
    return files[-1] if files else None


def _rated(run_dir: Path) -> set[int]:
    """Generation 0 and the generations whose metrics row has an Elo."""
    return {0} | {row["generation"] for row in metrics.read_metrics(run_dir)
                  if isinstance(row.get("elo"), (int, float))}


def _rating_of(run_dir: Path, generation: int) -> tuple[float, float]:
    """(Elo, CI half-width) of `generation` from metrics.json; generation 0 is 0 +- 0.

    A generation without a rating (its coach was stopped during its arena, and the resumed
    coach went on with the next) takes the newest rating below it, so the chain goes on where
    it was instead of starting again at 0."""
    for row in reversed(metrics.read_metrics(run_dir)):  # newest generation first
        if row["generation"] <= generation and isinstance(row.get("elo"), (int, float)):
            hi, lo = row.get("elo_ci_high"), row.get("elo_ci_low")
            half = (hi - lo) / 2 if isinstance(hi, (int, float)) and isinstance(
                lo, (int, float)) else 0.0
            return float(row["elo"]), half
    return 0.0, 0.0


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def evaluate_generation(cfg: Config, run_dir: str | os.PathLike, generation: int,
                        *, device: str | None = None) -> ArenaResult:
    """Arena + gating + Elo (+ GNU Go) for `generation`; writes its metrics row columns.

    On a CPU the arena runs with one torch thread (restored after): its search is one thread
    and its net calls are small (a batch of at most the games), so a second thread only spins
    beside the workers and the trainer. Measured alone on 2 cores, 20 games of the default
    config at 32 simulations: 28 to 33 s wall with one thread or two, 27 to 30 CPU seconds
    with one against 55 to 59 with two."""
    device = device or _device()
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        return _evaluate_generation(cfg, Path(run_dir), generation, device)
    finally:
        torch.set_num_threads(threads)


def _evaluate_generation(cfg: Config, run_dir: Path, generation: int,
                         device: str) -> ArenaResult:
    ev = cfg.evaluation
    t0 = time.monotonic()
    models_dir = run_dir / "models"
    opponent = _opponent(models_dir, generation,
                         _rated(run_dir) if ev.gating == "none" else None)
    result = ArenaResult(generation=generation, opponent=opponent)
    new_path = models_dir / f"{model_stem(generation)}.pt"
    if opponent is not None and ev.games > 0:
        new_net, _ = load_model(new_path, device)
        old_net, _ = load_model(models_dir / f"{model_stem(opponent)}.pt", device)
        batch = max(cfg.self_play.batch_size, ev.games)
        evaluate_new, evaluate_old = (
            make_evaluator(net, device, jit=cfg.net.inference, max_batch=batch,
                           score=cfg.mcts.wants_score) for net in (new_net, old_net))
        rounds = SPRT_ROUNDS if ev.gating == "sprt" else 1
        per_round = max(2, 2 * math.ceil(ev.games / rounds / 2))
        verdict, llr = "continue", None
        while result.match.games < ev.games:
            n = min(per_round, ev.games - result.match.games)
            seed = cfg.run.seed * 1_000_003 + generation * 10_007 + result.match.games
            result.match.add(play_arena(evaluate_new, evaluate_old, n, cfg, seed))
            verdict, llr = decide(result.match, ev)
            if verdict != "continue":
                break
        if verdict == "continue":  # SPRT undecided after evaluation.games: use the threshold
            verdict = "promote" if result.match.score >= ev.gating_threshold else "reject"
            result.reason = f"SPRT undecided after {result.match.games} games; threshold"
        result.promote = verdict == "promote"
        result.sprt_llr = llr
        step = result.match.estimate()
        prev_elo, prev_half = _rating_of(run_dir, opponent)
        result.elo_diff = step.elo
        result.elo, result.elo_ci_low, result.elo_ci_high = elo.chain(prev_elo, prev_half, step)
        result.reason = result.reason or f"gating {ev.gating}"
    else:
        result.reason = "no previous generation" if opponent is None else "evaluation.games 0"
    if ev.gnugo_games > 0:
        result.gnugo = play_gnugo(cfg, new_path, ev.gnugo_games, ev.gnugo_level)
    result.seconds = time.monotonic() - t0
    _record(run_dir, result, ev)
    log.info(
        "arena generation=%d opponent=%s W=%d D=%d L=%d score=%.3f elo_diff=%s elo=%s "
        "promote=%s (%s) seconds=%.1f", generation, opponent, result.match.wins,
        result.match.draws, result.match.losses, result.match.score,
        _fmt(result.elo_diff), _fmt(result.elo), result.promote, result.reason, result.seconds,
    )
    return result


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _record(run_dir: Path, result: ArenaResult, ev: Any) -> None:
    values: dict[str, Any] = {"promoted": result.promote}
    if result.match.games:
        values.update(
            arena_opponent=result.opponent, arena_wins=result.match.wins,
            arena_draws=result.match.draws, arena_losses=result.match.losses,
            arena_score=result.match.score, elo_diff=result.elo_diff, elo=result.elo,
            elo_ci_low=result.elo_ci_low, elo_ci_high=result.elo_ci_high,
        )
        if result.sprt_llr is not None:
            values["sprt_llr"] = result.sprt_llr
    if result.gnugo is not None and result.gnugo.games:
        g = result.gnugo
        vs = g.estimate()
        lo, hi = g.interval()
        values.update(gnugo_level=ev.gnugo_level, gnugo_wins=g.wins, gnugo_draws=g.draws,
                      gnugo_games=g.games, gnugo_score=g.score, gnugo_ci_low=lo,
                      gnugo_ci_high=hi, gnugo_disagreements=g.disagreements,
                      elo_vs_gnugo=vs.elo)
    metrics.record_metrics(run_dir, result.generation, **values)


# ------------------------------------------------------------------------------------ GNU Go


@dataclass
class GnugoResult(MatchResult):
    """W/D/L against GNU Go by its own judgement, with the games' details."""

    level: int = 1
    disagreements: int = 0  # games where the judge and our area count name different winners
    outcomes: list = field(default_factory=list)  # training.play.gnugo.Outcome per game

    def interval(self) -> tuple[float, float]:
        """The Wilson 95% interval of the score."""
        return rating.wilson(self.wins + 0.5 * self.draws, self.games)


def play_gnugo(cfg: Config, model_path: str | os.PathLike, games: int, level: int,
               *, simulations: int | None = None, seconds_per_move: float | None = None,
               jobs: int = 1, timeout_s: float = 120.0, seed: int | None = None,
               on_game: Any = None) -> GnugoResult:
    """`games` games of the model against GNU Go at `level` through `training.play.gnugo`: varied
    openings (each played with both colours), a GNU Go seed per game, GNU Go as the judge.

    Our side is `python -m training.gtp` with `cfg`'s search settings, at `simulations` (default
    evaluation.simulations or mcts.simulations) or `seconds_per_move` per move.
    """
    sims = None if seconds_per_move is not None else (
        simulations or cfg.evaluation.simulations or cfg.mcts.simulations)
    specs = gnugo.schedule(games, cfg.go.board_size, cfg.run.seed if seed is None else seed)
    with tempfile.TemporaryDirectory(prefix="azgo-gnugo-") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(dump_config(cfg))
        ours = gnugo.engine_command(model_path, simulations=sims,
                                    seconds_per_move=seconds_per_move, config=config)

        def report(outcome: gnugo.Outcome) -> None:
            log.info("vs gnugo level %d %s", level, outcome.describe())
            if on_game is not None:
                on_game(outcome)

        outcomes = gnugo.play_series(ours, gnugo.gnugo_opponent(level), specs,
                                     size=cfg.go.board_size, komi=cfg.go.komi, jobs=jobs,
                                     timeout_s=timeout_s, on_game=report)
    w, d, losses = gnugo.tally(outcomes)
    return GnugoResult(w, d, losses, level=level, outcomes=outcomes,
                       disagreements=sum(o.game.disagrees for o in outcomes))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m training.play.arena",
        description="evaluate a generation (the GTP engine is python -m training.gtp --model)")
    sub = ap.add_subparsers(dest="command", required=True)
    e = sub.add_parser("evaluate", help="arena (+ GNU Go) for one generation of a run")
    e.add_argument("--config", default=None)
    e.add_argument("--run-dir", default=None)
    e.add_argument("--generation", type=int, required=True)
    args = ap.parse_args(argv)
    from training.run.logsetup import configure_logging

    cfg = load_config(args.config)
    configure_logging(None, cfg.logging.level)
    run_dir = Path(args.run_dir or cfg.run.dir)
    r = evaluate_generation(cfg, run_dir, args.generation)
    print(f"generation {r.generation} vs {r.opponent}: W{r.match.wins} D{r.match.draws} "
          f"L{r.match.losses} elo={_fmt(r.elo)} promote={r.promote} ({r.reason})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
