"""Batched PUCT search over many games at once, in preallocated arrays (no node objects).

Owns `Mcts`: the search trees of G games, their root positions (a `training.fastgo.Boards`
with one row per game) and the step loop that sends the network ONE batch per step:

    1. `_select` (one njit call): in every searching game, walk from the root to a leaf by
       PUCT, replaying the path's moves on a scratch copy of the root position, and write the
       leaf's input planes and legal moves into batch slot s. A leaf where the game is over is
       scored by the rules and backed up at once (no network call).
    2. one `evaluate(planes, legal)` call per `batch_size` slots (usually exactly one).
    3. `_expand_backup` (one njit call): give each leaf its legal children with the network's
       priors and add the value to every node on its path, flipping sign per ply.

Vocabulary (the AlphaZero paper's, as minigo and mctx use it):
    N   visit count of a node.       W   sum of the values backed up through it.
    Q   W / N, the mean value.       P   prior of a node, from its parent's network policy.
    U   c_puct * P * sqrt(N_parent - 1) / (1 + N), the exploration bonus (PUCT).
    A   N*N points, so a policy has A + 1 entries (PASS = A last), see `training.coords`.
Values are kept from the view of the player who moved INTO a node (the parent's side to
move), so a parent picks argmax(Q + U) over its children without sign flips; the value of a
position for its own side to move is -W/N of its node. Unvisited children get the first play
urgency value Q_parent - fpu_reduction * sqrt(sum of P over the visited children), Leela
Zero's FPU reduction: no reduction before the first child is tried, so a node with many
equal priors does not pour its first visits into whichever child was tried first.

Tree layout, per game g (row g of every [G, M] array, M = `capacity` nodes): node 0 is the
root; an expanded node's children are one contiguous block
`first_child .. first_child + n_children - 1`, allocated when the node's leaf evaluation comes
back (only legal moves get a child). `first_child == -1` marks an unexpanded node.

"Simulations per move" means NEW simulations added below the root per move: after a search
the root's children hold `simulations` more visits than before it. The root's own network
evaluation (needed once for a fresh root) is not a simulation (as in mctx). With
`reuse_tree`, the chosen child's subtree becomes the next root with its visits kept, so the
policy target (the root's child visits) can sum to more than `simulations`.

Root Dirichlet noise is drawn once per search, when the root has children (at once for a
reused root, after its evaluation for a fresh one), with alpha = dirichlet_total_alpha /
legal moves, from each game's own numpy Generator, so a game's search does not depend on
which other games share its batch: a batched search and a one-game search agree.

Passes (`early_pass=False`, what self-play uses): the search may pass only right after the
opponent's pass (so that passing ends the game and is scored by the rules) or when every
legal point would fill one of its own single-point eyes. Measured without it (7x7, komi 9.5,
and the 5x5 tiny run): a pass is the one move legal in every position, so the visit mass it
gets where it ends a won game (exact +1 against noisy net values) leaks into the net's prior
for every position; where the values say nothing (a decided or not yet learned game, all Q
alike) the FPU-reduced search piles its visits on the highest prior, the targets follow, and
within 3 generations one side passed 60% of its moves, games shrank to a few moves and the
net lost to the random net it started from. The arena and GTP play keep the full rules.

No evaluation cache. A hit needs exactly the same input planes (the last `history` boards)
as an earlier evaluation; with tree reuse that happens only across games. Measured over 60
moves of 64 9x9 games at 100 simulations with a deterministic stand-in net: 34% of the leaf
evaluations in the first 5 moves of the games repeated an earlier input (all games open on
the same empty board), 4-8% later, 7% overall. So a cache could save at most about 7% of
network time (it depends on how peaked the net is: `benchmarks/selfplay.py --cache-stats`
measures it for a net), while it needs a bounded store cleared at every new model.
TODO(search): add one (keyed by the Zobrist hashes of the last `history` boards, computed in
`_select`) if trained nets show clearly more hits.

This module imports no torch, reads no files and owns no threads; it receives `evaluate` as
a callable: evaluate(planes float32 [B, C, N, N], legal bool [B, A+1]) ->
(priors float32 [B, A+1], values float32 [B] from the side to move's view).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import numpy as np
from numba import njit

from training import fastgo
from training.features import write_planes

if TYPE_CHECKING:
    from configs import GoConfig, MctsConfig

log = logging.getLogger(__name__)

Evaluate = Callable[[np.ndarray, np.ndarray], "tuple[np.ndarray, np.ndarray]"]

UNEXPANDED = -1


class Tree(NamedTuple):
    """The search trees of G games, one row per game (see the module docstring)."""

    visits: np.ndarray  # [G, M] int32  N
    value_sum: np.ndarray  # [G, M] float32  W, from the view of the player who moved in
    prior: np.ndarray  # [G, M] float32  P
    move: np.ndarray  # [G, M] int16  the move that leads to the node
    first_child: np.ndarray  # [G, M] int32  -1: unexpanded
    n_children: np.ndarray  # [G, M] int16
    size: np.ndarray  # [G] int32  nodes in use
    path: np.ndarray  # [G, D] int32  nodes of the current simulation, root first
    depth: np.ndarray  # [G] int32  nodes in path
    sims_done: np.ndarray  # [G] int32  new simulations in this search
    sims_target: np.ndarray  # [G] int32  simulations wanted in this search (0: idle)


def new_tree(n_games: int, capacity: int, max_depth: int) -> Tree:
    """Empty trees (one unexpanded root each) for G games of up to `capacity` nodes."""
    g, m = n_games, capacity
    tree = Tree(
        visits=np.zeros((g, m), np.int32),
        value_sum=np.zeros((g, m), np.float32),
        prior=np.zeros((g, m), np.float32),
        move=np.full((g, m), -1, np.int16),
        first_child=np.full((g, m), UNEXPANDED, np.int32),
        n_children=np.zeros((g, m), np.int16),
        size=np.ones(g, np.int32),
        path=np.zeros((g, max_depth + 2), np.int32),
        depth=np.zeros(g, np.int32),
        sims_done=np.zeros(g, np.int32),
        sims_target=np.zeros(g, np.int32),
    )
    return tree


# ------------------------------------------------------------------------------ njit core


@njit(cache=True)
def _clear_tree(t, g):
    """Game g's tree := one unexpanded root."""
    t.visits[g, 0] = 0
    t.value_sum[g, 0] = 0.0
    t.prior[g, 0] = 1.0
    t.move[g, 0] = -1
    t.first_child[g, 0] = UNEXPANDED
    t.n_children[g, 0] = 0
    t.size[g] = 1


