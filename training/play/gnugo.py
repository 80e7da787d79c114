"""Games of our GTP engine against a fixed opponent (GNU Go, the random player), judged by GNU Go.

    series = schedule(games=40, size=9, seed=0)          # openings, colours, GNU Go seeds
    outcomes = play_series(engine_command(model, budget), gnugo_opponent(1), series,
                           size=9, komi=7.0, jobs=2, on_game=print)

Owns the one game runner that the strength tool (`training.strength`) and the coach's
per-generation evaluation (`training.play.arena.play_gnugo`) use:

- **Openings**: game pair k starts from its own opening, `opening_stones` random legal stones
  off the first line (black first), drawn from (seed, k). Both games of a pair play it, ours
  black in the first and white in the second, so an opening that favours one colour favours
  each player once. Both engines are close to deterministic; without varied openings a
  series of 20 games is a few distinct games played over and over.
- **Opponents**: GNU Go 3.8 over GTP (`gnugo_command`: `--chinese-rules
  --positional-superko`, the rules we play), a fresh process per game with its own
  `--seed` (1 + the game's number), or any other GTP command (`random_opponent`: our
  `python -m training.gtp` random player; an outside engine, `training.play.opponent`, which
  `play_series` plays as `untrusted`: its illegal or unreadable moves lose it the game).
- **Games**: played by `training.play.referee.play_game` until two passes (or the referee's move
  cap of 4 N*N moves, or a resignation). Where the two players then name different dead
  stones (`final_status_list dead`), the game goes on with both on `kgs-genmove_cleanup` until
  two more passes: the dispute is played out on the board, as KGS does, and the count at the
  first passes is kept beside it. The winner is decided by a JUDGE, a fresh GNU Go
  process per game that replays every move and answers `final_score` (GNU Go removes the
  stones it judges dead; its level is `JUDGE_LEVEL`). Our engine never judges its own games.
  Our Tromp-Taylor area count of the same position is kept beside the judgement, and a
  series reports how many games the two name different winners for.
- **Endings**: `explain_endings(folder)` replays kept SGFs through a judge and tells, for each
  loss with all our stones dead, whether they were dead already at the opponent's first pass
  (lost in play) or died after it (lost in the ending: our own moves after the pass).
- **Parallel**: `jobs` games at once (threads, each driving its own engine processes: our
  engine, reused from game to game through an `Engines` pool, and that game's GNU Go), so
  the processes, not this one, use the cores.

Vocabulary: an **outcome** is one finished game from our point of view (+1 won, 0 a tie,
-1 lost). This module starts processes and talks GTP; it loads no model and imports no torch.
"""

from __future__ import annotations

import queue
import random
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from training.go.coords import BLACK, from_gtp, to_gtp
from training.go.rules import Position
from training.go.sgf import from_sgf, game_sgf
from training.play import endings
from training.play.gtp_client import GtpClient, find_gnugo
from training.play.referee import (ENDS_WITHOUT_COUNT, GameResult, TimeControl, parse_score,
                                   play_game)

REPO = Path(__file__).resolve().parents[2]
JUDGE_LEVEL = 10
"""GNU Go's level when it judges a final position (its default and its most careful)."""
OPENING_STONES = 2
"""Random stones that start each opening pair (one black, one white)."""


def gnugo_command(level: int, seed: int | None = None, gnugo: str | None = None) -> list[str]:
    """GNU Go in GTP mode under our rules (area scoring, positional superko)."""
    path = gnugo or find_gnugo()
    if path is None:
        raise FileNotFoundError("GNU Go not found on PATH or in /usr/games "
                                "(apt-get install gnugo)")
    cmd = [path, "--mode", "gtp", "--level", str(level), "--chinese-rules",
           "--positional-superko"]
    return cmd + (["--seed", str(seed)] if seed is not None else [])


def engine_command(model_path: str | Path, *, simulations: int | None = None,
                   seconds_per_move: float | None = None,
                   config: str | Path | None = None) -> list[str]:
    """Our GTP engine playing `model_path` under a budget: simulations or seconds per move."""
    cmd = [sys.executable, "-m", "training.gtp", "--model", str(model_path)]
    if seconds_per_move is not None:
        cmd += ["--seconds-per-move", f"{seconds_per_move:g}"]
    if simulations is not None:
        cmd += ["--simulations", str(simulations)]
    return cmd + (["--config", str(config)] if config is not None else [])


