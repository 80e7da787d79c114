"""The fast Go engine for the self-play hot path: numba over flat arrays, many games at once.

Same rules as the reference `training.go.rules` (positional superko, suicide illegal, the game ends
after two passes or `max_moves` moves, Tromp-Taylor area score with komi); the tests check
that both agree on every legal-move set of thousands of random games. Vocabulary as in
`training.go.coords`: A = N*N points, flat index = row*N + col (row 0 the top row), PASS = A.

Design: struct of arrays, one row per game
-----------------------------------------
All the state of G games lives in a `Boards` named tuple of numpy arrays whose first axis is
the game g. Copying a game is a row copy of each array (`copy_game`), so a search can keep
its root games in some rows and scratch games in others, and any njit code can take `b` and
a row number. Fields (per game g unless marked shared):

    stones     [G, A] int8     color on each point (BLACK 1, WHITE -1, EMPTY 0)
    chains     [G, 6, A] int32 chain data, chains[g, FIELD, p] with FIELD one of:
                 HEAD     for a stone, the representative point ("head") of its chain
                 LINK     the next stone of the same chain (a circular list)
                 SIZE     stones in the chain                 (valid at head points)
                 LIB_N    pseudo-liberties of the chain       (valid at head points)
                 LIB_SUM  sum of their flat indices           (valid at head points)
                 LIB_SQ   sum of their squares                (valid at head points)
    chain_hash [G, A] int64    xor of the chain's Zobrist keys  (valid at head points)
    info       [G, 5] int32    TO_PLAY (BLACK/WHITE), N_MOVES (moves played, passes
                               included), PASSES (consecutive passes just played),
                               CAPTURES_BLACK, CAPTURES_WHITE (stones captured by each)
    hashes     [G, M+1] int64  Zobrist hash of the board after each ply; hashes[g, 0] = 0
                               (the empty board), hashes[g, info[g, N_MOVES]] the current
                               one; M = max_moves = hashes.shape[1] - 1
    seen       [G, W] int64    bitset over the low bits of every hash in `hashes`
    moves      [G, M] int16    the moves played
    recent     [G, H, A] int8  ring buffer of the last H boards: the board after ply k is
                               recent[g, k % H] (k = N_MOVES is the current board)
    komi       [G] float64
    neighbors  [A, 4] int16    shared: the on-board neighbours of each point, -1 padding
    zobrist    [2, A] int64    shared: keys for black [0] and white [1] stones

Why these choices:
- Pseudo-liberties (each (stone, empty neighbour) pair counted once) with their sum and sum
  of squares make "no liberty" (LIB_N == 0) and "exactly one liberty" (LIB_N * LIB_SQ ==
  LIB_SUM**2, i.e. all pseudo-liberties are the same point) O(1) tests, updated in O(1) per
  placed stone; only merges (relabel the smaller chain) and captures walk stones.
- Positional superko: the hash a move would make is O(1) from `chain_hash` of the chains it
  captures. It is looked up in the `seen` bitset (16+ bits per possible ply, so a miss,
  the usual case, costs one load) and only on a bit hit compared against `hashes`. Two
  positions are taken as equal when their 64-bit Zobrist hashes are equal (as KataGo and
  Leela Zero do); the chance of a false superko in a 722-move game is below 1e-11, and the
  exact reference `training.go.rules` is the check of record for game validation.
- Features need the last H boards, so a small ring buffer is kept here rather than a whole
  board history (a 9x9 row is then about 6 KB, 19x19 about 26 KB with M = 2*N*N).
- Few arrays, packed by type: numba increfs every array of a tuple passed to a function
  (measured: ~15 ns per array per call), so the tuple is only passed at the public entry
  points and the internals take the few arrays they need. Read the packed fields with the
  index constants: `b.info[g, TO_PLAY]`, `b.chains[g, HEAD, p]`.
- The calls of the search's hot path (`copy_game`, `play_known_legal`, `legal_mask`,
  `is_over` and the internals they call) are inlined into their njit callers
  (`inline="always"`): no call, no incref per array. With them the search's leaf selection
  took about 40% less CPU. Row copies are plain loops over flat views (`_copy_flat`): numba's
  slice assignment of a 2-D row measured 3x slower.

The njit API (each takes the Boards `b` and a game row `g`; call them from your own njit
code, or from Python through `FastBoard`):

    b = new_boards(n_games, size=9, komi=7.5, max_moves=None, history=8)   # Python
    reset(b, g)                       empty board, black to play (komi kept)
    copy_game(b, src, dst)            game dst := game src
    is_over(b, g) -> bool             two passes, or n_moves == max_moves (`rows_over`: the
                                      same of many rows in numpy, from Python)
    is_legal(b, g, move) -> bool
    play(b, g, move) -> bool          plays for b.info[g, TO_PLAY]; False (no change) if illegal
    legal_mask(b, g, out) -> int      out[A + 1] bool := legal moves (all False once over),
                                      returns how many
    play_then_mask(b, g, move, out)   both in one call (-1 if illegal); FastBoard uses it
    score(b, g) -> float              Tromp-Taylor area score with komi, black's view
    random_playout(b, g) -> float     uniformly random legal moves (pass included) to the end,
                                      returns score(b, g); numba's RNG, seeded by seed(s)
    seed(s)                           seeds numba's RNG (np.random inside njit code)
    playouts(b, g, n_games) -> int    n random games from the empty board; returns moves played

Input planes for the net are written by `training.go.features.write_planes(b, g, history, out)`.

Speed (`python benchmarks/rules.py`, moves per CPU second of uniformly random playouts, this
2-core machine): 9x9 about 750k in the numba loop, 1.7x OpenSpiel's C++ Go driven from
Python; 19x19 about 360k, 2.1x. From Python each call costs a few microseconds of numba
dispatch (unboxing `b`), so `FastBoard` manages about 110k moves/s: keep loops in njit code.

This module imports no torch, reads no files and logs nothing.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from training.go.coords import MAX_SIZE, MIN_SIZE
from training.go.rules import IllegalMove


# chains[g, FIELD, p]
HEAD, LINK, SIZE, LIB_N, LIB_SUM, LIB_SQ = range(6)
# info[g, FIELD]
TO_PLAY, N_MOVES, PASSES, CAPTURES_BLACK, CAPTURES_WHITE = range(5)


class Boards(NamedTuple):
    """The state of G games, one row per game (see the module docstring)."""

    stones: np.ndarray
    chains: np.ndarray
    chain_hash: np.ndarray
    info: np.ndarray
    hashes: np.ndarray
    seen: np.ndarray
    moves: np.ndarray
    recent: np.ndarray
    komi: np.ndarray
    neighbors: np.ndarray
    zobrist: np.ndarray


def neighbor_table(n: int) -> np.ndarray:
    """[N*N, 4] int16: the on-board neighbours of each point, padded with -1."""
    table = np.full((n * n, 4), -1, dtype=np.int16)
    for p in range(n * n):
        row, col = divmod(p, n)
        k = 0
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            r, c = row + dr, col + dc
            if 0 <= r < n and 0 <= c < n:
                table[p, k] = r * n + c
                k += 1
    return table


def zobrist_keys(n: int) -> np.ndarray:
    """[2, N*N] int64 Zobrist keys, the same on every run for a given N."""
    rng = np.random.default_rng(20_261_121 + n)
    info = np.iinfo(np.int64)
    keys = rng.integers(info.min, info.max, size=(2, n * n), dtype=np.int64)
    assert np.all(keys != 0) and len(np.unique(keys)) == keys.size
    return keys


def new_boards(
    n_games: int,
    size: int = 9,
    komi: float = 7.5,
    max_moves: int | None = None,
    history: int = 8,
) -> Boards:
    """G empty games of size N (komi, move cap M = 2*N*N by default, H boards of history)."""
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise ValueError(f"board size must be {MIN_SIZE}..{MAX_SIZE}, got {size}")
    a = size * size
    m = 2 * a if max_moves is None else int(max_moves)
    if m < 1 or history < 1 or n_games < 1:
        raise ValueError(f"need n_games, max_moves and history >= 1, got {n_games, m, history}")
    seen_bits = 1024
    while seen_bits < 16 * (m + 1):
        seen_bits *= 2
    g = n_games
    b = Boards(
        stones=np.zeros((g, a), np.int8),
        chains=np.zeros((g, 6, a), np.int32),
        chain_hash=np.zeros((g, a), np.int64),
        info=np.zeros((g, 5), np.int32),
        hashes=np.zeros((g, m + 1), np.int64),
        seen=np.zeros((g, seen_bits // 64), np.int64),
        moves=np.full((g, m), -1, np.int16),
        recent=np.zeros((g, history, a), np.int8),
        komi=np.full(g, komi, np.float64),
        neighbors=neighbor_table(size),
        zobrist=zobrist_keys(size),
    )
    for i in range(g):
        reset(b, i)
    return b


def board_size(b: Boards) -> int:
    """N of the games in `b`."""
    return int(round(b.stones.shape[1] ** 0.5))


# ---------------------------------------------------------------------------------------
# njit public entry points: (b, g, ...)


@njit(cache=True)
def reset(b, g):
    """Empty board, black to play, no history (komi kept)."""
    b.stones[g, :] = 0
    b.chains[g, :, :] = 0
    b.chains[g, HEAD, :] = -1
    b.chains[g, LINK, :] = -1
    b.chain_hash[g, :] = 0
    b.info[g, :] = 0
    b.info[g, TO_PLAY] = 1
    b.hashes[g, :] = 0
    b.seen[g, :] = 0
    _mark_seen(b.seen, g, np.int64(0))
    b.moves[g, :] = -1
    b.recent[g, :, :] = 0


@njit(cache=True, inline="always")
def copy_game(b, src, dst):
    """Game dst := game src (a row copy of every per-game array)."""
    n = b.info[src, N_MOVES]
    _copy_flat(b.stones[dst], b.stones[src])
    _copy_flat(b.chains[dst].reshape(-1), b.chains[src].reshape(-1))
    _copy_flat(b.chain_hash[dst], b.chain_hash[src])
    _copy_flat(b.info[dst], b.info[src])
    # only the played part of the history is ever read
    _copy_flat(b.hashes[dst, : n + 1], b.hashes[src, : n + 1])
    _copy_flat(b.seen[dst], b.seen[src])
    _copy_flat(b.moves[dst, :n], b.moves[src, :n])
    _copy_flat(b.recent[dst].reshape(-1), b.recent[src].reshape(-1))
    b.komi[dst] = b.komi[src]


@njit(cache=True, inline="always")
def _copy_flat(dst, src):
    """dst[:] := src for 1-D arrays, as a plain loop (LLVM vectorises it; numba's slice
    assignment of a 2-D row measured 3x slower)."""
    for i in range(src.shape[0]):
        dst[i] = src[i]


@njit(cache=True, inline="always")
def is_over(b, g):
    """True after two consecutive passes or once max_moves moves have been played."""
    return _is_over(b.info, b.hashes, g)


def rows_over(b: Boards, games) -> np.ndarray:
    """`is_over` of rows `games` (an index or an index array) in numpy, for Python callers:
    no numba dispatch, which unboxes every array of `b` (a few microseconds a call)."""
    info = b.info[games]
    return (info[..., PASSES] >= 2) | (info[..., N_MOVES] >= b.hashes.shape[1] - 1)


@njit(cache=True)
def is_legal(b, g, move):
    """May the side to move in game g play `move` (a flat index or PASS)?"""
    a = b.stones.shape[1]
    if _is_over(b.info, b.hashes, g) or move < 0 or move > a:
        return False
    if move == a:
        return True
    out = np.empty(1, np.bool_)
    _legal_points(b.stones, b.chains, b.chain_hash, b.info, b.hashes, b.seen, b.neighbors,
                  b.zobrist, g, move, move + 1, out)
    return out[0]


@njit(cache=True, inline="always")
def legal_mask(b, g, out):
    """out[A + 1] := legal moves of game g (PASS last; all False once over); returns count."""
    if _is_over(b.info, b.hashes, g):
        out[:] = False
        return 0
    a = b.stones.shape[1]
    out[a] = True
    return 1 + _legal_points(b.stones, b.chains, b.chain_hash, b.info, b.hashes, b.seen,
                             b.neighbors, b.zobrist, g, 0, a, out)


@njit(cache=True)
def play(b, g, move):
    """Play `move` for the side to move in game g; False (game unchanged) if illegal."""
    if not is_legal(b, g, move):
        return False
    _play_legal(b.stones, b.chains, b.chain_hash, b.info, b.hashes, b.seen, b.moves,
                b.recent, b.neighbors, b.zobrist, g, move)
    return True


@njit(cache=True, inline="always")
def play_known_legal(b, g, move):
    """Play `move`, known to be legal in game g's position (a tree's child, made from that
    position's legal mask): `play` without its check."""
    _play_legal(b.stones, b.chains, b.chain_hash, b.info, b.hashes, b.seen, b.moves,
                b.recent, b.neighbors, b.zobrist, g, move)


