"""Input planes for the network, and the 8 symmetries of the board.

Planes, shape [C, N, N] float32 with C = num_planes(history, liberties) = 2 * history + 1
(+ 6 with liberties):

    planes[2k]     stones of the side to move, k plies ago (k = 0 is the current board)
    planes[2k + 1] stones of the opponent (of the side to move now), k plies ago
    planes[2H]     all ones if black is to move, all zeros if white is
    with liberties (`net.liberties`, KataGo's liberty features), on the current board:
    planes[2H + 1 + j]  stones of the side to move in chains with 1, 2, 3+ liberties (j=0..2)
    planes[2H + 4 + j]  the opponent's stones in chains with 1, 2, 3+ liberties

Plies before the start of the game are all-zero planes. "Side to move" is the player to
move NOW for every k, as in AlphaGo Zero. Rows and columns follow `training.go.coords`
(planes[c, row, col], row 0 the top row).

Three implementations that must give identical planes (tested):
- `planes(position, history, liberties)` from a reference `training.go.rules.Position`.
- `write_planes(b, g, history, out)`, njit, for the self-play hot path: writes the planes of
  game g of a `training.go.fastgo.Boards` into `out`, a preallocated C-contiguous [C, N, N]
  array, float32 or uint8 (the planes are 0/1; the search sends uint8 to evaluators that widen
  them, a quarter of the bytes), typically `batch[i]` of a [B, C, N, N] batch; its C says
  whether the liberty planes are wanted. The liberty planes come from the board's own chains
  (fastgo keeps each chain's stones and pseudo-liberties), not a flood fill. It needs
  history <= b.recent.shape[1].
- the replay window's vectorised gather (`training.learn.replay_buffer`), with
  `liberty_planes(boards, colors, n, out)` for the liberty planes of stored boards.

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
from training.go.fastgo import HEAD, LIB_N, LIB_SQ, LIB_SUM, LINK, N_MOVES, TO_PLAY

NUM_SYMMETRIES = 8


LIBERTY_PLANES = 6


def num_planes(history: int = 8, liberties: bool = False) -> int:
    """Planes per position for `history` boards: 2 * history + 1, + 6 with liberties."""
    return 2 * history + 1 + (LIBERTY_PLANES if liberties else 0)


def planes(position, history: int = 8, liberties: bool = False) -> np.ndarray:
    """[num_planes(history, liberties), N, N] float32 input planes of a
    `training.go.rules.Position`."""
    from training.go.rules import find_group

    n = position.size
    color = position.to_play
    out = np.zeros((num_planes(history, liberties), n, n), np.float32)
    for k in range(min(history, len(position.boards))):
        board = np.asarray(position.boards[-1 - k], np.int8).reshape(n, n)
        out[2 * k] = board == color
        out[2 * k + 1] = board == -color
    if color == BLACK:
        out[2 * history] = 1.0
    if liberties:
        board = position.board
        for p, stone in enumerate(board):
            if stone == 0:
                continue
            _, libs = find_group(board, n, p)
            base = 2 * history + 1 + (0 if stone == color else 3)
            out[base + min(len(libs), 3) - 1, p // n, p % n] = 1.0
    return out


@njit(cache=True)
def _liberty_counts(stones, neighbors, counts, queue, mark):
    """counts[p] := liberties of the chain of the stone at p (0 on empty points), for a flat
    board `stones` [A]; `queue`, `mark` are [A] int scratch (mark zeroed here)."""
    a = stones.shape[0]
    for p in range(a):
        counts[p] = -1 if stones[p] != 0 else 0
        mark[p] = 0
    stamp = 0
    for p in range(a):
        if counts[p] != -1:
            continue
        color = stones[p]
        stamp += 1
        head, tail = 0, 1
        queue[0] = p
        counts[p] = -2  # in the chain being walked
        libs = 0
        while head < tail:
            q = queue[head]
            head += 1
            for k in range(neighbors.shape[1]):
                r = neighbors[q, k]
                if r < 0:
                    break
                if stones[r] == 0:
                    if mark[r] != stamp:
                        mark[r] = stamp
                        libs += 1
                elif stones[r] == color and counts[r] == -1:
                    counts[r] = -2
                    queue[tail] = r
                    tail += 1
        for i in range(tail):
            counts[queue[i]] = libs


@njit(cache=True)
def _write_liberty_planes(stones, color, neighbors, base, out, counts, queue, mark):
    """out[base..base+5] := the liberty planes of the flat board `stones` (see above)."""
    n = out.shape[1]
    _liberty_counts(stones, neighbors, counts, queue, mark)
    for j in range(6):
        out[base + j, :, :] = 0.0
    for p in range(stones.shape[0]):
        if stones[p] == 0:
            continue
        c = min(counts[p], 3) - 1
        if stones[p] != color:
            c += 3
        out[base + c, p // n, p % n] = 1.0


@njit(cache=True)
def liberty_planes(boards, colors, neighbors, out):
    """out[i, 0..5] := the liberty planes of flat boards [B, A] int8 with `colors[i]` to move
    (the replay window's batches); out float32 [B, 6, N, N]."""
    a = boards.shape[1]
    counts = np.zeros(a, np.int32)
    queue = np.zeros(a, np.int32)
    mark = np.zeros(a, np.int32)
    for i in range(boards.shape[0]):
        _write_liberty_planes(boards[i], colors[i], neighbors, 0, out[i], counts, queue, mark)


@njit(cache=True, inline="always")
def _chain_liberty_planes(stones, chains, neighbors, color, base, out):
    """out[base..base+5] (flat [C, A] view) := the liberty planes of one fastgo game row,
    from its chains (`stones` [A], `chains` [6, A], `neighbors` [A, 4]): one pass per chain, stopped at its third
    distinct liberty, and a chain with one liberty known from its pseudo-liberty sums at once
    (see `training.go.fastgo`). No scratch arrays: this runs once per simulation."""
    for j in range(LIBERTY_PLANES):
        out[base + j, :] = 0
    for p in range(stones.shape[0]):
        if stones[p] == 0 or chains[HEAD, p] != p:
            continue
        n = np.int64(chains[LIB_N, p])
        total = np.int64(chains[LIB_SUM, p])
        if n * np.int64(chains[LIB_SQ, p]) == total * total:
            libs = 1
        elif n == 2:
            libs = 2
        else:  # two or more distinct liberties: find out whether there is a third
            libs = 2
            first = -1
            second = -1
            q = p
            while libs == 2:
                for k in range(4):
                    r = neighbors[q, k]
                    if r < 0:
                        break
                    if stones[r] == 0 and r != first and r != second:
                        if first < 0:
                            first = r
                        elif second < 0:
                            second = r
                        else:
                            libs = 3
                            break
                q = chains[LINK, q]
                if q == p:
                    break
        plane = base + libs - 1 + (0 if stones[p] == color else 3)
        q = p
        while True:
            out[plane, q] = 1
            q = chains[LINK, q]
            if q == p:
                break
@njit(cache=True, inline="always")
def write_planes(b, g, history, out):
    """out[C, N, N] (float32, or any dtype that holds 0 and 1) := the input planes of game g
    of fastgo Boards `b`; C = num_planes(history, liberties) says whether the liberty planes
    are wanted. `out` must be C-contiguous (a row of a batch is)."""
    depth = b.recent.shape[1]
    assert history <= depth, "Boards were made with fewer history boards than asked for"
    a = b.stones.shape[1]
    flat = out.reshape((out.shape[0], a))  # one index per point: the loops vectorise
    color = b.info[g, TO_PLAY]
    played = b.info[g, N_MOVES]
    for k in range(history):
        own = flat[2 * k]
        opp = flat[2 * k + 1]
        ply = played - k
        if ply < 0:
            own[:] = 0
            opp[:] = 0
            continue
        board = b.recent[g, ply % depth]
        for p in range(a):
            s = board[p]
            own[p] = 1 if s == color else 0
            opp[p] = 1 if s == -color else 0
    flat[2 * history, :] = 1 if color == 1 else 0
    if flat.shape[0] > 2 * history + 1:  # the liberty planes were asked for
        _chain_liberty_planes(b.stones[g], b.chains[g], b.neighbors, color, 2 * history + 1,
                              flat)


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
