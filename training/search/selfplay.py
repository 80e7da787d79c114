"""Self-play: many games at once through batched search, finished games as GameRecords.

Owns:
- `SelfPlay`: `parallel_games` slots, each holding one game in progress, searched together
  (all games' leaves evaluated together, one network call per search step). A game whose
  search ends plays its move and starts its next search at once, so every step keeps every
  game in the batch even when searches differ in length (playout cap randomization, a
  fresh root's extra evaluation); `step()` runs search steps until every game has played at
  least one move. A finished game is returned as a `training.go.records.GameRecord` while a
  new game starts in its slot.
- `play_match`: games between two evaluators (the arena), batched the same way.

Vocabulary: a *slot* is a place for one game in progress (a row of the search's arrays);
a game's *seed* (derived from the base seed and the game's number) seeds its own numpy
Generator, which draws its root noise, its sampled moves and whether its resignation is
disabled, so a game does not depend on which other games share its batches.

Policy targets (`GameRecord.visits`) are what the search learned, never the move played:
the root visit counts (`mcts.algorithm: puct`), or the improved policy
softmax(logits + sigma(completed Q)) as round(p * `records.POLICY_SCALE`), the move played
at least 1 (`gumbel`). Moves to play: PUCT draws the first `temperature_moves` moves of a
game in proportion to visits, then plays the most visited move. Gumbel plays the move its
search chose: among the moves sequential halving kept, the largest g + logit + sigma(Q),
with the root's Gumbel noise g in the first `temperature_moves` moves (a sample, close to
one from the improved policy) and g = 0 after them (the search's best). Self-play searches
always draw g (Gumbel's exploration of the targets; it replaces Dirichlet noise), so
`temperature_moves` only decides whether the noise also picks the move.

Playout cap randomization (KataGo; `mcts.full_search_fraction` < 1): each move is, by the
game's generator, a full search (`mcts.simulations`, root noise, a policy target) with that
probability, else a fast search (`mcts.fast_simulations`, no root noise except Gumbel's in
the first `temperature_moves` moves, where it varies the openings); `GameRecord.full_search`
marks the moves whose targets the trainer learns the policy from (every move trains the
value). The tree is reused across both kinds as usual.

A side resigns when its root value (its own view) has stayed below `resign_threshold` for
`resign_moves` of its own moves in a row (one noisy search never ends a game); in `resign_disabled_fraction` of games resignation is off and
the record notes the colour that would have resigned (`would_resign_as`), so the share of
such games that colour went on to win is the false-resignation rate. With
`self_play.soft_resign` no game resigns (every record says resignation was off): a game that
would resign is decided, and its later moves are all fast searches (value targets only),
played to the end (KataGo's soft resignation).

Self-play searches never pass first while a real move is left (`Mcts(early_pass=False)`,
see "Passes" in `training.search.mcts`), nor does `training.play.players.MctsPlayer` (the
GTP engine) by default; `play_match` plays the full rules unless given `early_pass=False`.

A record's `generation` is the model generation when the game STARTED; after
`set_evaluator(evaluate, generation)` games in progress continue with the new model, and
`offer_evaluator` (from any thread) puts it in between two network calls of a step.

This module imports no torch and reads no files: the evaluator comes in as a callable
(`training.learn.net.make_evaluator`), and the caller writes the records (`training.go.records`).
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from training.go import fastgo
from training.go.coords import BLACK
from training.go.records import MAX_SURPRISE, POLICY_SCALE, GameRecord
from training.search.mcts import Evaluate, Mcts

if TYPE_CHECKING:
    from configs import GoConfig, MctsConfig, SelfPlayConfig

log = logging.getLogger(__name__)


def game_seed(base_seed: int, game_number: int) -> int:
    """The seed of game `game_number` of a run with `base_seed` (63 bits, fits an int64)."""
    state = np.random.SeedSequence([base_seed, game_number]).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(1))


@dataclass
class _Game:
    """A game in progress in one slot."""

    seed: int
    rng: np.random.Generator
    generation: int
    resign_disabled: bool
    would_resign_as: int = 0
    below: dict[int, int] = field(default_factory=dict)
    """Each colour's own moves in a row with its root value below the resign threshold."""
    moves: list[int] = field(default_factory=list)
    visits: list[np.ndarray] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    full: list[bool] = field(default_factory=list)
    surprise: list[float] = field(default_factory=list)
    searching_full: bool = True
    """The search in progress is a full one (its move's target trains the policy)."""
    decided: bool = False
    """A side would have resigned and the game is played out (soft resignation): fast
    searches only from here."""


