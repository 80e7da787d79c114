"""Our GTP engine: `python -m training.gtp` speaks GTP version 2 on stdin/stdout.

Commands: protocol_version name version known_command list_commands quit boardsize
clear_board komi play genmove undo showboard final_score final_status_list
kgs-genmove_cleanup. Replies are `=[id] text` or `?[id] message` followed by a blank line, ids
echoed. An illegal `play` is answered `? illegal move` and leaves the board unchanged.
`final_score` is the area score of the current board with komi (`B+3.5`, `W+0.5`, `0`) after
removing the stones the player calls dead (a model: its ownership map, `training.go.endgame`;
the random player: none, so Tromp-Taylor); `final_status_list dead|alive|seki` lists those
groups, one per line. `kgs-genmove_cleanup` is `genmove` for a player that captures every
dead opponent stone before it passes (servers send it when the players disagree about dead
stones), so that Tromp-Taylor and the judge agree.

Who chooses the moves is a *player*: any object with
`genmove(position: training.go.rules.Position, color: int) -> move` (a flat index, PASS, or
`None` to resign). `GtpEngine(player)` owns the board and the protocol; the player only
chooses. A command or a player that fails raises `training.play.gtp_client.GtpError` (the one
class of a GTP failure, shared with the client); its message is the `? message` reply.

Until a trained network exists the player is `RandomPlayer`: a uniformly random legal move
that does not fill one of its own single-point eyes, passing when no other move is left.
With `--model FILE` the player is `training.play.players.NetPlayer`: the trained network with MCTS
(torch is imported only then), under an explicit budget per move: `--simulations N` or
`--seconds-per-move S` (chunks of simulations until the time is used; see
`training.play.players.MctsPlayer`), with the search settings of `--config` (default
configs/config.yaml's defaults).

`komi` takes a finite number of at most `MAX_KOMI` in size; anything else (`nan`, `inf`,
`1e300`) is answered `? komi ...` and the komi is unchanged.

The game itself is a reference `Position` with no practical move cap (GTP controllers decide
when a game ends); after two passes it is over: a further `play` of a stone is refused and
`genmove` answers `pass` without recording it.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
from typing import Protocol, TextIO

from training.go.coords import EMPTY, MAX_SIZE, MIN_SIZE, from_gtp, parse_color, to_gtp
from training.go.endgame import final_status, judged_score
from training.go.rules import IllegalMove, Position, neighbors
from training.play.gtp_client import GtpError

NAME = "azgo"
VERSION = "0.1.0"
PROTOCOL_VERSION = "2"
MAX_KOMI = MAX_SIZE * MAX_SIZE
"""Largest komi accepted (in size): more than any board's area is no game."""
COMMANDS = (
    "protocol_version",
    "name",
    "version",
    "known_command",
    "list_commands",
    "quit",
    "boardsize",
    "clear_board",
    "komi",
    "play",
    "genmove",
    "undo",
    "showboard",
    "final_score",
    "final_status_list",
    "kgs-genmove_cleanup",
)


class Player(Protocol):
    """Chooses moves; the engine keeps the board."""

    def genmove(self, position: Position, color: int) -> int | None:
        """A legal move for `color` in `position` (flat index or PASS), or None to resign."""


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


