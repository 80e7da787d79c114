"""The coach's training rounds (trainer subprocess -> evaluation -> promotion) and the models the
coach publishes.

`Rounds` runs one round at a time. It receives what it needs (the config, the run folder,
the trainer command, whether training nodes take part) and, on each call of
`advance(counts)` with what the coach counted this pass (`Counts`), returns what happened
as events: `RoundStarted`, `ModelPublished`, `RoundConcluded`, `Rated`. The coach reacts to
them (load balancing's baselines, the push to the workers, the metrics row, the plot again
once the arena has rated a concluded round); nothing here touches the
fleet, the collector or the coach, and nothing waits:

  1. due: once the generation's new games (`Counts.target`, see `training.fleet.balance`)
     and `training.min_new_positions` new positions have arrived, and no failed round is
     backing off (`distributed.backoff_max_s`);
  2. start: without training nodes at once; with them (`distributed.training_nodes`) their
     start runs as a `Job` (network work, off the loop) and the round launches when it is done;
  3. train: `python -m training.trainer` (or the coach's trainer command) as a subprocess, its
     output in `logs/trainer_<gen>.log`; games that arrive meanwhile count for the next round;
  4. finish: the trainer exited. A non-zero exit or no model file fails the round: the log's
     tail is logged and the round retried after the backoff; until a round trains again,
     `trainer_error` says how many failed in a row and the log's last error line (the coach
     shows it in status.txt and on the run page). Otherwise its result is read
     from `rounds/round_<gen>.json` (`training.learn.round_result`): a missing file leaves the
     round's loss unknown (a warning), an unreadable one is logged as an error, and either way
     the round counts. Then the evaluation starts in a thread (the arena in a child process,
     stopped with the coach). Without gating (`evaluation.gating: none`) the arena only rates:
     the model is published and pushed at once and the round concludes, so that neither the
     workers nor the next round wait for the arena (on a GPU box its games take longer than a
     generation's self-play); the rating goes on beside the next round (`Rounds.rating`, one
     at a time: a generation trained while the previous one is still being rated is not
     rated, and the next rating plays the newest rated generation, so each link of the Elo
     chain is measured);
  5. conclude: a promoted model not yet published is published (`ModelPublished`: the coach
     has the supervisors push it to every worker); `RoundConcluded` (the coach writes the
     generation's metrics row and the plot; the arena writes its own columns of that row,
     and without gating `Rated` follows when it has).

Publishing writes `models/model_<gen>.pt.zst` + manifest (`training.run.model_store`); a model
refused by gating keeps its number and the next round trains one past it.

It must not: talk to a host from the coach's loop (the training nodes' start is a Job, model
pushes are the coach's), play games, decide load balancing (`training.fleet.balance`), read
the coach's state, or import torch at module level (the trainer and the arena run in other processes; only
generation 0, a random net, is made here).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, Union

from configs import Config
from training.fleet.fleet import Job
from training.learn import round_result
from training.learn.command import run_hours_flag, trainer_command
from training.learn.round_result import RoundResult, RoundResultError
from training.run import model_store
from training.run.run_dir import RunDir
from training.run.signals import die_with_parent

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Counts:
    """What the coach counted this pass, all a round needs to know of the games."""

    total_games: int  # games collected in the run folder
    target: int  # new games a round needs (training.fleet.balance.generation_target)
    new_positions: Callable[[int], int] = lambda generation: 0
    """Positions ingested since `generation` was the newest published one."""
    ingested: Callable[[int], list[tuple[str, int]]] = lambda start=0: []
    """(batch name, positions) of the batches ingested into replay/ from the `start`-th on,
    in the ledger's order (training.mode continuous admits them to its trainer, the new ones
    of each pass)."""


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


@dataclass
class Round:
    """A training round running as a subprocess."""

    generation: int  # the generation it produces
    popen: subprocess.Popen
    started: float
    log_path: Path
    games_at_start: int
    train_s: float = 0.0
    evaluation: threading.Thread | None = None  # arena/gating, off the coach's loop
    promote: list = field(default_factory=list)  # the evaluation thread's verdict
    published: bool = False  # without gating the model goes out before its evaluation
    result: RoundResult | None = None  # what the trainer reported, when it did


class Rounds:
    """A run's training rounds and published models (see the module docstring).

    `cfg` is the run's config (the coach replaces it when the file is reloaded);
    `trainer_cmd`, when set, replaces `python -m training.trainer` (tests); `distributed`:
    training nodes take part. Its state is written on the caller's thread, except `elo` and
    `Round.promote`, written by the evaluation thread."""

    def __init__(self, cfg: Config, paths: RunDir, stop: threading.Event, *,
                 trainer_cmd: Sequence[str] | None = None, distributed: bool = False,
                 initial_model: str | os.PathLike | None = None,
                 run_hours: Callable[[], float] | None = None):
        self.cfg = cfg
        self.paths = paths
        self.stopping = stop  # set when the coach stops: an evaluation in progress ends too
        self.trainer_cmd = list(trainer_cmd) if trainer_cmd else None
        self.distributed = distributed
        self.initial_model = initial_model  # generation 0 of a new run (--checkpoint)
        self.run_hours = run_hours  # the run's hours so far, read once a round (`_start`)
        self.round_hours: float | None = None  # what this round's ranks all get
        self.current: Round | None = None
        self.rating: threading.Thread | None = None  # gating none: a concluded round's arena
        self.rating_generation = -1  # the generation it rates
        self.generation = -1  # newest published generation
        self.concluded = 0  # rounds concluded since the coach started
        self.last_loss: float | None = None
        self.elo: float | None = None
        self.training_nodes: Any = None  # remote_training.TrainingNodes when configured
        self.node_start: Job | None = None  # the training nodes being started for a round
        self.round_nodes: list[str] = []  # extra nodes of the running round
        self.games_at_gen = 0  # games collected when the current generation's count began
        self.retry_at = 0.0  # time.monotonic() before which a failed round is not retried
        self.trainer_failures = 0  # trainer failures in a row
        self.trainer_error = ""
        """The last trainer failure while they go on (`trainer_failure`; "" once a generation
        is trained): what status.txt and the run page show."""
        self._events: list[Event] = []

    def new_games(self, total_games: int) -> int:
        """Games collected since the current generation's count began."""
        return total_games - self.games_at_gen

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
            from training.learn.train_state import write_initial_model

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

    # ------------------------------------------------------------------ the round

    def advance(self, counts: Counts) -> list[Event]:
        """One pass: drive the running round a step, or start one when it is due; returns
        what happened."""
        self._advance(counts)
        events, self._events = self._events, []
        return events

    def _advance(self, counts: Counts) -> None:
        if self.rating is not None and not self.rating.is_alive():
            self.rating = None
            self._events.append(Rated(self.rating_generation))
        if self.node_start is not None:
            self._launch_when_nodes_ready(counts)
            return
        rnd = self.current
        if rnd is not None:
            if rnd.evaluation is None:
                code = rnd.popen.poll()
                if code is None and self.round_nodes:
                    for name in self.training_nodes.check():
                        log.warning("training node %s: its trainer died; the round fails "
                                    "within training.timeout_s=%s", name,
                                    self.cfg.training.timeout_s)
                if code is not None:
                    self._finish_training(code)
            elif not rnd.evaluation.is_alive():
                self._conclude()
            return
        iterations = self.cfg.run.iterations
        if iterations and self.concluded >= iterations:
            return
        if self.new_games(counts.total_games) < counts.target:
            return
        if time.monotonic() < self.retry_at:
            return
        if counts.new_positions(self.generation) < self.cfg.training.min_new_positions:
            return
        self._start(counts)

    def start(self, counts: Counts) -> list[Event]:
        """Start the next round now, due or not; returns what happened."""
        self._start(counts)
        events, self._events = self._events, []
        return events

    def trainer_command(self, generation: int, nodes: int = 0,
                        master_addr: str = "") -> list[str]:
        """The trainer re-launches itself under torchrun when several GPUs/nodes train;
        with `nodes` extra training nodes it is node rank 0 of nodes + 1."""
        hours = self.round_hours
        if self.trainer_cmd:
            return [*self.trainer_cmd, "--generation", str(generation),
                    *run_hours_flag(hours)]
        return trainer_command(sys.executable, str(self.paths.config), str(self.paths.root),
                               generation, nodes=nodes + 1, master_addr=master_addr,
                               master_port=self.cfg.training.master_port, run_hours=hours)

    def _hours(self) -> float | None:
        """The run's hours so far when it has a time limit (run.hours), else None."""
        if self.run_hours is None or self.cfg.run.hours <= 0:
            return None
        return self.run_hours()

    def next_generation(self) -> int:
        """One past the newest trained model (a model refused by gating keeps its number)."""
        return max([self.generation, *model_store.list_models(self.paths.models)]) + 1

    def sync_training_nodes(self) -> None:
        """Match `training_nodes` to distributed.training_nodes of the current config.

        Called at start and before each round: nodes added to or removed from the watched
        config file take part from the next round on (a running round keeps its nodes)."""
        specs = list(self.cfg.distributed.training_nodes) if self.distributed else []
        current = self.training_nodes
        if current is not None and list(current.cfg.distributed.training_nodes) == specs:
            return
        if current is not None:
            current.close()
            log.info("training nodes changed: %s -> %s", ",".join(current.names()) or "-",
                     ",".join(s.name for s in specs) or "-")
        self.training_nodes = None
        if specs:
            from training.fleet.remote_training import TrainingNodes

            self.training_nodes = TrainingNodes(self.cfg, str(self.paths.config))

    def _start(self, counts: Counts) -> None:
        """Start the next training round: at once without training nodes; with them, their
        start runs as a job (network work) and `advance` launches the round when it is done."""
        self.sync_training_nodes()
        gen = self.next_generation()
        self.round_hours = hours = self._hours()  # one value for every rank of the round
        if self.training_nodes is None:
            self._launch(gen, 0, "", counts)
            return
        nodes, d = self.training_nodes, self.cfg.distributed
        deadline = (d.retries + 1) * (d.connect_timeout_s + 4 * max(d.command_timeout_s, 300.0))
        self.node_start = Job(f"start-nodes-{gen}", lambda: (gen, *nodes.start_round(
            gen, self.cfg.training.master_port, hours)), deadline)

    def _launch_when_nodes_ready(self, counts: Counts) -> None:
        from training.fleet.remote_training import NodeStartError

        job = self.node_start
        if job.overdue():
            self.node_start = None
            log.warning("training nodes did not start within %.0fs; their connections are "
                        "closed and the round is retried", job.deadline_s)
            self.training_nodes.abort()
            self.retry_at = time.monotonic() + self.cfg.distributed.backoff_max_s
            return
        if not job.done():
            return
        self.node_start = None
        try:
            gen, nodes, addr = job.result()
        except (NodeStartError, OSError) as e:
            log.warning("training round not started: %s; retrying next pass", e)
            return
        self.round_nodes = list(self.training_nodes.in_round)
        if not nodes and self.training_nodes.names():
            log.warning("training generation %d on the main node only (training nodes "
                        "benched: %s)", gen, ", ".join(self.training_nodes.names()))
        self._launch(gen, nodes, addr, counts)

    def _launch(self, gen: int, nodes: int, addr: str, counts: Counts) -> None:
        log_path = Path(self.cfg.logging.dir) / f"trainer_{gen:06d}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # a result left by an earlier attempt at this generation must not pass for this one's
        self.paths.round_result(gen).unlink(missing_ok=True)
        cmd = self.trainer_command(gen, nodes, addr)
        total = counts.total_games
        log.info("training generation %d on %d games (%d new): %s", gen, total,
                 self.new_games(total), " ".join(cmd))
        out = open(log_path, "ab")
        try:
            popen = subprocess.Popen(cmd, cwd=str(REPO), stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        finally:
            out.close()
        self.current = Round(gen, popen, time.monotonic(), log_path, total)
        # games that arrive while it trains count for the next round (workers never wait)
        self.games_at_gen = total
        self._events.append(RoundStarted(gen))

    def _finish_training(self, code: int) -> None:
        """The trainer exited: on success start the evaluation (a thread), else retry."""
        rnd = self.current
        rnd.train_s = time.monotonic() - rnd.started
        pt = self.paths.model(rnd.generation)
        if self.round_nodes:
            self.training_nodes.finish_round(code == 0 and pt.exists())
            self.round_nodes = []
        refused = code == 0 and pt.exists() and self._refuse_model(pt)
        if code != 0 or not pt.exists() or refused:
            self.current = None
            tail = log_tail(rnd.log_path)
            log.error("training round for generation %d failed (exit %s, %.0fs); retrying "
                      "next pass. Trainer log %s ends:\n%s", rnd.generation, code,
                      rnd.train_s, rnd.log_path, tail)
            self.trainer_failures += 1
            why = f"exit {code}" if code != 0 else (
                "its model was refused" if refused else "no model written")
            self.trainer_error = trainer_failure(
                f"generation {rnd.generation}", self.trainer_failures, why, rnd.log_path, tail)
            self.games_at_gen = rnd.games_at_start
            self.retry_at = time.monotonic() + self.cfg.distributed.backoff_max_s
            return
        self.trainer_failures, self.trainer_error = 0, ""
        rnd.result = self._read_result(rnd.generation)
        if rnd.result is not None:
            self.last_loss = rnd.result.loss
        log.info("trained generation %d in %.1fs: loss=%s", rnd.generation, rnd.train_s,
                 rnd.result.loss if rnd.result is not None else "unknown")
        if self.cfg.evaluation.gating == "none":  # the arena only rates: nothing waits for it
            self._publish_for_workers(rnd.generation)
            rnd.published = True
            self._rate(rnd.generation)
            rnd.promote.append(True)
            self._conclude()
            return
        rnd.evaluation = threading.Thread(
            target=lambda: rnd.promote.append(self._evaluate(rnd.generation)),
            name=f"evaluate-{rnd.generation}", daemon=True)
        rnd.evaluation.start()

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

    def _conclude(self) -> None:
        """Evaluation done: publish and push a promoted model, record the metrics."""
        rnd, self.current = self.current, None
        promote = rnd.promote[0] if rnd.promote else True
        self.concluded += 1
        log.info("generation %d %s", rnd.generation,
                 "promoted" if promote else "not promoted (gating); workers keep "
                 f"generation {self.generation}")
        if promote and not rnd.published:
            self._publish_for_workers(rnd.generation)
        # a generation still being rated (gating none) has no Elo yet: its arena writes it
        self._events.append(RoundConcluded(rnd.generation, bool(promote), rnd.train_s,
                                           None if rnd.published else self.elo))

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

    # ------------------------------------------------------------------ stopping

    def abandon(self) -> None:
        """The coach stops: end a running round (its trainer, its evaluation) and the
        training nodes' part of it."""
        rnd = self.current
        if rnd is not None:
            log.warning("stopping: training round for generation %d abandoned", rnd.generation)
            _terminate(rnd.popen)
            if rnd.evaluation is not None:  # its child process stops with `stopping`
                rnd.evaluation.join(timeout=15)
            self.current = None
        if self.rating is not None:  # its child process stops with `stopping`
            self.rating.join(timeout=15)
            self.rating = None
        if self.training_nodes is not None:
            self.training_nodes.stop_round(wait=True)

    def close(self) -> None:
        if self.training_nodes is not None:
            self.training_nodes.close()


TAIL_MAX_BYTES = 64 * 1024
"""At most this much of a trainer's log is read for its tail (a log may be large)."""
_ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|^\s*([A-Za-z_][\w.]*(Error|Exception|Exit)"
                         r"|Killed|Traceback)\b")


def log_tail(path: Path, lines: int = 15, max_bytes: int = TAIL_MAX_BYTES) -> str:
    """The last `lines` lines of the log at `path`, from at most its last `max_bytes`."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - max_bytes))
            text = f.read(max_bytes).decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


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


def _terminate(popen: subprocess.Popen, grace_s: float = 10.0) -> None:
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()