def gnugo_opponent(level: int) -> Callable[[int], list[str]]:
    """seed -> the command of GNU Go at `level` with that seed."""
    return lambda seed: gnugo_command(level, seed)


def random_opponent() -> Callable[[int], list[str]]:
    """seed -> the command of our GTP engine's random player with that seed."""
    return lambda seed: [sys.executable, "-m", "training.gtp", "--seed", str(seed)]


def gnugo_name(key: int | str) -> str:
    """The pool name of a GNU Go opponent: `gnugo 10`, or `gnugo 10+5` (level 10 receiving 5
    points)."""
    return f"gnugo {key}"


def split_gnugo(key: int | str) -> tuple[int, float]:
    """(level, points it receives) of an opponent key: "10" -> (10, 0.0), "10+5" -> (10, 5.0)."""
    level, _, bonus = str(key).partition("+")
    return int(level), float(bonus) if bonus else 0.0


def parse_gnugo(text: str | None) -> list[str]:
    """`--gnugo 1,10,10+5` -> ["1", "10", "10+5"]: GNU Go levels 1..10, each optionally with
    the points it receives (a multiple of 0.5, at most 81), for a rung above level 10."""
    if text is None:
        return []
    keys = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            level, bonus = split_gnugo(item)
        except ValueError:
            level, bonus = -1, 0.0
        if not 1 <= level <= 10 or not (0 <= bonus <= 81 and bonus * 2 == int(bonus * 2)):
            raise ValueError(f"--gnugo {text!r}: expected a comma list of GNU Go levels 1..10, "
                             "each optionally +POINTS it receives, e.g. 1,10,10+5")
        keys.append(f"{level}+{bonus:g}" if bonus else str(level))
    if not keys:
        raise ValueError(f"--gnugo {text!r}: expected a comma list of GNU Go levels, e.g. 1,10")
    return keys


@dataclass(frozen=True)
class GameSpec:
    """How game `index` of a series starts."""

    index: int
    opening: tuple[str, ...]  # GTP moves, black first
    we_are_black: bool
    seed: int  # the opponent's --seed


def random_opening(size: int, stones: int, rng: random.Random) -> tuple[str, ...]:
    """`stones` random legal stones (black first), off the first line on boards of 7 and up."""
    edge = 1 if size >= 7 else 0
    points = [r * size + c for r in range(edge, size - edge) for c in range(edge, size - edge)]
    position = Position(size, komi=0.0, max_moves=4 * size * size)
    out = []
    for _ in range(stones):
        legal = [p for p in points if position.is_legal(p)]
        if not legal:
            break
        move = rng.choice(legal)
        position.play(move)
        out.append(to_gtp(move, size))
    return tuple(out)


def schedule(games: int, size: int, seed: int, opening_stones: int = OPENING_STONES
             ) -> list[GameSpec]:
    """`games` games: pairs share an opening, ours black first then white; seeds 1, 2, ..."""
    specs = []
    for k in range(games):
        opening = random_opening(size, opening_stones, random.Random(f"{seed}/{k // 2}"))
        specs.append(GameSpec(index=k, opening=opening, we_are_black=k % 2 == 0, seed=k + 1))
    return specs