@njit(cache=True)
def play_then_mask(b, g, move, out):
    """play(b, g, move), then legal_mask(b, g, out): one call per move from Python.

    Returns the number of legal moves after the move, or -1 (and no change) if illegal.
    """
    if not play(b, g, move):
        return -1
    return legal_mask(b, g, out)


@njit(cache=True)
def score(b, g):
    """Tromp-Taylor area score of game g with komi, from black's view."""
    return _area(b.stones, b.neighbors, g) - b.komi[g]


@njit(cache=True)
def seed(s):
    """Seed numba's random generator (used by random_playout)."""
    np.random.seed(s)


@njit(cache=True)
def random_playout(b, g):
    """Play uniformly random legal moves (pass included) until the game ends; return score."""
    a = b.stones.shape[1]
    mask = np.empty(a + 1, np.bool_)
    while not _is_over(b.info, b.hashes, g):
        count = 1 + _legal_points(b.stones, b.chains, b.chain_hash, b.info, b.hashes, b.seen,
                                  b.neighbors, b.zobrist, g, 0, a, mask)
        mask[a] = True
        pick = np.random.randint(count)
        for m in range(a + 1):
            if mask[m]:
                if pick == 0:
                    _play_legal(b.stones, b.chains, b.chain_hash, b.info, b.hashes, b.seen,
                                b.moves, b.recent, b.neighbors, b.zobrist, g, m)
                    break
                pick -= 1
    return score(b, g)