@njit(cache=True, inline="always")
def _pick_child(t, g, node, c_puct, fpu_reduction):
    """The child of `node` with the largest Q + U (the first one on ties)."""
    n_parent = t.visits[g, node]
    first = t.first_child[g, node]
    end = first + t.n_children[g, node]
    visited_prior = 0.0
    for c in range(first, end):
        if t.visits[g, c] > 0:
            visited_prior += t.prior[g, c]
    parent_q = -t.value_sum[g, node] / max(n_parent, 1)
    fpu = parent_q - fpu_reduction * np.sqrt(visited_prior)
    scale = c_puct * np.sqrt(np.float32(max(n_parent - 1, 1)))
    best = first
    best_score = -np.inf
    for c in range(first, end):
        n = t.visits[g, c]
        q = t.value_sum[g, c] / n if n > 0 else fpu
        score = q + scale * t.prior[g, c] / (1 + n)
        if score > best_score:
            best_score = score
            best = c
    return best


@njit(cache=True, inline="always")
def _backup(t, g, value):
    """Add `value` (leaf's side to move's view) along game g's path, flipping sign per ply."""
    v = -value  # the leaf node's W is from the view of the player who moved into it
    for i in range(t.depth[g] - 1, -1, -1):
        node = t.path[g, i]
        t.visits[g, node] += 1
        t.value_sum[g, node] += v
        v = -v


@njit(cache=True, inline="always")
def _terminal_value(b, g):
    """+1/-1/0 by the final score, from the view of game g's side to move."""
    s = fastgo.score(b, g)
    if s == 0:
        return 0.0
    color = float(b.info[g, fastgo.TO_PLAY])
    return color if s > 0 else -color


