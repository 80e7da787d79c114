"""The players of our GTP engine (`python -m training.gtp`): a search, and a trained model.

A *player* chooses moves for `training.gtp.GtpEngine`, which keeps the board and speaks the
protocol (see `training.gtp.Player`).

Owns:
- `RandomPlayer(seed)`: a uniformly random legal move that never fills its own eye; the
  engine's player until a trained network exists, and the strength table's weakest opponent.
- `MctsPlayer(evaluate, go_cfg, mcts_cfg, simulations)`: searches one position at a time with
  any evaluator (no noise, the search's own choice), under a budget of simulations or seconds
  per move.
- `NetPlayer(model_path, simulations, cfg)`: a `training.gtp.Player` that loads a model file
  and plays with an `MctsPlayer` on the model's board size; `python -m training.gtp --model
  FILE` plays with it. A position of another size is refused with `GtpError`.
- `NetWinrates(model_path, go_cfg)`: black's win rate after every move of a finished game by
  the net alone, for the SBKV graph of the SGFs the strength tool keeps.

It must not: speak GTP or keep a game's board (`training.gtp` does), play self-play games or
write records (`training.search.selfplay`), or import torch when imported: only making a
`NetPlayer` or a `NetWinrates` loads `training.learn.net` (and torch).
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from configs import Config, GoConfig
from training.go import endgame
from training.go.coords import BLACK, EMPTY
from training.go.rules import Position, neighbors
from training.play.gtp_client import GtpError
from training.search.mcts import Evaluate, Mcts

if TYPE_CHECKING:
    from configs import MctsConfig


class RandomPlayer:
    """Uniformly random legal move, never filling its own single-point eye; else pass."""

    def __init__(self, seed: int | None = None):
        self._rng = random.Random(seed)

    def genmove(self, position: Position, color: int) -> int:
        n = position.size
        board = position.board
        nbrs = neighbors(n)
        candidates = [
            p
            for p in range(n * n)
            if board[p] == EMPTY
            and not all(board[q] == color for q in nbrs[p])  # own eye: keep it
            and position.is_legal(p, color)
        ]
        return self._rng.choice(candidates) if candidates else position.pass_move


class MctsPlayer:
    """Searches one position at a time for the GTP engine (no noise, most visited move).

    The budget per move is `simulations`, or with `seconds_per_move` a time: one search of as
    many simulations as the time left allows at the speed of the searches before it (the first
    move of an engine measures it with one chunk first), stopped early if the time runs out
    and followed by another if time is left. So with Gumbel one sequential halving spreads the
    whole budget, as with a fixed number of simulations: the few root moves left at the end
    get most of the visits. A game clock's share (`genmove(seconds=...)`) is searched the same
    way, with `simulations` as a floor rather than a cap: the move searches at least that many
    while the clock's limit allows. No search runs more than `max_simulations`, which also
    sizes the tree (the memory bound: about 32 bytes a node, (max_simulations + 1) * (N*N + 1)
    nodes). Live analysis (`on_chunk`) reads the same searches every `chunk` simulations: a
    genmove with analysis plays the move a plain genmove plays, and open-ended analysis
    (`analyze`) runs searches that each double the tree's visits, so the newest halving
    always holds at least half of them. `last_simulations` and `last_seconds` tell what the
    last move used.

    `early_pass` False (default): never pass first while a real move is left, as in self-play
    (the net never learned what follows its own early pass; against players that never pass
    early, such as `RandomPlayer`, passing first gives the board away; under area
    scoring the rule costs nothing but own-eye fills, which it does not force).
    """

    CHUNK = 8
    """Simulations per chunk of a timed search (`mcts.leaf_batch` leaves per net call)."""
    MAX_TIMED_SIMULATIONS = 20_000
    """Default cap of a timed search: 50 MiB of tree on 9x9."""
    TIME_USE = 0.9
    """Share of the time left that a timed search plans its simulations for (the speed
    varies from position to position; the search also stops at the time)."""

    def __init__(
        self,
        evaluate: Evaluate,
        go_cfg: GoConfig,
        mcts_cfg: MctsConfig,
        simulations: int | None = None,
        *,
        history: int,
        early_pass: bool = False,
        liberties: bool = False,
        seconds_per_move: float | None = None,
        max_simulations: int | None = None,
    ):
        if seconds_per_move is not None and not seconds_per_move > 0:
            raise ValueError(f"seconds_per_move must be > 0, got {seconds_per_move}")
        self.evaluate = evaluate
        self.size = go_cfg.board_size
        self.seconds_per_move = seconds_per_move
        simulations = simulations or mcts_cfg.simulations
        if max_simulations is None:
            max_simulations = (self.MAX_TIMED_SIMULATIONS if seconds_per_move is not None
                               else simulations)
        self.max_simulations = max(1, max_simulations)
        self.simulations = min(simulations, self.max_simulations)
        self.chunk = max(self.CHUNK, mcts_cfg.leaf_batch)
        if mcts_cfg.algorithm == "gumbel":
            self.chunk = max(self.chunk, mcts_cfg.gumbel_max_considered)
        self.mcts = Mcts(
            1, go_cfg, mcts_cfg, history=history, batch_size=mcts_cfg.leaf_batch,
            simulations=self.max_simulations, reuse_tree=False, early_pass=early_pass,
            liberties=liberties, leaf_batch=mcts_cfg.leaf_batch,
        )
        self.last_value = 0.0
        self.last_simulations = 0
        self.last_seconds = 0.0
        self.rate: float | None = None  # simulations per second of the last timed search

    def warm_up(self) -> None:
        """Two small searches on one tree (a fresh root, then an expanded one, as a timed search
        does), then what genmove reads after its search, so that compiling or loading the
        search code is not timed on move 1."""
        self.mcts.reset_game(0, [0], komi=0.5)  # a position after one move, as genmove sets
        for _ in range(2):
            self.mcts.search(self.evaluate, [0], simulations=min(self.chunk,
                                                                 self.max_simulations))
        self.mcts.root_values([0])
        self.mcts.select_moves([0])
        self.mcts.reset_game(0)

    def forget(self) -> None:
        """Drop the tree (a move chosen without a search must not be read as its analysis)."""
        self.mcts.reset_game(0)

    def genmove(self, moves: Sequence[int], komi: float, *, seconds: float | None = None,
                limit: float | None = None,
                on_chunk: Callable[[], None] | None = None) -> int:
        """The move to play after `moves` (flat indices, PASS = N*N); PASS if the game is over.

        `seconds` replaces the budget for this move with a time (a clock's share, see
        `training.play.clock`): the search uses it, and does at least `simulations` as long
        as it ends within `limit` seconds (default `seconds`: the most the clock allows).
        `on_chunk` is called every chunk of simulations of the same search (live analysis:
        the move is the one a plain genmove plays). Raises ValueError if `moves` holds an
        illegal move.
        """
        start = time.perf_counter()
        self.mcts.reset_game(0, moves, komi=komi)
        if self.mcts.is_over(0):
            return self.size * self.size
        if seconds is not None:  # a clock: the time is the budget, the simulations a floor
            self._timed_search(start + seconds, on_chunk, floor=self.simulations,
                               limit=start + max(seconds, limit or seconds))
        elif self.seconds_per_move is not None:
            self._timed_search(start + self.seconds_per_move, on_chunk)
        else:
            self.last_simulations = self._search(self.simulations, on_chunk=on_chunk)[0]
        self.last_value = float(self.mcts.root_values([0])[0])
        move = int(self.mcts.select_moves([0])[0])  # Gumbel: its choice, not the most visited
        self.last_seconds = time.perf_counter() - start
        return move

    def analyze(self, moves: Sequence[int], komi: float, stop: threading.Event,
                on_chunk: Callable[[], None], *, seconds: float | None = None) -> None:
        """Search the position after `moves` until `stop` is set, the tree is full
        (`max_simulations`) or `seconds` have passed, calling `on_chunk` every chunk of
        simulations (GTP's lz-analyze).

        An anytime search: each search is as large as all before it together (the first one
        chunk), so with Gumbel the newest sequential halving holds at least half the visits
        and the visits gather on the best moves as the analysis runs, as with one long search.
        """
        deadline = None if seconds is None else time.perf_counter() + seconds
        self.mcts.reset_game(0, moves, komi=komi)
        done = 0
        while not self.mcts.is_over(0) and done < self.max_simulations and not stop.is_set():
            n = min(max(self.chunk, done), self.max_simulations - done)
            ran, out_of_time = self._search(n, on_chunk=on_chunk, stop=stop, deadline=deadline)
            done += ran
            self.last_simulations = done
            if ran == 0 or out_of_time:
                return

    def candidates(self, pv_length: int = 12) -> list[tuple[int, int, float, float, list[int]]]:
        """The searched root moves, the search's choice first, then by visits: (move, visits,
        Q of the side to move, prior, principal variation)."""
        found = self.mcts.root_children(0, pv_length)
        if not found:
            return []
        chosen = int(self.mcts.select_moves([0])[0])
        return sorted(found, key=lambda c: c[0] != chosen)  # stable: the rest keep their order

    def _timed_search(self, deadline: float, on_chunk: Callable[[], None] | None = None, *,
                      floor: int = 0, limit: float | None = None) -> None:
        """Searches of the simulations the time left allows (see the class) until `deadline`;
        until `floor` simulations are done, until `limit` instead. The first search always
        gets a chunk done (a move needs one)."""
        floor = min(floor, self.max_simulations)
        limit = deadline if limit is None else max(limit, deadline)
        done = 0
        while done < self.max_simulations:
            t0 = time.perf_counter()
            if self.rate is None:
                n = self.chunk  # no speed known yet: measure it on one chunk
            else:
                n = int(self.rate * (deadline - t0) * self.TIME_USE)
                if done >= floor and done and n < max(self.chunk, done // 4):
                    return  # a small last search would choose the move by its own halving
            n = min(max(n, self.chunk, floor - done), self.max_simulations - done)
            ran, out_of_time = self._search(n, deadline=deadline, at_least=self.chunk - done,
                                            floor=floor - done, limit=limit, on_chunk=on_chunk)
            took = time.perf_counter() - t0
            if ran and took > 0:
                self.rate = ran / took
            done += ran
            self.last_simulations = done
            if out_of_time or ran == 0:
                return

    def _search(self, n: int, *, deadline: float | None = None, at_least: int = 0,
                floor: int = 0, limit: float | None = None,
                on_chunk: Callable[[], None] | None = None,
                stop: threading.Event | None = None) -> tuple[int, bool]:
        """One search of `n` simulations on the tree, step by step: stopped when `stop` is
        set, or (once `at_least` are done) when the next step, as long as the last, would end
        past `limit`, or (once `floor` are done too) past `deadline`; `on_chunk` is called
        every `chunk` simulations. Returns the simulations done and whether the time ran
        out."""
        mcts = self.mcts
        mcts.start_search([0], simulations=n)
        limit = deadline if limit is None else limit
        floor = max(floor, at_least)
        reported = 0
        out_of_time = False
        while mcts.is_searching():
            s0 = time.perf_counter()
            mcts.step([self.evaluate])
            s1 = time.perf_counter()
            ran = int(mcts.tree.sims_done[0])
            end = s1 + (s1 - s0)  # when the next step would end
            if deadline is not None and ran >= at_least and (
                    end > limit or ran >= floor and end > deadline):
                mcts.stop_search([0])
                out_of_time = True
            elif stop is not None and stop.is_set():
                mcts.stop_search([0])
            if on_chunk is not None and ran - reported >= self.chunk:
                reported = ran
                on_chunk()
        return int(mcts.tree.sims_done[0]), out_of_time


class NetPlayer:
    """A `training.gtp.Player` that searches with a trained model (no noise, most visits).

    The budget per move is `simulations`, or `seconds_per_move` when given (see `MctsPlayer`);
    under a game clock the clock's share, with `simulations` as a floor. `max_simulations`
    (default the config's `engine.max_visits`) caps every search and sizes the tree; an
    analysis also stops after `engine.analysis_max_seconds` when that is set. Any komi the
    GTP engine accepts is searched with: the config's range and half-point checks apply to
    config files, not to a controller's komi.

    The end of a game is judged the way the opponent's judge will (`training.go.endgame`): the
    net's ownership map (averaged over the 8 symmetries) names the dead stones. Right after
    the opponent's pass, `genmove` passes when the board without those stones is won, and
    answers a search move that would only fill its own area with a neutral point between both
    colours' living stones, or a pass when none is left (self-play never sees
    an opponent pass before the board is settled, so the search does not know these moves are
    worthless, and Tromp-Taylor calls every dead stone alive). `genmove_cleanup` captures the
    dead opponent stones (`kgs-genmove_cleanup`), answering the opponent's moves first.
    Without an ownership head every stone counts as alive.
    """

    def __init__(self, model_path: str | os.PathLike, simulations: int, cfg: Config | None = None,
                 *, device: str = "cpu", seconds_per_move: float | None = None,
                 max_simulations: int | None = None):
        from training.learn.net import load_model, make_evaluator  # torch: only with a model

        net, info = load_model(model_path, device)
        self.board_size = info.board_size
        self._net = net.eval()
        self._device = device
        cfg = cfg or Config()
        # The komi in this GoConfig only seeds empty boards; every search gets the game's own.
        # The move cap is the referee's (4 N*N), so the search never ends a game it plays.
        n = info.board_size
        go_cfg = GoConfig(board_size=n, max_moves=4 * n * n)
        self.analysis_seconds = cfg.engine.analysis_max_seconds or None
        self.player = MctsPlayer(make_evaluator(net, device, jit=cfg.net.inference,
                                                score=cfg.mcts.wants_score), go_cfg,
                                 cfg.mcts, simulations,
                                 history=net.history, liberties=net.liberties,
                                 seconds_per_move=seconds_per_move,
                                 max_simulations=max_simulations or max(
                                     cfg.engine.max_visits, simulations))
        self.player.warm_up()

    def ownership(self, position: Any, color: int | None = None) -> list[float] | None:
        """The net's ownership of every point (black's view, -1..1) with `color` to move
        (default: the side to move), averaged over the 8 symmetries; None without the head."""
        if not getattr(self._net, "ownership_head", False):
            return None
        import torch

        from training.go import features

        if color is not None and color != position.to_play and not position.is_over():
            position = position.copy()
            position.play(position.pass_move)  # GTP may ask either colour: the other passed
        to_move = position.to_play
        n = position.size
        x = features.planes(position, self._net.history, self._net.liberties)
        batch = np.stack([features.transform_planes(x, s)
                          for s in range(features.NUM_SYMMETRIES)])
        with torch.inference_mode():
            out = self._net(torch.from_numpy(batch).to(self._device), heads=True)
        own = torch.tanh(out["ownership"].float()).cpu().numpy().reshape(-1, n, n)
        mean = np.mean([features.inverse_transform_planes(own[s], s)
                        for s in range(features.NUM_SYMMETRIES)], axis=0)
        return [float(v) * to_move for v in mean.reshape(-1)]

    def dead_stones(self, position: Any) -> set[int]:
        """The stones the net's ownership map calls dead (none without an ownership head)."""
        own = self.ownership(position)
        return set() if own is None else endgame.dead_stones(position.board, position.size, own)

    def genmove(self, position: Any, color: int, *, seconds: float | None = None,
                limit: float | None = None,
                on_chunk: Callable[[], None] | None = None) -> int | None:
        """The search's move for `color` after the position's moves; a pass right after the
        opponent's pass when the board without its dead stones is won (see the class).
        `seconds`, `limit` and `on_chunk` as in `MctsPlayer.genmove` (a clock's share and
        limit, live analysis)."""
        moves = self._moves(position, color)
        self.player.forget()  # a move chosen without a search leaves no analysis behind
        search = dict(seconds=seconds, limit=limit, on_chunk=on_chunk)
        if not _after_pass(position, color):
            return self.player.genmove(moves, position.komi, **search)
        board, n = position.board, position.size
        own = self.ownership(position, color)
        dead = set() if own is None else endgame.dead_stones(board, n, own)
        if endgame.judged_score(board, n, position.komi, dead) * color > 0:
            return position.pass_move
        move = self.player.genmove(moves, position.komi, **search)
        if own is not None and endgame.fills_own_area(board, n, move, color, own):
            # a move inside our own area gains nothing: take a neutral point, else pass
            dame = endgame.dame_move(board, n, color, dead,
                                     lambda p: position.is_legal(p, color))
            return position.pass_move if dame is None else dame
        return move

    def genmove_cleanup(self, position: Any, color: int, *, seconds: float | None = None,
                        limit: float | None = None) -> int | None:
        """`kgs-genmove_cleanup`: capture the dead opponent stones, so that the Tromp-Taylor
        count of the final board is the judged one, and answer attacks; nothing else.

        After the opponent's pass: a capture, else a pass when the judged board is won, else
        a neutral point or a pass (no search: a search of a lost board finds every move
        equally lost, and filled its own eyes until its groups died). After a stone (the
        opponent cleans up too, or attacks) the search's move when it touches an opponent
        stone; else (a pass, or a move that can only fill space: on a lost board the map
        gives our own area away, so it cannot tell) a capture, else the search's pass, else a
        neutral point or a pass."""
        self._moves(position, color)  # the size check
        self.player.forget()
        clock = dict(seconds=seconds, limit=limit)
        own = self.ownership(position, color)
        if own is None:
            return self.genmove(position, color, **clock)
        board, n = position.board, position.size

        def legal(p: int) -> bool:
            return position.is_legal(p, color)

        dead_all = endgame.dead_stones(board, n, own)
        dead = {p for p in dead_all if board[p] == -color}
        capture = endgame.cleanup_move(board, n, color, dead, legal)
        if _after_pass(position, color):
            if capture is not None:
                return capture
            if endgame.judged_score(board, n, position.komi, dead_all) * color > 0:
                return position.pass_move
        else:
            move = self.genmove(position, color, **clock)
            if move != position.pass_move and endgame.touches_opponent(board, n, move, color):
                return move
            if capture is not None:
                return capture
            if move == position.pass_move:
                return move
        dame = endgame.dame_move(board, n, color, dead_all, legal)
        return position.pass_move if dame is None else dame

    def _moves(self, position: Any, color: int) -> list[int]:
        """The moves the search replays: the game's as alternating turns, a pass wherever a
        colour played twice (handicap stones set up with `play`) or the colour asked is not
        the one to move (the other one passed), so the search sees the true board; without
        the pairs of passes of a game resumed to play out a dispute."""
        if position.size != self.board_size:
            raise GtpError(f"this model plays {self.board_size}x{self.board_size} only")
        return position.searchable_moves(color)

    # -- analysis (GTP lz-analyze / kata-analyze, training.analysis) --------------------------

    def analyze(self, position: Any, color: int, stop: threading.Event,
                on_chunk: Callable[[], None]) -> None:
        """Search the position for `color` until `stop`, a full tree (`max_simulations`) or
        `engine.analysis_max_seconds`, calling `on_chunk` every chunk of simulations;
        `move_infos` reads the search meanwhile."""
        self.player.analyze(self._moves(position, color), position.komi, stop, on_chunk,
                            seconds=self.analysis_seconds)

    def move_infos(self, position: Any, color: int, pv_length: int = 12) -> list[MoveInfo]:
        """What the search knows of each move it visited (the move it would play first), with
        the net's score lead of the position after it where the net has a score head."""
        found = self.player.candidates(pv_length)
        leads = self._score_leads(position, color, [c[0] for c in found])
        infos = []
        for order, (move, visits, q, prior, pv) in enumerate(found):
            winrate = (q + 1) / 2
            # A normal-approximation lower bound of the win rate (KataGo and Leela Zero
            # report one as lcb): the search's values are not independent draws, so it
            # orders moves by how sure the search is rather than giving a true interval.
            margin = 1.96 * math.sqrt(max(winrate * (1 - winrate), 0.0025) / visits)
            infos.append(MoveInfo(move, visits, winrate, prior, max(0.0, winrate - margin),
                                  order, pv, None if leads is None else leads[order]))
        return infos

    def policy(self, position: Any, color: int) -> list[float]:
        """The net's prior over the moves of `color` (N*N + 1 entries, pass last; 0 for an
        illegal move), averaged over the 8 symmetries."""
        from training.go import features

        base = position.copy()
        if color != base.to_play and not base.is_over():
            base.play(base.pass_move)
        n = base.size
        legal = np.array([base.is_legal(m) for m in range(n * n + 1)], bool)
        x = features.planes(base, self._net.history, self._net.liberties)
        batch = np.stack([features.transform_planes(x, k)
                          for k in range(features.NUM_SYMMETRIES)])
        masks = np.stack([features.transform_policy(legal.astype(np.float32), k) > 0
                          for k in range(features.NUM_SYMMETRIES)])
        priors = self.player.evaluate(batch, masks)[0]
        mean = np.mean([features.inverse_transform_policy(priors[k], k)
                        for k in range(features.NUM_SYMMETRIES)], axis=0)
        return [float(p) if ok else 0.0 for p, ok in zip(mean, legal)]

    def root_score_lead(self, position: Any, color: int) -> float | None:
        """The net's score lead of `color` in the position (points), None without the head."""
        leads = self._score_leads(position, color, [None])
        return None if leads is None else leads[0]

    def _score_leads(self, position: Any, color: int, moves: list[int | None]
                     ) -> list[float] | None:
        """For each move (None: no move), the points `color` leads by after it, by the score
        head (margin / N from the side to move's view, komi included)."""
        if not getattr(self._net, "score_head", False) or not moves:
            return None
        import torch

        from training.go import features

        base = position.copy()
        if color != base.to_play and not base.is_over():
            base.play(base.pass_move)
        planes, signs = [], []
        for move in moves:
            child = base
            if move is not None and not base.is_over():
                child = base.copy()
                child.play(move)
            planes.append(features.planes(child, self._net.history, self._net.liberties))
            signs.append(1.0 if child.to_play == color else -1.0)
        with torch.inference_mode():
            out = self._net(torch.from_numpy(np.stack(planes)).to(self._device), heads=True)
        score = out["score"].float().cpu().numpy() * position.size
        return [float(s) * sign for s, sign in zip(score, signs)]