def policy_rows(mcts: Mcts, games: np.ndarray, moves: np.ndarray) -> np.ndarray:
    """uint16 [len(games), A + 1]: the stored policy targets of finished searches.

    PUCT: the root visit counts (at most 65535). Gumbel: the improved policy as
    round(p * POLICY_SCALE), the move played at least 1 (a batch's check that the target
    does not disagree with the move; a shift of at most 1 / POLICY_SCALE).
    """
    if not mcts.is_gumbel:
        return np.minimum(mcts.root_visits(games), 65535).astype(np.uint16)
    rows = np.rint(mcts.policy_targets(games) * POLICY_SCALE).astype(np.uint16)
    at = np.arange(len(games))
    rows[at, moves] = np.maximum(rows[at, moves], 1)
    return rows


SURPRISE_PRIOR_FLOOR = 1e-9
"""Priors are floored here before their log, so one surprise is at most about 21 nats."""


def policy_surprise(targets: np.ndarray, priors: np.ndarray) -> np.ndarray:
    """float32 [B]: KL(target || prior) in nats of each row (targets are normalised here,
    priors floored at SURPRISE_PRIOR_FLOOR): how much the search's policy target surprised the
    net (KataGo's policy surprise weighting reads it)."""
    t = targets / np.maximum(targets.sum(axis=1, keepdims=True), 1e-12)
    log_q = np.log(np.maximum(priors, SURPRISE_PRIOR_FLOOR))
    terms = np.where(t > 0, t * (np.log(np.where(t > 0, t, 1.0)) - log_q), 0.0)
    return np.clip(terms.sum(axis=1), 0.0, MAX_SURPRISE).astype(np.float32)