@njit(cache=True)
def _drop_early_pass(b, g, legal):
    """legal[PASS] := False unless the opponent has just passed or every legal point fills
    one of the side to move's own single-point eyes (see "Passes" in the module docstring)."""
    a = legal.shape[0] - 1
    if b.info[g, fastgo.PASSES] > 0:
        return
    color = b.info[g, fastgo.TO_PLAY]
    for p in range(a):
        if not legal[p]:
            continue
        for k in range(4):
            q = b.neighbors[p, k]
            if q < 0:
                break
            if b.stones[g, q] != color:  # not an own eye: a real move is left
                legal[a] = False
                return


@njit(cache=True)
def _select(t, b, c_puct, fpu_reduction, history, planes, legal, slot_game, early_pass):
    """Pick one leaf in every searching game; write its planes and legal moves to a slot.

    Game g's root position is row g of `b`; row G + g (scratch) is overwritten with the leaf
    position. Leaves where the game is over are backed up here. Returns the slots used.
    """
    n_slots = 0
    n_games = t.size.shape[0]
    for g in range(n_games):
        if t.sims_done[g] >= t.sims_target[g]:
            continue
        leaf_row = n_games + g
        fastgo.copy_game(b, g, leaf_row)
        node = 0
        t.path[g, 0] = 0
        depth = 1
        while t.first_child[g, node] != UNEXPANDED:
            node = _pick_child(t, g, node, c_puct, fpu_reduction)
            ok = fastgo.play(b, leaf_row, t.move[g, node])
            assert ok
            t.path[g, depth] = node
            depth += 1
        t.depth[g] = depth
        if fastgo.is_over(b, leaf_row):
            if depth == 1:  # the root itself is over: nothing to search
                t.sims_done[g] = t.sims_target[g]
                continue
            _backup(t, g, _terminal_value(b, leaf_row))
            t.sims_done[g] += 1
            continue
        fastgo.legal_mask(b, leaf_row, legal[n_slots])
        if not early_pass:
            _drop_early_pass(b, leaf_row, legal[n_slots])
        write_planes(b, leaf_row, history, planes[n_slots])
        slot_game[n_slots] = g
        n_slots += 1
    return n_slots


@njit(cache=True)
def _expand_backup(t, n_slots, slot_game, priors, values, legal, root_expanded):
    """Expand each slot's leaf with its legal moves' priors and back up its value.

    root_expanded[g] is set when game g's root got its children in this call.
    """
    n_moves = legal.shape[1]
    capacity = t.visits.shape[1]
    for s in range(n_slots):
        g = slot_game[s]
        leaf = t.path[g, t.depth[g] - 1]
        k = 0
        total = 0.0
        for m in range(n_moves):
            if legal[s, m]:
                k += 1
                total += max(priors[s, m], 0.0)
        if t.first_child[g, leaf] == UNEXPANDED and t.size[g] + k <= capacity:
            # HACK: a full tree leaves the leaf unexpanded (it is evaluated again next time
            # it is reached); the capacity makes this rare, see Mcts.__init__.
            first = t.size[g]
            c = first
            for m in range(n_moves):
                if legal[s, m]:
                    p = max(priors[s, m], 0.0) / total if total > 0 else 1.0 / k
                    t.visits[g, c] = 0
                    t.value_sum[g, c] = 0.0
                    t.prior[g, c] = p
                    t.move[g, c] = m
                    t.first_child[g, c] = UNEXPANDED
                    t.n_children[g, c] = 0
                    c += 1
            t.first_child[g, leaf] = first
            t.n_children[g, leaf] = k
            t.size[g] = first + k
            if leaf == 0:
                root_expanded[g] = True
        v = min(max(values[s], -1.0), 1.0)
        _backup(t, g, v)
        if leaf != 0:
            t.sims_done[g] += 1


@njit(cache=True)
def _root_visits(t, g, out):
    """out[A + 1] := visits of game g's root children by move (0 for the others)."""
    out[:] = 0
    first = t.first_child[g, 0]
    if first == UNEXPANDED:
        return
    for c in range(first, first + t.n_children[g, 0]):
        out[t.move[g, c]] = t.visits[g, c]


@njit(cache=True)
def _all_root_visits(t, games, out):
    """out[i] := root child visits of game games[i], by move."""
    for i in range(games.shape[0]):
        _root_visits(t, games[i], out[i])


