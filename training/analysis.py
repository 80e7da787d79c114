"""KataGo's JSON analysis protocol over our net and search: `python3 -m training.analysis --model
FILE` reads one JSON query per line on stdin and writes one JSON answer per analysed turn on
stdout, as KaTrain and batch-analysis tools expect from `katago analysis`.

    {"id": "a", "moves": [["B", "E5"], ["W", "C3"]], "rules": "chinese", "komi": 7,
     "boardXSize": 9, "boardYSize": 9, "analyzeTurns": [1, 2], "maxVisits": 200,
     "includeOwnership": true, "includePolicy": true, "reportDuringSearchEvery": 0.5}

answers, for each turn, `{"id", "turnNumber", "isDuringSearch", "moveInfos": [{"move",
"visits", "winrate", "scoreLead", "scoreMean", "prior", "lcb", "utility", "order", "pv"}],
"rootInfo": {"winrate", "scoreLead", "visits", "currentPlayer"}, "ownership", "policy"}`.
Win rates, score leads and ownership are from black's view (KataGo's example analysis config,
`reportAnalysisWinratesAs = BLACK`); `ownership` is N*N floats and `policy` N*N+1 (pass last,
-1 for an illegal move), row-major from the top left. Also understood: `initialStones`,
`initialPlayer`, `id`-only actions `{"action": "query_version"}`, `{"action": "terminate",
"terminateId": ...}` and `{"action": "clear_cache"}`. A query it cannot answer gets
`{"id", "error", "field"}` and nothing else; a value it clamps gets a `warning` line.

Concurrency: every turn of every query is a game of one batched search (`training.search.mcts.Mcts`
with `--slots` games, one network call per step for all of them), so queries sent together
are searched together: many queries cost little more per step than one. A turn is one search
of `maxVisits` simulations (at most `--max-visits`, which sizes the tree; with Gumbel one
sequential halving over all of them), stepped with the others and answered when it is done,
with `reportDuringSearchEvery` partial answers meanwhile (checked every `chunk` steps).

Bounds: a line is at most `MAX_LINE_BYTES`, a game at most 4 N*N moves, at most
`MAX_PENDING` turns wait; the rules must be area scoring (the net plays Tromp-Taylor with
positional superko).

It must not: keep state between queries beyond the search's arrays (no cache), or block the
reader: stdin is read by its own thread.
"""

from __future__ import annotations

import argparse
import json
import math
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from training.go.coords import BLACK, WHITE, from_gtp, to_gtp
from training.go.rules import IllegalMove, Position

VERSION = "azgo-0.1.0"
MAX_LINE_BYTES = 1 << 20
MAX_PENDING = 4096
AREA_RULES = {"tromp-taylor", "chinese", "chinese-ogs", "chinese-kgs", "aga", "bga",
              "new-zealand", "stone-scoring"}


class QueryError(ValueError):
    """A query field the engine cannot take; `field` names it."""

    def __init__(self, message: str, field_name: str):
        super().__init__(message)
        self.field = field_name


@dataclass
class Job:
    """One turn of one query: the position after `moves`, searched to `max_visits`."""

    query_id: str
    turn: int
    moves: list[int]
    position: Position
    max_visits: int
    report_every: float | None
    ownership: bool
    policy: bool
    slot: int = -1
    done: int = 0
    next_report: float = 0.0
    extra: dict = field(default_factory=dict)


def _color(text: Any, what: str) -> int:
    t = str(text).upper()
    if t in ("B", "BLACK"):
        return BLACK
    if t in ("W", "WHITE"):
        return WHITE
    raise QueryError(f"{what}: {text!r} is not B or W", what)