class SelfPlay:
    """Plays `parallel_games` games at once with one evaluator; yields finished GameRecords.

    Args:
        evaluate: evaluate(planes [B, C, N, N], legal [B, A+1]) -> (priors, values).
        go_cfg, mcts_cfg, self_play_cfg: the config sections `go`, `mcts` and `self_play`.
        history: the net's history (C = 2 * history + 1 input planes).
        generation: the model generation of `evaluate`.
        seed: base seed; game k of this object has seed game_seed(seed, k).
        liberties: the net's liberty planes are wanted.
        planes_dtype: the planes' dtype (float32; uint8 for an evaluator that widens them:
            `training.learn.net.make_evaluator`, the net server's client).
    """

    def __init__(
        self,
        evaluate: Evaluate,
        go_cfg: GoConfig,
        mcts_cfg: MctsConfig,
        self_play_cfg: SelfPlayConfig,
        *,
        history: int,
        generation: int = 0,
        seed: int = 0,
        liberties: bool = False,
        planes_dtype: type | str = np.float32,
    ):
        self.go_cfg = go_cfg
        self.mcts_cfg = mcts_cfg
        self.cfg = self_play_cfg
        self.evaluate = evaluate
        self.generation = generation
        self.seed = seed
        self.n_slots = self_play_cfg.parallel_games
        self.mcts = Mcts(
            self.n_slots,
            go_cfg,
            mcts_cfg,
            history=history,
            batch_size=self_play_cfg.batch_size,
            early_pass=self_play_cfg.early_pass,
            liberties=liberties,
            planes_dtype=planes_dtype,
        )
        self.games_started = 0
        self.games_finished = 0
        self.moves_played = 0
        self.full_searches = 0  # moves whose search was a full one (policy targets)
        self._pending: list[GameRecord] = []
        self._searching = np.zeros(self.n_slots, bool)  # a search of this slot is under way
        self._slots: list[_Game] = [self._new_game(g) for g in range(self.n_slots)]
        self._offered: tuple[Evaluate, int] | None = None
        self._offer_lock = threading.Lock()

    def set_evaluator(self, evaluate: Evaluate, generation: int) -> None:
        """Use a new model from the next move on; games in progress continue with it."""
        self.evaluate = evaluate
        self.generation = generation

    def offer_evaluator(self, evaluate: Evaluate, generation: int) -> None:
        """Use a new model from the next network call on, also in the middle of a `step()`
        (safe from another thread, e.g. one that loaded the model while this one played):
        the searches under way finish with it, as games in progress do. A newer offer not
        yet taken replaces an older one."""
        with self._offer_lock:
            self._offered = (evaluate, generation)

    def take_offered(self) -> None:
        """Put an offered model in now (between steps; `step()` does it before each of its
        network calls)."""
        if self._offered is None:  # the common case, without the lock
            return
        with self._offer_lock:
            offered, self._offered = self._offered, None
        if offered is not None:
            self.set_evaluator(*offered)

    @property
    def full_simulations(self) -> int:
        """A full search's simulations at this generation: `mcts.simulations`, or during
        `self_play.simulations_ramp` generations a linear ramp up from
        `mcts.fast_simulations` (progressive simulation)."""
        ramp, top = self.cfg.simulations_ramp, self.mcts.simulations
        if ramp <= 0 or self.generation >= ramp:
            return top
        low = min(self.mcts_cfg.fast_simulations, top)
        return int(round(low + (top - low) * self.generation / ramp))

    def _new_game(self, slot: int) -> _Game:
        seed = game_seed(self.seed, self.games_started)
        self.games_started += 1
        rng = np.random.default_rng(seed)
        disabled = bool(rng.random() < self.cfg.resign_disabled_fraction) or self.cfg.soft_resign
        self.mcts.reset_game(slot, komi=self.go_cfg.komi)
        self._searching[slot] = False
        return _Game(seed=seed, rng=rng, generation=self.generation, resign_disabled=disabled)

    def step(self) -> list[GameRecord]:
        """Search steps until every game has played at least one move (a game whose search
        ends plays and starts its next search at once); returns the games that finished."""
        finished: list[GameRecord] = []
        moved = np.zeros(self.n_slots, bool)
        while not moved.all():
            self.take_offered()
            idle = np.flatnonzero(~self._searching)
            if len(idle):
                self._start_searches(idle)
            self.mcts.step([self.evaluate])
            done = np.flatnonzero(self._searching & ~self.mcts.searching())
            if len(done):
                self._searching[done] = False
                moved[done] = True
                finished += self._play_searched(done)
        return finished

    def _start_searches(self, slots: np.ndarray) -> None:
        """Start the next move's search in `slots`: full or fast (playout cap
        randomization, drawn from the game's generator), with or without root noise."""
        cfg = self.mcts_cfg
        fraction = cfg.full_search_fraction
        sims = np.empty(len(slots), np.int64)
        rngs: list[np.random.Generator | None] = []
        for i, g in enumerate(slots.tolist()):
            game = self._slots[g]
            full = (fraction >= 1.0 or bool(game.rng.random() < fraction)) and not game.decided
            game.searching_full = full
            sims[i] = self.full_simulations if full else cfg.fast_simulations
            opening = len(game.moves) < self.cfg.temperature_moves
            noisy = full or (self.mcts.is_gumbel and opening)
            rngs.append(game.rng if noisy else None)
        self.mcts.start_search(slots, rngs, sims)
        self._searching[slots] = True

    def _play_searched(self, slots: np.ndarray) -> list[GameRecord]:
        """Resign, or play the searched move, in each of `slots`; the finished games."""
        games = self._slots
        values = self.mcts.root_values(slots)
        threshold = self.cfg.resign_threshold
        finished: list[GameRecord] = []
        playing = []
        for i, g in enumerate(slots.tolist()):
            game = games[g]
            color = self.mcts.to_play(g)
            game.below[color] = game.below.get(color, 0) + 1 if values[i] < threshold else 0
            if threshold > -1.0 and game.below[color] >= self.cfg.resign_moves:
                if not game.resign_disabled:
                    finished.append(self._finish(g, resigned_by=color))
                    continue
                if game.would_resign_as == 0:
                    game.would_resign_as = color
                game.decided = self.cfg.soft_resign
            playing.append((g, float(values[i])))
        if not playing:
            return finished
        idx = np.asarray([g for g, _ in playing], np.int64)
        sample = np.array([len(games[g].moves) < self.cfg.temperature_moves for g in idx], bool)
        moves = self.mcts.select_moves(idx, [games[g].rng for g in idx], sample)
        rows = policy_rows(self.mcts, idx, moves)
        full = np.array([games[g].searching_full for g in idx.tolist()], bool)
        surprise = np.zeros(len(idx), np.float32)  # a fast search has no policy target
        if full.any():
            surprise[full] = policy_surprise(rows[full].astype(np.float32),
                                             self.mcts.root_priors(idx[full]))
        for (g, value), move, row, s in zip(playing, moves, rows, surprise.tolist()):
            game = games[g]
            game.moves.append(int(move))
            game.visits.append(row)
            game.values.append(value)
            game.full.append(game.searching_full)
            game.surprise.append(s)
            self.full_searches += game.searching_full
        self.mcts.play(idx, moves)
        self.moves_played += len(playing)
        for g in idx[fastgo.rows_over(self.mcts.boards, idx)].tolist():
            finished.append(self._finish(g, resigned_by=0))
        return finished

    def _finish(self, slot: int, resigned_by: int) -> GameRecord:
        """The record of the game in `slot`; a new game starts there."""
        game = self._slots[slot]
        n = self.go_cfg.board_size
        if resigned_by:
            score, result = math.nan, -resigned_by
        else:
            score = self.mcts.score(slot)
            result = 0 if score == 0 else (1 if score > 0 else -1)
        record = GameRecord(
            board_size=n,
            komi=float(self.go_cfg.komi),
            moves=np.asarray(game.moves, np.int16),
            visits=(
                np.stack(game.visits)
                if game.visits
                else np.zeros((0, n * n + 1), np.uint16)
            ),
            result=int(result),
            score=float(score),
            resigned=bool(resigned_by),
            resign_disabled=game.resign_disabled,
            would_resign_as=int(game.would_resign_as),
            generation=game.generation,
            seed=game.seed,
            simulations=self.full_simulations,
            values=np.asarray(game.values, np.float16),
            full_search=np.asarray(game.full, np.bool_),
            surprise=np.asarray(game.surprise, np.float16),
        )
        self.games_finished += 1
        log.debug(
            "game seed=%d moves=%d result=%+d resigned=%s", game.seed, len(game.moves),
            result, bool(resigned_by),
        )
        self._slots[slot] = self._new_game(slot)
        return record

    def play(
        self,
        max_games: int | None = None,
        should_stop: Callable[[], bool] | None = None,
        on_game: Callable[[GameRecord], None] | None = None,
    ) -> list[GameRecord]:
        """Play until `max_games` games have finished or `should_stop()` is true (checked
        between moves). Returns exactly `max_games` records when that many finished; games
        that finish beyond it are kept for the next call."""
        out: list[GameRecord] = []
        while True:
            while self._pending and (max_games is None or len(out) < max_games):
                record = self._pending.pop(0)
                out.append(record)
                if on_game is not None:
                    on_game(record)
            if max_games is not None and len(out) >= max_games:
                return out
            if should_stop is not None and should_stop():
                return out
            self._pending.extend(self.step())

    def discard_unfinished(self) -> int:
        """Drop every game in progress (they restart empty); returns how many had moves."""
        dropped = sum(1 for game in self._slots if game.moves)
        self._slots = [self._new_game(g) for g in range(self.n_slots)]
        return dropped


