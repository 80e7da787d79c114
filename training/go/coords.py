"""Go vocabulary and coordinate conversions; board size is always an argument.

Words used everywhere in this project:

- **color**: ``BLACK = 1``, ``WHITE = -1``, ``EMPTY = 0``. The opponent of ``c`` is ``-c``.
- **N**: the board size (5 to 19). There is no global board size.
- **point**: ``(row, col)``, 0-based, with ``row 0`` the TOP row as printed (so ``showboard``
  prints row 0 first) and ``col 0`` the left column.
- **flat index**: ``row * N + col``, an int in ``[0, N*N)``. Boards are flat arrays of length
  ``N*N`` indexed this way.
- **PASS**: the flat index ``N*N`` (one past the last point); ``pass_move(N)`` returns it.
- **move**: a flat index, PASS included. Policy vectors have ``N*N + 1`` entries, pass last.
- **GTP text**: a column letter (``A``..``T`` skipping ``I``) and a row number where GTP row 1
  is the BOTTOM row, e.g. ``"D4"``; ``"pass"`` for PASS. Case-insensitive on input, upper
  case on output.
- **group** (chain): a maximal set of same-colored stones connected along the grid lines;
  **liberties**: the empty points adjacent to a group.
- **ko / superko**: this project uses POSITIONAL superko: a move that recreates any earlier
  whole-board position of the game is illegal.
- **komi**: points added to white's score. **score**: Tromp-Taylor area score from black's
  view, ``black area - white area - komi``.

This module holds tiny pure functions only: no numpy, no state, no I/O.
"""

from __future__ import annotations

BLACK = 1
WHITE = -1
EMPTY = 0

MIN_SIZE = 5
MAX_SIZE = 19

# GTP column letters skip "I" (and so do SGF-reading humans, though SGF itself does not).
GTP_COLUMNS = "ABCDEFGHJKLMNOPQRST"


def pass_move(n: int) -> int:
    """The flat index of PASS on an N x N board."""
    return n * n


def is_pass(move: int, n: int) -> bool:
    """True if `move` is PASS on an N x N board."""
    return move == n * n


def to_flat(point: tuple[int, int], n: int) -> int:
    """(row, col) -> flat index."""
    row, col = point
    if not (0 <= row < n and 0 <= col < n):
        raise ValueError(f"point {point} is off a {n}x{n} board")
    return row * n + col


def from_flat(index: int, n: int) -> tuple[int, int]:
    """Flat index (not PASS) -> (row, col)."""
    if not 0 <= index < n * n:
        raise ValueError(f"flat index {index} is not a point of a {n}x{n} board")
    return divmod(index, n)


def to_gtp(move: int, n: int) -> str:
    """Flat index or PASS -> GTP text, e.g. "D4" or "pass"."""
    if move == n * n:
        return "pass"
    row, col = from_flat(move, n)
    return f"{GTP_COLUMNS[col]}{n - row}"


def from_gtp(text: str, n: int) -> int:
    """GTP text ("d4", "D4", "pass") -> flat index or PASS; ValueError if not on the board."""
    t = text.strip().upper()
    if t == "PASS":
        return n * n
    if len(t) < 2 or t[0] not in GTP_COLUMNS[:n] or not t[1:].isdigit():
        raise ValueError(f"{text!r} is not a point of a {n}x{n} board")
    col = GTP_COLUMNS.index(t[0])
    gtp_row = int(t[1:])
    if not 1 <= gtp_row <= n:
        raise ValueError(f"{text!r} is not a point of a {n}x{n} board")
    return (n - gtp_row) * n + col


def color_name(color: int) -> str:
    """BLACK -> "black", WHITE -> "white"."""
    if color == BLACK:
        return "black"
    if color == WHITE:
        return "white"
    raise ValueError(f"{color!r} is not a color")


def parse_color(text: str) -> int:
    """GTP color ("b", "black", "W", "white") -> BLACK or WHITE; ValueError otherwise."""
    t = text.strip().lower()
    if t in ("b", "black"):
        return BLACK
    if t in ("w", "white"):
        return WHITE
    raise ValueError(f"{text!r} is not a color")
