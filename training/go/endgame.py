"""How a game ends the way a judge scores it: dead stones, the score without them, clean-up.

Self-play ends a game only when every point is settled (no side passes while a real move is
left), so the Tromp-Taylor count of its last board is the true result. Other players pass as
soon as nothing is left to gain, with dead stones still on the board, and a judge (GNU Go's
`final_score`, a server, a person) removes those stones before counting. A Tromp-Taylor count
of such a board names the wrong winner whenever dead stones sit in someone's area, and an
engine that plays on because of it fills its own eyes until its groups die. This module gives
the engine the judge's view, from an ownership map (the net's ownership head: +1 black owns
the point at the end, -1 white):

- `dead_stones(board, n, ownership)`: the stones of every group whose mean ownership is the
  other colour's. A group is decided as a whole, so a chain is never half dead.
- `judged_score(board, n, komi, dead)`: the area score (black's view, komi included) after
  removing `dead`: what a judge with that opinion counts.
- `fills_own_area(board, n, p, color, ownership)`: a move that touches no opponent stone on
  a point the map gives to `color`: after the opponent's pass it gains nothing and can only
  shrink our eyes.
- `touches_opponent(board, n, p, color)`: a move next to an opponent stone (in a dispute
  played out, the only kind that captures, attacks or defends).
- `dame_move(board, n, color, dead, is_legal)`: a neutral point between living stones of both
  colours, worth a point under area scoring, for when a pass in reply would lose.
- `cleanup_move(board, n, color, dead, is_legal)`: a liberty of the dead opponent group with
  the fewest liberties (capturing first, never a self-atari that captures nothing), for
  `kgs-genmove_cleanup`: play on until Tromp-Taylor and the judge agree.

Pure Python over flat boards (`training.go.rules` colours and indices); no torch, no search.
"""

from __future__ import annotations

from typing import Callable, Sequence

from training.go.coords import EMPTY
from training.go.rules import area_score, find_group, neighbors


def groups(board: Sequence[int], n: int) -> list[tuple[int, set[int], set[int]]]:
    """Every chain on the board as (colour, stones, liberties)."""
    seen: set[int] = set()
    out = []
    for p in range(n * n):
        if board[p] == EMPTY or p in seen:
            continue
        stones, liberties = find_group(tuple(board), n, p)
        seen |= stones
        out.append((board[p], stones, liberties))
    return out


def dead_stones(board: Sequence[int], n: int, ownership: Sequence[float]) -> set[int]:
    """Stones of the groups whose mean ownership (black's view) favours the other colour."""
    dead: set[int] = set()
    for color, stones, _ in groups(board, n):
        mean = sum(ownership[p] for p in stones) / len(stones)
        if mean * color < 0:
            dead |= stones
    return dead


def judged_score(board: Sequence[int], n: int, komi: float, dead: set[int]) -> float:
    """Area score with komi, black's view, after removing the `dead` stones."""
    cleared = tuple(EMPTY if p in dead else c for p, c in enumerate(board))
    return area_score(cleared, n) - komi


def touches_opponent(board: Sequence[int], n: int, p: int, color: int) -> bool:
    """`p` (a point, not a pass) is next to a stone of `color`'s opponent."""
    return 0 <= p < n * n and any(board[q] == -color for q in neighbors(n)[p])


def fills_own_area(board: Sequence[int], n: int, p: int, color: int,
                   ownership: Sequence[float]) -> bool:
    """`p` touches no stone of the opponent and the map gives it to `color`."""
    if not 0 <= p < n * n or board[p] != EMPTY:
        return False
    return not touches_opponent(board, n, p, color) and ownership[p] * color > 0


def cleanup_move(board: Sequence[int], n: int, color: int, dead: set[int],
                 is_legal: Callable[[int], bool]) -> int | None:
    """A legal liberty of a dead opponent group, the group with the fewest liberties first.

    A move that leaves our new stone's chain in atari is taken only when it captures. None
    when no dead opponent stone is left or none of their liberties can be played.
    """
    nbrs = neighbors(n)
    targets = sorted(((len(libs), min(stones), libs)
                      for c, stones, libs in groups(board, n)
                      if c == -color and stones <= dead), key=lambda t: (t[0], t[1]))
    for count, _, libs in targets:
        for p in sorted(libs):
            if not is_legal(p):
                continue
            if count == 1:
                return p  # captures
            after = list(board)
            after[p] = color
            _, own_libs = find_group(tuple(after), n, p)
            if len(own_libs) >= 2 or any(board[q] == EMPTY and q not in own_libs
                                         for q in nbrs[p]):
                return p
    return None


def dame_move(board: Sequence[int], n: int, color: int, dead: set[int],
              is_legal: Callable[[int], bool]) -> int | None:
    """A legal neutral point between living stones of both colours (a point for us under area
    scoring) that does not put our new chain in atari; None when there is none."""
    nbrs = neighbors(n)
    for p in range(n * n):
        if board[p] != EMPTY or not is_legal(p):
            continue
        touching = {board[q] for q in nbrs[p] if board[q] != EMPTY and q not in dead}
        if touching != {1, -1}:
            continue
        after = list(board)
        after[p] = color
        _, libs = find_group(tuple(after), n, p)
        if len(libs) >= 2:
            return p
    return None


def final_status(board: Sequence[int], n: int, dead: set[int], status: str) -> list[list[int]]:
    """The groups of GTP's `final_status_list`: `dead`, `alive` or `seki` (we know no seki)."""
    if status not in ("dead", "alive", "seki"):
        raise ValueError(f"unknown status {status!r}: dead, alive or seki")
    if status == "seki":
        return []
    want_dead = status == "dead"
    return [sorted(stones) for _, stones, _ in groups(board, n)
            if (next(iter(stones)) in dead) == want_dead]

