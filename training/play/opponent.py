"""Opponents of the strength tool besides GNU Go's levels: frozen models and outside engines.

    frozen = pool_model("other_run/models/model_000040.pt", board_size=9)  # "model 1a2b3c4d"
    engine = open_engine("katago gtp -model kata.bin.gz -config 1visit.cfg", timeout_s=60)
    engine.name                       # "KataGo 1.14.1": its GTP name and version
    play_series(ours, engine.command, specs, size=9, komi=7.0, **engine.series_args)

- A **pool model** is a model file kept fixed (`--pool-model`), played by our own GTP engine and
  named by its content (`model <first 8 hex of its sha256>`), so the same file is the same
  anchor in every evaluation.
- An **engine** is any GTP engine the user names by its command line (`--opponent`, split with
  `shlex`, run without a shell, from the caller's folder): KataGo, Leela Zero, GNU Go at a
  level of the user's choosing. It is asked its `name` and `version` once (its label, unless
  the user gives one) and whether it knows `final_status_list` and `kgs-genmove_cleanup` (a
  dispute about dead stones is played out only when it does). Its games are played and judged
  like GNU Go's (`training.play.gnugo.play_series`), a fresh process per game, as an
  untrusted player: every answer within `timeout_s` (a `GtpEngineError` naming its command
  otherwise), lines and replies bounded (`training.play.gtp_client`), an illegal or
  unreadable move or a refused legal one a loss by forfeit with the reason kept, and its
  process killed at the end of each game.

It must not: trust what an engine says beyond these bounds, or start a shell.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from training.play.gtp_client import GtpClient, GtpEngineError, GtpError

MAX_NAME_CHARS = 40
"""The longest label of an engine (its GTP name and version are cut to it)."""
RESERVED = ("gen ", "gnugo ", "model ", "random")
"""Beginnings of the names the strength tool gives its own players: no engine label may take
one."""


class OpponentError(ValueError):
    """An `--opponent` that cannot be played: a bad command line, or an engine that does not
    start or answer. The message names the command and what to do."""


@dataclass(frozen=True)
class PoolModel:
    """A model file kept fixed as a pool member (`--pool-model`), named by its content."""

    path: Path
    name: str  # "model <first 8 hex digits of the file's sha256>"


def pool_model(path: str | Path, board_size: int) -> PoolModel:
    """A `--pool-model` file checked the way the engine will load it: a model (or trainer
    checkpoint) of this board size. Raises ValueError naming the file and what is wrong."""
    from training.learn.net import ModelError, load_model

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--pool-model {path}: no such file (a model_NNNNNN.pt of a run's "
                         "models/ folder, or a trainer checkpoint)")
    try:
        _, info = load_model(path)
    except ModelError as e:
        raise ValueError(f"--pool-model {path}: {e}") from None
    size = int(info.config.get("board_size", 0))
    if size != board_size:
        raise ValueError(f"--pool-model {path}: a {size}x{size} model; this run plays "
                         f"{board_size}x{board_size}")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return PoolModel(path, f"model {digest.hexdigest()[:8]}")


@dataclass(frozen=True)
class Engine:
    """An outside GTP engine as an opponent: its command line, label and answer limit."""

    argv: tuple[str, ...]
    name: str
    timeout_s: float
    playout: bool  # it knows final_status_list and kgs-genmove_cleanup

    def command(self, seed: int) -> list[str]:
        """The command of a game (`play_series`'s opponent): the same for every seed, since
        an outside engine has no common seed flag."""
        return list(self.argv)

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    @property
    def series_args(self) -> dict:
        """`play_series` keywords that play this engine as an untrusted opponent."""
        return {"untrusted": True, "opponent_name": self.name,
                "opponent_timeout_s": self.timeout_s, "playout": self.playout}


def parse_command(text: str) -> list[str]:
    """`--opponent "katago gtp -model m.bin.gz"` -> argv (shlex, no shell); the program must
    exist (on PATH, or a path to an executable file)."""
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise OpponentError(f"--opponent {text!r}: {e} (quote it as a shell would)") from None
    if not argv:
        raise OpponentError("--opponent '': expected the command line of a GTP engine, e.g. "
                            "'katago gtp -model model.bin.gz -config gtp.cfg'")
    program = argv[0]
    found = shutil.which(program) if os.sep not in program else (
        program if os.path.isfile(program) and os.access(program, os.X_OK) else None)
    if found is None:
        raise OpponentError(f"--opponent {text!r}: {program!r} is not an executable "
                            "(not on PATH, or no such file): give its full path")
    return argv


def clean_name(text: str) -> str:
    """An engine's words as a label: printable characters, single spaces, at most
    MAX_NAME_CHARS."""
    printable = "".join(c if c.isprintable() else " " for c in text)
    return " ".join(printable.split())[:MAX_NAME_CHARS].strip()


def check_name(name: str, text: str) -> str:
    """`name` if it can label the engine of `--opponent text` in the pool."""
    if not name or name.lower().startswith(RESERVED):
        raise OpponentError(f"--opponent {text!r}: the label {name!r} is empty or taken by "
                            f"the tool's own players ({', '.join(r.strip() for r in RESERVED)}"
                            "...); give another with --opponent-name")
    return name


def open_engine(text: str, name: str | None = None, timeout_s: float = 60.0) -> Engine:
    """The engine of `--opponent text`, started once to ask its name, version and commands
    (then killed), labelled `name` (cleaned) or `<name> <version>`. Raises OpponentError
    naming the command when it does not start or answer within `timeout_s`."""
    argv = parse_command(text)
    try:
        with GtpClient(argv, timeout_s=timeout_s, name=Path(argv[0]).name) as probe:
            answers = probe.send_many(["name", "version", "known_command final_status_list",
                                       "known_command kgs-genmove_cleanup"])
    except GtpEngineError as e:
        raise OpponentError(f"--opponent {text!r}: {e}") from None
    said = [a if isinstance(a, str) else "" for a in answers]
    if isinstance(answers[0], GtpError):
        raise OpponentError(f"--opponent {text!r}: refused GTP's name command "
                            f"({answers[0].message[:80]}); is it in GTP mode?")
    label = clean_name(name if name is not None else f"{said[0]} {said[1]}")
    return Engine(tuple(argv), check_name(label, text), timeout_s,
                  playout=said[2].strip() == said[3].strip() == "true")