@njit(cache=True)
def playouts(b, g, n_games):
    """Play n random games in row g, each from the empty board; returns the moves played."""
    total = 0
    for _ in range(n_games):
        reset(b, g)
        random_playout(b, g)
        total += b.info[g, N_MOVES]
    return total


# ---------------------------------------------------------------------------------------
# njit internals: they take arrays, not the Boards tuple (see "Few arrays" above)


@njit(cache=True, inline="always")
def _is_over(info, hashes, g):
    return info[g, PASSES] >= 2 or info[g, N_MOVES] >= hashes.shape[1] - 1


@njit(cache=True, inline="always")
def _seen_bit(seen, h):
    bit = h & (seen.shape[1] * 64 - 1)
    return bit >> 6, np.int64(1) << (bit & 63)


@njit(cache=True, inline="always")
def _mark_seen(seen, g, h):
    word, mask = _seen_bit(seen, h)
    seen[g, word] |= mask


@njit(cache=True, inline="always")
def _legal_points(stones, chains, chain_hash, info, hashes, seen, neighbors, zobrist, g, lo,
                  hi, out):
    """out[p - lo] := may the side to move play p, for p in [lo, hi); returns the count.

    The game must not be over. This is the one place the rules of a stone move live.
    """
    color = info[g, TO_PLAY]
    keys = zobrist[(1 - color) >> 1]
    hash_now = hashes[g, info[g, N_MOVES]]
    n_hashes = info[g, N_MOVES] + 1
    seen_mask = seen.shape[1] * 64 - 1
    count = 0
    for p in range(lo, hi):
        if stones[g, p] != 0:
            out[p - lo] = False
            continue
        new_hash = hash_now ^ keys[p]
        has_liberty = False
        taken0 = -1  # heads of chains this move captures, to xor each chain's keys once
        taken1 = -1
        taken2 = -1
        for k in range(4):
            q = neighbors[p, k]
            if q < 0:
                break
            s = stones[g, q]
            if s == 0:
                has_liberty = True
                continue
            h = chains[g, HEAD, q]
            n = np.int64(chains[g, LIB_N, h])
            total = np.int64(chains[g, LIB_SUM, h])
            one_liberty = n * np.int64(chains[g, LIB_SQ, h]) == total * total
            if s == color:
                if not one_liberty:  # p was not its last liberty
                    has_liberty = True
            elif one_liberty and h != taken0 and h != taken1 and h != taken2:
                new_hash ^= chain_hash[g, h]  # p was its last liberty: captured
                has_liberty = True
                if taken0 < 0:
                    taken0 = h
                elif taken1 < 0:
                    taken1 = h
                else:
                    taken2 = h
        ok = has_liberty  # else suicide
        if ok:
            bit = new_hash & seen_mask
            if seen[g, bit >> 6] & (np.int64(1) << (bit & 63)) != 0:
                for i in range(n_hashes):  # positional superko, exact on the hashes
                    if hashes[g, i] == new_hash:
                        ok = False
                        break
        out[p - lo] = ok
        count += ok
    return count


