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
"terminateId": ..., "turnNumbers": [...]}` and `{"action": "clear_cache"}`. A line it cannot
answer gets `{"id", "error", "field"}` and nothing else (`id` null when the line has none it
could read); a value it clamps gets a `warning` line. No line ends the process: not JSON, not
UTF-8, nested too deep, numbers too large for a float, any other type where a field wants a
number or a list, a line longer than `MAX_LINE_BYTES` (read and dropped in bounded pieces).

Concurrency: every turn of every query is a game of one batched search (`training.search.mcts.Mcts`
with `--slots` games, one network call per step for all of them), so queries sent together
are searched together: many queries cost little more per step than one. A turn is one search
of `maxVisits` simulations (at most `--max-visits`, which sizes the tree; with Gumbel one
sequential halving over all of them), stepped with the others and answered when it is done,
with `reportDuringSearchEvery` partial answers meanwhile (`isDuringSearch` true, the visits
growing; written after the step in which one falls due, not at the end of a chunk).

Bounds: a line is at most `MAX_LINE_BYTES`, a game at most 4 N*N moves, at most
`MAX_PENDING` turns wait and `MAX_QUEUED_LINES` lines are read ahead (the reader then waits:
the pipe pushes back); the rules must be area scoring (the net plays Tromp-Taylor with
positional superko). Memory is linear in a query's moves however many turns it analyses: the
turns of a query share its one list of moves, and the position of a turn is built only when
its search starts (`--slots` positions at a time), by replaying the query's moves once in
turn order (one query of every turn of a 19x19 game, 1,445 turns, used to hold a replayed
position per turn: quadratic, about 3 GB).

It must not: keep state between queries beyond the search's arrays (no cache), or read stdin
in the search loop: stdin is read by its own thread (`read_lines`).
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
from typing import Any, BinaryIO, TextIO

import numpy as np

from training.go.coords import BLACK, WHITE, from_gtp, to_gtp
from training.go.rules import IllegalMove, Position

VERSION = "azgo-0.1.0"
MAX_LINE_BYTES = 1 << 20
MAX_PENDING = 4096
MAX_QUEUED_LINES = 64
"""Lines the reader thread holds ahead of the search; it then waits (the pipe fills)."""
MAX_REPORT_EVERY = 86_400.0
"""Largest reportDuringSearchEvery (seconds); the largest komi in size is N*N."""
AREA_RULES = {"tromp-taylor", "chinese", "chinese-ogs", "chinese-kgs", "aga", "bga",
              "new-zealand", "stone-scoring"}


class QueryError(ValueError):
    """A query field the engine cannot take; `field` names it."""

    def __init__(self, message: str, field_name: str):
        super().__init__(message)
        self.field = field_name


class Game:
    """The moves of one query, shared by its turns, and a position replayed along them in
    turn order (each move played once however many turns are analysed)."""

    def __init__(self, size: int, komi: float, moves: list[int]):
        self.size, self.komi, self.moves = size, komi, moves
        self._cursor: Position | None = None

    def position(self, upto: int) -> Position:
        """A copy of the position after the first `upto` moves (the copies share the boards
        of the history; each holds only its lists)."""
        if self._cursor is None or len(self._cursor.moves) > upto:
            n = self.size
            self._cursor = Position(n, komi=self.komi, max_moves=4 * n * n)
        cursor = self._cursor
        for m in self.moves[len(cursor.moves):upto]:
            cursor.play(m)
        return cursor.copy()

    def release(self) -> None:
        """Drop the replayed position (the query's last turn has started)."""
        self._cursor = None


@dataclass
class Job:
    """One turn of one query: the position after the first `upto` of its game's moves,
    searched to `max_visits`. `position` is set while the job holds a slot."""

    query_id: str
    turn: int
    game: Game
    upto: int
    max_visits: int
    report_every: float | None
    ownership: bool
    policy: bool
    last: bool = False  # the query's last turn: its game's replay is dropped when it starts
    position: Position | None = None
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


def _number(value: Any, lo: float, hi: float) -> float | None:
    """`value` as a float if it is a JSON number (not a boolean) from `lo` to `hi`, else None
    (a 400-digit integer is too large for a float: None, not OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and not lo <= value <= hi:
        return None
    value = float(value)
    return value if math.isfinite(value) and lo <= value <= hi else None


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
    komi = _number(q.get("komi", 7.5), -size * size, size * size)
    if komi is None:
        raise QueryError(f"komi must be a number from {-size * size} to {size * size}", "komi")
    position = Position(size, komi=komi, max_moves=4 * size * size)
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
    if every is not None:
        every = _number(every, 0.0, MAX_REPORT_EVERY)
        if not every:
            raise QueryError(f"reportDuringSearchEvery must be a number of seconds above 0, "
                             f"at most {MAX_REPORT_EVERY:g}", "reportDuringSearchEvery")
    game = Game(size, komi, moves)  # one list of moves for every turn: no copy per turn
    ownership = bool(q.get("includeOwnership", False))
    policy = bool(q.get("includePolicy", False))
    jobs = [Job(qid, t, game, start + t, visits, every, ownership, policy)
            for t in sorted(set(turns))]
    jobs[-1].last = True
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
        self.evaluate = make_evaluator(net, jit=cfg.net.inference, max_batch=slots,
                                       score=cfg.mcts.wants_score)
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

    def take(self, line: str | bytes) -> None:
        """One input line: a query (its jobs queued), an action, or an error answer. Nothing
        a line holds raises: a line the engine cannot take is answered `{"id", "error"}`."""
        qid = None
        try:
            qid = self._take(line)
        except Exception as e:  # the last guard: a bad line never ends the engine
            print(f"analysis: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            self.write({"id": qid if isinstance(qid, str) else None,
                        "error": f"internal error on this query: {type(e).__name__}",
                        "field": ""})

    def _take(self, line: str | bytes) -> Any:
        body = line.rstrip()
        if len(body) > MAX_LINE_BYTES or isinstance(body, str) and (
                len(body.encode(errors="replace")) > MAX_LINE_BYTES):
            self.write({"id": None, "error": f"a query line is at most {MAX_LINE_BYTES} bytes",
                        "field": ""})
            return None
        if isinstance(line, bytes):
            try:
                line = line.decode()
            except UnicodeDecodeError as e:
                self.write({"id": None, "error": f"the line is not UTF-8 text: {e}",
                            "field": ""})
                return None
        try:
            q = json.loads(line)
        except ValueError as e:
            self.write({"id": None, "error": f"could not parse JSON: {e}", "field": ""})
            return None
        except RecursionError:
            self.write({"id": None, "error": "could not parse JSON: nested too deep",
                        "field": ""})
            return None
        if not isinstance(q, dict):
            self.write({"id": None, "error": "a query is a JSON object", "field": ""})
            return None
        qid = q.get("id")
        action = q.get("action")
        if action is not None:
            self._action(q, qid, action)
            return qid
        try:
            jobs, warnings = parse_query(q, self.size, self.max_visits)
        except QueryError as e:
            self.write({"id": qid if isinstance(qid, str) else None, "error": str(e),
                        "field": e.field})
            return qid
        if len(self.pending) + len(jobs) > MAX_PENDING:
            self.write({"id": qid, "error": f"more than {MAX_PENDING} turns are waiting",
                        "field": "analyzeTurns"})
            return
        for w in warnings:
            self.write({"id": qid, "warning": w, "field": "maxVisits"})
        self.pending.extend(jobs)
        return qid

    def _action(self, q: dict, qid: Any, action: Any) -> None:
        if action == "query_version":
            self.write({"id": qid, "action": action, "version": VERSION, "git_hash": ""})
        elif action == "clear_cache":
            self.write({"id": qid, "action": action})  # there is no cache to clear
        elif action == "terminate":
            target = q.get("terminateId")
            turns = q.get("turnNumbers")
            if turns is not None and not (isinstance(turns, list) and all(
                    isinstance(t, int) and not isinstance(t, bool) for t in turns)):
                self.write({"id": qid, "error": "turnNumbers must be a list of turn numbers",
                            "field": "turnNumbers"})
                return
            if turns is not None:
                turns = set(turns)

            def hit(job: Job) -> bool:
                return job.query_id == target and (turns is None or job.turn in turns)

            self.pending = [j for j in self.pending if not hit(j)]
            for slot, job in list(self.active.items()):
                if hit(job):
                    self._finish(slot)
            self.write({"id": qid, "action": action, "terminateId": target,
                        "turnNumbers": q.get("turnNumbers")})
        else:
            self.write({"id": qid, "error": f"unknown action {action!r}", "field": "action"})

    # -- search ------------------------------------------------------------------------------

    def _fill(self) -> None:
        free = [s for s in range(self.slots) if s not in self.active]
        while free and self.pending:
            job = self.pending.pop(0)
            slot = free.pop(0)
            job.position = job.game.position(job.upto)
            if job.last:
                job.game.release()
            self.mcts.reset_game(slot, job.game.moves[:job.upto], komi=job.game.komi)
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
        due = min(job.next_report for job in self.active.values())
        for _ in range(self.chunk):
            if not self.mcts.is_searching():
                break
            self.mcts.step([self.evaluate])
            if time.monotonic() >= due:
                break  # a report is due: do not make it wait for the rest of the chunk
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
        job.position = None  # the slot's position is dropped with its search

    def _answer(self, job: Job, during: bool) -> dict:
        n, pos = self.size, job.position
        assert pos is not None, "a job is answered while it holds a slot"
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

    def serve(self, stdin: TextIO | BinaryIO) -> None:
        """Answer queries until end of input and every job is answered."""
        lines: queue.Queue[bytes | str | None] = queue.Queue(maxsize=MAX_QUEUED_LINES)
        threading.Thread(target=read_lines, args=(stdin, lines), name="analysis-stdin",
                         daemon=True).start()
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


def read_lines(stdin: TextIO | BinaryIO, lines: queue.Queue) -> None:
    """Put each non-blank line of `stdin` (its bytes where it has them) on `lines`, then None.
    A line longer than MAX_LINE_BYTES is read on in pieces of that size and put as its first
    MAX_LINE_BYTES + 1 bytes, which `Analyzer.take` answers with an error: no line is held
    whole, and a line that is not UTF-8 reaches `take` too, instead of ending this thread."""
    source = getattr(stdin, "buffer", stdin)
    try:
        while True:
            line = source.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            if len(line) > MAX_LINE_BYTES and line[-1:] not in (b"\n", "\n"):
                piece = line
                while piece and piece[-1:] not in (b"\n", "\n"):
                    piece = source.readline(MAX_LINE_BYTES)  # the rest, dropped piecewise
                lines.put(line)
            elif line.strip():
                lines.put(line)
    except (OSError, ValueError) as e:  # a broken input: end as at end of input
        print(f"analysis: stdin: {e}", file=sys.stderr, flush=True)
    finally:
        lines.put(None)


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
