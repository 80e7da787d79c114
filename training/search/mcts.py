"""Batched tree search (PUCT or Gumbel MuZero) over many games at once, in preallocated
arrays (no node objects).

Owns `Mcts`: the search trees of G games, their root positions (a `training.go.fastgo.Boards`
with one row per game) and the step loop that sends the network ONE batch per step:

    1. `_select` (one njit call): in every searching game, walk from the root to a leaf by
       PUCT (or Gumbel's rules, below), replaying the path's moves on a scratch copy of the
       root position, and write the leaf's input planes and legal moves into batch slot s.
       A leaf where the game is over is scored by the rules and backed up at once (no
       network call).
    2. one `evaluate(planes, legal)` call per `batch_size` slots (usually exactly one).
    3. `_expand_backup` (one njit call): give each leaf its legal children with the network's
       priors and add the value to every node on its path, flipping sign per ply.

Vocabulary (the AlphaZero paper's, as minigo and mctx use it):
    N   visit count of a node.       W   sum of the values backed up through it.
    Q   W / N, the mean value.       P   prior of a node, from its parent's network policy.
    U   c_puct * P * sqrt(N_parent - 1) / (1 + N), the exploration bonus (PUCT).
    A   N*N points, so a policy has A + 1 entries (PASS = A last), see `training.go.coords`.
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

Root Dirichlet noise (PUCT) is drawn once per search, when the root has children (at once
for a reused root, after its evaluation for a fresh one), with alpha = dirichlet_total_alpha /
legal moves, from each game's own numpy Generator, as is Gumbel's noise g (A + 1 draws at
the start of a search), so a game's search does not depend on which other games share its
batch: a batched search and a one-game search agree.

Gumbel MuZero (`mcts.algorithm: gumbel`; Danihelka et al. 2022, as DeepMind's mctx does it):
    logit   log P (a prior floored at 1e-30).    g   the root's Gumbel noise, one per child.
    completed Q   a visited child's Q; an unvisited one's is the node's mixed value
            (v + sum N * sum_visited(P Q) / sum_visited(P)) / (sum N + 1), v the net's value
            of the node (`Tree.raw_value`).
    sigma   (gumbel_c_visit + max N) * gumbel_c_scale * q, q the completed Q normalised to
            [0, 1]: (Q + 1) / 2 by the value bounds (`gumbel_q_normalization: bounds`), or
            min-max over the node's children (`minmax`, mctx's `rescale_values`).
    pi'     the improved policy softmax(logit + sigma), over the node's children.
  At the root, sequential halving: m = min(legal moves, gumbel_max_considered, simulations);
  simulation i (of this search) goes to the child with the largest g + logit + sigma among
  those with exactly `halving_schedule(m, n)[i]` new visits (mctx's table), so the first m
  simulations visit the Gumbel-top-m children (a sample without replacement from the prior)
  and each later phase splits its budget over the better half. Below the root the
  deterministic rule argmax(pi' - N / (1 + sum N)) makes visits follow pi'. The search's move
  (`select_moves`) is, among the children with the most new visits, the largest
  g + logit + sigma (g = 0 in play); the policy target (`policy_targets`) is the root's pi'.
  No Dirichlet noise, FPU or c_puct. With `reuse_tree` the kept subtree's statistics stay
  (better Q, and max N counts old visits too) while the halving counts only this search's
  new visits (`Tree.root_base`); mctx searches fresh each move, KataGo-style reuse saves the
  root's evaluation and keeps what the tree learned. Searches of different lengths
  (`start_search(simulations=[...])`, playout cap randomization) share the batch.

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

Score utility (KataGo's; `mcts.score_utility_static` and `_dynamic`, off at 0): each leaf's
value also counts a term of its score s (the net's score head, margin / N from its side to
move's view, or the rules' margin at a finished game): w_static * 2/pi * atan(s / 2) +
w_dynamic * 2/pi * atan((s - c) / scale), c the root's own score pulled toward 0 by
`score_utility_zero_weight` (KataGo centres on the root's tree mean; a kept subtree is
rescored when its new root moves the centre). W then holds this utility, which every
selection rule reads; `Tree.score_sum` holds its score part, so the win rates a caller reads
(`root_values`, `root_children`) stay the pure mean of the values. Off, every sum is as
without it. KataGo integrates the term over the score's spread; our net has no spread head,
so this is its formula at spread 0.

The search receives `evaluate` as a callable: evaluate(planes [B, C, N, N] of 0s and 1s,
legal bool [B, A+1]) -> (priors float32 [B, A+1], values float32 [B] from the side to move's
view), or (priors, values, scores float32 [B]) with the score utility on. The planes are
float32 unless `Mcts(planes_dtype=np.uint8)`: a quarter of the bytes to write per leaf and
to copy to a GPU, for evaluators that widen them themselves
(`training.learn.net.make_evaluator` and the net server's client do).

Why one module of about 1000 lines: the njit kernels (`_select`, `_expand_backup`, `_reroot`,
`_advance`, Gumbel's root rules and halving) work on one tree layout and call each other; a
caller's compiled code carries its callees' (those of the descent inlined). Numba's on-disk cache
(`cache=True`) checks only the source file of the function it loads, not the files of the
jitted functions that function calls: kernels split over several files could run an edited
callee's old compiled code until the cache is cleared. So the search's kernels stay in this
file, and what it calls in other files has a stable interface: `training.go.fastgo` (the rules)
and `features.write_planes` (after changing either, delete the `*.nbi`/`*.nbc` files in
`training/__pycache__`). The `Mcts` class (about 300 lines) is the kernels' one caller and
reads the tree's arrays directly; beside them, the layout's invariants stay in one file.

It must not: import torch, read or write files, or own threads.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import numpy as np
from numba import njit

from training.go import fastgo
from training.go import features
from training.go.features import write_planes

if TYPE_CHECKING:
    from configs import GoConfig, MctsConfig

log = logging.getLogger(__name__)

Evaluate = Callable[[np.ndarray, np.ndarray], "tuple[np.ndarray, ...]"]

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
    raw_value: np.ndarray  # [G, M] float32  the net's value of an expanded node, its side to
    #                        move's view (the mixed value's start, Gumbel only)
    gumbel: np.ndarray  # [G, A+1] float32  root Gumbel noise g of the i-th root child
    root_base: np.ndarray  # [G, A+1] int32  visits of the i-th root child when the search began
    schedule: np.ndarray  # [G, S] int32  sequential halving: considered visit per simulation
    considered: np.ndarray  # [G] int32  m, the root children sequential halving started with
    halving_ready: np.ndarray  # [G] bool  schedule and root_base are set for this search
    scratch: np.ndarray  # [G, A+1] float32  per-child work space of the Gumbel rules
    visited: np.ndarray  # [G, A+1] int32  work space: the visited children of a node
    root_logit: np.ndarray  # [G, A+1] float64  log prior of the i-th root child (this search)
    score_sum: np.ndarray  # [G, M] float32  the score utility's part of W (0 when it is off)
    raw_score: np.ndarray  # [G, M] float32  the net's (or the rules') score of an evaluated
    #                        node, margin / N from its side to move's view
    score_center: np.ndarray  # [G] float32  the dynamic score utility's centre, margin / N
    #                           from the root's side to move's view


def new_tree(
    n_games: int, capacity: int, max_depth: int, *, n_moves: int = 1, schedule_len: int = 1
) -> Tree:
    """Empty trees (one unexpanded root each) for G games of up to `capacity` nodes
    (`n_moves` = A + 1; `schedule_len`: the most simulations of one Gumbel search)."""
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
        raw_value=np.zeros((g, m), np.float32),
        gumbel=np.zeros((g, n_moves), np.float32),
        root_base=np.zeros((g, n_moves), np.int32),
        schedule=np.zeros((g, schedule_len), np.int32),
        considered=np.zeros(g, np.int32),
        halving_ready=np.zeros(g, np.bool_),
        scratch=np.zeros((g, n_moves), np.float32),
        visited=np.zeros((g, n_moves), np.int32),
        root_logit=np.zeros((g, n_moves), np.float64),
        score_sum=np.zeros((g, m), np.float32),
        raw_score=np.zeros((g, m), np.float32),
        score_center=np.zeros(g, np.float32),
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
    t.raw_value[g, 0] = 0.0
    t.score_sum[g, 0] = 0.0
    t.size[g] = 1


@njit(cache=True, inline="always")
def _pick_child(t, g, node, c_puct, fpu_reduction):
    """The child of `node` with the largest Q + U (the first one on ties)."""
    visits = t.visits[g]
    value_sum = t.value_sum[g]
    prior = t.prior[g]
    first_child = t.first_child[g]
    n_children = t.n_children[g]
    n_parent = visits[node]
    first = first_child[node]
    end = first + n_children[node]
    visited_prior = 0.0
    for c in range(first, end):
        if visits[c] > 0:
            visited_prior += prior[c]
    parent_q = -value_sum[node] / max(n_parent, 1)
    fpu = parent_q - fpu_reduction * np.sqrt(visited_prior)
    scale = c_puct * np.sqrt(np.float32(max(n_parent - 1, 1)))
    best = first
    best_score = -np.inf
    for c in range(first, end):
        n = visits[c]
        q = value_sum[c] / n if n > 0 else fpu
        score = q + scale * prior[c] / (1 + n)
        if score > best_score:
            best_score = score
            best = c
    return best


TINY_PRIOR = 1e-30
"""Priors are floored here before their log (a zero prior is a logit of about -69)."""


@njit(cache=True)
def halving_schedule(m, n, out):
    """out[i] := the visit count a root child must have to be chosen by simulation i.

    mctx's `get_sequence_of_considered_visits`: sequential halving over m children with n
    simulations; each phase gives every one of the c children still considered
    max(1, n // (ceil(log2 m) * c)) more visits, then keeps the better half (at least 2).
    m <= 1: out[i] = i (the one child takes every visit).
    """
    if m <= 1:
        for i in range(n):
            out[i] = i
        return
    log2max = 0
    while (1 << log2max) < m:
        log2max += 1
    i = 0
    v = 0
    c = m
    while i < n:
        extra = max(1, n // (log2max * c))
        for _ in range(extra):
            for _ in range(c):
                if i < n:
                    out[i] = v
                    i += 1
            v += 1
        c = max(2, c // 2)


@njit(cache=True, inline="always")
def _logit(p):
    return np.log(max(p, TINY_PRIOR))


@njit(cache=True, inline="always")
def _completed_sigma(t, g, node, c_visit, c_scale, minmax, out):
    """out[i] := sigma(completed Q) of the i-th child of `node` (Gumbel MuZero's transform).

    Completed Q: a visited child's Q (W / N, from `node`'s side to move's view); an unvisited
    one's is the mixed value (raw + sum N * sum_visited(P * Q) / sum_visited(P)) / (sum N + 1),
    raw = the net's value of `node`. Then normalised to q in [0, 1], by the value bounds,
    q = (Q + 1) / 2, or (`minmax`, mctx's rescale) by the children's smallest and largest,
    and scaled: sigma = (c_visit + max N) * c_scale * q.
    """
    visits = t.visits[g]
    value_sum = t.value_sum[g]
    prior = t.prior[g]
    first_child = t.first_child[g]
    n_children = t.n_children[g]
    raw_value = t.raw_value[g]
    first = first_child[node]
    k = n_children[node]
    sum_n = 0
    max_n = 0
    sum_p = 0.0
    weighted_q = 0.0
    for i in range(k):
        c = first + i
        n = visits[c]
        if n > 0:
            p = max(prior[c], TINY_PRIOR)
            sum_n += n
            max_n = max(max_n, n)
            sum_p += p
            weighted_q += p * value_sum[c] / n
    mixed = raw_value[node]
    if sum_n > 0:
        mixed = (mixed + sum_n * weighted_q / sum_p) / (sum_n + 1)
    lo = np.inf if minmax else -1.0
    hi = -np.inf if minmax else 1.0
    for i in range(k):
        c = first + i
        n = visits[c]
        q = value_sum[c] / n if n > 0 else mixed
        out[i] = q
        if minmax:
            lo = min(lo, q)
            hi = max(hi, q)
    scale = (c_visit + max_n) * c_scale / max(hi - lo, 1e-8)
    for i in range(k):
        out[i] = scale * (out[i] - lo)


@njit(cache=True)
def _improved_policy(t, g, node, c_visit, c_scale, minmax, out):
    """out[i] := softmax(logits + sigma(completed Q)) over the children of `node`."""
    k = t.n_children[g, node]
    first = t.first_child[g, node]
    _completed_sigma(t, g, node, c_visit, c_scale, minmax, out)
    top = -np.inf
    for i in range(k):
        out[i] += _logit(t.prior[g, first + i])
        top = max(top, out[i])
    total = 0.0
    for i in range(k):
        out[i] = np.exp(out[i] - top)
        total += out[i]
    for i in range(k):
        out[i] /= total


@njit(cache=True, inline="always")
def _pick_child_gumbel(t, g, node, c_visit, c_scale, minmax):
    """Below the root: argmax of pi'(a) - N(a) / (1 + sum N), pi' the improved policy
    (mctx's deterministic non-root selection: visits come to follow pi'), the first on ties.

    The improved policy's softmax is taken over the visited children alone plus one term for
    all the unvisited ones, which share their completed Q (the mixed value) and so sigma:
    their share of the normaliser is e^(sigma - top) * sum of their priors, and the best of
    them is the one with the largest prior. One pass over the children notes the visited
    ones (`t.visited`), the later passes read only those, and a visit costs a log and an exp
    per visited child, not per child (`_improved_policy` spells the whole rule out)."""
    visits = t.visits[g]
    value_sum = t.value_sum[g]
    prior = t.prior[g]
    first_child = t.first_child[g]
    n_children = t.n_children[g]
    raw_value = t.raw_value[g]
    first = first_child[node]
    k = n_children[node]
    visited = t.visited[g]
    n_visited = 0
    sum_n = 0
    max_n = 0
    sum_p = 0.0
    weighted_q = 0.0
    unvisited_mass = 0.0
    best_unvisited = -1
    best_prior = -1.0
    for i in range(k):
        c = first + i
        n = visits[c]
        if n > 0:
            p = max(prior[c], TINY_PRIOR)
            sum_n += n
            max_n = max(max_n, n)
            sum_p += p
            weighted_q += p * value_sum[c] / n
            visited[n_visited] = c
            n_visited += 1
        else:
            unvisited_mass += max(prior[c], TINY_PRIOR)
            if prior[c] > best_prior:
                best_prior = prior[c]
                best_unvisited = i
    mixed = raw_value[node]
    if sum_n > 0:
        mixed = (mixed + sum_n * weighted_q / sum_p) / (sum_n + 1)
    lo = np.inf if minmax else -1.0
    hi = -np.inf if minmax else 1.0
    if minmax:
        if best_unvisited >= 0:
            lo = min(lo, mixed)
            hi = max(hi, mixed)
        for j in range(n_visited):
            c = visited[j]
            lo = min(lo, value_sum[c] / visits[c])
            hi = max(hi, value_sum[c] / visits[c])
    scale = (c_visit + max_n) * c_scale / max(hi - lo, 1e-8)
    sigma_unvisited = scale * (mixed - lo)
    top = -np.inf
    if best_unvisited >= 0:
        top = sigma_unvisited + _logit(best_prior)
    for j in range(n_visited):
        c = visited[j]
        top = max(top, scale * (value_sum[c] / visits[c] - lo) + _logit(prior[c]))
    total = 0.0
    if best_unvisited >= 0:
        total = unvisited_mass * np.exp(sigma_unvisited - top)
    for j in range(n_visited):
        c = visited[j]
        total += np.exp(scale * (value_sum[c] / visits[c] - lo)
                        + _logit(prior[c]) - top)
    best = -1  # the first in child order on ties
    best_score = -np.inf
    for j in range(n_visited):
        c = visited[j]
        n = visits[c]
        x = scale * (value_sum[c] / n - lo) + _logit(prior[c])
        score = np.exp(x - top) / total - n / (1.0 + sum_n)
        if score > best_score:
            best_score = score
            best = c
    if best_unvisited >= 0:
        c = first + best_unvisited
        score = np.exp(sigma_unvisited + _logit(best_prior) - top) / total
        if score > best_score or (score == best_score and c < best):
            best = c
    return first if best < 0 else best


@njit(cache=True)
def _start_halving(t, g, max_considered):
    """Game g's first descent of this search: note the root children's visits (a reused
    root already has some) and the halving schedule of m = min(k, max_considered, n)."""
    first = t.first_child[g, 0]
    k = t.n_children[g, 0]
    for i in range(k):
        t.root_base[g, i] = t.visits[g, first + i]
        t.root_logit[g, i] = _logit(t.prior[g, first + i])  # the priors are final (noise)
    n = t.sims_target[g]
    m = min(k, max_considered, n)
    halving_schedule(m, n, t.schedule[g])
    t.considered[g] = m
    t.halving_ready[g] = True


@njit(cache=True)
def _root_scores(t, g, c_visit, c_scale, minmax, with_noise, out):
    """out[i] := g_i + logit_i + sigma_i of the i-th root child (g_i = 0 without noise)."""
    first = t.first_child[g, 0]
    _completed_sigma(t, g, 0, c_visit, c_scale, minmax, out)
    for i in range(t.n_children[g, 0]):
        out[i] = max(-1e9, out[i] + _logit(t.prior[g, first + i])
                     + (t.gumbel[g, i] if with_noise else 0.0))


@njit(cache=True, inline="always")
def _pick_root_gumbel(t, g, c_visit, c_scale, minmax):
    """At the root: among the children with exactly the schedule's visit count for this
    simulation (new visits of this search), the one with the largest g + logit + sigma.
    Phase one (count 0) thus visits the Gumbel-top-m children, the later phases halve them."""
    visits = t.visits[g]
    first_child = t.first_child[g]
    n_children = t.n_children[g]
    root_base = t.root_base[g]
    root_logit = t.root_logit[g]
    gumbel = t.gumbel[g]
    first = first_child[0]
    k = n_children[0]
    want = t.schedule[g, t.sims_done[g]]
    score = t.scratch[g]
    _completed_sigma(t, g, 0, c_visit, c_scale, minmax, score)
    for i in range(k):  # `_root_scores` with the log priors taken once per search
        score[i] = max(-1e9, score[i] + root_logit[i] + gumbel[i])
    best = -1
    best_score = -np.inf
    for i in range(k):
        if visits[first + i] - root_base[i] == want and score[i] > best_score:
            best_score = score[i]
            best = i
    if best < 0:  # not reached while every simulation adds one root visit; be safe
        for i in range(k):
            if score[i] > best_score:
                best_score = score[i]
                best = i
    return first + best


@njit(cache=True)
def _root_action(t, g, c_visit, c_scale, minmax, with_noise):
    """The move a Gumbel search chose: among the root children with the most new visits
    (those sequential halving kept), the largest (g +) logit + sigma(completed Q)."""
    first = t.first_child[g, 0]
    k = t.n_children[g, 0]
    if first == UNEXPANDED or k == 0:
        return -1
    score = t.scratch[g]
    _root_scores(t, g, c_visit, c_scale, minmax, with_noise, score)
    most = -1
    for i in range(k):
        most = max(most, t.visits[g, first + i] - t.root_base[g, i])
    best = 0
    best_score = -np.inf
    for i in range(k):
        if t.visits[g, first + i] - t.root_base[g, i] == most and score[i] > best_score:
            best_score = score[i]
            best = i
    return t.move[g, first + best]


@njit(cache=True)
def _all_root_actions(t, games, c_visit, c_scale, minmax, with_noise, out):
    for i in range(games.shape[0]):
        out[i] = _root_action(t, games[i], c_visit, c_scale, minmax, with_noise[i])


@njit(cache=True)
def _all_root_policies(t, games, c_visit, c_scale, minmax, out):
    """out[i] := the improved policy of game games[i]'s root, by move (0 off its children)."""
    for j in range(games.shape[0]):
        g = games[j]
        out[j, :] = 0.0
        first = t.first_child[g, 0]
        if first == UNEXPANDED:
            continue
        pi = t.scratch[g]
        _improved_policy(t, g, 0, c_visit, c_scale, minmax, pi)
        for i in range(t.n_children[g, 0]):
            out[j, t.move[g, first + i]] = pi[i]


@njit(cache=True, inline="always")
def _backup_path(t, g, path, depth, value, score, virtual):
    """Add `value` (the leaf's side to move's view, its score utility `score` included) along
    `path` (`depth` nodes, root first), flipping sign per ply, and `score` to `score_sum`.
    `virtual` > 0: the path already counts its visits and that virtual loss
    (`_select_leaves`), which the value replaces."""
    visits = t.visits[g]
    value_sum = t.value_sum[g]
    score_sum = t.score_sum[g]
    scored = score != 0.0  # adding 0 changes nothing: the search without the utility skips it
    v = -value
    u = -score
    for i in range(depth - 1, -1, -1):
        node = path[i]
        if virtual > 0:
            value_sum[node] += v + virtual
        else:
            visits[node] += 1
            value_sum[node] += v
        if scored:
            score_sum[node] += u
        v = -v
        u = -u


@njit(cache=True, inline="always")
def _backup(t, g, value, score):
    """Add `value` (leaf's side to move's view, `score` its score utility part) along game
    g's path, flipping sign per ply."""
    _backup_path(t, g, t.path[g], t.depth[g], value, score, 0.0)


TWO_OVER_PI = 2.0 / np.pi


@njit(cache=True, inline="always")
def _score_term(s, depth, center, w_static, w_dynamic, scale):
    """The score utility of a node at `depth` (1: the root) whose side to move the net (or
    the rules) puts `s` ahead, in margin / N (KataGo's, with the score's spread taken as 0):
    w_static * 2/pi * atan(s / 2) + w_dynamic * 2/pi * atan((s - c) / scale), c the root's
    `center` seen from that side. 0 when both weights are; a score that is not finite adds 0."""
    if (w_static == 0.0 and w_dynamic == 0.0) or not np.isfinite(s):
        return 0.0
    u = w_static * TWO_OVER_PI * np.arctan(s / 2.0)
    if w_dynamic != 0.0:
        c = center if depth % 2 == 1 else -center
        u += w_dynamic * TWO_OVER_PI * np.arctan((s - c) / scale)
    return u


@njit(cache=True, inline="always")
def _score_center(s, zero_weight, scale):
    """KataGo's dynamic centre for a root scored `s`: s pulled toward 0 by `zero_weight` of
    it, by at most `scale`."""
    if not np.isfinite(s):
        return 0.0
    return s - min(max(zero_weight * s, -scale), scale)


@njit(cache=True, inline="always")
def _terminal_score(b, g):
    """The final margin / N of game g, from its side to move's view (komi included)."""
    n = np.sqrt(np.float64(b.stones.shape[1]))
    return fastgo.score(b, g) * float(b.info[g, fastgo.TO_PLAY]) / n


@njit(cache=True)
def _rescore(t, g, center, w_static, w_dynamic, scale):
    """Game g's tree with the dynamic centre moved to `center`: every node's score part of W
    (and of its raw value) computed again from the scores of the evaluations below it.

    A node's own evaluations are its visits that went to no child (its expansion, a finished
    game, a full tree's re-evaluation), each worth its `raw_score`'s term; children have
    larger indices than their parent, so one backward pass sums them bottom-up."""
    size = t.size[g]
    visits = t.visits[g]
    value_sum = t.value_sum[g]
    score_sum = t.score_sum[g]
    raw_value = t.raw_value[g]
    raw_score = t.raw_score[g]
    first_child = t.first_child[g]
    n_children = t.n_children[g]
    old_center = t.score_center[g]
    depth = np.ones(size, np.int32)
    for i in range(size):
        first = first_child[i]
        if first != UNEXPANDED:
            for c in range(first, first + n_children[i]):
                depth[c] = depth[i] + 1
    new_sum = np.zeros(size, np.float64)
    for i in range(size - 1, -1, -1):
        n = visits[i]
        if n == 0:
            continue
        own = n
        below = 0.0
        first = first_child[i]
        if first != UNEXPANDED:
            for c in range(first, first + n_children[i]):
                own -= visits[c]
                below += new_sum[c]
        term = _score_term(raw_score[i], depth[i], center, w_static, w_dynamic, scale)
        new_sum[i] = -own * term - below
        if first != UNEXPANDED:
            raw_value[i] += term - _score_term(raw_score[i], depth[i], old_center, w_static,
                                               w_dynamic, scale)
        value_sum[i] += new_sum[i] - score_sum[i]
        score_sum[i] = new_sum[i]
    t.score_center[g] = center


@njit(cache=True, inline="always")
def _terminal_value(b, g):
    """+1/-1/0 by the final score, from the view of game g's side to move."""
    s = fastgo.score(b, g)
    if s == 0:
        return 0.0
    color = float(b.info[g, fastgo.TO_PLAY])
    return color if s > 0 else -color


@njit(cache=True, inline="always")
def _terminal_term(t, b, g, leaf_row, path, depth, w_static, w_dynamic, scale):
    """The score utility of game g's finished leaf (board row `leaf_row`, the last node of
    `path`), by the rules' margin; noted as the node's `raw_score`."""
    if w_static == 0.0 and w_dynamic == 0.0:
        return 0.0
    s = _terminal_score(b, leaf_row)
    t.raw_score[g, path[depth - 1]] = s
    return _score_term(s, depth, t.score_center[g], w_static, w_dynamic, scale)


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


@njit(cache=True, inline="always")
def _descend(t, b, g, leaf_row, path, c_puct, fpu_reduction, gumbel, c_visit, c_scale, minmax,
             max_considered):
    """Walk game g's tree from the root to an unexpanded node, replaying the moves on board
    row `leaf_row` (a copy of the root position) and writing the nodes to `path`, root first.
    Returns the path's length."""
    first_child = t.first_child[g]
    move = t.move[g]
    fastgo.copy_game(b, g, leaf_row)
    node = 0
    path[0] = 0
    depth = 1
    while first_child[node] != UNEXPANDED:
        if not gumbel:
            node = _pick_child(t, g, node, c_puct, fpu_reduction)
        elif node == 0:
            if not t.halving_ready[g]:
                _start_halving(t, g, max_considered)
            node = _pick_root_gumbel(t, g, c_visit, c_scale, minmax)
        else:
            node = _pick_child_gumbel(t, g, node, c_visit, c_scale, minmax)
        fastgo.play_known_legal(b, leaf_row, move[node])  # legal when expanded
        path[depth] = node
        depth += 1
    return depth


@njit(cache=True)
def _select(t, b, history, planes, legal, slot_game, early_pass, w_static, w_dynamic,
            score_scale, c_puct, fpu_reduction, gumbel, c_visit, c_scale, minmax,
            max_considered):
    """Pick one leaf in every searching game; write its planes and legal moves to a slot.

    Game g's root position is row g of `b`; row G (scratch, shared by every game) is
    overwritten with each leaf position in turn. Leaves where the game is over are backed up
    here. Returns the slots used.
    `gumbel`: Gumbel MuZero's rules (sequential halving at the root, the improved-policy
    rule below it) instead of PUCT.
    """
    n_slots = 0
    n_games = t.size.shape[0]
    leaf_row = n_games
    for g in range(n_games):
        if t.sims_done[g] >= t.sims_target[g]:
            continue
        depth = _descend(t, b, g, leaf_row, t.path[g], c_puct, fpu_reduction, gumbel, c_visit,
                         c_scale, minmax, max_considered)
        t.depth[g] = depth
        if fastgo.is_over(b, leaf_row):
            if depth == 1:  # the root itself is over: nothing to search
                t.sims_done[g] = t.sims_target[g]
                continue
            u = _terminal_term(t, b, g, leaf_row, t.path[g], depth, w_static, w_dynamic,
                               score_scale)
            _backup(t, g, _terminal_value(b, leaf_row) + u, u)
            t.sims_done[g] += 1
            continue
        fastgo.legal_mask(b, leaf_row, legal[n_slots])
        if not early_pass:
            _drop_early_pass(b, leaf_row, legal[n_slots])
        write_planes(b, leaf_row, history, planes[n_slots])
        slot_game[n_slots] = g
        n_slots += 1
    return n_slots


@njit(cache=True, inline="always")
def _expand(t, g, leaf, priors, legal, value, scored):
    """Give `leaf` its legal moves as children with the net's priors (unless it has children
    already or the tree is full) and note its raw value. Returns True if it was expanded.
    `scored`: the score utility is on (without it `score_sum` is never written, so stays 0)."""
    visits = t.visits[g]
    value_sum = t.value_sum[g]
    prior = t.prior[g]
    move = t.move[g]
    first_child = t.first_child[g]
    n_children = t.n_children[g]
    raw_value = t.raw_value[g]
    n_moves = legal.shape[0]
    k = 0
    total = 0.0
    for m in range(n_moves):
        if legal[m]:
            k += 1
            total += max(priors[m], 0.0)
    if first_child[leaf] != UNEXPANDED or t.size[g] + k > t.visits.shape[1]:
        # HACK: a full tree leaves the leaf unexpanded (it is evaluated again next time
        # it is reached); the capacity makes this rare, see Mcts.__init__.
        return False
    first = t.size[g]
    c = first
    for m in range(n_moves):
        if legal[m]:
            p = max(priors[m], 0.0) / total if total > 0 else 1.0 / k
            visits[c] = 0
            value_sum[c] = 0.0
            if scored:  # raw_score: set when the node is evaluated
                t.score_sum[g, c] = 0.0
            prior[c] = p
            move[c] = m
            first_child[c] = UNEXPANDED
            n_children[c] = 0
            c += 1
    first_child[leaf] = first
    n_children[leaf] = k
    t.size[g] = first + k
    raw_value[leaf] = value
    return True


@njit(cache=True, inline="always")
def _leaf_term(t, g, leaf, depth, score, w_static, w_dynamic, scale, zero_weight):
    """The score utility of an evaluated leaf the net scores `score`, noted as its
    `raw_score`; the root's own evaluation first sets the game's dynamic centre."""
    if w_static == 0.0 and w_dynamic == 0.0:
        return 0.0
    s = score if np.isfinite(score) else 0.0
    t.raw_score[g, leaf] = s
    if leaf == 0:
        t.score_center[g] = _score_center(s, zero_weight, scale)
    return _score_term(s, depth, t.score_center[g], w_static, w_dynamic, scale)


@njit(cache=True)
def _expand_backup(t, n_slots, slot_game, priors, values, scores, legal, root_expanded,
                   w_static, w_dynamic, score_scale, zero_weight):
    """Expand each slot's leaf with its legal moves' priors and back up its value (with its
    score utility, from scores[s], when that is on).

    root_expanded[g] is set when game g's root got its children in this call.
    """
    scored = w_static != 0.0 or w_dynamic != 0.0
    for s in range(n_slots):
        g = slot_game[s]
        depth = t.depth[g]
        leaf = t.path[g, depth - 1]
        v = min(max(values[s], -1.0), 1.0)
        u = _leaf_term(t, g, leaf, depth, scores[s], w_static, w_dynamic, score_scale,
                       zero_weight)
        if _expand(t, g, leaf, priors[s], legal[s], v + u, scored) and leaf == 0:
            root_expanded[g] = True
        _backup(t, g, v + u, u)
        if leaf != 0:
            t.sims_done[g] += 1


VIRTUAL_LOSS = 1.0
"""What a leaf in flight counts as until its value comes back (`_select_leaves`): a visit
and a loss for the player who moved into each node of its path."""


@njit(cache=True)
def _select_leaves(t, b, g, k, history, planes, legal, paths, depths, early_pass, w_static,
                   w_dynamic, score_scale, c_puct, fpu_reduction, gumbel, c_visit, c_scale,
                   minmax, max_considered):
    """Up to k leaves of game g's tree for one net call, each walked with the ones before it
    in flight: every node on a chosen path counts a visit and a virtual loss at once, so the
    next walk prefers other moves (KataGo's and Leela Zero's leaf batching; Gumbel's
    sequential halving counts the visits in flight as its schedule's). Slot s gets the
    leaf's planes, legal moves and path (`paths[s]`, `depths[s]` nodes). Leaves where the
    game is over are backed up here; a fresh root is evaluated alone. Returns the slots used;
    `t.sims_done[g]` already counts them."""
    leaf_row = t.size.shape[0]
    n_slots = 0
    while n_slots < k and t.sims_done[g] < t.sims_target[g]:
        path = paths[n_slots]
        depth = _descend(t, b, g, leaf_row, path, c_puct, fpu_reduction, gumbel, c_visit,
                         c_scale, minmax, max_considered)
        if fastgo.is_over(b, leaf_row):
            if depth == 1:  # the root itself is over: nothing to search
                t.sims_done[g] = t.sims_target[g]
                break
            u = _terminal_term(t, b, g, leaf_row, path, depth, w_static, w_dynamic,
                               score_scale)
            _backup_path(t, g, path, depth, _terminal_value(b, leaf_row) + u, u, 0.0)
            t.sims_done[g] += 1
            continue
        fastgo.legal_mask(b, leaf_row, legal[n_slots])
        if not early_pass:
            _drop_early_pass(b, leaf_row, legal[n_slots])
        write_planes(b, leaf_row, history, planes[n_slots])
        depths[n_slots] = depth
        n_slots += 1
        if depth == 1:  # a fresh root: its children come with this evaluation
            break
        for i in range(depth):
            node = path[i]
            t.visits[g, node] += 1
            t.value_sum[g, node] -= VIRTUAL_LOSS
        t.sims_done[g] += 1
    return n_slots


@njit(cache=True)
def _expand_backup_leaves(t, g, n_slots, paths, depths, priors, values, scores, legal,
                          w_static, w_dynamic, score_scale, zero_weight):
    """`_expand_backup` for the leaves of `_select_leaves`: expand each, then replace its
    path's virtual losses with its value. Two slots may hold the same leaf (every other move
    looked worse even with the loss): the first expands it, both back up. Returns True if
    the root got its children."""
    root_expanded = False
    scored = w_static != 0.0 or w_dynamic != 0.0
    for s in range(n_slots):
        depth = depths[s]
        leaf = paths[s, depth - 1]
        v = min(max(values[s], -1.0), 1.0)
        u = _leaf_term(t, g, leaf, depth, scores[s], w_static, w_dynamic, score_scale,
                       zero_weight)
        if _expand(t, g, leaf, priors[s], legal[s], v + u, scored) and leaf == 0:
            root_expanded = True
        _backup_path(t, g, paths[s], depth, v + u, u, VIRTUAL_LOSS if depth > 1 else 0.0)
    return root_expanded


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
def _reroot(t, g, new_root, keep_limit):
    """Make `new_root`'s subtree game g's whole tree, renumbered breadth first from 0, if it
    has at most `keep_limit` nodes; returns False (the tree unchanged) if it has more.

    One breadth-first walk both counts the subtree and orders it; each field is then
    gathered into a block of the subtree's size and copied back to the row's front."""
    old = np.empty(min(t.size[g], keep_limit + 1), np.int32)  # old index of each new node
    first_child = t.first_child[g]
    n_children = t.n_children[g]
    old[0] = new_root
    count = 1
    head = 0
    while head < count:
        first = first_child[old[head]]
        if first != UNEXPANDED:
            k = n_children[old[head]]
            if count + k > keep_limit:
                return False
            for c in range(first, first + k):
                old[count] = c
                count += 1
        head += 1
    new_first = np.empty(count, np.int32)  # the children stay one block, in the same order
    nxt = 1
    for i in range(count):
        first = first_child[old[i]]
        if first == UNEXPANDED:
            new_first[i] = UNEXPANDED
        else:
            new_first[i] = nxt
            nxt += n_children[old[i]]
    _gather_front(t.visits[g], old, count)
    _gather_front(t.value_sum[g], old, count)
    _gather_front(t.prior[g], old, count)
    _gather_front(t.move[g], old, count)
    _gather_front(n_children, old, count)
    _gather_front(t.raw_value[g], old, count)
    _gather_front(t.score_sum[g], old, count)
    _gather_front(t.raw_score[g], old, count)
    for i in range(count):
        first_child[i] = new_first[i]
    t.move[g, 0] = -1
    t.prior[g, 0] = 1.0
    t.size[g] = count
    t.score_center[g] = -t.score_center[g]  # the same centre, seen from the new root's side
    return True


@njit(cache=True, inline="always")
def _gather_front(row, old, count):
    """row[:count] := row[old[:count]] (through a copy: the two ranges may overlap)."""
    block = np.empty(count, row.dtype)
    for i in range(count):
        block[i] = row[old[i]]
    for i in range(count):
        row[i] = block[i]


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
        if not (child >= 0 and t.visits[g, child] > 0 and _reroot(t, g, child, keep_limit)):
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
        mcts_cfg: `cfg.mcts` (algorithm, c_puct, fpu_reduction, dirichlet_*, gumbel_*,
            reuse_tree, simulations).
        history: the net's history (input planes C = 2 * history + 1).
        liberties: the net also reads the 6 liberty planes (`net.liberties`).
        batch_size: most positions per evaluate call.
        leaf_batch: leaves of the one game (n_games must be 1) evaluated together in one
            call, with virtual loss (`_select_leaves`); 1: one leaf per game and step.
        simulations: simulations per move (default mcts_cfg.simulations).
        reuse_tree: keep the chosen child's subtree (default mcts_cfg.reuse_tree).
        early_pass: False: the search may pass only right after the opponent's pass or when
            every legal point fills an own single-point eye (self-play; see "Passes").
        planes_dtype: the dtype of the planes `evaluate` receives (float32, or uint8 for an
            evaluator that takes them compact; see above).

    Attributes: `boards` (fastgo.Boards, row g = game g's root position, row G the
    leaves' scratch row), `tree` (Tree).
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
        liberties: bool = False,
        leaf_batch: int = 1,
        planes_dtype: type | str = np.float32,
    ):
        if leaf_batch > 1 and n_games != 1:
            raise ValueError(f"leaf_batch {leaf_batch} searches one game; got {n_games} games")
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
        self.is_gumbel = mcts_cfg.algorithm == "gumbel"
        self._minmax = mcts_cfg.gumbel_q_normalization == "minmax"
        # the selection rule's constants, last in every selecting kernel's arguments
        self._rules = (np.float32(mcts_cfg.c_puct), np.float32(mcts_cfg.fpu_reduction),
                       self.is_gumbel, np.float32(mcts_cfg.gumbel_c_visit),
                       np.float32(mcts_cfg.gumbel_c_scale), self._minmax,
                       mcts_cfg.gumbel_max_considered)
        # the score utility's weights and scale, before the rules in the kernels' arguments
        self._score = (np.float32(mcts_cfg.score_utility_static),
                       np.float32(mcts_cfg.score_utility_dynamic),
                       np.float32(mcts_cfg.score_utility_scale))
        self._zero_weight = np.float32(mcts_cfg.score_utility_zero_weight)
        self.wants_score = mcts_cfg.wants_score
        self._missing_scores_logged = False
        move_cap = go_cfg.move_cap
        # rows [0, G): the root positions; row G: the scratch row every leaf is built in
        self.boards = fastgo.new_boards(n_games + 1, n, go_cfg.komi, move_cap, history)
        # One search expands at most simulations + 1 leaves of at most A + 1 children each;
        # with reuse, a kept subtree may be as large again (larger ones are dropped).
        per_search = (self.simulations + 1) * self.n_moves + 1
        self._keep_limit = per_search if self.reuse_tree else 0
        capacity = per_search + self._keep_limit
        self.tree = new_tree(
            n_games, capacity, max_depth(n, move_cap), n_moves=self.n_moves,
            schedule_len=self.simulations if self.is_gumbel else 1,
        )
        channels = features.num_planes(history, liberties)
        self.leaf_batch = max(1, leaf_batch)
        slots = max(n_games, self.leaf_batch)
        self._planes = np.zeros((slots, channels, n, n), planes_dtype)
        self._legal = np.zeros((slots, self.n_moves), np.bool_)
        self._paths = np.zeros((self.leaf_batch, self.tree.path.shape[1]), np.int32)
        self._depths = np.zeros(self.leaf_batch, np.int32)
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
        return bool(fastgo.rows_over(self.boards, g))

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
        simulations: int | Sequence[int] | np.ndarray | None = None,
    ) -> None:
        """Begin a search of `simulations` new simulations in each of `games` (one number
        for all, or one per game).

        rngs[i], when given, draws the root noise of games[i]: Dirichlet noise (PUCT) or the
        Gumbel noise g (gumbel); None: no noise (g = 0).
        """
        games = np.asarray(games, np.int64).reshape(-1)
        sims = np.broadcast_to(
            np.asarray(self.simulations if simulations is None else simulations, np.int64),
            games.shape,
        )
        if self.is_gumbel and len(sims) and sims.max() > self.tree.schedule.shape[1]:
            width = int(sims.max())
            self.tree = self.tree._replace(schedule=np.zeros((self.n_games, width), np.int32))
        t = self.tree
        for i, g in enumerate(games.tolist()):
            t.sims_done[g] = 0
            t.sims_target[g] = sims[i]
            if self._score[1] != 0 and t.first_child[g, 0] != UNEXPANDED:
                self._recenter(g)
            rng = None if rngs is None else rngs[i]
            if self.is_gumbel:
                t.halving_ready[g] = False
                if rng is None:
                    t.gumbel[g] = 0.0
                else:
                    t.gumbel[g] = rng.gumbel(size=self.n_moves)
                continue
            self._rngs[g] = rng
            self._noise_pending[g] = rng is not None and self.cfg.dirichlet_fraction > 0
            if self._noise_pending[g] and t.first_child[g, 0] != UNEXPANDED:
                self._add_noise(g)

    def _recenter(self, g: int) -> None:
        """A kept root's dynamic score centre from its own score (KataGo's, by the root's net
        score rather than the tree's mean), the tree's score terms redone if it moved."""
        t = self.tree
        center = _score_center(np.float64(t.raw_score[g, 0]), self._zero_weight,
                               self._score[2])
        if np.float32(center) != t.score_center[g]:
            _rescore(t, g, np.float32(center), *self._score)

    def stop_search(self, games: Sequence[int] | np.ndarray) -> None:
        """End the searches of `games` where they are (a time budget ran out): their trees
        keep the simulations done, and `select_moves` chooses from them."""
        t = self.tree
        for g in np.asarray(games, np.int64).reshape(-1).tolist():
            t.sims_target[g] = t.sims_done[g]

    def is_searching(self) -> bool:
        t = self.tree
        return bool(np.any(t.sims_done < t.sims_target))

    def searching(self) -> np.ndarray:
        """bool [G]: the games whose search has simulations left."""
        t = self.tree
        return t.sims_done < t.sims_target

    def step(self, evaluators: Sequence[Evaluate], owner: np.ndarray | None = None) -> int:
        """One simulation in every searching game; returns the positions evaluated.

        Game g's leaves go to evaluators[owner[g]] (owner None: all to evaluators[0]), in
        calls of at most batch_size positions. With `leaf_batch` > 1: up to that many
        simulations of the one game instead.
        """
        if self.leaf_batch > 1:
            return self._step_leaves(evaluators[0])
        t = self.tree
        n = _select(t, self.boards, self.history, self._planes, self._legal, self._slot_game,
                    self.early_pass, *self._score, *self._rules)
        if n == 0:
            return 0
        priors = np.empty((n, self.n_moves), np.float32)
        values = np.empty(n, np.float32)
        scores = np.zeros(n, np.float32)
        if owner is None or len(evaluators) == 1:
            self._evaluate(evaluators[0], np.arange(n), priors, values, scores)
        else:
            who = owner[self._slot_game[:n]]
            for k, evaluate in enumerate(evaluators):
                slots = np.flatnonzero(who == k)
                if len(slots):
                    self._evaluate(evaluate, slots, priors, values, scores)
        self._root_expanded[:] = False
        _expand_backup(t, n, self._slot_game, priors, values, scores, self._legal,
                       self._root_expanded, *self._score, self._zero_weight)
        for g in np.flatnonzero(self._root_expanded & self._noise_pending):
            self._add_noise(int(g))
        return n

    def _step_leaves(self, evaluate: Evaluate) -> int:
        """Up to `leaf_batch` simulations of game 0, their leaves evaluated together."""
        t = self.tree
        n = _select_leaves(t, self.boards, 0, self.leaf_batch, self.history, self._planes,
                           self._legal, self._paths, self._depths, self.early_pass,
                           *self._score, *self._rules)
        if n == 0:
            return 0
        priors = np.empty((n, self.n_moves), np.float32)
        values = np.empty(n, np.float32)
        scores = np.zeros(n, np.float32)
        self._evaluate(evaluate, np.arange(n), priors, values, scores)
        if (_expand_backup_leaves(t, 0, n, self._paths, self._depths, priors, values, scores,
                                  self._legal, *self._score, self._zero_weight)
                and self._noise_pending[0]):
            self._add_noise(0)
        return n

    def _evaluate(self, evaluate: Evaluate, slots: np.ndarray, priors, values,
                  scores) -> None:
        """Evaluate the given batch slots in calls of at most batch_size positions (scores
        stay 0 where the evaluator returns none)."""
        contiguous = len(slots) == slots[-1] - slots[0] + 1
        for lo in range(0, len(slots), self.batch_size):
            part = slots[lo : lo + self.batch_size]
            at = slice(int(part[0]), int(part[-1]) + 1) if contiguous else part
            out = evaluate(self._planes[at], self._legal[at])
            priors[at] = out[0]
            values[at] = out[1]
            if len(out) > 2:
                scores[at] = out[2]
            elif self.wants_score and not self._missing_scores_logged:
                self._missing_scores_logged = True
                log.warning("the score utility is on but the evaluator returns no scores "
                            "(a net without a score head?): its leaves score 0")
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
        simulations: int | Sequence[int] | np.ndarray | None = None,
    ) -> np.ndarray:
        """Search `games` (default all) to completion; returns root visits [len(games), A+1].

        The move the search chose is `select_moves(games)`, its policy target
        `policy_targets(games)`."""
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

    def root_priors(self, games: Sequence[int] | np.ndarray) -> np.ndarray:
        """float32 [len(games), A + 1]: the priors of each game's root children by move (the
        net's policy over the legal moves, with PUCT's root noise when the search drew it);
        zeros for a root without children."""
        t = self.tree
        out = np.zeros((len(games), self.n_moves), np.float32)
        for i, g in enumerate(np.asarray(games, np.int64).tolist()):
            first, k = int(t.first_child[g, 0]), int(t.n_children[g, 0])
            if first >= 0 and k > 0:
                out[i, t.move[g, first:first + k]] = t.prior[g, first:first + k]
        return out

    def policy_targets(self, games: Sequence[int] | np.ndarray) -> np.ndarray:
        """float32 [len(games), A + 1]: what the policy learns from each game's search.

        PUCT: the root visits, normalised. Gumbel: the improved policy
        softmax(logits + sigma(completed Q)) over the root's children (every legal move).
        A root without children (a finished game) gives a row of zeros.
        """
        games = np.ascontiguousarray(games, np.int64)
        if self.is_gumbel:
            out = np.zeros((len(games), self.n_moves), np.float32)
            _all_root_policies(
                self.tree, games, np.float32(self.cfg.gumbel_c_visit),
                np.float32(self.cfg.gumbel_c_scale), self._minmax, out,
            )
            return out
        visits = self.root_visits(games).astype(np.float32)
        total = visits.sum(axis=1, keepdims=True)
        return np.divide(visits, total, out=np.zeros_like(visits), where=total > 0)

    def select_moves(
        self,
        games: Sequence[int] | np.ndarray,
        rngs: Sequence[np.random.Generator] | None = None,
        sample: np.ndarray | None = None,
    ) -> np.ndarray:
        """int64 [len(games)]: the move each game's finished search chose.

        PUCT: where sample[i], drawn in proportion to visits with rngs[i], else the most
        visited (ties broken by rngs[i], or the first without rngs; `choose_moves`).
        Gumbel: among the children sequential halving kept (the most new visits), the largest
        g + logit + sigma(completed Q), with the root's Gumbel noise g where sample[i] and
        g = 0 elsewhere (a search without noise has g = 0 anyway).
        """
        games = np.ascontiguousarray(games, np.int64)
        sample = np.zeros(len(games), bool) if sample is None else np.asarray(sample, bool)
        if not self.is_gumbel:
            visits = self.root_visits(games)
            if rngs is None:
                assert not sample.any(), "sampling a move needs each game's generator"
                assert (visits.sum(1) > 0).all(), "a search must visit a child of the root"
                return visits.argmax(axis=1).astype(np.int64)
            return choose_moves(visits, rngs, sample)
        out = np.empty(len(games), np.int64)
        _all_root_actions(
            self.tree, games, np.float32(self.cfg.gumbel_c_visit),
            np.float32(self.cfg.gumbel_c_scale), self._minmax, np.ascontiguousarray(sample),
            out,
        )
        assert (out >= 0).all(), "a search must expand the root before it chooses a move"
        return out

    def root_children(self, g: int, pv_length: int = 12) -> list[tuple[int, int, float, float,
                                                                         list[int]]]:
        """Game g's root children with visits, most visited first: (move, visits, Q from the
        root's side to move, prior, principal variation from that move). The variation follows
        the most visited child at each node, at most `pv_length` moves, the move included."""
        t = self.tree
        first, count = int(t.first_child[g, 0]), int(t.n_children[g, 0])
        if first == UNEXPANDED:
            return []
        out = []
        for node in range(first, first + count):
            n = int(t.visits[g, node])
            if n == 0:
                continue
            q = (float(t.value_sum[g, node]) - float(t.score_sum[g, node])) / n
            out.append((int(t.move[g, node]), n, q,
                        float(t.prior[g, node]), self._variation(g, node, pv_length)))
        out.sort(key=lambda c: (-c[1], -c[2]))
        return out

    def _variation(self, g: int, node: int, length: int) -> list[int]:
        t = self.tree
        pv = [int(t.move[g, node])]
        while len(pv) < length and t.first_child[g, node] != UNEXPANDED:
            first, count = int(t.first_child[g, node]), int(t.n_children[g, node])
            visits = t.visits[g, first:first + count]
            if count == 0 or visits.max() == 0:
                break
            node = first + int(visits.argmax())
            pv.append(int(t.move[g, node]))
        return pv

    def root_values(self, games: Sequence[int] | np.ndarray) -> np.ndarray:
        """Mean search value of each game's root, from its side to move's view, float32."""
        games = np.asarray(games, np.int64)
        t = self.tree
        n = t.visits[games, 0]
        w = t.value_sum[games, 0].astype(np.float64) - t.score_sum[games, 0]
        return np.where(n > 0, -w / np.maximum(n, 1), 0.0).astype(np.float32)


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