def false_resignation_rate(records: Sequence[GameRecord]) -> float | None:
    """Among resign-disabled games that would have resigned, the share that the would-be
    resigner went on to win (None when there is no such game). Keep it under ~5% by
    lowering resign_threshold when it grows."""
    would = [r for r in records if r.resign_disabled and r.would_resign_as != 0]
    if not would:
        return None
    return sum(r.result == r.would_resign_as for r in would) / len(would)


# ------------------------------------------------------------------------------ arena


def play_match(
    evaluate_a: Evaluate,
    evaluate_b: Evaluate,
    n_games: int,
    go_cfg: GoConfig,
    mcts_cfg: MctsConfig,
    seed: int,
    *,
    history: int,
    opening_moves: int = 4,
    simulations: int | None = None,
    batch_size: int = 256,
    early_pass: bool = True,
    liberties: bool = False,
) -> list[tuple[GameRecord, bool]]:
    """Play n_games between two evaluators, all at once; returns (record, a_was_black).

    Colours alternate (A is black in games 0, 2, 4, ...). Each move is a fresh search by the
    side to move's evaluator (no tree reuse); the first `opening_moves` moves are drawn from
    the game's own seed, so the games differ (PUCT: in proportion to visits, no root noise;
    Gumbel: the search's choice with Gumbel noise), then the search's best move is played
    (the most visited; Gumbel: its choice with g = 0). No resignation: games are played out
    and scored.
    `early_pass` False: neither side passes first while a real move is left
    (`training.search.mcts`).
    """
    if n_games <= 0:
        return []
    sims = mcts_cfg.simulations if simulations is None else simulations
    mcts = Mcts(
        n_games, go_cfg, mcts_cfg, history=history, batch_size=batch_size,
        simulations=sims, reuse_tree=False, early_pass=early_pass, liberties=liberties,
    )
    a_black = np.arange(n_games) % 2 == 0
    seeds = [game_seed(seed, k) for k in range(n_games)]
    rngs = [np.random.default_rng(s) for s in seeds]
    moves: list[list[int]] = [[] for _ in range(n_games)]
    visits: list[list[np.ndarray]] = [[] for _ in range(n_games)]
    values: list[list[float]] = [[] for _ in range(n_games)]
    for g in range(n_games):
        mcts.reset_game(g, komi=go_cfg.komi)
    active = np.ones(n_games, bool)
    while active.any():
        games = np.flatnonzero(active)
        to_play = mcts.boards.info[:n_games, fastgo.TO_PLAY]
        owner = np.where((to_play == BLACK) == a_black, 0, 1)
        sample = np.array([len(moves[g]) < opening_moves for g in games], bool)
        noise = None
        if mcts.is_gumbel:  # Gumbel samples through its root noise, PUCT by its visits
            noise = [rngs[g] if s else None for g, s in zip(games, sample)]
        mcts.search([evaluate_a, evaluate_b], games, rngs=noise, owner=owner)
        vals = mcts.root_values(games)
        chosen = mcts.select_moves(games, [rngs[g] for g in games], sample)
        rows = policy_rows(mcts, games, chosen)
        for i, g in enumerate(games):
            moves[g].append(int(chosen[i]))
            visits[g].append(rows[i])
            values[g].append(float(vals[i]))
        mcts.play(games, chosen)
        for g in games:
            if mcts.is_over(int(g)):
                active[g] = False
    return _match_records(mcts, go_cfg, moves, visits, values, seeds, sims, a_black)


def _match_records(mcts: Mcts, go_cfg: GoConfig, moves: list[list[int]],
                   visits: list[list[np.ndarray]], values: list[list[float]], seeds: list[int],
                   sims: int, a_black: np.ndarray) -> list[tuple[GameRecord, bool]]:
    """`play_match`'s finished games as records, scored by the search's rules, with whether
    A was black in each."""
    n_games = len(moves)
    out = []
    n = go_cfg.board_size
    for g in range(n_games):
        score = mcts.score(g)
        record = GameRecord(
            board_size=n,
            komi=float(go_cfg.komi),
            moves=np.asarray(moves[g], np.int16),
            visits=np.stack(visits[g]),
            result=0 if score == 0 else (1 if score > 0 else -1),
            score=float(score),
            resigned=False,
            resign_disabled=True,
            would_resign_as=0,
            generation=-1,
            seed=seeds[g],
            simulations=sims,
            values=np.asarray(values[g], np.float16),
        )
        out.append((record, bool(a_black[g])))
    return out
