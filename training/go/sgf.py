"""SGF, the Go ecosystem's game file format: a finished game out as SGF text, and back.

Owns:
- `to_sgf(record)`: one `training.go.records.GameRecord` as SGF FF[4] text (Tromp-Taylor rules,
  pass as B[] / W[], the generation, simulations and seed in the root comment, and on every
  move black's win rate by the search as Sabaki's SBKV, which it draws as its win-rate graph),
  readable move for move by other SGF tools (sgfmill).
- `from_sgf(text)`: the main line of a simple SGF game (ours, or any without setup stones or
  variations) as an `SgfGame`: board size, komi, our flat move indices and black's win
  rates where the moves carry SBKV.
- `game_sgf(size, komi, moves, result, ...)`: any game (flat moves, black first) as SGF, for
  games that are not self-play records (the strength tool's games against GNU Go).
- `result_text(record)`: a game's result as SGF's RE (and GTP's final_score) text: "B+3.5",
  "W+R", "0".

Vocabulary (see `training.go.coords`): N is the board size, a move is a flat index
``row * N + col`` (row 0 = top) or PASS = ``N*N``. An SGF point is two letters, the column
first, row "a" at the top; so GTP's A1 (bottom left) is "a" + the last row letter.

It must not: import torch, read or write files (callers do, through
`distributed.transfer.write_atomic`), or know batch files: it imports `training.go.records`
(which imports it) only for the type of a record.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from training.go.coords import BLACK, MAX_SIZE, MIN_SIZE

if TYPE_CHECKING:
    from training.go.records import GameRecord


class SgfGame(NamedTuple):
    board_size: int
    komi: float
    moves: np.ndarray
    """int16 [T], our flat indices, PASS = N*N."""
    winrates: np.ndarray | None = None
    """float64 [T]: black's win rate (0..1) after each move from its node's SBKV (Sabaki's,
    in percent), NaN where a move has none."""


def result_text(record: GameRecord) -> str:
    """SGF/GTP result: "B+3.5", "W+R", "0" for a draw."""
    if record.result == 0:
        return "0"
    winner = "B" if record.result == BLACK else "W"
    if record.resigned or not math.isfinite(record.score):
        return f"{winner}+R"
    return f"{winner}+{abs(record.score):g}"


def _sgf_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("]", "\\]")


def _sgf_point(move: int, n: int) -> str:
    """Our flat index -> SGF point "cr" (column letter first, row 'a' = top), "" for pass."""
    if move == n * n:
        return ""
    row, col = divmod(int(move), n)
    return "abcdefghijklmnopqrs"[col] + "abcdefghijklmnopqrs"[row]


def to_sgf(
    record: GameRecord,
    *,
    player_black: str = "azgo",
    player_white: str = "azgo",
    comment: str = "",
) -> str:
    """One game as SGF FF[4] text (pass as B[] / W[]; the generation in the root comment)."""
    notes = [f"generation {record.generation}, {record.simulations} simulations, "
             f"seed {record.seed}"]
    if record.resign_disabled:
        notes.append("resignation disabled"
                     + (f", {'black' if record.would_resign_as == BLACK else 'white'} would "
                        "have resigned" if record.would_resign_as else ""))
    if comment:
        notes.append(comment)
    # SBKV on the node of move t: black's win rate (percent) in the position after it, the
    # search's root value of move t + 1 (side to move's view); Sabaki draws its graph from it.
    values = np.asarray(record.values, np.float64)
    sides = np.where(np.arange(len(values)) % 2 == 0, 1.0, -1.0)  # black moves first
    black = (values * sides + 1) / 2
    winrates: list[float | None] = [float(v) for v in black[1:]] + [None]
    return game_sgf(record.board_size, record.komi, record.moves.tolist(), result_text(record),
                    player_black=player_black, player_white=player_white,
                    comment="\n".join(notes), winrates=winrates)


def game_sgf(size: int, komi: float, moves: list[int], result: str, *,
             player_black: str, player_white: str, comment: str = "",
             rules: str = "Tromp-Taylor", winrates: list[float | None] | None = None) -> str:
    """Any game as SGF FF[4] text: flat moves black first (PASS = N*N), RE as given.
    `winrates[t]` (black's, 0..1, or None) goes on move t's node as Sabaki's SBKV (percent)."""
    props = [
        "FF[4]", "GM[1]", "CA[UTF-8]", "AP[azgo:1]", f"SZ[{size}]", f"KM[{komi:g}]",
        f"RU[{_sgf_escape(rules)}]", f"RE[{_sgf_escape(result)}]",
        f"PB[{_sgf_escape(player_black)}]", f"PW[{_sgf_escape(player_white)}]",
    ] + ([f"C[{_sgf_escape(comment)}]"] if comment else [])
    lines = ["(;" + "".join(props)]
    color = "B"
    nodes = []
    for t, move in enumerate(moves):
        node = f";{color}[{_sgf_point(move, size)}]"
        w = winrates[t] if winrates is not None and t < len(winrates) else None
        if w is not None and math.isfinite(w):
            node += f"SBKV[{100 * min(1.0, max(0.0, w)):.2f}]"
        nodes.append(node)
        color = "W" if color == "B" else "B"
    for i in range(0, len(nodes), 12):
        lines.append("".join(nodes[i : i + 12]))
    return "\n".join(lines) + ")\n"


MAX_SGF_CHARS = 1 << 20
"""The longest SGF text `from_sgf` reads: a game of 19x19 is a few kilobytes."""


def _properties(body: str):
    """(key, first value) of each property in order, in one pass over the text (a regular
    expression with nested repeats backtracks quadratically on an unclosed value)."""
    i, n = 0, len(body)
    while i < n:
        if not ("A" <= body[i] <= "Z"):
            i += 1
            continue
        start = i
        while i < n and "A" <= body[i] <= "Z":
            i += 1
        key = body[start:i]
        while i < n and body[i].isspace():
            i += 1
        values = []
        while i < n and body[i] == "[":
            i += 1
            chars = []
            while i < n and body[i] != "]":
                if body[i] == "\\" and i + 1 < n:
                    i += 1
                chars.append(body[i])
                i += 1
            if i >= n:
                raise ValueError(f"{key}: a value is not closed with ']'")
            i += 1
            values.append("".join(chars))
            while i < n and body[i].isspace():
                i += 1
        if values:
            yield key, values[0]


def from_sgf(text: str) -> SgfGame:
    """Read the main line of a simple SGF game (ours, or any without setup stones/variations).

    Raises ValueError for what it cannot read: setup stones, moves out of turn, bad points.
    """
    if len(text) > MAX_SGF_CHARS:
        raise ValueError(f"SGF text of {len(text)} characters, over {MAX_SGF_CHARS}: not one game")
    body = text.strip()
    if not body.startswith("(;"):
        raise ValueError("not an SGF game: it must start with '(;'")
    size, komi, moves, rates = 19, 0.0, [], {}
    expected = "B"
    for key, value in _properties(body):
        if key == "SZ":
            size = int(value.split(":")[0])
            if not MIN_SIZE <= size <= MAX_SIZE:
                raise ValueError(f"SZ[{value}]: board size outside {MIN_SIZE}..{MAX_SIZE}")
        elif key == "KM":
            komi = float(value)
            if not math.isfinite(komi) or abs(komi) > MAX_SIZE * MAX_SIZE:
                raise ValueError(f"KM[{value}]: komi must be a finite number of points")
        elif key == "SBKV" and moves:
            try:
                rate = float(value) / 100
            except ValueError:
                raise ValueError(f"move {len(moves) - 1}: SBKV[{value}] is not a percentage")
            if math.isfinite(rate):
                rates[len(moves) - 1] = min(1.0, max(0.0, rate))
        elif key in ("AB", "AW", "AE"):
            raise ValueError(f"{key}: setup stones are not supported")
        elif key in ("B", "W"):
            if key != expected:
                raise ValueError(f"move {len(moves)}: {key} plays out of turn")
            expected = "W" if key == "B" else "B"
            if value == "" or (value == "tt" and size <= 19):
                moves.append(size * size)
                continue
            if len(value) != 2 or not all("a" <= c < chr(ord("a") + size) for c in value):
                raise ValueError(f"move {len(moves)}: {key}[{value}] is not a point")
            col, row = ord(value[0]) - ord("a"), ord(value[1]) - ord("a")
            moves.append(row * size + col)
    winrates = None
    if rates:
        winrates = np.full(len(moves), np.nan)
        winrates[list(rates)] = list(rates.values())
    return SgfGame(size, komi, np.array(moves, dtype=np.int16), winrates)