def _after_pass(position: Any, color: int) -> bool:
    """Whether `color` moves right after the opponent's pass (as the search replays the game)."""
    return position.alternating_moves(color)[-1:] == [position.pass_move]


@dataclass
class MoveInfo:
    """One candidate move of an analysis, from the view of the side to move."""

    move: int
    visits: int
    winrate: float  # 0..1
    prior: float  # 0..1
    lcb: float  # 0..1
    order: int  # 0: the move the search would play
    pv: list[int]  # the principal variation, this move first
    score_lead: float | None  # points ahead after this move (the net's score head)


class NetWinrates:
    """Black's win rate after each move of a game, by the evaluated generation's own net
    (one forward pass a position, no search): the SBKV graph of the evaluation's SGFs, so a
    reviewer sees where the net thought the game turned."""

    def __init__(self, model: str | os.PathLike, go: GoConfig):
        from training.learn.net import load_model, make_evaluator  # torch: only with a model

        net, _ = load_model(model)
        self.evaluate = make_evaluator(net, jit=False)
        self.size, self.komi, self.history = go.board_size, go.komi, net.history
        self.liberties = net.liberties

    def __call__(self, moves: Sequence[int]) -> list[float | None]:
        from training.go.features import planes

        position = Position(self.size, self.komi, max_moves=10 * self.size * self.size)
        batch, black_to_move = [], []
        for move in moves:
            position.play_on(move)
            batch.append(planes(position, self.history, self.liberties))
            black_to_move.append(position.to_play == BLACK)
        if not batch:
            return []
        _, values = self.evaluate(np.stack(batch))
        return [float((1 + (v if black else -v)) / 2) for v, black in zip(values, black_to_move)]
