"""Input planes for the network, and the 8 symmetries of the board.

Planes, shape [C, N, N] float32 with C = num_planes(history) = 2 * history + 1:

    planes[2k]     stones of the side to move, k plies ago (k = 0 is the current board)
    planes[2k + 1] stones of the opponent (of the side to move now), k plies ago
    planes[-1]     all ones if black is to move, all zeros if white is

Plies before the start of the game are all-zero planes. "Side to move" is the player to
move NOW for every k, as in AlphaGo Zero. Rows and columns follow `training.go.coords`
(planes[c, row, col], row 0 the top row).

Two implementations that must give identical planes (tested):
- `planes(position, history)` from a reference `training.go.rules.Position` (numpy).
- `write_planes(b, g, history, out)`, njit, for the self-play hot path: writes the planes of
  game g of a `training.go.fastgo.Boards` into `out`, a preallocated float32 [C, N, N] array
  (typically `batch[i]` of a [B, C, N, N] batch). It needs history <= b.recent.shape[1].

Symmetries: s in 0..7 is `rot90` by s % 4 quarter turns (counter-clockwise on the printed
board), then for s >= 4 a left-right flip. `transform_planes` works on any [..., N, N]
array, `transform_policy` on [..., N*N + 1] vectors (PASS stays last and unchanged); the
`inverse_*` functions undo them, so that a policy predicted for a transformed position can be
mapped back: `inverse_transform_policy(net(transform_planes(x, s)), s)`.

Ownership target: `area_ownership(boards)` gives the final owner of every point of finished
boards by Tromp-Taylor area scoring (+1 black, -1 white, 0 dame: an empty region that reaches
both colours, or none), vectorised over many boards at once; its sum is `go.area_score`.

numpy and numba only: no torch, no files, no logging.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from training.go.coords import BLACK
from training.go.fastgo import N_MOVES, TO_PLAY

NUM_SYMMETRIES = 8


def num_planes(history: int = 8) -> int:
    """Planes per position for `history` boards: 2 * history + 1."""
    return 2 * history + 1


def planes(position, history: int = 8) -> np.ndarray:
    """[2 * history + 1, N, N] float32 input planes of a `training.go.rules.Position`."""
    n = position.size
    color = position.to_play
    out = np.zeros((num_planes(history), n, n), np.float32)
    for k in range(min(history, len(position.boards))):
        board = np.asarray(position.boards[-1 - k], np.int8).reshape(n, n)
        out[2 * k] = board == color
        out[2 * k + 1] = board == -color
    if color == BLACK:
        out[-1] = 1.0
    return out


@njit(cache=True)
def write_planes(b, g, history, out):
    """out[2 * history + 1, N, N] float32 := input planes of game g of fastgo Boards `b`."""
    depth = b.recent.shape[1]
    assert history <= depth, "Boards were made with fewer history boards than asked for"
    n = out.shape[1]
    color = b.info[g, TO_PLAY]
    played = b.info[g, N_MOVES]
    for k in range(history):
        ply = played - k
        if ply < 0:
            out[2 * k, :, :] = 0.0
            out[2 * k + 1, :, :] = 0.0
            continue
        slot = ply % depth
        # Rows then columns: no division per point (this runs once per simulation).
        p = 0
        for r in range(n):
            for c in range(n):
                s = b.recent[g, slot, p]
                out[2 * k, r, c] = 1.0 if s == color else 0.0
                out[2 * k + 1, r, c] = 1.0 if s == -color else 0.0
                p += 1
    out[2 * history, :, :] = 1.0 if color == 1 else 0.0


def inverse(s: int) -> int:
    """The symmetry that undoes symmetry s."""
    assert 0 <= s < NUM_SYMMETRIES
    return (4 - s) % 4 if s < 4 else s  # rotations undo by turning back; flips are their own


def transform_planes(x: np.ndarray, s: int) -> np.ndarray:
    """Apply symmetry s to the last two (N, N) axes of x (returns a new array)."""
    assert 0 <= s < NUM_SYMMETRIES
    y = np.rot90(x, k=s % 4, axes=(-2, -1))
    if s >= 4:
        y = np.flip(y, axis=-1)
    return np.ascontiguousarray(y)


def inverse_transform_planes(x: np.ndarray, s: int) -> np.ndarray:
    """Undo transform_planes(., s)."""
    return transform_planes(x, inverse(s))


def transform_policy(policy: np.ndarray, s: int) -> np.ndarray:
    """Apply symmetry s to policy vectors [..., N*N + 1]; the PASS entry is unchanged."""
    a = policy.shape[-1] - 1
    n = int(round(a**0.5))
    assert n * n == a, f"policy length {policy.shape[-1]} is not N*N + 1"
    board = policy[..., :a].reshape(policy.shape[:-1] + (n, n))
    moved = transform_planes(board, s).reshape(policy.shape[:-1] + (a,))
    return np.concatenate([moved, policy[..., a:]], axis=-1)


def inverse_transform_policy(policy: np.ndarray, s: int) -> np.ndarray:
    """Undo transform_policy(., s)."""
    return transform_policy(policy, inverse(s))


def area_ownership(boards: np.ndarray, board_size: int) -> np.ndarray:
    """int8 [..., N*N]: the owner of every point of `boards` (int8 [..., N*N]) by area scoring.

    A stone belongs to its colour; an empty point to the colour whose stones its empty region
    reaches, if it reaches only one colour (Tromp-Taylor), else 0. Black's view (+1 black).
    Regions grow by whole-array dilation, so a batch of boards costs a few numpy passes (at
    most the longest empty path), with no Python loop over points.
    """
    boards = np.asarray(boards, np.int8)
    n = board_size
    assert boards.shape[-1] == n * n, f"boards must end in N*N = {n * n}, got {boards.shape}"
    grid = boards.reshape(-1, n, n)
    empty = grid == 0

    def reach(color: int) -> np.ndarray:
        # stones of `color` plus every empty point connected to them through empty points
        seen = grid == color
        while True:
            grown = seen.copy()
            grown[:, 1:, :] |= seen[:, :-1, :]
            grown[:, :-1, :] |= seen[:, 1:, :]
            grown[:, :, 1:] |= seen[:, :, :-1]
            grown[:, :, :-1] |= seen[:, :, 1:]
            grown &= empty | seen
            if np.array_equal(grown, seen):
                return seen
            seen = grown

    black, white = reach(1), reach(-1)
    owner = np.where(empty, black.astype(np.int8) - white.astype(np.int8), grid)
    return owner.astype(np.int8).reshape(boards.shape)
