"""A trainer that keeps failing shows its last error in status.txt and on the run page.

What is checked, with the real trainer (`python -m training.trainer`) started by the coach's
side of training (`Rounds`, `LongLivedTrainer`) from a config file it refuses: each exit is
counted, `trainer_error` names how many failures in a row, the exit and the log's last error
line, and status.txt (written and read back) and the page show it; a round that trains clears
it. Also the error line picked from a log's tail, and a tail read from the end of a large log.
"""

from __future__ import annotations

import itertools
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from configs import dump_config, load_config, override
from distributed.status import StatusSnapshot, read_status, write_status
from distributed.status_page import render_html
from tests.conftest import REPO, wait_until
from training.generations import Counts, Generations, last_error_line
from training.run.child_process import log_tail
from training.run.run_dir import RunDir

TINY = REPO / "configs" / "tiny.yaml"


def _setup(tmp_path: Path, mode: str):
    run = RunDir(tmp_path / "run").create()
    cfg = override(load_config(TINY), {
        "run.dir": str(run.root), "training.mode": mode, "logging.dir": str(tmp_path / "logs"),
        "distributed.backoff_max_s": 1.0, "evaluation.games": 0})
    run.config.write_text(dump_config(cfg))
    bad = tmp_path / "bad.yaml"  # what the trainer is given: a key it does not know
    bad.write_text(dump_config(cfg) + "\nbogus_section:\n  x: 1\n")
    return cfg, run, [sys.executable, "-m", "training.trainer", "--config", str(bad)]


def _growing() -> Iterator[Counts]:
    """What the coach counts on each pass: a game more each time (a failed round is due
    again once new games came)."""
    for games in itertools.count(100):
        yield Counts(games, 1, new_positions=10**6)


def _status_shows(tmp_path: Path, error: str) -> str:
    """status.txt and the page for a snapshot with `error`; returns the line read back."""
    path = tmp_path / "status.txt"
    write_status(path, StatusSnapshot(trainer_error=error))
    assert "bogus_section" in render_html(StatusSnapshot(trainer_error=error))
    return read_status(path).trainer_error


@pytest.mark.parametrize("mode", ["continuous", "rounds"])
def test_a_trainer_that_keeps_failing_shows_its_last_error_in_status_txt(tmp_path, mode):
    from training.long_lived_trainer import LongLivedTrainer
    from training.rounds import Rounds

    cfg, run, cmd = _setup(tmp_path, mode)
    kind = LongLivedTrainer if mode == "continuous" else Rounds
    gens = Generations(cfg, run, threading.Event())
    rounds = kind(gens, trainer_cmd=cmd)
    gens.ensure_first_model()
    counts = _growing()
    try:
        wait_until(lambda: (rounds.advance(next(counts)), gens.trainer_failures >= 2)[1], 120,
                   "two trainer failures", interval_s=0.2)
    finally:
        rounds.abandon()
    error = gens.trainer_error
    assert "trainer failed 2 times in a row" in error and "exit 2" in error, error
    assert "bogus_section" in error, error  # the config error the trainer printed
    shown = _status_shows(tmp_path, error)
    assert shown.startswith(error[:300]) and "bogus_section" in shown
    assert "Trainer error: " in (tmp_path / "status.txt").read_text()


def test_a_round_that_trains_clears_the_trainer_error(tmp_path):
    from training.rounds import Rounds

    cfg, run, cmd = _setup(tmp_path, "rounds")
    gens = Generations(cfg, run, threading.Event())
    rounds = Rounds(gens, trainer_cmd=cmd)
    gens.ensure_first_model()
    counts = _growing()
    wait_until(lambda: (rounds.advance(next(counts)), gens.trainer_failures >= 1)[1], 120,
               "a trainer failure", interval_s=0.2)
    assert "trainer failed once" in gens.trainer_error
    # the next trainer writes its model and exits 0 (the round's own command, not a real one)
    model = run.model(rounds.next_generation())
    rounds.trainer_cmd = [sys.executable, "-c", "import shutil, sys; shutil.copy(sys.argv[1], "
                          "sys.argv[2])", str(run.model(0)), str(model)]
    rounds.retry_at = 0.0
    wait_until(lambda: (rounds.advance(next(counts)), gens.concluded >= 1)[1], 120,
               "a round that trains", interval_s=0.2)
    assert gens.trainer_error == "" and gens.trainer_failures == 0
    write_status(tmp_path / "s.txt", StatusSnapshot(trainer_error=gens.trainer_error))
    assert "Trainer error" not in (tmp_path / "s.txt").read_text()


def test_the_error_line_is_the_last_error_of_the_log_tail():
    tail = ("2026-11-28 07:00:00 INFO MainProcess[1] training.trainer: training generation 3\n"
            "Traceback (most recent call last):\n"
            '  File "x.py", line 1, in <module>\n'
            "OSError: [Errno 24] Too many open files\n"
            "\n")
    assert last_error_line(tail) == "OSError: [Errno 24] Too many open files"
    logged = "2026 ERROR MainProcess[1] training.trainer: the window is empty\nbye\n"
    assert last_error_line(logged) == logged.splitlines()[0]
    assert last_error_line("error: bad.yaml: unknown key\n") == "error: bad.yaml: unknown key"
    assert last_error_line("") == ""


def test_a_log_tail_reads_only_the_end_of_a_large_log(tmp_path):
    path = tmp_path / "trainer.log"
    with open(path, "w") as f:
        for i in range(200_000):
            f.write(f"line {i}\n")
    assert log_tail(path, lines=2, max_bytes=4096).splitlines() == ["line 199998", "line 199999"]
    assert log_tail(tmp_path / "missing.log") == ""