class GtpEngine:
    """The GTP protocol over a Position, with moves chosen by `player`."""

    def __init__(self, player: Player, size: int = 9, komi: float = 7.5):
        self.player = player
        self.komi = komi
        self.position = self._new_position(size)
        self.is_done = False  # set by `quit`

    def _new_position(self, size: int) -> Position:
        # No move cap of our own: 100*N*N is beyond any game a controller will play.
        return Position(size, komi=self.komi, max_moves=100 * size * size)

    # -- protocol ----------------------------------------------------------------------

    def handle(self, line: str) -> str | None:
        """One input line -> the full reply (ending in a blank line), or None to ignore."""
        line = "".join(c for c in line if c in "\t\n" or ord(c) >= 32 and ord(c) != 127)
        line = line.split("#", 1)[0].replace("\t", " ").strip()
        if not line:
            return None
        words = line.split()
        cmd_id = ""
        if words[0].isdigit():
            cmd_id = words.pop(0)
            if not words:
                return f"?{cmd_id} missing command\n\n"
        command, args = words[0], words[1:]
        handler = (getattr(self, "cmd_" + command.replace("-", "_"), None)
                   if command in COMMANDS else None)
        if handler is None:
            return f"?{cmd_id} unknown command\n\n"
        try:
            text = handler(args)
        except GtpError as e:
            return f"?{cmd_id} {e}\n\n"
        return f"={cmd_id} {text}\n\n" if text else f"={cmd_id}\n\n"

    def run(self, stdin: TextIO, stdout: TextIO) -> None:
        """Serve commands until `quit` or end of input."""
        for line in stdin:
            reply = self.handle(line)
            if reply is not None:
                stdout.write(reply)
                stdout.flush()
            if self.is_done:
                break

    # -- commands ------------------------------------------------------------------------

    def cmd_protocol_version(self, args):
        return PROTOCOL_VERSION

    def cmd_name(self, args):
        return NAME

    def cmd_version(self, args):
        return VERSION

    def cmd_known_command(self, args):
        _expect(args, 1)
        return "true" if args[0] in COMMANDS else "false"

    def cmd_list_commands(self, args):
        return "\n".join(COMMANDS)

    def cmd_quit(self, args):
        self.is_done = True
        return ""

    def cmd_boardsize(self, args):
        _expect(args, 1)
        try:
            size = int(args[0])
        except ValueError:
            raise GtpError("boardsize not an integer") from None
        if not MIN_SIZE <= size <= MAX_SIZE:
            raise GtpError("unacceptable size")
        self.position = self._new_position(size)
        return ""

    def cmd_clear_board(self, args):
        self.position = self._new_position(self.position.size)
        return ""

    def cmd_komi(self, args):
        _expect(args, 1)
        try:
            komi = float(args[0])
        except ValueError:
            raise GtpError("komi not a float") from None
        if not math.isfinite(komi) or abs(komi) > MAX_KOMI:
            raise GtpError(f"komi must be a finite number from -{MAX_KOMI} to {MAX_KOMI}")
        self.komi = komi
        self.position.komi = komi
        return ""

    def cmd_play(self, args):
        _expect(args, 2)
        color = _color(args[0])
        try:
            move = from_gtp(args[1], self.position.size)
        except ValueError:
            raise GtpError("invalid coordinate") from None
        try:
            self.position.play(move, color)
        except IllegalMove:
            raise GtpError("illegal move") from None
        return ""

    def cmd_genmove(self, args):
        return self._genmove(args, self.player.genmove)

    def cmd_kgs_genmove_cleanup(self, args):
        """genmove that captures every dead opponent stone before it passes (KGS, CGOS)."""
        return self._genmove(args, getattr(self.player, "genmove_cleanup", self.player.genmove))

    def _genmove(self, args, choose):
        _expect(args, 1)
        color = _color(args[0])
        if self.position.is_over():
            return "pass"  # two passes already: nothing left to play, nothing recorded
        move = choose(self.position, color)
        if move is None:
            return "resign"
        self.position.play(move, color)  # a player returning an illegal move is a bug
        return to_gtp(move, self.position.size)

    def cmd_undo(self, args):
        try:
            self.position.undo()
        except IndexError:
            raise GtpError("cannot undo") from None
        return ""

    def cmd_showboard(self, args):
        return "\n" + str(self.position)

    def cmd_final_score(self, args):
        p = self.position
        s = judged_score(p.board, p.size, p.komi, self._dead())
        if s == 0:
            return "0"
        return f"B+{s:g}" if s > 0 else f"W+{-s:g}"

    def cmd_final_status_list(self, args):
        _expect(args, 1)
        try:
            found = final_status(self.position.board, self.position.size, self._dead(), args[0])
        except ValueError:
            raise GtpError("syntax error: final_status_list dead|alive|seki") from None
        n = self.position.size
        return "\n".join(" ".join(to_gtp(p, n) for p in stones) for stones in found)

    def _dead(self) -> set[int]:
        """The player's dead stones (its ownership map), or none: Tromp-Taylor."""
        dead_stones = getattr(self.player, "dead_stones", None)
        return set() if dead_stones is None else dead_stones(self.position)


def _expect(args: list[str], count: int) -> None:
    if len(args) < count:
        raise GtpError("syntax error")


def _color(text: str) -> int:
    try:
        return parse_color(text)
    except ValueError:
        raise GtpError("syntax error") from None


def make_player(model: str | None, simulations: int, seed: int | None, *,
                seconds_per_move: float | None = None, config: str | None = None) -> Player:
    """The move chooser the flags ask for: random, or a trained model with MCTS."""
    if model is None:
        return RandomPlayer(seed)
    if not os.path.isfile(model):
        raise SystemExit(f"error: --model {model}: no such file")
    # Imported here: torch is only needed (and only loaded) when a model is asked for.
    import torch

    from configs import ConfigError, load_config
    from training.play.players import NetPlayer

    try:
        cfg = load_config(config)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    torch.set_num_threads(1)  # one search, batch 1: more threads only contend
    return NetPlayer(model, simulations, cfg, seconds_per_move=seconds_per_move)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m training.gtp", description="azgo GTP engine on stdin/stdout"
    )
    parser.add_argument("--size", type=int, default=9, help="initial board size (default 9)")
    parser.add_argument("--komi", type=float, default=7.5, help="initial komi (default 7.5)")
    parser.add_argument("--model", help="trained model file (model_<gen>.pt); plays with MCTS")
    parser.add_argument("--simulations", type=int, default=100,
                        help="MCTS simulations per move with --model (default 100)")
    parser.add_argument("--seconds-per-move", type=float, default=None,
                        help="with --model: think this many seconds per move instead of a "
                        "fixed number of simulations")
    parser.add_argument("--config", default=None,
                        help="config whose mcts section the model searches with "
                        "(default configs/config.yaml)")
    parser.add_argument("--seed", type=int, help="seed of the random player")
    args = parser.parse_args(argv)
    if not MIN_SIZE <= args.size <= MAX_SIZE:
        parser.error(f"--size must be {MIN_SIZE}..{MAX_SIZE}")
    if args.simulations < 1:
        parser.error("--simulations must be at least 1")
    if args.seconds_per_move is not None and not (
            math.isfinite(args.seconds_per_move) and args.seconds_per_move > 0):
        parser.error("--seconds-per-move must be a positive number")
    if not math.isfinite(args.komi) or abs(args.komi) > MAX_KOMI:
        parser.error(f"--komi must be a finite number from -{MAX_KOMI} to {MAX_KOMI}")
    player = make_player(args.model, args.simulations, args.seed,
                         seconds_per_move=args.seconds_per_move, config=args.config)
    size = getattr(player, "board_size", args.size)  # a model plays its own board size
    engine = GtpEngine(player, size, args.komi)
    engine.run(sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