@njit(cache=True, inline="always")
def _play_legal(stones, chains, chain_hash, info, hashes, seen, moves, recent, neighbors,
                zobrist, g, move):
    """Play a move known to be legal for the side to move, and record it."""
    a = stones.shape[1]
    color = info[g, TO_PLAY]
    n = info[g, N_MOVES]
    new_hash = hashes[g, n]
    if move == a:
        info[g, PASSES] += 1
    else:
        info[g, PASSES] = 0
        captured, new_hash = _place(stones, chains, chain_hash, neighbors, zobrist, g, move,
                                    color, new_hash)
        info[g, CAPTURES_BLACK if color == 1 else CAPTURES_WHITE] += captured
        _mark_seen(seen, g, new_hash)
    moves[g, n] = move
    hashes[g, n + 1] = new_hash
    info[g, N_MOVES] = n + 1
    info[g, TO_PLAY] = -color
    _copy_flat(recent[g, (n + 1) % recent.shape[1]], stones[g])


@njit(cache=True, inline="always")
def _place(stones, chains, chain_hash, neighbors, zobrist, g, p, color, board_hash):
    """Put a stone on p, merge, capture; returns (stones captured, the new board hash)."""
    z = zobrist[(1 - color) >> 1, p]
    stones[g, p] = color
    chains[g, HEAD, p] = p
    chains[g, LINK, p] = p
    chains[g, SIZE, p] = 1
    chains[g, LIB_N, p] = 0
    chains[g, LIB_SUM, p] = 0
    chains[g, LIB_SQ, p] = 0
    chain_hash[g, p] = z
    board_hash ^= z
    for k in range(4):  # p stops being a liberty of its neighbours and gains the empty ones
        q = neighbors[p, k]
        if q < 0:
            break
        if stones[g, q] == 0:
            _add_liberty(chains, g, p, q)
        else:
            h = chains[g, HEAD, q]
            chains[g, LIB_N, h] -= 1
            chains[g, LIB_SUM, h] -= p
            chains[g, LIB_SQ, h] -= p * p
    for k in range(4):
        q = neighbors[p, k]
        if q < 0:
            break
        if stones[g, q] == color and chains[g, HEAD, q] != chains[g, HEAD, p]:
            _merge(chains, chain_hash, g, chains[g, HEAD, q], chains[g, HEAD, p])
    captured = 0
    for k in range(4):
        q = neighbors[p, k]
        if q < 0:
            break
        if stones[g, q] == -color:
            h = chains[g, HEAD, q]
            if chains[g, LIB_N, h] == 0:
                board_hash ^= chain_hash[g, h]
                captured += _capture(stones, chains, neighbors, g, h)
    return captured, board_hash