@dataclass
class Outcome:
    """One finished game of a series, from our point of view."""

    spec: GameSpec
    game: GameResult

    @property
    def points(self) -> int:
        """+1 we won, 0 a tie, -1 we lost (by the judge when there is one)."""
        if self.game.winner == 0:
            return 0
        return 1 if (self.game.winner == BLACK) == self.spec.we_are_black else -1

    @property
    def our_score(self) -> str | None:
        """Our engine's own `final_score` of the end position (its judged count)."""
        return next((v for k, v in self.game.engine_scores.items() if k.endswith(" azgo")),
                    None)

    @property
    def we_agree(self) -> bool | None:
        """Our engine's own count names the judge's winner (None: no judge, a resignation)."""
        if self.game.judgement is None or self.game.end in ENDS_WITHOUT_COUNT \
                or not self.our_score:
            return None
        try:
            ours = parse_score(self.our_score)
        except ValueError:
            return False
        return _sign(ours) == _sign(parse_score(self.game.judgement))

    @property
    def points_at_passes(self) -> int:
        """`points` by the judge's count at the first two passes, before any play-out."""
        at = self.game.judgement_at_passes
        if at is None:
            return self.points
        margin = parse_score(at)
        if margin == 0:
            return 0
        return 1 if (margin > 0) == self.spec.we_are_black else -1

    @property
    def wiped_out(self) -> bool:
        """The judge called every stone of ours on the final board dead."""
        g = self.game
        if g.judgement is None or g.end == "resignation":
            return False
        position = Position(g.size, komi=g.komi, max_moves=10 * g.size * g.size)
        for text in g.moves:
            position.play_on(from_gtp(text, g.size))
        ours = BLACK if self.spec.we_are_black else -BLACK
        return all_dead(position.board, g.size, ours, g.judged_dead)

    def to_sgf(self, player: str, opponent: str,
               winrates: Sequence[float | None] | None = None) -> str:
        """The game as SGF, the judge's result as RE and its dead stones in the comment;
        `winrates[t]` (black's, 0..1) on move t's node as Sabaki's SBKV."""
        g = self.game
        black, white = (player, opponent) if self.spec.we_are_black else (opponent, player)
        moves = self.moves
        result = g.judgement or g.result
        if g.end in ENDS_WITHOUT_COUNT:
            result = g.result
        note = (f"{g.end}; judge (GNU Go) {g.judgement}, dead {' '.join(g.judged_dead) or '-'}; "
                f"Tromp-Taylor {g.result}; ours {self.our_score}; opening "
                f"{' '.join(self.spec.opening)}; opponent seed {self.spec.seed}"
                + self._playout_note() + (f"; forfeit: {g.forfeit}" if g.forfeit else ""))
        return game_sgf(g.size, g.komi, moves, result, player_black=black, player_white=white,
                        comment=note, rules="Chinese, positional superko", winrates=winrates)

    def _playout_note(self) -> str:
        g = self.game
        if g.playout_skipped:
            return f"; not played out: {g.playout_skipped}"
        if g.playout_from is None:
            return ""
        return (f"; dead stones disputed at the first passes, played out from move "
                f"{g.playout_from + 1} (judge there {g.judgement_at_passes})")

    @property
    def moves(self) -> list[int]:
        """The game's moves as flat indices (a resignation, a loss on time or by forfeit left
        out)."""
        g = self.game
        return [from_gtp(m, g.size) for m in g.moves
                if m not in ("resign", "timeout", "forfeit")]

    def to_json(self) -> dict:
        g = self.game
        return {"game": self.spec.index, "we": "black" if self.spec.we_are_black else "white",
                "opening": list(self.spec.opening), "seed": self.spec.seed,
                "moves": len(g.moves), "end": g.end, "judge": g.judgement,
                "area": g.result, "disagree": g.disagrees, "ours": self.our_score,
                "we_agree": self.we_agree, "wiped_out": self.wiped_out,
                "playout_from": g.playout_from, "judge_at_passes": g.judgement_at_passes,
                "disputed_dead": g.disputed_dead or None,
                "think_max_s": {k: round(v, 3) for k, v in g.think_max_s.items()},
                "forfeit": g.forfeit, "playout_skipped": g.playout_skipped,
                "points": self.points, "record": " ".join(g.moves)}

    def describe(self) -> str:
        g = self.game
        verdict = {1: "won", 0: "tie", -1: "lost"}[self.points]
        judged = f"judge {g.judgement}, area {g.result}" if g.judgement else g.result
        flag = "  (judge and area disagree)" if g.disagrees else ""
        flag += f"  ({g.forfeit})" if g.forfeit else ""
        flag += f"  (not played out: {g.playout_skipped})" if g.playout_skipped else ""
        if g.playout_from is not None:
            flag += (f"  (dead stones disputed: played out from move {g.playout_from + 1}; "
                     f"judge at the first passes {g.judgement_at_passes})")
        return (f"game {self.spec.index + 1}: we {'black' if self.spec.we_are_black else 'white'}"
                f", {verdict}: {judged} after {len(g.moves)} moves ({g.end}){flag}")