@njit(cache=True)
def _subtree_size(t, g, root):
    """Nodes in the subtree under `root` (included)."""
    stack = np.empty(t.size[g], np.int32)
    stack[0] = root
    top = 1
    count = 0
    while top > 0:
        top -= 1
        node = stack[top]
        count += 1
        first = t.first_child[g, node]
        if first != UNEXPANDED:
            for c in range(first, first + t.n_children[g, node]):
                stack[top] = c
                top += 1
    return count


@njit(cache=True)
def _reroot(t, g, new_root):
    """Make `new_root`'s subtree game g's whole tree, renumbered breadth first from 0."""
    size = t.size[g]
    old = np.empty(size, np.int32)  # old index of each new node, in breadth-first order
    visits = np.empty(size, np.int32)
    value_sum = np.empty(size, np.float32)
    prior = np.empty(size, np.float32)
    move = np.empty(size, np.int16)
    first_child = np.empty(size, np.int32)
    n_children = np.empty(size, np.int16)
    old[0] = new_root
    count = 1
    head = 0
    while head < count:
        o = old[head]
        visits[head] = t.visits[g, o]
        value_sum[head] = t.value_sum[g, o]
        prior[head] = t.prior[g, o]
        move[head] = t.move[g, o]
        n_children[head] = t.n_children[g, o]
        first = t.first_child[g, o]
        if first == UNEXPANDED:
            first_child[head] = UNEXPANDED
        else:
            first_child[head] = count  # the children stay one block, in the same order
            for c in range(first, first + t.n_children[g, o]):
                old[count] = c
                count += 1
        head += 1
    t.visits[g, :count] = visits[:count]
    t.value_sum[g, :count] = value_sum[:count]
    t.prior[g, :count] = prior[:count]
    t.move[g, :count] = move[:count]
    t.first_child[g, :count] = first_child[:count]
    t.n_children[g, :count] = n_children[:count]
    t.move[g, 0] = -1
    t.prior[g, 0] = 1.0
    t.size[g] = count


@njit(cache=True)
def _advance(t, b, games, moves, reuse, keep_limit):
    """Play moves[i] in game games[i] and move its root down (reused subtree or fresh).

    A subtree is kept only when reuse is on and it has at most keep_limit nodes (so the next
    search has room). Returns False at the first illegal move (that game is left unchanged).
    """
    for i in range(games.shape[0]):
        g = games[i]
        m = moves[i]
        if not fastgo.play(b, g, m):
            return False
        child = -1
        first = t.first_child[g, 0]
        if reuse and first != UNEXPANDED:
            for c in range(first, first + t.n_children[g, 0]):
                if t.move[g, c] == m:
                    child = c
                    break
        if child >= 0 and t.visits[g, child] > 0 and _subtree_size(t, g, child) <= keep_limit:
            _reroot(t, g, child)
        else:
            _clear_tree(t, g)
        t.sims_done[g] = 0
        t.sims_target[g] = 0
    return True


# ------------------------------------------------------------------------------ Python API


def max_depth(board_size: int, max_moves: int) -> int:
    """Deepest possible path: one node per remaining move plus the root."""
    return (max_moves or 2 * board_size * board_size) + 1