def parse_query(q: Any, size: int, max_visits: int) -> tuple[list[Job], list[str]]:
    """The jobs of one query, and warnings; QueryError names the field that is wrong."""
    if not isinstance(q, dict):
        raise QueryError("a query is a JSON object", "")
    qid = q.get("id")
    if not isinstance(qid, str) or not qid:
        raise QueryError("id must be a non-empty string", "id")
    warnings = []
    for key in ("boardXSize", "boardYSize"):
        if q.get(key, size) != size:
            raise QueryError(f"this model plays {size}x{size} only", key)
    rules = str(q.get("rules", "tromp-taylor")).lower()
    if rules not in AREA_RULES:
        raise QueryError(f"rules {rules!r}: only area scoring ({', '.join(sorted(AREA_RULES))})",
                         "rules")
    komi = q.get("komi", 7.5)
    if not isinstance(komi, (int, float)) or isinstance(komi, bool) or not math.isfinite(komi) \
            or abs(komi) > size * size:
        raise QueryError("komi must be a finite number", "komi")
    position = Position(size, komi=float(komi), max_moves=4 * size * size)
    setup = q.get("initialStones", [])
    moves_in = q.get("moves", [])
    for name, value in (("initialStones", setup), ("moves", moves_in)):
        if not isinstance(value, list) or len(value) > 4 * size * size:
            raise QueryError(f"{name} must be a list of at most {4 * size * size} [color, move]",
                             name)
    moves: list[int] = []

    def play(entry: Any, what: str) -> None:
        if not isinstance(entry, list) or len(entry) != 2:
            raise QueryError(f"{what}: each entry is [color, move]", what)
        color = _color(entry[0], what)
        try:
            move = from_gtp(str(entry[1]), size)
        except ValueError:
            raise QueryError(f"{what}: {entry[1]!r} is not a point of the board", what) from None
        try:
            if color != position.to_play:
                position.play(position.pass_move)
                moves.append(position.pass_move)
            position.play(move, color)
        except IllegalMove as e:
            raise QueryError(f"{what}: {entry[1]} is illegal ({e})", what) from None
        moves.append(move)

    for entry in setup:
        play(entry, "initialStones")
    start = len(moves)
    if "initialPlayer" in q and _color(q["initialPlayer"], "initialPlayer") != position.to_play:
        position.play(position.pass_move)
        moves.append(position.pass_move)
        start += 1
    for entry in moves_in:
        play(entry, "moves")
    turns = q.get("analyzeTurns", [len(moves_in)])
    if not isinstance(turns, list) or not turns or len(turns) > len(moves_in) + 1 or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= len(moves_in)
            for t in turns):
        raise QueryError(f"analyzeTurns must list turns from 0 to {len(moves_in)}",
                         "analyzeTurns")
    visits = q.get("maxVisits", min(max_visits, 500))
    if not isinstance(visits, int) or isinstance(visits, bool) or visits < 1:
        raise QueryError("maxVisits must be a positive integer", "maxVisits")
    if visits > max_visits:
        warnings.append(f"maxVisits {visits} is more than this engine's --max-visits "
                        f"{max_visits}: searching {max_visits}")
        visits = max_visits
    every = q.get("reportDuringSearchEvery")
    if every is not None and not (isinstance(every, (int, float)) and math.isfinite(every)
                                  and every > 0):
        raise QueryError("reportDuringSearchEvery must be a positive number of seconds",
                         "reportDuringSearchEvery")
    jobs = []
    for t in sorted(set(turns)):
        upto = start + t
        # the position after `upto` moves, for the heads: replayed from the empty board
        pos = Position(size, komi=float(komi), max_moves=4 * size * size)
        for m in moves[:upto]:
            pos.play(m)
        jobs.append(Job(qid, t, moves[:upto], pos, visits, every,
                        bool(q.get("includeOwnership", False)),
                        bool(q.get("includePolicy", False))))
    return jobs, warnings