class Engines:
    """Our GTP engine processes for a series, started as games need them and reused from game
    to game (and from series to series while the pool is open); `close()` ends them."""

    def __init__(self, argv: list[str], timeout_s: float = 120.0):
        self.argv = argv
        self.timeout_s = timeout_s
        self._idle: queue.Queue[GtpClient] = queue.Queue()
        self._started: list[GtpClient] = []
        self._lock = threading.Lock()

    def take(self) -> GtpClient:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            engine = GtpClient(self.argv, timeout_s=self.timeout_s, name="azgo", cwd=str(REPO))
            with self._lock:
                self._started.append(engine)
            return engine

    def give_back(self, engine: GtpClient) -> None:
        if engine.returncode is None:  # a dead engine is not handed out again
            self._idle.put(engine)

    def close(self) -> None:
        for engine in self._started:
            engine.close()

    def __enter__(self) -> "Engines":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def play_series(ours: list[str] | Engines, opponent: Callable[[int], list[str]],
                specs: Sequence[GameSpec], *, size: int, komi: float, komi_bonus: float = 0.0,
                time_control: TimeControl | None = None, jobs: int = 1,
                timeout_s: float = 120.0, on_game: Callable[[Outcome], None] | None = None,
                judge_level: int = JUDGE_LEVEL, playout: bool = True,
                untrusted: bool = False, opponent_name: str | None = None,
                opponent_timeout_s: float | None = None) -> list[Outcome]:
    """Play `specs` between our engine (`ours`: a GTP command, or an open `Engines` pool) and
    `opponent(seed)`, the opponent receiving `komi_bonus` points on top of `komi` (a handicap
    for a stronger player: komi rises when it is white, falls when it is black); return the
    outcomes in the order of `specs`. With `time_control` every game is played under that
    clock (the referee's; a flag that falls loses the game). With `playout` a dispute about
    dead stones at the two passes is played out before the judge counts (see the module).
    `on_game` is called as each game finishes, one call at a time. An `untrusted` opponent (an
    outside engine, named `opponent_name`, every answer within `opponent_timeout_s`) loses a
    game by forfeit for an illegal or unreadable move (the referee's `untrusted`); its
    process is killed at the end of each game whatever happens. When a game raises (an
    engine overran its timeout or broke the protocol), the games not yet started are
    cancelled and the error is raised."""
    if not specs:
        return []
    judge_cmd = gnugo_command(judge_level)  # fails early, by name, without GNU Go
    jobs = max(1, min(jobs, len(specs)))
    engines = ours if isinstance(ours, Engines) else Engines(ours, timeout_s)
    lock = threading.Lock()

    def one(spec: GameSpec) -> Outcome:
        engine = engines.take()
        try:
            argv = opponent(spec.seed)
            with GtpClient(argv, timeout_s=opponent_timeout_s or timeout_s,
                           cwd=None if untrusted else str(REPO),  # its paths are the user's
                           name=opponent_name or Path(argv[0]).name) as other, \
                    GtpClient(judge_cmd, timeout_s=timeout_s, name="judge") as judge:
                black, white = (engine, other) if spec.we_are_black else (other, engine)
                # the opponent receives `komi_bonus` extra points whichever colour it has
                game_komi = komi + (komi_bonus if spec.we_are_black else -komi_bonus)
                game = play_game(black, white, size, game_komi, opening=spec.opening,
                                 judge=judge, time_control=time_control, playout=playout,
                                 untrusted=other if untrusted else None)
        finally:
            engines.give_back(engine)
        outcome = Outcome(spec, game)
        if on_game is not None:
            with lock:
                on_game(outcome)
        return outcome

    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            # a game that raises ends the series: map cancels the games not yet started
            return list(pool.map(one, specs))
    finally:
        if engines is not ours:
            engines.close()


