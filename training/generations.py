"""What follows a trained generation, the same for both trainer drivers: check, result,
evaluation, publishing; and the models the coach publishes.

A driver (`training.rounds.Rounds`, one trainer subprocess per generation, or
`training.long_lived_trainer.LongLivedTrainer`, one trainer for the whole run) hands each
generation its trainer wrote to `Generations.take(generation, train_s, log_path)`, and calls
`poll()` on each pass; both return what happened as events (`ModelPublished`,
`RoundConcluded`, `Rated`; the drivers add `RoundStarted`), which the coach reacts to:

  1. check: no model file, or one that does not load or holds a non-finite weight (moved
     aside as `<name>.refused`), fails the generation: the trainer log's tail is logged and
     `take` returns None (the driver retries or goes on); until a generation is taken again,
     `trainer_error` says how many failures in a row and the log's last error line (the coach
     shows it in status.txt and on the run page);
  2. result: read from `rounds/round_<gen>.json` (`training.train.round_result`): a missing
     file leaves the loss unknown (a warning), an unreadable one is logged as an error, and
     either way the generation counts;
  3. evaluate: the arena and gating run in a thread (the arena in a child process, stopped
     with the coach) and `poll` concludes once they are done. Without gating
     (`evaluation.gating: none`) the arena only rates: the model is published at once and the
     generation concludes, so that neither the workers nor the next generation wait for the
     arena (on a GPU box its games take longer than a generation's self-play); the rating
     goes on beside (`rating`, one at a time: a generation trained while the previous one is
     still being rated is not rated, and the next rating plays the newest rated generation,
     so each link of the Elo chain is measured);
  4. conclude: a promoted model not yet published is published (`ModelPublished`: the coach
     has the supervisors push it to every worker); `RoundConcluded` (the coach writes the
     generation's metrics row and the plot; the arena writes its own columns of that row,
     and without gating `Rated` follows when it has).

Publishing writes `models/model_<gen>.pt.zst` + manifest (`training.run.model_store`); a model
refused by gating keeps its number and the next generation is trained one past it.

It must not: start a trainer (the drivers do), talk to a host, play games (the arena's child
does), read the coach's state, or import torch at module level (only generation 0, a random
net, and the model check load it here).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Union

from configs import Config
from training.run import model_store
from training.run.child_process import log_tail
from training.run.run_dir import RunDir
from training.train import round_result
from training.train.round_result import RoundResult, RoundResultError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Counts:
    """What the coach counted this pass, all a driver needs to know of the games."""

    total_games: int  # games collected in the run folder
    target: int  # new games a round needs (training.fleet.balance.generation_target)
    new_positions: int = 0
    """Positions ingested since the newest published generation was published."""
    ingested: tuple[tuple[str, int], ...] = ()
    """(batch name, positions) of the batches ingested into replay/ since the last pass (all
    of the ledger's on the first), in the ledger's order (training.mode continuous admits
    them to its trainer)."""


@dataclass(frozen=True)
class RoundStarted:
    """A trainer was launched for `generation`: games from now on count for the next one."""

    generation: int


@dataclass(frozen=True)
class ModelPublished:
    """`generation` is published in models/ (the workers should get it)."""

    generation: int


@dataclass(frozen=True)
class RoundConcluded:
    """`generation`'s round is over (trained and evaluated); `promoted` or held back."""

    generation: int
    promoted: bool
    train_s: float
    elo: float | None


@dataclass(frozen=True)
class Rated:
    """Without gating: the arena has rated `generation` (or stopped) after its round
    concluded; its columns of the metrics row are written."""

    generation: int


Event = Union[RoundStarted, ModelPublished, RoundConcluded, Rated]


class Driver(Protocol):
    """What the coach asks of a trainer driver (`Rounds`, `LongLivedTrainer`)."""

    generations: Generations
    training_nodes: object | None  # training.fleet.remote_training.TrainingNodes, if any
    games_at_gen: int  # games collected when the current generation's count began

    def advance(self, counts: Counts) -> list[Event]: ...
    def pace(self, total_games: int, target: int) -> str: ...
    def in_hand(self) -> int | None: ...
    def sync_training_nodes(self) -> None: ...
    def abandon(self) -> None: ...
    def close(self) -> None: ...


@dataclass
class Taken:
    """A trained generation being evaluated (or just concluded)."""

    generation: int
    train_s: float
    result: RoundResult | None = None  # what the trainer reported, when it did
    evaluation: threading.Thread | None = None  # arena/gating, off the coach's loop
    promote: list = field(default_factory=list)  # the evaluation thread's verdict
    published: bool = False  # without gating the model goes out before its evaluation


class Generations:
    """A run's trained generations and published models (see the module docstring).

    `cfg` is the run's config (the coach replaces it when the file is reloaded; the drivers
    read it here); `stop` is set when the coach stops (an evaluation in progress ends too);
    `initial_model` is generation 0 of a new run (--checkpoint). Its state is written on the
    caller's thread, except `elo` and `Taken.promote`, written by the evaluation thread."""

    def __init__(self, cfg: Config, paths: RunDir, stop: threading.Event, *,
                 initial_model: str | os.PathLike | None = None):
        self.cfg = cfg
        self.paths = paths
        self.stopping = stop
        self.initial_model = initial_model
        self.generation = -1  # newest published generation
        self.concluded = 0  # generations concluded since the coach started
        self.last_loss: float | None = None
        self.elo: float | None = None
        self.evaluating: Taken | None = None  # a taken generation whose arena/gating runs
        self.rating: threading.Thread | None = None  # gating none: a concluded one's arena
        self.rating_generation = -1  # the generation it rates
        self.trainer_failures = 0  # trainer failures in a row
        self.trainer_error = ""
        """The last trainer failure while they go on (`trainer_failure`; "" once a generation
        is trained): what status.txt and the run page show."""
        self._events: list[Event] = []

    # ------------------------------------------------------------------ models

    def ensure_first_model(self) -> None:
        """Resume at the newest published model; publish a trained but unpublished one (the
        coach stopped in between); else make generation 0, a random net."""
        models = self.paths.models
        gens = model_store.list_manifests(models)
        if gens:
            self.generation = gens[-1]
            log.info("resuming at model generation %d", self.generation)
            return
        trained = model_store.list_models(models)
        if trained:  # the coach stopped between training and publishing: publish now
            gen = trained[-1]
        elif self.initial_model is not None:
            gen = 0
            self._adopt_initial_model(Path(self.initial_model))
        else:
            from training.train.train_state import write_initial_model

            gen = 0
            write_initial_model(self.cfg, self.paths.root)
            log.info("wrote generation 0 (a random net)")
        self.publish(gen)

    def _adopt_initial_model(self, source: Path) -> None:
        """Generation 0 of a new run is the net of `source` (a model file or a trainer
        checkpoint; `start_main.py --checkpoint`); its board and net must be the config's."""
        from training.learn.net import load_model, net_from_config, save_model

        net, info = load_model(source)
        want = net_from_config(self.cfg.net, self.cfg.go.board_size).config
        if net.config != want:
            differ = ", ".join(f"{k} ({net.config.get(k)} vs {want[k]})" for k in sorted(want)
                               if want[k] != net.config.get(k))
            raise ValueError(f"--checkpoint {source}: its net differs from the config's in "
                             f"{differ}; set net.* and go.board_size to match it")
        save_model(self.paths.model(0), net, 0,
                   meta={"from": str(source), "from_generation": info.generation})
        log.info("wrote generation 0 from %s (its generation %d)", source, info.generation)

    def manifest(self, generation: int) -> model_store.Manifest:
        return model_store.read_manifest(
            self.paths.models / f"{model_store.model_stem(generation)}.json")

    def publish(self, generation: int) -> None:
        """Publish a trained model (no event: the caller pushes it when it chooses)."""
        model_store.publish_model(self.paths.models, generation,
                                  self.cfg.distributed.wire_level)
        self.generation = generation
        log.info("published generation %d", generation)

    def _publish_for_workers(self, generation: int) -> None:
        self.publish(generation)
        self._events.append(ModelPublished(generation))

    # ------------------------------------------------------------------ a generation

    def take(self, generation: int, train_s: float, log_path: Path) -> list[Event] | None:
        """A trainer wrote `generation` in `train_s` seconds (its log at `log_path`): check
        it, read its result, and evaluate it (or publish and rate it without gating);
        returns what happened, or None when it failed the check (logged and counted)."""
        pt = self.paths.model(generation)
        refused = pt.exists() and self._refuse_model(pt)
        if not pt.exists() or refused:
            self.round_failed(generation, 0, train_s, log_path,
                              "its model was refused" if refused else "no model written")
            return None
        self.clear_failures()
        taken = Taken(generation, train_s, result=self._read_result(generation))
        if taken.result is not None:
            self.last_loss = taken.result.loss
        log.info("trained generation %d in %.1fs: loss=%s", generation, train_s,
                 taken.result.loss if taken.result is not None else "unknown")
        if self.cfg.evaluation.gating == "none":  # the arena only rates: nothing waits for it
            self._publish_for_workers(generation)
            taken.published = True
            self._rate(generation)
            taken.promote.append(True)
            self._conclude(taken)
        else:
            taken.evaluation = threading.Thread(
                target=lambda: taken.promote.append(self._evaluate(generation)),
                name=f"evaluate-{generation}", daemon=True)
            self.evaluating = taken
            taken.evaluation.start()
        return self._drain()

    def poll(self) -> list[Event]:
        """One pass: a rating that ended (`Rated`), an evaluation that ended (concluded)."""
        if self.rating is not None and not self.rating.is_alive():
            self.rating = None
            self._events.append(Rated(self.rating_generation))
        taken = self.evaluating
        if taken is not None and not taken.evaluation.is_alive():
            self._conclude(taken)
        return self._drain()

    def _drain(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def round_failed(self, generation: int, code: int | None, train_s: float, log_path: Path,
                     why: str) -> None:
        """The trainer of `generation` failed (exit `code`, or a model not taken): logged
        with its log's tail, and counted."""
        tail = log_tail(log_path)
        log.error("training round for generation %d failed (exit %s, %.0fs); retrying "
                  "next pass. Trainer log %s ends:\n%s", generation, code, train_s, log_path,
                  tail)
        self.trainer_failed(f"generation {generation}", why, log_path, tail)

    def trainer_failed(self, what: str, why: str, log_path: Path, tail: str) -> None:
        """Count a trainer failure in a row; `trainer_error` says it (`trainer_failure`)."""
        self.trainer_failures += 1
        self.trainer_error = trainer_failure(what, self.trainer_failures, why, log_path, tail)

    def clear_failures(self) -> None:
        """A trainer trains again: its failures are history."""
        self.trainer_failures, self.trainer_error = 0, ""

    def _rate(self, generation: int) -> None:
        """Without gating: the arena rates `generation` in a thread beside the next round, one
        rating at a time."""
        ev = self.cfg.evaluation
        if ev.games == 0 and ev.gnugo_games == 0:
            return
        if self.rating is not None and self.rating.is_alive():
            log.info("generation %d is not rated: the arena of an earlier generation still "
                     "runs (evaluation.games=%d, evaluation.gnugo_games=%d)", generation,
                     ev.games, ev.gnugo_games)
            return
        self.rating = threading.Thread(target=self._evaluate, args=(generation,),
                                       name=f"rate-{generation}", daemon=True)
        self.rating_generation = generation
        self.rating.start()

    def _refuse_model(self, pt: Path) -> bool:
        """True (and the file moved aside as `<name>.refused`) when the trained model does not
        load or holds a non-finite weight: such a model is never published."""
        from training.learn.net import ModelError, load_model

        try:
            load_model(pt)
            return False
        except (ModelError, OSError, RuntimeError, ValueError) as e:
            log.error("generation model %s refused, not published: %s", pt.name, e)
            try:
                os.replace(pt, pt.with_name(pt.name + ".refused"))
            except OSError as e2:
                log.error("cannot move %s aside: %s", pt, e2)
            return True

    def _read_result(self, generation: int) -> RoundResult | None:
        """The round's result file, or None (logged): the model is on disk, so the round
        counts either way; only its loss is unknown."""
        path = self.paths.round_result(generation)
        try:
            result = round_result.read(path)
        except (RoundResultError, OSError) as e:
            log.error("generation %d: its round result is unreadable (%s); the round counts, "
                      "its loss is unknown", generation, e)
            return None
        if result is None:
            log.warning("generation %d: the trainer wrote no round result (%s); the round "
                        "counts, its loss is unknown", generation, path)
        elif result.generation != generation:
            log.error("generation %d: %s reports generation %r; the round counts, its loss is "
                      "unknown", generation, path, result.generation)
            return None
        return result

    def _conclude(self, taken: Taken) -> None:
        """Evaluation done: publish and push a promoted model, record the metrics."""
        self.evaluating = None
        promote = taken.promote[0] if taken.promote else True
        self.concluded += 1
        log.info("generation %d %s", taken.generation,
                 "promoted" if promote else "not promoted (gating); workers keep "
                 f"generation {self.generation}")
        if promote and not taken.published:
            self._publish_for_workers(taken.generation)
        # a generation still being rated (gating none) has no Elo yet: its arena writes it
        self._events.append(RoundConcluded(taken.generation, bool(promote), taken.train_s,
                                           None if taken.published else self.elo))

    def _evaluate(self, generation: int) -> bool:
        """Optional arena and gating; True when the new model is promoted."""
        ev = self.cfg.evaluation
        if ev.gating == "none" and ev.games == 0 and ev.gnugo_games == 0:
            return True
        from training.play import arena
        from training.run.child_process import ChildFailed, ChildStopped, run_in_child

        try:  # in a child process: stopped at once when the coach stops (see child_process)
            result = run_in_child(arena.evaluate_generation, self.cfg, self.paths.root,
                                  generation, stop=self.stopping)
        except ChildStopped:
            return False
        except ChildFailed as e:  # evaluation must never stop training
            log.error("evaluation of generation %d failed; promoting it: %s", generation, e)
            return True
        self.elo = result.elo
        return result.promote

    def abandon(self) -> None:
        """The coach stops: wait for an evaluation and a rating (their child processes stop
        with `stopping`)."""
        taken, self.evaluating = self.evaluating, None
        if taken is not None:
            taken.evaluation.join(timeout=15)
        if self.rating is not None:
            self.rating.join(timeout=15)
            self.rating = None


_ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|^\s*([A-Za-z_][\w.]*(Error|Exception|Exit)"
                         r"|Killed|Traceback)\b")


def last_error_line(tail: str) -> str:
    """The line of a log's `tail` that says what failed: the last logged error or exception
    line (a traceback's last line names the exception), else its last non-empty line."""
    found = [line for line in tail.splitlines() if line.strip()]
    errors = [line for line in found if _ERROR_LINE.search(line)]
    return (errors or found or [""])[-1].strip()


def trainer_failure(what: str, failures: int, why: str, log_path: Path, tail: str) -> str:
    """One line for status.txt: `generation 3: trainer failed 2 times in a row, last at
    12:00:01 UTC (exit 1; log logs/trainer_000003.log): <its last error line>`."""
    times = "once" if failures == 1 else f"{failures} times in a row"
    line = last_error_line(tail) or "its log says nothing"
    return (f"{what}: trainer failed {times}, last at {time.strftime('%H:%M:%S', time.gmtime())} "
            f"UTC ({why}; log {log_path}): {line}")