class Mcts:
    """Search trees and root positions of G games, searched together with batched evaluation.

    Args:
        n_games: G, the games searched at once.
        go_cfg: `cfg.go` (board_size, komi, move_cap).
        mcts_cfg: `cfg.mcts` (c_puct, fpu_reduction, dirichlet_*, reuse_tree, simulations).
        history: the net's history (input planes C = 2 * history + 1).
        batch_size: most positions per evaluate call.
        simulations: simulations per move (default mcts_cfg.simulations).
        reuse_tree: keep the chosen child's subtree (default mcts_cfg.reuse_tree).
        early_pass: False: the search may pass only right after the opponent's pass or when
            every legal point fills an own single-point eye (self-play; see "Passes").

    Attributes: `boards` (fastgo.Boards, row g = game g's root position, rows G.. are
    scratch), `tree` (Tree).
    """

    def __init__(
        self,
        n_games: int,
        go_cfg: GoConfig,
        mcts_cfg: MctsConfig,
        *,
        history: int,
        batch_size: int = 256,
        simulations: int | None = None,
        reuse_tree: bool | None = None,
        early_pass: bool = True,
    ):
        n = go_cfg.board_size
        self.n_games = n_games
        self.size = n
        self.n_moves = n * n + 1
        self.cfg = mcts_cfg
        self.history = history
        self.batch_size = max(1, batch_size)
        self.simulations = mcts_cfg.simulations if simulations is None else simulations
        self.reuse_tree = mcts_cfg.reuse_tree if reuse_tree is None else reuse_tree
        self.early_pass = early_pass
        move_cap = go_cfg.move_cap
        # rows [0, G): the root positions; rows [G, 2G): scratch rows for the leaves
        self.boards = fastgo.new_boards(2 * n_games, n, go_cfg.komi, move_cap, history)
        # One search expands at most simulations + 1 leaves of at most A + 1 children each;
        # with reuse, a kept subtree may be as large again (larger ones are dropped).
        per_search = (self.simulations + 1) * self.n_moves + 1
        self._keep_limit = per_search if self.reuse_tree else 0
        capacity = per_search + self._keep_limit
        self.tree = new_tree(n_games, capacity, max_depth(n, move_cap))
        channels = 2 * history + 1
        self._planes = np.zeros((n_games, channels, n, n), np.float32)
        self._legal = np.zeros((n_games, self.n_moves), np.bool_)
        self._slot_game = np.zeros(n_games, np.int32)
        self._root_expanded = np.zeros(n_games, np.bool_)
        self._noise_pending = np.zeros(n_games, np.bool_)
        self._rngs: list[np.random.Generator | None] = [None] * n_games
        self.evaluations = 0  # positions sent to the network so far
        self.net_calls = 0

    # -- positions -------------------------------------------------------------------

    def reset_game(self, g: int, moves: Sequence[int] = (), komi: float | None = None) -> None:
        """Game g := a new game (after `moves`), with a fresh tree."""
        fastgo.reset(self.boards, g)
        if komi is not None:
            self.boards.komi[g] = komi
        for m in moves:
            if not fastgo.play(self.boards, g, int(m)):
                raise ValueError(f"game {g}: move {m} is illegal after {list(moves)}")
        _clear_tree(self.tree, g)
        self.tree.sims_done[g] = 0
        self.tree.sims_target[g] = 0
        self._noise_pending[g] = False

    def is_over(self, g: int) -> bool:
        return bool(fastgo.is_over(self.boards, g))

    def to_play(self, g: int) -> int:
        return int(self.boards.info[g, fastgo.TO_PLAY])

    def score(self, g: int) -> float:
        return float(fastgo.score(self.boards, g))

    def play(self, games: np.ndarray, moves: np.ndarray) -> None:
        """Play moves[i] in games[i]; the chosen child's subtree is kept if reuse_tree."""
        games = np.ascontiguousarray(games, np.int64)
        moves = np.ascontiguousarray(moves, np.int64)
        if not _advance(self.tree, self.boards, games, moves, self.reuse_tree, self._keep_limit):
            raise ValueError("illegal move passed to Mcts.play")

    # -- search ----------------------------------------------------------------------

    def start_search(
        self,
        games: Sequence[int] | np.ndarray,
        rngs: Sequence[np.random.Generator | None] | None = None,
        simulations: int | None = None,
    ) -> None:
        """Begin a search of `simulations` new simulations in each of `games`.

        rngs[i], when given, draws the root Dirichlet noise of games[i] (None: no noise).
        """
        sims = self.simulations if simulations is None else simulations
        for i, g in enumerate(games):
            self.tree.sims_done[g] = 0
            self.tree.sims_target[g] = sims
            rng = None if rngs is None else rngs[i]
            self._rngs[g] = rng
            self._noise_pending[g] = rng is not None and self.cfg.dirichlet_fraction > 0
            if self._noise_pending[g] and self.tree.first_child[g, 0] != UNEXPANDED:
                self._add_noise(g)

    def is_searching(self) -> bool:
        t = self.tree
        return bool(np.any(t.sims_done < t.sims_target))

    def step(self, evaluators: Sequence[Evaluate], owner: np.ndarray | None = None) -> int:
        """One simulation in every searching game; returns the positions evaluated.

        Game g's leaves go to evaluators[owner[g]] (owner None: all to evaluators[0]), in
        calls of at most batch_size positions.
        """
        t = self.tree
        n = _select(
            t,
            self.boards,
            np.float32(self.cfg.c_puct),
            np.float32(self.cfg.fpu_reduction),
            self.history,
            self._planes,
            self._legal,
            self._slot_game,
            self.early_pass,
        )
        if n == 0:
            return 0
        priors = np.empty((n, self.n_moves), np.float32)
        values = np.empty(n, np.float32)
        if owner is None or len(evaluators) == 1:
            self._evaluate(evaluators[0], np.arange(n), priors, values)
        else:
            who = owner[self._slot_game[:n]]
            for k, evaluate in enumerate(evaluators):
                slots = np.flatnonzero(who == k)
                if len(slots):
                    self._evaluate(evaluate, slots, priors, values)
        self._root_expanded[:] = False
        _expand_backup(t, n, self._slot_game, priors, values, self._legal, self._root_expanded)
        for g in np.flatnonzero(self._root_expanded & self._noise_pending):
            self._add_noise(int(g))
        return n

    def _evaluate(self, evaluate: Evaluate, slots: np.ndarray, priors, values) -> None:
        """Evaluate the given batch slots in calls of at most batch_size positions."""
        contiguous = len(slots) == slots[-1] - slots[0] + 1
        for lo in range(0, len(slots), self.batch_size):
            part = slots[lo : lo + self.batch_size]
            if contiguous:
                sl = slice(int(part[0]), int(part[-1]) + 1)
                p, v = evaluate(self._planes[sl], self._legal[sl])
                priors[sl] = p
                values[sl] = v
            else:
                p, v = evaluate(self._planes[part], self._legal[part])
                priors[part] = p
                values[part] = v
            self.evaluations += len(part)
            self.net_calls += 1

    def _add_noise(self, g: int) -> None:
        """Mix Dirichlet noise into game g's root priors (once per search)."""
        t = self.tree
        first, k = int(t.first_child[g, 0]), int(t.n_children[g, 0])
        self._noise_pending[g] = False
        rng = self._rngs[g]
        if rng is None or k == 0:
            return
        alpha = self.cfg.dirichlet_total_alpha / k
        noise = rng.dirichlet(np.full(k, alpha))
        eps = self.cfg.dirichlet_fraction
        block = t.prior[g, first : first + k]
        t.prior[g, first : first + k] = (1 - eps) * block + eps * noise.astype(np.float32)

    def search(
        self,
        evaluators: Evaluate | Sequence[Evaluate],
        games: Sequence[int] | np.ndarray | None = None,
        rngs: Sequence[np.random.Generator | None] | None = None,
        owner: np.ndarray | None = None,
        simulations: int | None = None,
    ) -> np.ndarray:
        """Search `games` (default all) to completion; returns root visits [len(games), A+1]."""
        if callable(evaluators):
            evaluators = [evaluators]
        games = np.arange(self.n_games) if games is None else np.asarray(games, np.int64)
        self.start_search(games, rngs, simulations)
        while self.is_searching():
            self.step(evaluators, owner)
        return self.root_visits(games)

    # -- results ---------------------------------------------------------------------

    def root_visits(self, games: Sequence[int] | np.ndarray) -> np.ndarray:
        """Visits of each game's root children by move, int32 [len(games), A + 1]."""
        games = np.ascontiguousarray(games, np.int64)
        out = np.zeros((len(games), self.n_moves), np.int32)
        _all_root_visits(self.tree, games, out)
        return out

    def root_values(self, games: Sequence[int] | np.ndarray) -> np.ndarray:
        """Mean search value of each game's root, from its side to move's view, float32."""
        games = np.asarray(games, np.int64)
        n = self.tree.visits[games, 0]
        return np.where(n > 0, -self.tree.value_sum[games, 0] / np.maximum(n, 1), 0.0).astype(
            np.float32
        )


def choose_moves(
    visits: np.ndarray, rngs: Sequence[np.random.Generator], sample: np.ndarray
) -> np.ndarray:
    """Per row: a move drawn in proportion to visits where sample[i], else the most visited.

    Ties for the most visited are broken by the row's generator, so no move is favoured by
    its index.
    """
    moves = np.empty(len(visits), np.int64)
    for i, row in enumerate(visits):
        total = row.sum()
        assert total > 0, "a search must visit at least one child of the root"
        if sample[i]:
            moves[i] = rngs[i].choice(len(row), p=row / total)
        else:
            best = np.flatnonzero(row == row.max())
            moves[i] = best[0] if len(best) == 1 else rngs[i].choice(best)
    return moves
