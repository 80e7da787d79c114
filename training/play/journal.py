"""The games of one evaluation as they end, so that a cut evaluation goes on where it stopped.

`python -m training.strength` appends one JSON line per finished game through GTP to
`games.jsonl` in its `strength_games/<time>/` folder, beside the game's SGF:

    {"series": KEY, "spec": {index, opening, we_are_black, seed}, "game": {GameResult}}

KEY names the series exactly: the generation, its model file's content (sha256), the budget,
the opponent (its label, and the command line of an outside engine), the points it receives,
the board, komi and the run seed that draw the openings. `--resume FOLDER` reads the file
back, and each series plays only the games whose spec (index, opening, colour, seed) is not
there under its key: a changed model, budget or opponent starts its series again, and the
report at the end counts the games read back and the new ones alike.

The file is the tool's own, but it is read as the standards ask of any input: at most
`MAX_BYTES`, every line checked, a line that is not a game an error naming the file and the
line. A last line without its newline (the tool killed while writing it) is dropped, and
the file rewritten without it, before new lines are appended.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from distributed.transfer import write_atomic
from training.play.gnugo import GameSpec, Outcome
from training.play.referee import GameResult

FILE = "games.jsonl"
MAX_BYTES = 64 << 20
"""The largest journal read back (a 9x9 game is about 2 KB: some 30,000 games)."""

_FIELDS = {f.name: f for f in dataclasses.fields(GameResult)}


class JournalError(ValueError):
    """A journal that cannot be read back; the message names the file and says what to do."""


def series_key(**parts) -> str:
    """One string for the parts that make a series (sorted by name, JSON)."""
    return json.dumps(parts, sort_keys=True, separators=(",", ":"))


def _spec(d: dict) -> GameSpec:
    opening = d["opening"]
    if not (isinstance(opening, list) and all(isinstance(m, str) for m in opening)):
        raise ValueError("opening is not a list of moves")
    if not (isinstance(d["index"], int) and isinstance(d["seed"], int)
            and isinstance(d["we_are_black"], bool)):
        raise ValueError("index, seed or colour of the wrong type")
    return GameSpec(index=d["index"], opening=tuple(opening), we_are_black=d["we_are_black"],
                    seed=d["seed"])


def _game(d: dict) -> GameResult:
    unknown = set(d) - set(_FIELDS)
    if unknown or not {"size", "komi"} <= set(d):
        raise ValueError(f"fields {sorted(unknown) or 'size, komi missing'}")
    game = GameResult(**d)
    if not (isinstance(game.size, int) and isinstance(game.moves, list)
            and all(isinstance(m, str) for m in game.moves) and game.winner in (-1, 0, 1)):
        raise ValueError("size, moves or winner of the wrong type")
    return game


class Journal:
    """`games.jsonl` of one strength_games folder: `add` appends a game as it ends, `done`
    says which games of a series are there already (read back with `resume`)."""

    def __init__(self, folder: Path, *, resume: bool = False):
        self.path = Path(folder) / FILE
        self._done: dict[str, dict[int, Outcome]] = {}
        if resume:
            self._read()

    @property
    def games(self) -> int:
        """Games read back."""
        return sum(len(v) for v in self._done.values())

    def _read(self) -> None:
        if not self.path.is_file():
            raise JournalError(f"{self.path}: not found; --resume takes a strength_games/<time> "
                               "folder of a cut evaluation (one with this file)")
        if self.path.stat().st_size > MAX_BYTES:
            raise JournalError(f"{self.path}: over {MAX_BYTES:,} bytes, not a journal of this "
                               "tool; move it aside and start the evaluation again")
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        if lines[-1]:  # cut while writing its last line: drop it before appending
            write_atomic(self.path, b"".join(line + b"\n" for line in lines[:-1]))
        for number, line in enumerate(lines[:-1], 1):
            try:
                entry = json.loads(line)
                key = entry["series"]
                if not isinstance(key, str):
                    raise ValueError("series is not a string")
                outcome = Outcome(spec=_spec(entry["spec"]), game=_game(entry["game"]))
            except (ValueError, KeyError, TypeError) as e:
                raise JournalError(f"{self.path} line {number}: not a game of this tool ({e}); "
                                   "move the file aside to play every game again") from None
            self._done.setdefault(key, {})[outcome.spec.index] = outcome

    def done(self, key: str, spec: GameSpec) -> Outcome | None:
        """The finished game of series `key` that started as `spec`, if there is one."""
        outcome = self._done.get(key, {}).get(spec.index)
        return outcome if outcome is not None and outcome.spec == spec else None

    def add(self, key: str, outcome: Outcome) -> None:
        """Append a finished game (one write of one line, then fsync)."""
        line = json.dumps({"series": key, "spec": dataclasses.asdict(outcome.spec),
                           "game": dataclasses.asdict(outcome.game)}, separators=(",", ":"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self._done.setdefault(key, {})[outcome.spec.index] = outcome