@njit(cache=True, inline="always")
def _add_liberty(chains, g, h, p):
    chains[g, LIB_N, h] += 1
    chains[g, LIB_SUM, h] += p
    chains[g, LIB_SQ, h] += p * p


@njit(cache=True)
def _merge(chains, chain_hash, g, h1, h2):
    """Merge the chains with heads h1 and h2 (the smaller one is relabelled)."""
    if chains[g, SIZE, h1] < chains[g, SIZE, h2]:
        h1, h2 = h2, h1
    s = h2
    while True:
        chains[g, HEAD, s] = h1
        s = chains[g, LINK, s]
        if s == h2:
            break
    nxt = chains[g, LINK, h1]  # splice the two circular lists
    chains[g, LINK, h1] = chains[g, LINK, h2]
    chains[g, LINK, h2] = nxt
    for f in (SIZE, LIB_N, LIB_SUM, LIB_SQ):
        chains[g, f, h1] += chains[g, f, h2]
    chain_hash[g, h1] ^= chain_hash[g, h2]


@njit(cache=True)
def _capture(stones, chains, neighbors, g, h):
    """Remove the chain with head h; its points become liberties of the chains around it."""
    s = h
    while True:
        stones[g, s] = 0
        s = chains[g, LINK, s]
        if s == h:
            break
    count = 0
    while True:
        for k in range(4):
            q = neighbors[s, k]
            if q < 0:
                break
            if stones[g, q] != 0:
                _add_liberty(chains, g, chains[g, HEAD, q], s)
        nxt = chains[g, LINK, s]
        chains[g, HEAD, s] = -1
        chains[g, LINK, s] = -1
        count += 1
        s = nxt
        if s == h:
            break
    return count


