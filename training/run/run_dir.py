"""The run folder's layout: the one place that spells where a run keeps what.

    runs/main/                    RunDir(root)
      config.yaml                 the resolved config of the running coach (`config`)
      worker_config.yaml          the same for SSH workers and training nodes, without other
      node_config.yaml              hosts' addresses, users and keys
      coach.lock                  held while a coach runs (`lock`, training/run/run_lock.py)
      models/                     published models: model_<gen>.pt, .pt.zst, .json (model_store)
      checkpoints/                checkpoint_<gen>.pt: optimizer, schedule and RNG state
      rounds/                     round_<gen>.json: what a training round reports to the coach
      replay/                     ingested game batches <worker>_<gen>_<seq>.npz.zst (records)
      incoming/                   batches on their way into replay/ (collector)
      quarantine/                 batches that failed validation, bounded (collector)
      workers/                    local workers' folders (training/fleet/local_workers.py)
      ledger.jsonl                one line per ingested batch: exactly once (collector)
      admitted.jsonl              the batches admitted to the long-lived trainer, in order
                                    (training.mode continuous; training/train/admissions.py)
      trainer.json                the long-lived trainer's counters: step, samples, waiting
      metrics.json, metrics.csv   one row per generation (metrics)
      metrics.lock                held while a process merges its columns into them (metrics)
      progress.png                the plot of those rows (metrics)
      strength.json, .png         the newest evaluation of training.strength
      strength_history.jsonl      every evaluation it ran, one line each, never rewritten
      strength_games/<stamp>/     the SGF of every game of an evaluation against GNU Go, and
                                  games.jsonl, a line per game (--resume reads it back)
      index.html                  the run page: status, plots, last games (the coach)
      tensorboard/                each generation's metrics as TensorBoard scalars (optional)

The worker folder's twin is `distributed/remote.py` (`WorkerPaths`). Model and batch file
names are spelled by `model_store.model_stem` and `records.batch_name`; this module composes
them into paths and never parses files.

A relative `run.dir` or `logging.dir` is taken from the folder the coach was started in and
made absolute once, at start (`absolute_paths`), so that the coach, its worker daemons and its
trainer (each started with its own working directory) mean the same folders.

It must not: create, read or delete anything but folders in `create`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from configs import Config, override
from training.run.model_store import model_stem

CONFIG_NAME = "config.yaml"
WORKER_CONFIG_NAME = "worker_config.yaml"
NODE_CONFIG_NAME = "node_config.yaml"
LOCK_NAME = "coach.lock"
LEDGER_NAME = "ledger.jsonl"
ADMISSIONS_NAME = "admitted.jsonl"
TRAINER_STATE_NAME = "trainer.json"
METRICS_JSON = "metrics.json"
METRICS_CSV = "metrics.csv"
METRICS_LOCK = "metrics.lock"
PROGRESS_PNG = "progress.png"
STRENGTH_JSON = "strength.json"
STRENGTH_PNG = "strength.png"
STRENGTH_HISTORY = "strength_history.jsonl"
STRENGTH_GAMES = "strength_games"
PAGE_NAME = "index.html"
SUBDIRS = ("models", "checkpoints", "rounds", "replay", "incoming", "quarantine", "workers")


def absolute_paths(cfg: Config, base: str | os.PathLike | None = None) -> Config:
    """`cfg` with `run.dir` and `logging.dir` absolute: `~` expanded, a relative one taken
    from `base` (the working directory by default)."""
    base = Path(base) if base is not None else Path.cwd()
    changes = {}
    for key, value in (("run.dir", cfg.run.dir), ("logging.dir", cfg.logging.dir)):
        path = Path(os.path.expanduser(value))
        absolute = os.path.normpath(path if path.is_absolute() else base / path)
        if absolute != value:
            changes[key] = absolute
    return override(cfg, changes) if changes else cfg


def checkpoint_name(generation: int) -> str:
    return f"checkpoint_{generation:06d}.pt"


def round_result_name(generation: int) -> str:
    return f"round_{generation:06d}.json"


_ROUND_RESULT = re.compile(r"^round_(\d{6,})\.json$")


def round_result_generations(folder: Path) -> list[int]:
    """The generations of the round results in `folder` (rounds/), unordered (a trainer
    killed between its checkpoint and its result leaves a gap: the next one publishes past
    it)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return [int(m.group(1)) for n in names if (m := _ROUND_RESULT.match(n))]


@dataclass(frozen=True)
class RunDir:
    """Paths of one run folder (see the module docstring for the tree)."""

    root: Path

    def __init__(self, root: str | os.PathLike) -> None:
        object.__setattr__(self, "root", Path(root))

    def create(self) -> RunDir:
        """Make the root and every subfolder (existing ones are kept)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for name in SUBDIRS:
            (self.root / name).mkdir(exist_ok=True)
        return self

    # folders
    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def rounds(self) -> Path:
        return self.root / "rounds"

    @property
    def replay(self) -> Path:
        return self.root / "replay"

    @property
    def incoming(self) -> Path:
        return self.root / "incoming"

    @property
    def quarantine(self) -> Path:
        return self.root / "quarantine"

    @property
    def workers(self) -> Path:
        return self.root / "workers"

    # files
    @property
    def config(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def worker_config(self) -> Path:
        """The config sent to SSH workers (their hosts' keys and users left out)."""
        return self.root / WORKER_CONFIG_NAME

    @property
    def node_config(self) -> Path:
        """The config sent to training nodes (the other machines left out)."""
        return self.root / NODE_CONFIG_NAME

    @property
    def lock(self) -> Path:
        return self.root / LOCK_NAME

    @property
    def ledger(self) -> Path:
        return self.root / LEDGER_NAME

    @property
    def admissions(self) -> Path:
        """The admission log of the long-lived trainer (training/train/admissions.py)."""
        return self.root / ADMISSIONS_NAME

    @property
    def trainer_state(self) -> Path:
        """What the long-lived trainer last reported of itself (`admissions.TrainerState`)."""
        return self.root / TRAINER_STATE_NAME

    @property
    def metrics_json(self) -> Path:
        return self.root / METRICS_JSON

    @property
    def metrics_csv(self) -> Path:
        return self.root / METRICS_CSV

    @property
    def metrics_lock(self) -> Path:
        return self.root / METRICS_LOCK

    @property
    def progress_png(self) -> Path:
        return self.root / PROGRESS_PNG

    @property
    def strength_json(self) -> Path:
        return self.root / STRENGTH_JSON

    @property
    def strength_png(self) -> Path:
        return self.root / STRENGTH_PNG

    @property
    def page(self) -> Path:
        return self.root / PAGE_NAME

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def strength_history(self) -> Path:
        return self.root / STRENGTH_HISTORY

    def strength_games(self, stamp: str) -> Path:
        """The SGF folder of one evaluation (`stamp`: its start time, UTC)."""
        return self.root / STRENGTH_GAMES / stamp

    def model(self, generation: int) -> Path:
        """The unpacked model of `generation` (`models/model_<gen>.pt`)."""
        return self.models / f"{model_stem(generation)}.pt"

    def checkpoint(self, generation: int) -> Path:
        return self.checkpoints / checkpoint_name(generation)

    def round_result(self, generation: int) -> Path:
        """The JSON a training round writes for the coach (training/train/round_result.py)."""
        return self.rounds / round_result_name(generation)

    def worker(self, name: str) -> Path:
        """A local worker's folder."""
        return self.workers / name
