"""A referee for games between two GTP engines (our engine vs GNU Go, model vs model).

`play_game(black, white, size, komi)` sets both engines up, asks the side to move for
`genmove`, checks the move against our reference rules (`training.go.Position`), passes it
to the other engine with `play` and goes on until two consecutive passes, a resignation or
`max_moves`. Every move must be legal by our rules and accepted by the opponent, otherwise
`RefereeError` names the move, the engine and the reason. The result is scored by
Tromp-Taylor on the referee's own board (each engine's `final_score` is recorded beside it,
for information: GNU Go's estimates dead stones, ours does not).

The engines are `training.gtp_client.GtpClient`s; the referee does not start or stop them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from training.coords import BLACK, WHITE, from_gtp, to_gtp
from training.go import Position
from training.gtp_client import GtpClient, GtpError


class RefereeError(RuntimeError):
    """An engine sent an illegal move, or refused a legal one."""


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


def play_game(
    black: GtpClient,
    white: GtpClient,
    size: int = 9,
    komi: float = 7.5,
    max_moves: int | None = None,
) -> GameResult:
    """Play one game from the empty board and return its result."""
    max_moves = 4 * size * size if max_moves is None else max_moves
    engines = {BLACK: black, WHITE: white}
    names = {BLACK: "black", WHITE: "white"}
    for engine in engines.values():
        engine.send(f"boardsize {size}")
        engine.send("clear_board")
        engine.send(f"komi {komi:g}")
    position = Position(size, komi=komi, max_moves=max_moves)
    game = GameResult(size=size, komi=komi)
    color = BLACK
    while not position.is_over():
        reply = engines[color].send(f"genmove {names[color]}")
        if reply.lower() == "resign":
            game.moves.append("resign")
            game.winner = -color
            game.result = ("W" if color == BLACK else "B") + "+R"
            game.end = "resignation"
            return game
        try:
            move = from_gtp(reply, size)
        except ValueError:
            raise RefereeError(f"{engines[color].name} ({names[color]}) sent {reply!r}, "
                               f"not a move on {size}x{size}") from None
        reason = position.illegal_reason(move)
        if reason is not None:
            raise RefereeError(f"{engines[color].name} ({names[color]}) played "
                               f"{to_gtp(move, size)} at move {len(position.moves) + 1}: "
                               f"illegal, {reason}")
        try:
            engines[-color].send(f"play {names[color]} {to_gtp(move, size)}")
        except GtpError as e:
            raise RefereeError(f"{engines[-color].name} refused {names[color]}'s legal move "
                               f"{to_gtp(move, size)} at move {len(position.moves) + 1}: "
                               f"{e.message}") from e
        position.play(move)
        game.moves.append(to_gtp(move, size))
        color = -color
    game.end = "two passes" if position.passes >= 2 else "move cap"
    game.score = position.score()
    game.result = position.result()
    game.winner = BLACK if game.score > 0 else WHITE if game.score < 0 else 0
    for c, engine in engines.items():
        game.engine_scores[f"{names[c]} {engine.name}"] = engine.send("final_score")
    return game