@njit(cache=True)
def _area(stones, neighbors, g):
    """Tromp-Taylor area of game g without komi: stones plus single-color empty regions."""
    a = stones.shape[1]
    total = 0
    visited = np.zeros(a, np.bool_)
    stack = np.empty(a, np.int64)
    for p in range(a):
        s = stones[g, p]
        if s != 0:
            total += s
            continue
        if visited[p]:
            continue
        visited[p] = True  # flood the empty region from p, noting the colors around it
        stack[0] = p
        top = 1
        size = 0
        borders = 0  # bit 1: black, bit 2: white
        while top > 0:
            top -= 1
            q = stack[top]
            size += 1
            for k in range(4):
                r = neighbors[q, k]
                if r < 0:
                    break
                sr = stones[g, r]
                if sr == 1:
                    borders |= 1
                elif sr == -1:
                    borders |= 2
                elif not visited[r]:
                    visited[r] = True
                    stack[top] = r
                    top += 1
        if borders == 1:
            total += size
        elif borders == 2:
            total -= size
    return total


# ---------------------------------------------------------------------------------------
# Python API: one game, one call per move


class FastBoard:
    """One game on the fast engine, with a Python-friendly API.

    It keeps the legal-move mask of the current position up to date, so a move costs one
    call into numba (`play_then_mask`): from Python, each call costs a few microseconds of
    numba dispatch (unboxing the Boards tuple), more than the move itself on 9x9. For many
    games at once, or from njit code, use `new_boards` and the njit functions.
    """

    def __init__(self, size: int = 9, komi: float = 7.5, max_moves: int | None = None,
                 history: int = 8):
        self.size = size
        self.pass_move = size * size
        self.boards = new_boards(1, size, komi, max_moves, history)
        self._mask = np.zeros(size * size + 1, np.bool_)
        legal_mask(self.boards, 0, self._mask)

    @property
    def to_play(self) -> int:
        return int(self.boards.info[0, TO_PLAY])

    @property
    def n_moves(self) -> int:
        return int(self.boards.info[0, N_MOVES])

    @property
    def moves(self) -> list[int]:
        return self.boards.moves[0, : self.n_moves].tolist()

    @property
    def captures(self) -> tuple[int, int]:
        """(stones captured by black, by white)."""
        return int(self.boards.info[0, CAPTURES_BLACK]), int(self.boards.info[0, CAPTURES_WHITE])

    def board(self) -> np.ndarray:
        """The current board, int8 [N, N] (a copy)."""
        return self.boards.stones[0].reshape(self.size, self.size).copy()

    def is_over(self) -> bool:
        return not self._mask[self.pass_move]  # pass is legal until the game is over

    def is_legal(self, move: int) -> bool:
        return 0 <= move <= self.pass_move and bool(self._mask[move])

    def legal_mask(self) -> np.ndarray:
        """[N*N + 1] bool, PASS last (read-only view, valid until the next move)."""
        view = self._mask.view()
        view.flags.writeable = False
        return view

    def legal_moves(self) -> np.ndarray:
        """Legal moves ascending, PASS last; empty once the game is over."""
        return np.flatnonzero(self._mask)

    def play(self, move: int) -> None:
        """Play for the side to move; IllegalMove (and no change) if illegal."""
        if play_then_mask(self.boards, 0, move, self._mask) < 0:
            raise IllegalMove(move, self.size, "refused by the fast engine")

    def score(self) -> float:
        return float(score(self.boards, 0))

    def copy(self) -> "FastBoard":
        other = FastBoard.__new__(FastBoard)
        other.size = self.size
        other.pass_move = self.pass_move
        other.boards = Boards(*(a.copy() for a in self.boards))
        other._mask = self._mask.copy()
        return other
