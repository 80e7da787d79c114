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
stones), so that Tromp-Taylor and the judge agree. A game that two passes ended goes on when
a `play` or a `kgs-genmove_cleanup` follows (the dispute played out); a plain `genmove`
there still answers `pass`.

Who chooses the moves is a *player*: any object with
`genmove(position: training.go.rules.Position, color: int) -> move` (a flat index, PASS, or
`None` to resign). `GtpEngine(player)` owns the board and the protocol; the player only
chooses. A command or a player that fails raises `training.play.gtp_client.GtpError` (the one
class of a GTP failure, shared with the client); its message is the `? message` reply.

Until a trained network exists the player is `RandomPlayer` (`training.play.players`): a
uniformly random legal move that does not fill one of its own single-point eyes, passing when
no other move is left.
With `--model FILE` the player is `training.play.players.NetPlayer`: the trained network with MCTS
(torch is imported only then), under an explicit budget per move: `--simulations N` or
`--seconds-per-move S` (searches sized to the time; see `training.play.players.MctsPlayer`),
with the search settings of `--config` (default configs/config.yaml's defaults). Under a game
clock (`time_settings`, `kgs-time_settings`, `time_left`) a move thinks for its share of the
time (`training.play.clock`), with `--simulations` as a floor while the clock allows it, not a
cap. No search runs more than `--max-simulations` (default the config's `engine.max_visits`),
which sizes the search tree: the engine's memory bound.

Live analysis (Lizzie, Sabaki, GoGui): `lz-analyze`, `kata-analyze` and `analyze` answer `=`
at once and search on a thread until the next input line (any line, a blank one too, stops
it), up to `--max-simulations` or `engine.analysis_max_seconds`, writing an `info` line every
interval with the visits growing; the reply ends with a blank line before the next command is
handled. `lz-genmove_analyze` and `kata-genmove_analyze` search as `genmove` does, with an
interval write `info` lines while they think and the analysis of the search that chose the
move, then `play MOVE`.

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
import sys
import threading
import time
from typing import Protocol, TextIO

from training.go.coords import MAX_SIZE, MIN_SIZE, from_gtp, parse_color, to_gtp
from training.go.endgame import final_status, judged_score
from training.go.rules import IllegalMove, Position
from training.play.clock import Clock
from training.play.gtp_client import GtpError

NAME = "azgo"
VERSION = "0.1.0"
PROTOCOL_VERSION = "2"
MAX_KOMI = MAX_SIZE * MAX_SIZE
"""Largest komi accepted (in size): more than any board's area is no game."""
MAX_LINE_CHARS = 1 << 16
"""Longest command line read (far more than any GTP command needs)."""
MAX_SIMULATIONS = 200_000
"""Largest --max-simulations (the tree: about 1.7 GB on 19x19), as the config's
engine.max_visits."""
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
    "time_settings",
    "kgs-time_settings",
    "time_left",
    "lz-analyze",
    "kata-analyze",
    "analyze",
    "lz-genmove_analyze",
    "kata-genmove_analyze",
    "genmove_analyze",
    "gogui-analyze_commands",
    "azgo-policy",
    "azgo-ownership",
)
STREAMING = object()
"""What a command handler returns when it has written its reply itself (analysis)."""


class Player(Protocol):
    """Chooses moves; the engine keeps the board."""

    def genmove(self, position: Position, color: int) -> int | None:
        """A legal move for `color` in `position` (flat index or PASS), or None to resign."""


class GtpEngine:
    """The GTP protocol over a Position, with moves chosen by `player`."""

    def __init__(self, player: Player, size: int = 9, komi: float = 7.5):
        self.player = player
        self.komi = komi
        self.position = self._new_position(size)
        self.is_done = False  # set by `quit`
        self.clock = Clock()
        self._out: TextIO | None = None  # the stream `run` serves: analysis writes to it
        self._write_lock = threading.Lock()
        self._analysis: tuple[threading.Thread, threading.Event] | None = None
        self._cmd_id = ""

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
        self._cmd_id = cmd_id
        try:
            text = handler(args)
        except GtpError as e:
            return f"?{cmd_id} {e}\n\n"
        except Exception as e:  # a failing command answers, the engine stays up
            print(f"azgo: {command}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return f"?{cmd_id} internal error in {command}: {type(e).__name__}\n\n"
        if text is STREAMING:
            return None
        return f"={cmd_id} {text}\n\n" if text else f"={cmd_id}\n\n"

    def run(self, stdin: TextIO, stdout: TextIO) -> None:
        """Serve commands until `quit` or end of input. Any input line, a blank one too, ends
        a running analysis first (its reply then ends with the blank line). A line longer
        than `MAX_LINE_CHARS` is read on in pieces, dropped and answered `? command line
        longer than ...`: no line is held whole."""
        self._out = stdout
        try:
            while line := stdin.readline(MAX_LINE_CHARS + 1):
                self._stop_analysis()
                if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
                    while line and not line.endswith("\n"):
                        line = stdin.readline(MAX_LINE_CHARS)
                    self._write(f"? command line longer than {MAX_LINE_CHARS} characters\n\n")
                    continue
                reply = self.handle(line)
                if reply is not None:
                    self._write(reply)
                if self.is_done:
                    break
        finally:
            self._stop_analysis()

    def _write(self, text: str) -> None:
        assert self._out is not None
        with self._write_lock:
            self._out.write(text)
            self._out.flush()

    def _stop_analysis(self) -> None:
        if self._analysis is not None:
            thread, stop = self._analysis
            stop.set()
            thread.join()
            self._analysis = None

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
        self._resume()  # after two passes: the players play out a dispute about dead stones
        try:
            self.position.play(move, color)
        except IllegalMove:
            raise GtpError("illegal move") from None
        return ""

    def _resume(self) -> None:
        """Reopen a game that two passes ended (nothing to do otherwise)."""
        p = self.position
        if p.passes >= 2 and len(p.moves) < p.max_moves:
            p.resume()

    def cmd_genmove(self, args):
        return self._genmove(args, self.player.genmove)

    def cmd_kgs_genmove_cleanup(self, args):
        """genmove that captures every dead opponent stone before it passes (KGS, CGOS);
        after two passes the game goes on (KGS asks it when the players disagree)."""
        self._resume()
        return self._genmove(args, getattr(self.player, "genmove_cleanup", self.player.genmove))

    def _genmove(self, args, choose, **extra):
        _expect(args, 1)
        color = _color(args[0])
        if self.position.is_over():
            return "pass"  # two passes already: nothing left to play, nothing recorded
        move = self._choose(choose, color, **extra)
        if move is None:
            return "resign"
        self.position.play(move, color)  # a player returning an illegal move is a bug
        return to_gtp(move, self.position.size)

    def _choose(self, choose, color: int, **extra) -> int | None:
        """The player's move, thinking for the clock's share when a clock runs (and never
        past the clock's limit); the clock counts the time down."""
        start = time.monotonic()
        allowed = self.clock.allowance(color, self.position.size, len(self.position.moves))
        if allowed is not None and hasattr(self.player, "analyze"):  # a searching player
            extra["seconds"], extra["limit"] = allowed
        move = choose(self.position, color, **extra)
        self.clock.spent(color, time.monotonic() - start)
        return move

    # -- the clock -------------------------------------------------------------------------

    def cmd_time_settings(self, args):
        _expect(args, 3)
        try:
            self.clock.settings(float(args[0]), float(args[1]), int(args[2]))
        except ValueError as e:
            raise GtpError(f"syntax error: time_settings main_time byo_yomi_time "
                           f"byo_yomi_stones ({e})") from None
        return ""

    def cmd_kgs_time_settings(self, args):
        _expect(args, 1)
        try:
            self.clock.kgs_settings(args[0], [float(a) for a in args[1:4]])
        except ValueError as e:
            raise GtpError(f"syntax error: kgs-time_settings {e}") from None
        return ""

    def cmd_time_left(self, args):
        _expect(args, 3)
        try:
            self.clock.time_left(_color(args[0]), float(args[1]), int(args[2]))
        except ValueError as e:
            raise GtpError(f"syntax error: time_left color time stones ({e})") from None
        return ""

    # -- analysis (Lizzie, Sabaki, KaTrain's GTP mode, GoGui) --------------------------------

    def cmd_lz_analyze(self, args):
        return self._analyze(args, "lz")

    def cmd_analyze(self, args):
        return self._analyze(args, "lz")

    def cmd_kata_analyze(self, args):
        return self._analyze(args, "kata")

    def cmd_lz_genmove_analyze(self, args):
        return self._genmove_analyze(args, "lz")

    def cmd_genmove_analyze(self, args):
        return self._genmove_analyze(args, "lz")

    def cmd_kata_genmove_analyze(self, args):
        return self._genmove_analyze(args, "kata")

    # -- GoGui's analysis menu ----------------------------------------------------------------

    def cmd_gogui_analyze_commands(self, args):
        if not hasattr(self.player, "policy"):
            return ""
        return "gfx/Policy/azgo-policy\ngfx/Ownership/azgo-ownership"

    def cmd_azgo_policy(self, args):
        """GoGui graphics: the net's prior of the side to move, in percent, as labels."""
        if not hasattr(self.player, "policy"):
            raise GtpError("the policy needs a model (--model FILE)")
        p, n = self.position, self.position.size
        prior = self.player.policy(p, p.to_play)
        top = sorted(range(n * n), key=lambda m: -prior[m])[:12]
        labels = " ".join(f"{to_gtp(m, n)} {round(100 * prior[m])}" for m in top
                          if prior[m] >= 0.005)
        return f"LABEL {labels}" if labels else ""

    def cmd_azgo_ownership(self, args):
        """GoGui graphics: the net's ownership of every point (black +1, white -1)."""
        own = getattr(self.player, "ownership", None)
        values = None if own is None else own(self.position)
        if values is None:
            raise GtpError("the ownership needs a model with an ownership head")
        n = self.position.size
        return "INFLUENCE " + " ".join(f"{to_gtp(m, n)} {v:.2f}" for m, v in enumerate(values))

    def _analysis_request(self, args) -> AnalysisRequest:
        if not hasattr(self.player, "analyze"):
            raise GtpError("analysis needs a model (--model FILE)")
        if self._out is None:
            raise GtpError("analysis streams its reply: serve with run()")
        try:
            return AnalysisRequest.parse(args, self.position.to_play)
        except ValueError as e:
            raise GtpError(f"syntax error: {e}") from None

    def _analyze(self, args, style: str):
        """Search the position and report every interval until the next input line."""
        request = self._analysis_request(args)
        stop = threading.Event()
        position = self.position.copy()
        self._write(f"={self._cmd_id}\n")
        reporter = Reporter(self, position, request, style)

        def work() -> None:
            try:
                if not position.is_over():  # a finished game: nothing to search or report
                    self.player.analyze(position, request.color, stop, reporter.maybe)
                    reporter.maybe(force=True)
                stop.wait()
            finally:
                self._write("\n")

        thread = threading.Thread(target=work, name="gtp-analysis", daemon=True)
        self._analysis = (thread, stop)
        thread.start()
        return STREAMING

    def _genmove_analyze(self, args, style: str):
        """genmove with analysis lines while it thinks, then the analysis of the search that
        chose the move (with an interval), then `play MOVE`."""
        request = self._analysis_request(args)
        if self.position.is_over():
            self._write(f"={self._cmd_id}\nplay pass\n\n")
            return STREAMING
        self._write(f"={self._cmd_id}\n")
        reporter = Reporter(self, self.position.copy(), request, style)
        move = self._choose(self.player.genmove, request.color, on_chunk=reporter.maybe)
        reporter.maybe(force=True)  # what the move was chosen on, however short the search
        if move is None:
            self._write("play resign\n\n")
            return STREAMING
        self.position.play(move, request.color)
        self._write(f"play {to_gtp(move, self.position.size)}\n\n")
        return STREAMING

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


class AnalysisRequest:
    """The arguments of lz-analyze / kata-analyze / *-genmove_analyze: `[color] [interval]
    KEY VALUE ...` with the keys interval (centiseconds), ownership (true/false), maxmoves,
    minmoves (accepted, as KataGo does not enforce it either), pvlength; allow and avoid are
    accepted and ignored."""

    def __init__(self, color: int, interval_s: float, ownership: bool, max_moves: int,
                 pv_length: int):
        self.color = color
        self.interval_s = interval_s
        self.ownership = ownership
        self.max_moves = max_moves
        self.pv_length = pv_length

    @classmethod
    def parse(cls, args: list[str], to_play: int) -> AnalysisRequest:
        words = list(args)
        color = to_play
        if words:
            try:
                color = parse_color(words[0])
                words.pop(0)
            except ValueError:
                pass
        interval_cs = 0.0
        if words and _is_number(words[0]):
            interval_cs = float(words.pop(0))
        ownership, max_moves, pv_length = False, 0, 12
        while words:
            key = words.pop(0).lower()
            if key in ("allow", "avoid"):
                del words[:3]  # colour, vertices, until depth
                continue
            if not words:
                raise ValueError(f"{key} needs a value")
            value = words.pop(0)
            if key == "interval":
                if not _is_number(value):
                    raise ValueError(f"interval {value!r} is not a number")
                interval_cs = float(value)
            elif key == "ownership":
                ownership = value.lower() == "true"
            elif key in ("maxmoves", "minmoves", "pvlength"):
                if not value.isdigit():
                    raise ValueError(f"{key} {value!r} is not a count")
                if key == "maxmoves":
                    max_moves = int(value)
                elif key == "pvlength":
                    pv_length = max(1, min(int(value), 100))
        if not (math.isfinite(interval_cs) and interval_cs >= 0):
            raise ValueError("interval must be a number of centiseconds >= 0")
        return cls(color, interval_cs / 100, ownership, max_moves, pv_length)


class Reporter:
    """Writes an analysis line when the interval has passed since the last one."""

    def __init__(self, engine: GtpEngine, position: Position, request: AnalysisRequest,
                 style: str):
        self.engine = engine
        self.position = position
        self.request = request
        self.style = style
        self.last = time.monotonic()

    def maybe(self, force: bool = False) -> None:
        interval = self.request.interval_s
        now = time.monotonic()
        if interval <= 0 or (not force and now - self.last < interval):
            return
        self.last = now
        line = self.line()
        if line:
            self.engine._write(line + "\n")

    def line(self) -> str:
        player, req, n = self.engine.player, self.request, self.position.size
        infos = player.move_infos(self.position, req.color, req.pv_length)
        if req.max_moves:
            infos = infos[:req.max_moves]
        parts = []
        for i in infos:
            pv = " ".join(to_gtp(m, n) for m in i.pv)
            if self.style == "lz":
                parts.append(f"info move {to_gtp(i.move, n)} visits {i.visits} "
                             f"winrate {round(10000 * i.winrate)} prior {round(10000 * i.prior)} "
                             f"lcb {round(10000 * i.lcb)} order {i.order} pv {pv}")
            else:
                score = "" if i.score_lead is None else (
                    f"scoreMean {i.score_lead:.3f} scoreLead {i.score_lead:.3f} ")
                parts.append(f"info move {to_gtp(i.move, n)} visits {i.visits} "
                             f"utility {2 * i.winrate - 1:.5f} winrate {i.winrate:.5f} {score}"
                             f"prior {i.prior:.5f} lcb {i.lcb:.5f} "
                             f"utilityLcb {2 * i.lcb - 1:.5f} order {i.order} pv {pv}")
        if not parts:
            return ""  # no search to report (a move chosen without one)
        text = " ".join(parts)
        if self.style == "kata" and req.ownership:
            own = player.ownership(self.position, req.color)
            if own is not None:  # the current player's view, row-major from the top left
                text += " ownership " + " ".join(f"{v * req.color:.4f}" for v in own)
        return text


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _expect(args: list[str], count: int) -> None:
    if len(args) < count:
        raise GtpError("syntax error")


def _color(text: str) -> int:
    try:
        return parse_color(text)
    except ValueError:
        raise GtpError("syntax error") from None


def make_player(model: str | None, simulations: int, seed: int | None, *,
                seconds_per_move: float | None = None, config: str | None = None,
                max_simulations: int | None = None) -> Player:
    """The move chooser the flags ask for: random, or a trained model with MCTS."""
    from training.play.players import RandomPlayer

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
    return NetPlayer(model, simulations, cfg, seconds_per_move=seconds_per_move,
                     max_simulations=max_simulations)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m training.gtp", description="azgo GTP engine on stdin/stdout"
    )
    parser.add_argument("--size", type=int, default=9, help="initial board size (default 9)")
    parser.add_argument("--komi", type=float, default=7.5, help="initial komi (default 7.5)")
    parser.add_argument("--model", help="trained model file (model_<gen>.pt); plays with MCTS")
    parser.add_argument("--simulations", type=int, default=100,
                        help="MCTS simulations per move with --model (default 100); under a "
                        "game clock (time_settings) the least a move searches while the clock "
                        "allows")
    parser.add_argument("--seconds-per-move", type=float, default=None,
                        help="with --model: think this many seconds per move instead of a "
                        "fixed number of simulations")
    parser.add_argument("--max-simulations", type=int, default=None,
                        help="with --model: the most simulations of any search (under a "
                        "clock, with --seconds-per-move, in live analysis); sizes the tree "
                        "(default: the config's engine.max_visits, 20000)")
    parser.add_argument("--config", default=None,
                        help="config whose mcts section the model searches with "
                        "(default configs/config.yaml)")
    parser.add_argument("--seed", type=int, help="seed of the random player")
    args = parser.parse_args(argv)
    if not MIN_SIZE <= args.size <= MAX_SIZE:
        parser.error(f"--size must be {MIN_SIZE}..{MAX_SIZE}")
    if args.simulations < 1:
        parser.error("--simulations must be at least 1")
    if args.max_simulations is not None and not (
            args.simulations <= args.max_simulations <= MAX_SIMULATIONS):
        parser.error(f"--max-simulations must be from --simulations ({args.simulations}) "
                     f"to {MAX_SIMULATIONS}")
    if args.seconds_per_move is not None and not (
            math.isfinite(args.seconds_per_move) and args.seconds_per_move > 0):
        parser.error("--seconds-per-move must be a positive number")
    if not math.isfinite(args.komi) or abs(args.komi) > MAX_KOMI:
        parser.error(f"--komi must be a finite number from -{MAX_KOMI} to {MAX_KOMI}")
    player = make_player(args.model, args.simulations, args.seed,
                         seconds_per_move=args.seconds_per_move, config=args.config,
                         max_simulations=args.max_simulations)
    size = getattr(player, "board_size", args.size)  # a model plays its own board size
    engine = GtpEngine(player, size, args.komi)
    sys.stdin.reconfigure(errors="replace")  # bytes that are not UTF-8: an unknown command
    engine.run(sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
