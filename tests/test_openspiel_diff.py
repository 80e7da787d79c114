"""Differential tests of our rules against OpenSpiel's C++ Go (`pyspiel.load_game("go")`).

How OpenSpiel 2.0.2's Go differs from ours (read from open_spiel/games/go/go.cc and
go_board.cc, and checked below):

- Ko. OpenSpiel forbids only a SIMPLE ko recapture: after a stone played into an enemy eye
  (all four neighbours enemy stones or the edge) captures exactly one stone, the captured
  point is banned for the very next move only (any move, a pass too, lifts the ban). We use
  POSITIONAL superko: any stone move that recreates an earlier whole-board position is
  illegal. A simple-ko recapture always recreates the previous board, so OpenSpiel's
  illegal moves are a subset of ours, and the extra moves OpenSpiel allows are exactly
  moves our reference rejects with reason SUPERKO (tested at every ply).
- Repetition. OpenSpiel keeps a set of board hashes (stones only, as ours) of every
  position of the game; a NON-pass move that repeats one is played, sets `superko_`, and
  ENDS the game as a draw (returns 0, 0). We forbid such moves instead. The compared games
  only play moves legal for us, so OpenSpiel must never end one that way (tested:
  `is_terminal` agrees at every ply); the triple-ko test shows the difference itself.
- Game end. Both end after two consecutive passes or after max_game_length = 2*N*N moves
  (passes counted); OpenSpiel also never ends before 2 moves, which a cap of 2*N*N >= 50
  never reaches. Same.
- Suicide is illegal in both (a move that captures is never suicide).
- Score. Both use Tromp-Taylor area scoring with komi, no dead-stone removal. OpenSpiel only
  exposes the winner (returns +1/-1, 0 on a tie), so the exact score is pinned by replaying
  the game with komi = our raw score - 0.5 (black must win) and + 0.5 (white must win).
- Coordinates. OpenSpiel's action is row * N + col with row 0 = rank 1 (the BOTTOM row);
  ours has row 0 at the top. Pass is N*N in both.

The default run plays a few hundred random games per size (uniform over OUR legal moves,
pass included, random komi); `AZGO_DIFF_GAMES=5000 pytest tests/test_openspiel_diff.py`
plays 5000 per size up to 9x9 (a fifth of that on 13x13, a tenth on 19x19). In CI (CI=true)
a missing open_spiel fails these tests; elsewhere they are skipped with the reason.
"""

import importlib
import os
import random

import numpy as np
import pytest

from tests.test_go import TRIPLE_KO, load_board
from training.go import fastgo
from training.go.coords import from_gtp
from training.go.rules import SUPERKO, Position

DIFF_GAMES = int(os.environ.get("AZGO_DIFF_GAMES", "0"))
# board size -> (random games in the default run, divisor of AZGO_DIFF_GAMES)
GAMES = {5: (300, 1), 7: (200, 1), 9: (150, 1), 13: (20, 5), 19: (6, 10)}


@pytest.fixture(scope="module")
def pyspiel():
    try:
        return importlib.import_module("pyspiel")
    except ImportError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"open_spiel is required in CI (pip install open_spiel): {e}")
        pytest.skip(f"open_spiel not installed: {e}")


def to_openspiel(move: int, n: int) -> int:
    if move == n * n:
        return move
    row, col = divmod(move, n)
    return (n - 1 - row) * n + col


def from_openspiel(action: int, n: int) -> int:
    return to_openspiel(action, n)  # the vertical flip is its own inverse


def openspiel_board(state, n: int) -> np.ndarray:
    """[N, N] int8 board in our orientation (row 0 = top) from OpenSpiel's planes."""
    t = np.asarray(state.observation_tensor(0)).reshape(4, n, n)  # black, white, empty, turn
    return (t[0] - t[1]).astype(np.int8)[::-1]


def openspiel_winner(pyspiel, n, komi, moves) -> float:
    """Black's return after replaying `moves` in a fresh OpenSpiel game with this komi."""
    state = pyspiel.load_game("go", {"board_size": n, "komi": komi}).new_initial_state()
    for m in moves:
        state.apply_action(to_openspiel(m, n))
    assert state.is_terminal()
    return state.returns()[0]