def all_dead(board, size: int, color: int, dead: Sequence[str]) -> bool:
    """`color` has stones on `board` and the judge's `dead` list (GTP points) holds them all."""
    stones = {to_gtp(p, size) for p, c in enumerate(board) if c == color}
    return bool(stones) and stones <= set(dead)


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def tally_at_passes(outcomes: Sequence[Outcome]) -> tuple[int, int, int]:
    """`tally` by the judge's count at the first two passes (no play-out)."""
    points = [o.points_at_passes for o in outcomes]
    return points.count(1), points.count(0), points.count(-1)


def tally(outcomes: Sequence[Outcome]) -> tuple[int, int, int]:
    """(wins, draws, losses) from our point of view."""
    points = [o.points for o in outcomes]
    return points.count(1), points.count(0), points.count(-1)


def explain_endings(folder: Path, judge_level: int = JUDGE_LEVEL,
                    log: Callable[[str], None] = print, plot: Path | None = None) -> dict:
    """How the games in `folder` (SGFs the strength tool wrote) ended: for each game the judge
    (a fresh GNU Go) scores the board at the opponent's first pass and at the end, and lists
    which of our stones it calls dead at both. A loss whose stones were all dead already when
    the opponent passed was lost in play; one that was alive then and dead at the end was
    lost in the ending (our own moves after the pass). Each lost game's turning point, from
    our net's win rates in the SGF, is counted by phase (`training.play.endings`) and, with
    `plot`, drawn there, a panel per lost game. Returns the counts."""
    counts = {"games": 0, "lost": 0, "wiped_out": 0, "dead_at_first_pass": 0,
              "lost_in_the_ending": 0, "we_passed_in_reply_and_won": 0,
              **{f"turned_{p}": 0 for p in endings.PHASES}}
    lost_games: list[endings.LostGame] = []
    for path in sorted(folder.glob("*.sgf")):
        text = path.read_text()
        ours = "B" if "PB[azgo" in text else "W"
        game = from_sgf(text)
        n = game.board_size
        moves = [int(m) for m in game.moves]
        colors = ["B" if k % 2 == 0 else "W" for k in range(len(moves))]
        theirs_pass = next((k for k, (m, c) in enumerate(zip(moves, colors))
                            if m == n * n and c != ours), None)
        color = BLACK if ours == "B" else -BLACK
        position = Position(n, komi=game.komi, max_moves=10 * n * n)

        def judged() -> tuple[str, bool]:
            return judge.send("final_score"), all_dead(
                position.board, n, color, judge.send("final_status_list dead").split())

        with GtpClient(gnugo_command(judge_level), name="judge") as judge:
            judge.send(f"boardsize {n}")
            judge.send("clear_board")
            judge.send(f"komi {game.komi:g}")
            at_pass = None
            for k, (m, c) in enumerate(zip(moves, colors)):
                if k == theirs_pass:
                    at_pass = judged()
                judge.send(f"play {c} {to_gtp(m, n)}")
                position.play_on(m)
            end = judged()
        won = end[0].startswith(ours + "+")
        lost = not won and end[0] != "0"
        counts["games"] += 1
        counts["lost"] += lost
        if lost:
            ours_rate = endings.our_winrates(game.winrates, ours == "B", len(moves))
            turn, phase = endings.turning_point(ours_rate, theirs_pass, n * n)
            counts[f"turned_{phase}"] += 1
            lost_games.append(endings.LostGame(path.stem, ours_rate, theirs_pass, turn, phase,
                                               end[0], end[1]))
        counts["wiped_out"] += lost and end[1]
        if at_pass is not None and lost and end[1]:
            counts["dead_at_first_pass" if at_pass[1] else "lost_in_the_ending"] += 1
        if (theirs_pass is not None and theirs_pass + 1 < len(moves)
                and moves[theirs_pass + 1] == n * n and won):
            counts["we_passed_in_reply_and_won"] += 1
        after = [to_gtp(m, n) for m in moves[theirs_pass:]] if theirs_pass is not None else []
        log(f"{path.name}: we {ours}, end {end[0]}{' (all ours dead)' if end[1] else ''}; at "
            f"their first pass {at_pass[0] if at_pass else '-'}"
            f"{' (all ours dead)' if at_pass and at_pass[1] else ''}; after it: "
            f"{' '.join(after[:16])}")
    if plot is not None:
        endings.plot_lost_games(lost_games, plot, title=str(folder))
        log(f"wrote {plot}")
    return counts
