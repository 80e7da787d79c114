"""The readable reference rules of Go: `Position`, `IllegalMove`.

Rules (see `training.go.coords` for the vocabulary):

- Board sizes 5 to 19, any komi. Black moves first.
- A move places a stone on an empty point; opponent groups left without liberties are
  removed (captured). Suicide, a move whose own group is left without liberties after
  captures, is illegal.
- POSITIONAL superko: a stone move that recreates any earlier whole-board position of this
  game (the empty starting board included) is illegal. Pass is always legal and never
  counts as a repetition.
- The game is over after two consecutive passes, or once `max_moves` moves (passes
  included; default 2*N*N, as OpenSpiel) have been played. No move is legal after that,
  unless `resume()` reopens a game that two passes ended (a dispute about dead stones played
  out, as KGS's cleanup phase does).
- Score: Tromp-Taylor area scoring, no dead-stone removal. Black's area is its stones plus
  the empty regions that reach only black stones; same for white; `score()` returns
  ``black area - white area - komi`` (positive: black wins).

This is the reference that the fast engine (`training.go.fastgo`) is tested against and that
the game-batch validator replays games through, so it favours being plainly correct over
speed: boards are flat tuples, superko compares whole boards exactly. It imports no numpy
beyond `board_array()`, reads no files and logs nothing.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import numpy as np

from training.go.coords import BLACK, EMPTY, MAX_SIZE, MIN_SIZE, WHITE, color_name, to_gtp


SUPERKO = "positional superko: repeats an earlier position"


class IllegalMove(ValueError):
    """A move that the rules forbid; `reason` says why."""

    def __init__(self, move: int, size: int, reason: str):
        self.move = move
        self.reason = reason
        where = to_gtp(move, size) if 0 <= move <= size * size else f"#{move}"
        super().__init__(f"illegal move {where}: {reason}")


@lru_cache(maxsize=None)
def neighbors(n: int) -> tuple[tuple[int, ...], ...]:
    """For each flat index of an N x N board, the flat indices of its on-board neighbours."""
    result = []
    for p in range(n * n):
        row, col = divmod(p, n)
        around = []
        if row > 0:
            around.append(p - n)
        if row < n - 1:
            around.append(p + n)
        if col > 0:
            around.append(p - 1)
        if col < n - 1:
            around.append(p + 1)
        result.append(tuple(around))
    return tuple(result)


def find_group(board: tuple[int, ...], n: int, p: int) -> tuple[set[int], set[int]]:
    """The group containing the stone at `p`: (its stones, its liberties)."""
    color = board[p]
    nbrs = neighbors(n)
    stones, liberties, todo = {p}, set(), [p]
    while todo:
        q = todo.pop()
        for r in nbrs[q]:
            if board[r] == EMPTY:
                liberties.add(r)
            elif board[r] == color and r not in stones:
                stones.add(r)
                todo.append(r)
    return stones, liberties


def area_score(board: tuple[int, ...], n: int) -> int:
    """Tromp-Taylor area: black stones and black-only regions minus the same for white."""
    nbrs = neighbors(n)
    score = sum(board)  # stones: +1 each black, -1 each white
    seen = set()
    for p in range(n * n):
        if board[p] != EMPTY or p in seen:
            continue
        region, borders, todo = {p}, set(), [p]
        while todo:
            q = todo.pop()
            for r in nbrs[q]:
                if board[r] == EMPTY:
                    if r not in region:
                        region.add(r)
                        todo.append(r)
                else:
                    borders.add(board[r])
        seen |= region
        if borders == {BLACK}:
            score += len(region)
        elif borders == {WHITE}:
            score -= len(region)
    return score


class Position:
    """A game of Go in progress: the board, whose turn it is, and everything before.

    Attributes (read them, change them only through `play`/`undo`):
        size: N.  komi: float.  max_moves: the move cap.
        board: flat tuple of N*N colors, the current position.
        to_play: BLACK or WHITE.
        moves: the moves played so far (flat indices, PASS included).
        boards: the board after each ply, boards[0] the empty board, boards[-1] == board.
        captures: {BLACK: stones black has captured, WHITE: ...}.
        passes: consecutive passes just played.
    """

    def __init__(
        self,
        size: int = 9,
        komi: float = 7.5,
        max_moves: int | None = None,
        board: tuple[int, ...] | None = None,
        to_play: int = BLACK,
    ):
        """A new game; `board` (flat, N*N colors) and `to_play` set up a starting position."""
        if not MIN_SIZE <= size <= MAX_SIZE:
            raise ValueError(f"board size must be {MIN_SIZE}..{MAX_SIZE}, got {size}")
        self.size = size
        self.komi = float(komi)
        self.max_moves = 2 * size * size if max_moves is None else int(max_moves)
        self.pass_move = size * size
        self.board: tuple[int, ...] = (EMPTY,) * (size * size) if board is None else tuple(board)
        assert len(self.board) == size * size and set(self.board) <= {BLACK, WHITE, EMPTY}
        self.to_play = to_play
        self.moves: list[int] = []
        self.boards: list[tuple[int, ...]] = [self.board]
        self.captures = {BLACK: 0, WHITE: 0}
        self.passes = 0
        self._seen = Counter([self.board])  # every board of the game, for superko
        # per ply: (stones captured, passes before, to_play before, color that moved)
        self._undo: list[tuple[int, int, int, int]] = []

    # -- queries ---------------------------------------------------------------------

    def is_over(self) -> bool:
        """True after two consecutive passes or once max_moves moves have been played."""
        return self.passes >= 2 or len(self.moves) >= self.max_moves

    def is_legal(self, move: int, color: int | None = None) -> bool:
        """True if `color` (default: the side to move) may play `move` now."""
        try:
            self._board_after(move, color)
        except IllegalMove:
            return False
        return True

    def illegal_reason(self, move: int, color: int | None = None) -> str | None:
        """Why `move` is illegal now (IllegalMove.reason), or None if it is legal."""
        try:
            self._board_after(move, color)
        except IllegalMove as e:
            return e.reason
        return None

    def legal_moves(self) -> list[int]:
        """All legal moves for the side to move, ascending, PASS last; [] once over."""
        if self.is_over():
            return []
        return [p for p in range(self.size * self.size) if self.is_legal(p)] + [self.pass_move]

    def score(self) -> float:
        """Tromp-Taylor area score with komi, from black's view."""
        return area_score(self.board, self.size) - self.komi

    def result(self) -> str:
        """The score as GTP/SGF text: "B+3.5", "W+0.5" or "0"."""
        s = self.score()
        if s == 0:
            return "0"
        return f"B+{s:g}" if s > 0 else f"W+{-s:g}"

    def board_array(self) -> np.ndarray:
        """The current board as an int8 array [N, N], row 0 the top row."""
        return np.array(self.board, dtype=np.int8).reshape(self.size, self.size)

    def __str__(self) -> str:
        n = self.size
        cols = "ABCDEFGHJKLMNOPQRST"[:n]
        lines = ["   " + " ".join(cols)]
        for row in range(n):
            cells = " ".join(".XO"[self.board[row * n + c]] for c in range(n))
            lines.append(f"{n - row:2d} {cells} {n - row:2d}")
        lines.append("   " + " ".join(cols))
        lines.append(
            f"{color_name(self.to_play)} to play, captures B {self.captures[BLACK]} "
            f"W {self.captures[WHITE]}, move {len(self.moves)}"
        )
        return "\n".join(lines)

    # -- changes ---------------------------------------------------------------------

    def play(self, move: int, color: int | None = None) -> None:
        """Play `move` for `color` (default: the side to move), who then hands the turn over.

        Raise IllegalMove and change nothing if the move is illegal. Playing out of turn is
        for GTP controllers (`play white D4` with black to move); self-play never does.
        """
        board, captured = self._board_after(move, color)
        color = self.to_play if color is None else color
        self.captures[color] += captured
        self._undo.append((captured, self.passes, self.to_play, color))
        self.passes = self.passes + 1 if move == self.pass_move else 0
        self.board = board
        self.boards.append(board)
        self._seen[board] += 1
        self.moves.append(move)
        self.to_play = -color

    def resume(self) -> None:
        """Reopen a game that two consecutive passes ended, so that play goes on from the same
        board and turn (both sides dispute which stones are dead: they play it out). The
        passes stay in `moves`; the next pass counts as the first of a new pair. Raises
        ValueError if the game is not over by passes (running, or at the move cap)."""
        if self.passes < 2 or len(self.moves) >= self.max_moves:
            raise ValueError("only a game that two passes ended can be resumed")
        self.passes = 0

    def play_on(self, move: int) -> None:
        """Play the next move of a game record: where two passes ended the game and the record
        goes on (the players played out a dispute about dead stones), reopen it first
        (`resume`). Raises ValueError as `play` does, and at the move cap."""
        if self.is_over():
            self.resume()
        self.play(move)

    def undo(self) -> int:
        """Take back the last move and return it; IndexError if no move has been played."""
        if not self.moves:
            raise IndexError("no move to undo")
        move = self.moves.pop()
        captured, self.passes, self.to_play, color = self._undo.pop()
        board = self.boards.pop()
        self._seen[board] -= 1
        if not self._seen[board]:
            del self._seen[board]
        self.board = self.boards[-1]
        self.captures[color] -= captured
        return move

    def colors(self) -> list[int]:
        """The colour that played each move of `moves` (GTP may play either colour)."""
        return [entry[3] for entry in self._undo]

    def alternating_moves(self, color: int | None = None) -> list[int]:
        """`moves` as a game of alternating turns, black first, ending with `color` to move
        (default: the side to move), never with two passes in a row that the game did not
        have: a pass is put wherever the same colour placed stones twice (a handicap set up
        with `play`) or the other colour is asked to move, and a pass out of turn is left out
        (it changes nothing). What a search that replays moves from the empty board is given."""
        out: list[int] = []
        expected = BLACK

        def hand_over() -> None:  # the other colour's turn, the board unchanged
            if out and out[-1] == self.pass_move:
                out.pop()  # a pass the other colour never needed
            else:
                out.append(self.pass_move)

        for move, c in zip(self.moves, self.colors()):
            if move == self.pass_move and c != expected:
                continue  # a pass out of turn changes nothing
            if c != expected:
                hand_over()
            out.append(move)
            expected = -c
        if color is not None and color != expected:
            hand_over()
        return out

    def searchable_moves(self, color: int | None = None) -> list[int]:
        """`alternating_moves` without the pairs of passes that a resumed game went on after
        (`resume`): a search that replays them would find its game over. Both colours passed
        once in a pair, so the turn and every board stay the same."""
        out: list[int] = []
        for move in self.alternating_moves(color):
            if move == self.pass_move and out and out[-1] == self.pass_move:
                out.pop()
            else:
                out.append(move)
        return out

    def copy(self) -> "Position":
        """An independent copy (history included)."""
        other = Position.__new__(Position)
        other.__dict__.update(self.__dict__)
        other.moves = list(self.moves)
        other.boards = list(self.boards)
        other.captures = dict(self.captures)
        other._seen = Counter(self._seen)
        other._undo = list(self._undo)
        return other

    # -- the rules -------------------------------------------------------------------

    def _board_after(self, move: int, color: int | None = None) -> tuple[tuple[int, ...], int]:
        """(board after `color` plays `move`, stones captured); raise IllegalMove."""
        n = self.size
        if self.is_over():
            raise IllegalMove(move, n, "the game is over")
        if move == self.pass_move:
            return self.board, 0
        if not 0 <= move < n * n:
            raise IllegalMove(move, n, "not a point of the board")
        if self.board[move] != EMPTY:
            raise IllegalMove(move, n, "point is occupied")
        color = self.to_play if color is None else color
        board = list(self.board)
        board[move] = color
        captured = 0
        for q in neighbors(n)[move]:
            if board[q] == -color:
                stones, liberties = find_group(board, n, q)
                if not liberties:
                    for s in stones:
                        board[s] = EMPTY
                    captured += len(stones)
        if not captured and not find_group(board, n, move)[1]:
            raise IllegalMove(move, n, "suicide")
        new_board = tuple(board)
        if new_board in self._seen:
            raise IllegalMove(move, n, SUPERKO)
        return new_board, captured
