"""A referee for games between two GTP engines (our engine vs GNU Go, model vs model).

`play_game(black, white, size, komi)` sets both engines up, asks the side to move for
`genmove`, checks the move against our reference rules (`training.go.rules.Position`), passes it
to the other engine with `play` and goes on until two consecutive passes, a resignation or
`max_moves`. Every move must be legal by our rules and accepted by the opponent, otherwise
`RefereeError` names the move, the engine and the reason. An `opening` (GTP moves, black
first) is played onto both engines before the first `genmove`.

Scoring: the referee's own board gives the Tromp-Taylor area score (`score`, `result`), which
counts every stone left on the board as alive. With a `judge` (a third engine, GNU Go: see
`training.play.gnugo`), `judge_game` replays all moves into it and asks its `final_score`, which
removes dead stones; the winner is then the judge's (`judgement`, with the stones it calls
dead in `judged_dead`), and `disagrees` says whether the two counts name different winners.
Each engine's own `final_score` is recorded beside them, for information, except an untrusted
engine's (KataGo runs a search of 100 visits for it: a minute of CPU on a small machine, taken
from the game played beside it). Where the two players name different dead stones at the two
passes, `playout` plays the dispute out first (both sides on `kgs-genmove_cleanup`) and the
judge counts the board that comes of it; an untrusted engine that does not name its dead
stones in time (or refuses to) leaves the game as the passes left it, with the reason in
`playout_skipped`.

An engine named `untrusted` (an outside engine: `training.play.opponent`) that sends an illegal
move, a reply that is no move, refuses a legal move or a `genmove` loses the game by forfeit
(end "forfeit", `B+F` / `W+F`, the reason in `forfeit`) instead of stopping the series with a
`RefereeError`; an engine that breaks the protocol or overruns its timeout still raises
`GtpEngineError` (the client's, naming the engine's command).

The engines are `training.play.gtp_client.GtpClient`s; the referee does not start or stop them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from training.go.coords import BLACK, WHITE, from_gtp, to_gtp
from training.go.rules import Position
from training.play.gtp_client import GtpClient, GtpEngineError, GtpError


class RefereeError(RuntimeError):
    """An engine sent an illegal move, or refused a legal one."""


@dataclass(frozen=True)
class TimeControl:
    """GTP's `time_settings main byo_time byo_stones`: main time, then `byo_stones` stones in
    every period of `byo_time` seconds (Canadian; 1 stone: Japanese byo-yomi with one period);
    byo_time 0: absolute time."""

    main: float
    byo_time: float
    byo_stones: int

    def gtp(self) -> str:
        """GTP's `time_settings` (whole seconds in the protocol; a fraction, which only our
        own engine accepts, is kept for short test clocks)."""
        return f"time_settings {self.main:g} {self.byo_time:g} {self.byo_stones}"


class GameClock:
    """One player's clock as the referee keeps it: `time_left()` for GTP's `time_left`,
    `spend(seconds)` after each move (False: the flag fell, the game is lost on time)."""

    def __init__(self, tc: TimeControl):
        self.tc = tc
        self.main = tc.main
        self.in_byo = tc.main <= 0
        self.period = tc.byo_time
        self.stones = tc.byo_stones

    def time_left(self) -> tuple[float, int]:
        return (self.period, self.stones) if self.in_byo else (self.main, 0)

    def spend(self, seconds: float) -> bool:
        tc = self.tc
        if not self.in_byo:
            if seconds <= self.main:
                self.main -= seconds
                return True
            seconds -= self.main
            self.main = 0.0
            if tc.byo_time <= 0 or tc.byo_stones <= 0:
                return False  # absolute time used up
            self.in_byo = True
            self.period, self.stones = tc.byo_time, tc.byo_stones
        if seconds > self.period:
            return False
        self.period -= seconds
        self.stones -= 1
        if self.stones == 0:
            self.period, self.stones = tc.byo_time, tc.byo_stones
        return True


@dataclass
class GameResult:
    """How a refereed game went."""

    size: int
    komi: float
    moves: list[str] = field(default_factory=list)  # GTP text, black first
    winner: int = 0  # BLACK, WHITE or 0 (a tie)
    result: str = "0"  # "B+3.5", "W+R", "0", ...
    end: str = ""  # "two passes", "resignation" or "move cap"
    score: float = 0.0  # Tromp-Taylor on the referee's board, black's view
    engine_scores: dict[str, str] = field(default_factory=dict)  # final_score per engine
    opening: list[str] = field(default_factory=list)  # GTP moves played before the game
    judgement: str | None = None  # the judge's final_score of the end position, "B+12.5"
    judged_dead: list[str] = field(default_factory=list)  # the judge's dead stones (GTP)
    think_max_s: dict[str, float] = field(default_factory=dict)  # longest genmove per colour
    # a dispute about dead stones played out (play_game's `playout`): each player's dead
    # stones at the first two passes, the judge's count there, and the index in `moves` of
    # the play-out's first move
    disputed_dead: dict[str, list[str]] = field(default_factory=dict)
    judgement_at_passes: str | None = None
    playout_from: int | None = None
    forfeit: str | None = None  # why the untrusted engine lost by forfeit (end "forfeit")
    playout_skipped: str | None = None  # why the dead stones at the passes were not compared

    @property
    def disagrees(self) -> bool:
        """The judge and the Tromp-Taylor count name different winners."""
        return self.judgement is not None and self.end not in ENDS_WITHOUT_COUNT and (
            _sign(parse_score(self.judgement)) != _sign(self.score))


ENDS_WITHOUT_COUNT = ("resignation", "time", "forfeit")
"""Ends of a game that no count decides."""


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def parse_score(text: str) -> float:
    """A GTP score, `B+3.5` / `W+0.5` / `0`, as black's margin (+3.5, -0.5, 0.0).

    Raises ValueError for anything else (a resignation, `B+R`, has no margin).
    """
    t = text.strip().upper()
    if t in ("0", "DRAW", "JIGO"):
        return 0.0
    if len(t) > 2 and t[0] in "BW" and t[1] == "+":
        try:
            margin = float(t[2:])
        except ValueError:
            margin = float("nan")
        if margin == margin and margin >= 0 and margin != float("inf"):
            return margin if t[0] == "B" else -margin
    raise ValueError(f"not a GTP score: {text!r}")


def judge_game(judge: GtpClient, size: int, komi: float, moves: list[str]) -> str:
    """Replay `moves` (GTP text, black first, passes included) into `judge` and return its
    `final_score` of the final position."""
    judge.send(f"boardsize {size}")
    judge.send("clear_board")
    judge.send(f"komi {komi:g}")
    color = "black"
    for k, move in enumerate(moves):
        try:
            judge.send(f"play {color} {move}")
        except GtpError as e:
            raise RefereeError(f"{judge.name} (judge) refused {color} {move} at move {k + 1} "
                               f"of the replay: {e.message}") from e
        color = "white" if color == "black" else "black"
    reply = judge.send("final_score")
    parse_score(reply)  # a judge that answers something else is of no use
    return reply


def play_game(
    black: GtpClient,
    white: GtpClient,
    size: int = 9,
    komi: float = 7.5,
    max_moves: int | None = None,
    *,
    opening: Sequence[str] = (),
    judge: GtpClient | None = None,
    time_control: TimeControl | None = None,
    playout: bool = False,
    untrusted: GtpClient | None = None,
) -> GameResult:
    """Play one game (after `opening`) and return its result, judged by `judge` if given.

    With `playout` (and a judge), a game that two passes end while the players' own
    `final_status_list dead` differ goes on, each side asked `kgs-genmove_cleanup` (it
    captures what it calls dead before it passes again), until two more passes: the dispute is
    played out on the board, as KGS does, before the judge counts. `judgement_at_passes` keeps
    the judge's count at the first two passes, `playout_from` the move the play-out began at.

    With `time_control` both engines get `time_settings`, each `genmove` is preceded by the
    mover's `time_left` and timed here (pipes included, as a server times it), and a player
    whose clock runs out loses on time (`B+T` / `W+T`, end "time").

    The `untrusted` engine (black or white) loses by forfeit where it sends a move that is
    illegal or no move, or refuses a legal move (see the module)."""
    max_moves = 4 * size * size if max_moves is None else max_moves
    engines = {BLACK: black, WHITE: white}
    names = {BLACK: "black", WHITE: "white"}
    _set_up(engines, size, komi, time_control)
    clocks = {c: GameClock(time_control) for c in engines} if time_control else {}
    position = Position(size, komi=komi, max_moves=max_moves)
    game = GameResult(size=size, komi=komi, opening=list(opening))
    _play_opening(opening, engines, position, game)

    table = _Table(engines, position, game, clocks, untrusted, size)

    if not table.play_on("genmove"):
        return game
    if (playout and judge is not None and position.passes >= 2
            and len(position.moves) < max_moves):
        dead = _dead_lists(engines, untrusted, game)
        if dead is not None and dead["black"] != dead["white"]:  # play it out, as KGS does
            game.disputed_dead = dead
            game.judgement_at_passes = judge_game(judge, size, komi, game.moves)
            game.playout_from = len(game.moves)
            position.resume()
            if not table.play_on("kgs-genmove_cleanup"):
                return game
    _count(game, position, engines, judge, untrusted, komi)
    return game


_NAMES = {BLACK: "black", WHITE: "white"}


def _dead_lists(engines: dict[int, GtpClient], untrusted: GtpClient | None,
                game: GameResult) -> dict[str, list[str]] | None:
    """Each player's `final_status_list dead` at the passes, by colour name; None when the
    untrusted engine refuses or does not answer within its timeout (`game.playout_skipped`
    says which): no play-out then, the judge counts the board as it stands."""
    dead: dict[str, list[str]] = {}
    for c, engine in engines.items():
        try:
            dead[_NAMES[c]] = sorted(engine.send("final_status_list dead").split())
        except (GtpError, GtpEngineError) as e:
            if engine is not untrusted:
                raise
            game.playout_skipped = (f"{engine.name} ({_NAMES[c]}) did not name its dead "
                                    f"stones: {str(e)[:160]}")
            return None
    return dead


def _set_up(engines: dict[int, GtpClient], size: int, komi: float,
            time_control: TimeControl | None) -> None:
    """Both engines on an empty board of `size` with `komi`, under `time_control`."""
    for engine in engines.values():
        engine.send(f"boardsize {size}")
        engine.send("clear_board")
        engine.send(f"komi {komi:g}")
        if time_control is not None:
            engine.send(time_control.gtp())


def _play_opening(opening: Sequence[str], engines: dict[int, GtpClient], position: Position,
                  game: GameResult) -> None:
    """The opening's moves played on `position` and by both engines; RefereeError for an
    illegal one."""
    size, names = position.size, _NAMES
    for text in opening:
        move = from_gtp(text, size)
        color = position.to_play
        if not position.is_legal(move, color):
            raise RefereeError(f"opening move {text} at move {len(position.moves) + 1}: "
                               f"illegal, {position.illegal_reason(move)}")
        for engine in engines.values():
            engine.send(f"play {names[color]} {to_gtp(move, size)}")
        position.play(move)
        game.moves.append(to_gtp(move, size))


@dataclass
class _Table:
    """A game in progress between two engines: the board, the clocks and the result so far."""

    engines: dict[int, GtpClient]
    position: Position
    game: GameResult
    clocks: dict[int, GameClock]
    untrusted: GtpClient | None
    size: int

    def forfeit(self, color: int, reason: str) -> bool:
        """`color` (the untrusted engine) loses the game for `reason`; raise RefereeError for
        any other engine."""
        engines, game, untrusted = self.engines, self.game, self.untrusted
        if engines[color] is not untrusted:
            raise RefereeError(reason)
        game.moves.append("forfeit")
        game.winner = -color
        game.result = ("W" if color == BLACK else "B") + "+F"
        game.end, game.forfeit = "forfeit", reason
        return False

    def play_on(self, command: str) -> bool:
        """Ask the side to move for `command` (genmove, kgs-genmove_cleanup) until the game
        is over; False when it ended by resignation, on time or by forfeit (`game` says
        so)."""
        engines, names, position, game = self.engines, _NAMES, self.position, self.game
        clocks, untrusted, size, forfeit = self.clocks, self.untrusted, self.size, self.forfeit
        color = position.to_play
        while not position.is_over():
            if clocks:
                left, stones = clocks[color].time_left()
                # GTP's time_left takes whole seconds (GNU Go refuses anything else): the
                # seconds left, rounded down, as a server sends them
                engines[color].send(f"time_left {names[color]} {int(left)} {stones}")
            t0 = time.monotonic()
            try:
                reply = engines[color].send(f"{command} {names[color]}")
            except GtpError as e:
                if engines[color] is not untrusted:
                    raise
                return forfeit(color, f"{engines[color].name} ({names[color]}) refused "
                               f"{command} at move {len(position.moves) + 1}: {e.message}")
            if clocks:
                spent = time.monotonic() - t0
                key = names[color]
                game.think_max_s[key] = max(game.think_max_s.get(key, 0.0), spent)
                if not clocks[color].spend(spent):
                    game.moves.append("timeout")
                    game.winner = -color
                    game.result = ("W" if color == BLACK else "B") + "+T"
                    game.end = "time"
                    return False
            if reply.lower() == "resign":
                game.moves.append("resign")
                game.winner = -color
                game.result = ("W" if color == BLACK else "B") + "+R"
                game.end = "resignation"
                return False
            try:
                move = from_gtp(reply, size)
            except ValueError:
                return forfeit(color, f"{engines[color].name} ({names[color]}) sent "
                               f"{reply[:80]!r} at move {len(position.moves) + 1}, not a "
                               f"move on {size}x{size}")
            reason = position.illegal_reason(move)
            if reason is not None:
                return forfeit(color, f"{engines[color].name} ({names[color]}) played "
                               f"{to_gtp(move, size)} at move {len(position.moves) + 1}: "
                               f"illegal, {reason}")
            try:
                engines[-color].send(f"play {names[color]} {to_gtp(move, size)}")
            except GtpError as e:
                return forfeit(-color, f"{engines[-color].name} refused {names[color]}'s legal "
                               f"move {to_gtp(move, size)} at move "
                               f"{len(position.moves) + 1}: {e.message}")
            position.play(move)
            game.moves.append(to_gtp(move, size))
            color = -color
        return True


def _count(game: GameResult, position: Position, engines: dict[int, GtpClient],
           judge: GtpClient | None, untrusted: GtpClient | None, komi: float) -> None:
    """A finished game's end, score and result, each engine's own count and the judge's."""
    size, names = position.size, _NAMES
    game.end = "two passes" if position.passes >= 2 else "move cap"
    game.score = position.score()
    game.result = position.result()
    game.winner = BLACK if game.score > 0 else WHITE if game.score < 0 else 0
    for c, engine in engines.items():
        if engine is not untrusted:  # an outside engine's count is not asked (module)
            game.engine_scores[f"{names[c]} {engine.name}"] = engine.send("final_score")
    if judge is not None:
        game.judgement = judge_game(judge, size, komi, game.moves)
        game.judged_dead = judge.send("final_status_list dead").split()
        verdict = parse_score(game.judgement)
        game.winner = BLACK if verdict > 0 else WHITE if verdict < 0 else 0