class Analyzer:
    """Searches jobs in the slots of one batched search and writes their answers."""

    def __init__(self, model_path: str, cfg: Any, *, slots: int = 32, max_visits: int = 1000,
                 out: TextIO = sys.stdout, chunk: int = 16):
        import torch

        from configs import GoConfig
        from training.learn.net import load_model, make_evaluator
        from training.search.mcts import Mcts

        torch.set_num_threads(1)
        net, info = load_model(model_path)
        self.net = net.eval()
        self.size = info.board_size
        self.slots = slots
        self.max_visits = max_visits
        self.chunk = max(chunk, cfg.mcts.gumbel_max_considered if cfg.mcts.algorithm == "gumbel"
                         else chunk)
        n = self.size
        go_cfg = GoConfig(board_size=n, max_moves=4 * n * n)
        self.evaluate = make_evaluator(net, jit=cfg.net.inference, max_batch=slots)
        self.mcts = Mcts(slots, go_cfg, cfg.mcts, history=net.history, liberties=net.liberties,
                         batch_size=slots,
                         simulations=max_visits + self.chunk, reuse_tree=False,
                         early_pass=False)
        self.out = out
        self.lock = threading.Lock()
        self.pending: list[Job] = []
        self.active: dict[int, Job] = {}

    # -- output ------------------------------------------------------------------------------

    def write(self, obj: dict) -> None:
        with self.lock:
            self.out.write(json.dumps(obj, separators=(",", ":")) + "\n")
            self.out.flush()

    # -- input -------------------------------------------------------------------------------

    def take(self, line: str) -> None:
        """One input line: a query (its jobs queued), an action, or an error answer."""
        if len(line.encode()) > MAX_LINE_BYTES:
            self.write({"error": f"query longer than {MAX_LINE_BYTES} bytes", "field": ""})
            return
        try:
            q = json.loads(line)
        except ValueError as e:
            self.write({"error": f"could not parse JSON: {e}", "field": ""})
            return
        qid = q.get("id") if isinstance(q, dict) else None
        action = q.get("action") if isinstance(q, dict) else None
        if action is not None:
            self._action(q, qid, action)
            return
        try:
            jobs, warnings = parse_query(q, self.size, self.max_visits)
        except QueryError as e:
            self.write({"id": qid, "error": str(e), "field": e.field})
            return
        if len(self.pending) + len(jobs) > MAX_PENDING:
            self.write({"id": qid, "error": f"more than {MAX_PENDING} turns are waiting",
                        "field": "analyzeTurns"})
            return
        for w in warnings:
            self.write({"id": qid, "warning": w, "field": "maxVisits"})
        self.pending.extend(jobs)

    def _action(self, q: dict, qid: Any, action: Any) -> None:
        if action == "query_version":
            self.write({"id": qid, "action": action, "version": VERSION, "git_hash": ""})
        elif action == "clear_cache":
            self.write({"id": qid, "action": action})  # there is no cache to clear
        elif action == "terminate":
            target = q.get("terminateId")
            turns = q.get("turnNumbers")

            def hit(job: Job) -> bool:
                return job.query_id == target and (turns is None or job.turn in turns)

            self.pending = [j for j in self.pending if not hit(j)]
            for slot, job in list(self.active.items()):
                if hit(job):
                    self._finish(slot)
            self.write({"id": qid, "action": action, "terminateId": target,
                        "turnNumbers": turns})
        else:
            self.write({"id": qid, "error": f"unknown action {action!r}", "field": "action"})

    # -- search ------------------------------------------------------------------------------

    def _fill(self) -> None:
        free = [s for s in range(self.slots) if s not in self.active]
        while free and self.pending:
            job = self.pending.pop(0)
            slot = free.pop(0)
            self.mcts.reset_game(slot, job.moves, komi=job.position.komi)
            job.slot, job.done = slot, 0
            job.next_report = time.monotonic() + (job.report_every or math.inf)
            self.active[slot] = job
            if self.mcts.is_over(slot):
                self._finish(slot)
            else:  # one search of the whole budget: Gumbel halves over all of it
                self.mcts.start_search([slot], simulations=job.max_visits)

    def step(self) -> None:
        """`chunk` simulations of every active job's search, its leaves batched with the other
        jobs'; answers the jobs that are done, and reports on the others when they are due."""
        self._fill()
        if not self.active:
            return
        for _ in range(self.chunk):
            if not self.mcts.is_searching():
                break
            self.mcts.step([self.evaluate])
        now = time.monotonic()
        searching = self.mcts.searching()
        for s in sorted(self.active):
            job = self.active[s]
            job.done = int(self.mcts.tree.sims_done[s])
            if not searching[s]:
                self._finish(s)
            elif now >= job.next_report:
                job.next_report = now + job.report_every
                self.write(self._answer(job, during=True))

    def _finish(self, slot: int) -> None:
        self.mcts.stop_search([slot])
        job = self.active.pop(slot)
        self.write(self._answer(job, during=False))

    def _answer(self, job: Job, during: bool) -> dict:
        n, pos = self.size, job.position
        to_move = pos.to_play
        over = pos.is_over()
        children = [] if over else self.mcts.root_children(job.slot)
        chosen = None
        if children:
            chosen = int(self.mcts.select_moves([job.slot])[0])
            children.sort(key=lambda c: c[0] != chosen)
        heads = self._heads(pos, [c[0] for c in children])
        infos = []
        for order, (move, visits, q, prior, pv) in enumerate(children):
            winrate = (q + 1) / 2
            margin = 1.96 * math.sqrt(max(winrate * (1 - winrate), 0.0025) / visits)
            lead = heads["leads"][order] if heads["leads"] is not None else None
            info = {"move": to_gtp(move, n), "visits": visits,
                    "winrate": _black(winrate, to_move),
                    "prior": round(prior, 6), "lcb": _black(max(0.0, winrate - margin), to_move),
                    "utility": round((2 * winrate - 1) * to_move, 6), "order": order,
                    "pv": [to_gtp(m, n) for m in pv]}
            if lead is not None:
                info["scoreLead"] = info["scoreMean"] = round(lead * to_move, 4)
            infos.append(info)
        value = float(self.mcts.root_values([job.slot])[0]) if children else heads["value"]
        root = {"winrate": _black((value + 1) / 2, to_move),
                "visits": int(sum(c[1] for c in children)),
                "currentPlayer": "B" if to_move == BLACK else "W"}
        if heads["root_lead"] is not None:
            root["scoreLead"] = round(heads["root_lead"] * to_move, 4)
        out = {"id": job.query_id, "turnNumber": job.turn, "isDuringSearch": during,
               "moveInfos": infos, "rootInfo": root}
        if job.ownership and heads["ownership"] is not None:
            out["ownership"] = [round(v, 4) for v in heads["ownership"]]
        if job.policy:
            out["policy"] = heads["policy"]
        return out

    def _heads(self, pos: Position, moves: list[int]) -> dict:
        """The net's heads on the root (value, policy, ownership and score lead, black's view
        where it has a sign) and the score lead of the side to move after each move."""
        import torch

        from training.go import features

        n = self.size
        positions = [pos]
        for m in moves:
            child = pos.copy()
            child.play(m)
            positions.append(child)
        x = np.stack([features.planes(p, self.net.history, self.net.liberties)
                      for p in positions])
        with torch.inference_mode():
            out = self.net(torch.from_numpy(x), heads=True)
        to_move = pos.to_play
        logits = out["policy"][0].float().numpy()
        legal = np.array([pos.is_legal(m) for m in range(n * n + 1)]) if not pos.is_over() \
            else np.zeros(n * n + 1, bool)
        policy = [-1.0] * (n * n + 1)
        if legal.any():
            z = np.exp(logits[legal] - logits[legal].max())
            for m, p in zip(np.flatnonzero(legal), z / z.sum()):
                policy[int(m)] = round(float(p), 6)
        res: dict = {"value": float(out["value"][0]), "policy": policy, "ownership": None,
                     "leads": None, "root_lead": None}
        if "ownership" in out:
            own = torch.tanh(out["ownership"][0].float()).numpy() * to_move
            res["ownership"] = [float(v) for v in own]
        if "score" in out:
            score = out["score"].float().numpy() * n
            res["root_lead"] = float(score[0])  # the side to move's lead
            res["leads"] = [-float(s) for s in score[1:]]  # after a move: the opponent's view
        return res

    # -- the loop ----------------------------------------------------------------------------

    def serve(self, stdin: TextIO) -> None:
        """Answer queries until end of input and every job is answered."""
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            for line in stdin:
                if line.strip():
                    lines.put(line)
            lines.put(None)

        threading.Thread(target=read, name="analysis-stdin", daemon=True).start()
        eof = False
        while not (eof and not self.pending and not self.active):
            block = not self.pending and not self.active and not eof
            try:
                while True:
                    line = lines.get(block=block)
                    block = False
                    if line is None:
                        eof = True
                        break
                    self.take(line)
            except queue.Empty:
                pass
            self.step()


def _black(winrate: float, to_move: int) -> float:
    return round(winrate if to_move == BLACK else 1 - winrate, 6)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.analysis",
                                 description="KataGo-style JSON analysis engine on stdin/stdout")
    ap.add_argument("--model", required=True, help="model file (model_<gen>.pt)")
    ap.add_argument("--config", default=None, help="config whose mcts section searches "
                    "(default configs/config.yaml)")
    ap.add_argument("--slots", type=int, default=32,
                    help="turns searched at once in one batch (default 32)")
    ap.add_argument("--max-visits", type=int, default=1000,
                    help="most visits a query may ask; sizes the search tree (default 1000)")
    args = ap.parse_args(argv)
    if args.slots < 1 or not 1 <= args.max_visits <= 100_000:
        ap.error("--slots must be >= 1 and --max-visits 1..100000")
    from configs import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        analyzer = Analyzer(args.model, cfg, slots=args.slots, max_visits=args.max_visits)
    except (OSError, ValueError) as e:
        print(f"error: --model {args.model}: {e}", file=sys.stderr)
        return 2
    analyzer.serve(sys.stdin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