def compare_game(pyspiel, n: int, komi: float, rng: random.Random, stats: dict) -> None:
    game = pyspiel.load_game("go", {"board_size": n, "komi": komi})
    assert game.max_game_length() == 2 * n * n
    state = game.new_initial_state()
    ours = fastgo.FastBoard(n, komi=komi)
    ref = Position(n, komi=komi)
    while True:
        assert state.is_terminal() == ours.is_over(), f"ply {ours.n_moves}"
        if ours.is_over():
            break
        legal = set(ours.legal_moves().tolist())
        theirs = {from_openspiel(a, n) for a in state.legal_actions()}
        assert legal <= theirs, f"ply {ours.n_moves}: only ours {legal - theirs}"
        for m in theirs - legal:  # the only allowed difference: positional superko
            assert ref.illegal_reason(m) == SUPERKO, f"ply {ours.n_moves} move {m}"
            stats["superko_only_openspiel"] += 1
        stats["plies"] += 1
        move = rng.choice(sorted(legal))
        state.apply_action(to_openspiel(move, n))
        ours.play(move)
        ref.play(move)
        assert np.array_equal(openspiel_board(state, n), ours.board())
    assert ref.is_over() and ref.score() == ours.score()
    # the exact Tromp-Taylor score: OpenSpiel must agree on the winner, and on the raw
    # area score (without komi) pinned between two half-point komis
    result = ours.score()
    assert state.returns()[0] == (1.0 if result > 0 else -1.0 if result < 0 else 0.0)
    raw = result + komi
    assert openspiel_winner(pyspiel, n, raw - 0.5, ours.moves) == 1.0
    assert openspiel_winner(pyspiel, n, raw + 0.5, ours.moves) == -1.0
    stats["games"] += 1


@pytest.mark.parametrize("n", sorted(GAMES))
def test_same_legal_moves_boards_and_scores_as_openspiel(pyspiel, n):
    default, divisor = GAMES[n]
    games = max(1, DIFF_GAMES // divisor) if DIFF_GAMES else default
    rng = random.Random(n)
    stats = {"games": 0, "plies": 0, "superko_only_openspiel": 0}
    for _ in range(games):
        compare_game(pyspiel, n, rng.choice([0.0, 0.5, 2.5, 7.5]), rng, stats)
    print(f"{n}x{n}: {stats}")
    assert stats["games"] == games


def openspiel_setup(pyspiel, text):
    """An OpenSpiel state with the stones of an ASCII board, black to move."""
    board = load_board(text)
    n = int(len(board) ** 0.5)
    state = pyspiel.load_game("go", {"board_size": n, "komi": 0.5}).new_initial_state()
    ours = Position(n, komi=0.5)
    blacks = [p for p, c in enumerate(board) if c == 1]
    whites = [p for p, c in enumerate(board) if c == -1]
    while blacks or whites:
        for stones in (blacks, whites):
            m = stones.pop() if stones else n * n
            state.apply_action(to_openspiel(m, n))
            ours.play(m)
    return state, ours


def test_openspiel_ends_a_superko_cycle_as_a_draw_where_we_forbid_the_move(pyspiel):
    state, ours = openspiel_setup(pyspiel, TRIPLE_KO)
    for m in ("C8", "C4", "H8", "B8", "B4"):
        move = from_gtp(m, 9)
        state.apply_action(to_openspiel(move, 9))
        ours.play(move)
    g8 = from_gtp("G8", 9)
    assert ours.illegal_reason(g8) == SUPERKO
    assert to_openspiel(g8, 9) in state.legal_actions()  # simple ko does not see the cycle
    state.apply_action(to_openspiel(g8, 9))
    assert state.is_terminal() and state.returns() == [0.0, 0.0]


def test_both_forbid_the_simple_ko_recapture(pyspiel):
    ko = """
        .XO..
        XO.O.
        .XO..
        .....
        .....
        """
    state, ours = openspiel_setup(pyspiel, ko)
    c4 = from_gtp("C4", 5)
    state.apply_action(to_openspiel(c4, 5))
    ours.play(c4)
    b4 = from_gtp("B4", 5)
    assert to_openspiel(b4, 5) not in state.legal_actions()
    assert ours.illegal_reason(b4) == SUPERKO
