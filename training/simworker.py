"""A simulated self-play worker: the real daemon's folder protocol, games without a network.

`SimWorker` is a `training.worker.Worker` subclass, so it speaks exactly the worker folder
protocol the coach collects from (docs/DESIGN.md, "Worker folder"): it waits for a model in
`models/` (size and sha256 verified against the manifest by the base class; a bad model is
refused, the previous one kept and Error reported), writes `distributed.batch_size` games per
batch to `outbox/` atomically, rewrites its `status.json` heartbeat, pauses when the outbox is
full, and stops on SIGTERM. What it does not do is search with a net: its games are
`records.random_record` games (legal, replayable, with visit counts), drawn from a small pool
made at start and handed out under each of the board's 8 symmetries, each (game, symmetry)
once, re-stamped with the model generation and a fresh seed (the pool grows by another
`pool_size` games once every one was used), so one core can feed the coach hundreds of games
per second, and no two games repeat their moves (the coach refuses a game it has seen). The
coach validates them by replay like any other.

Vocabulary:
  - pool: `pool_size` random legal games made once at start (the slow part, ~ms per 5x5 game);
  - rate: `games_per_s`, the pace of finished games (0 = as fast as it can);
  - ledger: `<dir>/written.jsonl`, one JSON line per batch the daemon wrote (name, games,
    sha256, time), appended after the batch is renamed into the outbox. Fault tests compare it
    with the coach's `ledger.jsonl` to prove every written batch was ingested exactly once.

Run it like `start_worker.py` (the coach's local fleet via `--worker-class
training.simworker:SimWorker`, or directly, e.g. as an SSH fleet's start command,
`SIM_START_COMMAND`):

    python -m training.simworker --config configs/tiny.yaml --name sim1 --dir /tmp/sim1 \
        --games-per-s 20

`python -m training.simworker` never imports torch (the model file is only verified, not
loaded), so 32 of them fit on a small machine.

It must not: be used for training data in a real run (its games are random), talk to the
network, or delete anything in outbox/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from configs import Config, ConfigError, load_config
from distributed import remote
from distributed.transfer import sha256_file
from training.run.logsetup import configure_logging
from training.worker import Worker

log = logging.getLogger(__name__)

LEDGER_NAME = "written.jsonl"
_MODEL_GEN_RE = re.compile(r"model_(\d+)\.pt$")
SIM_START_COMMAND = remote.daemon_start_command("training.simworker")
"""`SSHConnector(start_command=...)` for simulated workers on SSH hosts (the real daemon's
flags); the pace comes from `$AZGO_SIM_GAMES_PER_S` or a `--games-per-s` appended to it."""


class _GameDraw:
    """The pool's games under each of the 8 symmetries, each (game, symmetry) handed out once
    in a random order; once all were, `grow(k)` adds games (k: the pool's size so far)."""

    def __init__(self, pool: list[Any], rng: np.random.Generator,
                 grow: Callable[[int], list[Any]] | None = None):
        self.pool = pool
        self.rng = rng
        self.grow = grow
        self._order: list[tuple[int, int]] = []
        self._used = 0  # pool games already put in an order
        self._seen: set[bytes] = set()  # the moves handed out (a game may be its own mirror)

    def next(self) -> Any:
        while True:
            rec = self._next()
            key = np.asarray(rec.moves, np.int16).tobytes()
            if key not in self._seen or self.grow is None:
                self._seen.add(key)
                return rec

    def _next(self) -> Any:
        if not self._order:
            if self._used >= len(self.pool):
                if self.grow is not None:
                    self.pool.extend(self.grow(len(self.pool)))
                else:
                    self._used = 0  # no way to grow: the pool again
            pairs = [(i, s) for i in range(self._used, len(self.pool)) for s in range(8)]
            self._used = len(self.pool)
            self._order = [pairs[i] for i in self.rng.permutation(len(pairs))]
        index, symmetry = self._order.pop()
        return _symmetric(self.pool[index], symmetry)


class _SimSelfPlay:
    """Stands in for `selfplay.SelfPlay`: `.step()` returns finished games at a set pace."""

    def __init__(self, draw: _GameDraw, generation: int, rng: np.random.Generator,
                 games_per_s: float, games_per_step: int):
        self.draw = draw
        self.generation = generation
        self.rng = rng
        self.games_per_s = games_per_s
        self.games_per_step = max(1, games_per_step)
        self._next_t = time.monotonic()

    def set_evaluator(self, evaluate: Callable, generation: int) -> None:
        self.generation = generation

    def discard_unfinished(self) -> int:
        return 0  # a simulated game is finished the moment it is handed out

    def step(self) -> list[Any]:
        if self.games_per_s > 0:
            now = time.monotonic()
            if now < self._next_t:
                time.sleep(min(self._next_t - now, 0.5))
                return []
            self._next_t = max(now, self._next_t) + self.games_per_step / self.games_per_s
        out = []
        for _ in range(self.games_per_step):
            rec = self.draw.next()
            rec.generation = int(self.generation)
            rec.seed = int(self.rng.integers(1 << 62))
            out.append(rec)
        return out


def _symmetric(rec: Any, symmetry: int) -> Any:
    """A copy of game `rec` under one of the board's 8 symmetries (0: as it is): its moves
    and visit counts move with the board; a legal game stays legal with the same result."""
    import dataclasses

    n = rec.board_size
    a = n * n
    grid = np.arange(a).reshape(n, n)
    moved = np.rot90(grid.T if symmetry >= 4 else grid, symmetry % 4).ravel()  # new q <- old
    where = np.argsort(moved)  # old point p -> its new point
    moves = np.asarray(rec.moves)
    visits = np.asarray(rec.visits)
    new_visits = visits.copy()
    new_visits[:, :a] = visits[:, moved]
    new_moves = np.where(moves >= a, moves, where[np.minimum(moves, a - 1)]).astype(moves.dtype)
    return dataclasses.replace(rec, moves=new_moves, visits=new_visits)


def make_pool(cfg: Config, n: int, seed: int) -> list[Any]:
    """`n` random legal games on the config's board (the pool SimWorker draws from)."""
    from training.go.records import random_record

    rng = np.random.default_rng(seed)
    cap = cfg.go.max_moves or None
    return [random_record(cfg.go.board_size, cfg.go.komi, rng, max_moves=cap,
                          simulations=max(2, cfg.mcts.simulations), seed=i,
                          honest_passes=not cfg.self_play.early_pass)
            for i in range(n)]


class SimWorker(Worker):
    """A `Worker` whose games are random legal games (see the module docstring)."""

    games_per_s: float = 0.0
    pool_size: int = 32

    def __init__(self, cfg: Config, name: str, folder: str | os.PathLike, *,
                 games_per_s: float | None = None, pool_size: int | None = None,
                 ledger_path: str | os.PathLike | None = None, **kw: Any):
        super().__init__(cfg, name, folder, **kw)
        if games_per_s is None:
            games_per_s = float(os.environ.get("AZGO_SIM_GAMES_PER_S", self.games_per_s))
        self.games_per_s = float(games_per_s)
        self.pool_size = int(pool_size or self.pool_size)
        self.ledger_path = Path(ledger_path) if ledger_path else self.folder / LEDGER_NAME
        self._pool: list[Any] | None = None

    def load_evaluator(self, model_path: Path) -> tuple[Callable, int]:
        """Check the unpacked model is a torch zip archive and take its generation from the
        file name; no torch (the base class already verified size and sha256)."""
        m = _MODEL_GEN_RE.search(model_path.name)
        if m is None:
            raise ValueError(f"{model_path}: not a model_<gen>.pt file")
        if not zipfile.is_zipfile(model_path):
            raise ValueError(f"{model_path}: not a torch.save archive")

        def evaluate(planes: Any) -> Any:  # never called: the games are simulated
            raise RuntimeError("SimWorker has no network")

        return evaluate, int(m.group(1))

    def make_selfplay(self, evaluate: Callable, generation: int) -> Any:
        if self._pool is None:
            t0 = time.perf_counter()
            self._pool = make_pool(self.cfg, self.pool_size, self.seed)
            log.info("simulated game pool: %d games in %.2fs", len(self._pool),
                     time.perf_counter() - t0)
            self._draw = _GameDraw(self._pool, np.random.default_rng(self.seed),
                                   lambda k: make_pool(self.cfg, self.pool_size, self.seed + k))
        per_step = max(1, min(self.cfg.distributed.batch_size,
                              int(self.games_per_s // 4) if self.games_per_s else 1 << 30))
        return _SimSelfPlay(self._draw, generation,
                            np.random.default_rng([self.seed, generation]),
                            self.games_per_s, per_step)

    def write_batch(self, records: Sequence[Any], path: Path) -> None:
        super().write_batch(records, path)
        line = {"name": path.name, "games": len(records), "sha256": sha256_file(path),
                "size": path.stat().st_size, "time": time.time()}
        with open(self.ledger_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_written(folder: str | os.PathLike) -> list[dict]:
    """The simulated worker's ledger of written batches (lines torn by a kill are skipped);
    `folder` is the worker folder or the ledger file itself."""
    path = Path(folder)
    if path.is_dir():
        path = path / LEDGER_NAME
    return read_jsonl(path)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The JSON lines of a file, skipping a torn last line; [] when there is no file."""
    out = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


# ----------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="simulated AZ-Go self-play worker (random games)")
    p.add_argument("--config", default=None, help="config file (default configs/config.yaml)")
    p.add_argument("--name", default="sim1", help="worker name (batch names, status)")
    p.add_argument("--dir", required=True, help="worker folder with models/ and outbox/")
    p.add_argument("--log-dir", default=None, help="folder of worker_<name>.log (default DIR/logs)")
    p.add_argument("--log-to-stderr-only", action="store_true",
                   help="no log file of its own (stderr is already redirected to one)")
    p.add_argument("--models-dir", default=None, help="model folder (default DIR/models)")
    p.add_argument("--device", default=None, help="ignored (accepted like start_worker.py)")
    p.add_argument("--gpu-id", type=int, default=None, help="ignored (accepted like start_worker)")
    p.add_argument("--seed", type=int, default=None, help="seed (default: derived from the name)")
    p.add_argument("--min-seq", type=int, default=0, help="first batch sequence number")
    p.add_argument("--max-games", type=int, default=None, help="stop after this many games")
    p.add_argument("--games-per-s", type=float, default=None,
                   help="pace of finished games (default $AZGO_SIM_GAMES_PER_S or 0 = flat out)")
    p.add_argument("--pool", type=int, default=None, help="random games made at start (32)")
    p.add_argument("--ledger", default=None,
                   help=f"written-batch ledger (default DIR/{LEDGER_NAME})")
    p.add_argument("--worker-class", default=None, help="ignored (accepted like start_worker)")
    p.add_argument("--nice", type=int, default=0, help="ignored (accepted like start_worker)")
    # a coach newer than this stand-in may pass flags of training.worker it does not know
    # yet: they are logged and ignored, so that benchmarks of that coach still run
    args, args.ignored = p.parse_known_args(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    folder = Path(os.path.expanduser(args.dir))
    log_dir = Path(args.log_dir) if args.log_dir else folder / "logs"
    log_file = None if args.log_to_stderr_only else log_dir / f"worker_{args.name}.log"
    configure_logging(log_file, cfg.logging.level)
    worker = SimWorker(cfg, args.name, folder, games_per_s=args.games_per_s,
                       pool_size=args.pool, ledger_path=args.ledger, seed=args.seed,
                       min_seq=args.min_seq, models_dir=args.models_dir)
    worker.install_signal_handlers()
    log.info("simulated worker %s pid %d, %s games/s", args.name, os.getpid(),
             worker.games_per_s or "max")
    if args.ignored:
        log.warning("ignored unknown flags %s", " ".join(args.ignored))
    worker.run(max_games=args.max_games)
    return 0


if __name__ == "__main__":
    sys.exit(main())
