"""What follows a trained generation (`training.generations`), through both trainer drivers,
when publishing it fails: the generation is taken in again on a later pass, never lost.

Real parts: the fake trainer of tests/test_coach.py as a subprocess (rounds), a model and a
round result on disk as the long-lived trainer writes them (continuous), a folder standing
where the manifest goes (the failure), and the real model store.
"""

from __future__ import annotations

import pytest

from configs import override
from tests.test_coach import FAKE_TRAINER, _model_file, _round_result


def test_a_round_whose_model_cannot_be_published_is_published_on_a_later_pass(tiny_cfg,
                                                                              run_dir):
    """Without gating the model is published as the trainer exits; when that fails (here a
    folder stands where its manifest goes), the pass raises and the round stays current, and
    once the place is free the next pass publishes it and concludes: no round is lost."""
    import sys
    import threading
    import time

    from training.generations import (Counts, Generations, ModelPublished, RoundConcluded,
                                      RoundStarted)
    from training.rounds import Rounds
    from training.run.run_dir import RunDir

    cfg = override(tiny_cfg, {"run.dir": str(run_dir), "logging.dir": str(run_dir / "logs"),
                              "evaluation.games": 0, "evaluation.gnugo_games": 0,
                              "evaluation.gating": "none"})
    paths = RunDir(run_dir).create()
    source = _model_file(run_dir.parent / "source.pt", cfg)
    gens = Generations(cfg, paths, threading.Event())
    rounds = Rounds(gens, trainer_cmd=[sys.executable, "-c", FAKE_TRAINER, str(source),
                                       str(paths.model(1)), "", str(paths.round_result(1))])
    gens.ensure_first_model()
    assert rounds.advance(Counts(total_games=10, target=10)) == [RoundStarted(1)]
    blocked = paths.models / "model_000001.json"
    blocked.mkdir()
    t0 = time.monotonic()
    while True:
        assert time.monotonic() - t0 < 60, "the round did not end"
        try:
            rounds.advance(Counts(total_games=10, target=10))
        except OSError:
            break
        time.sleep(0.05)
    assert rounds.current is not None and gens.generation == 0 and gens.concluded == 0
    blocked.rmdir()
    seen = rounds.advance(Counts(total_games=10, target=10))
    assert seen == [ModelPublished(1), RoundConcluded(1, True, seen[1].train_s, None)]
    assert gens.generation == 1 and rounds.current is None


def test_a_long_lived_trainers_generation_that_cannot_be_published_is_taken_again(tiny_cfg,
                                                                                   run_dir):
    """The same for training.mode continuous: a generation the trainer wrote whose publishing
    fails is taken in again on the next pass, and published once it can be."""
    import shutil
    import sys
    import threading

    from training.generations import (Counts, Generations, ModelPublished, RoundConcluded,
                                      RoundStarted)
    from training.long_lived_trainer import LongLivedTrainer
    from training.run.run_dir import RunDir
    from training.train import round_result

    cfg = override(tiny_cfg, {"run.dir": str(run_dir), "logging.dir": str(run_dir / "logs"),
                              "evaluation.games": 0, "evaluation.gnugo_games": 0,
                              "evaluation.gating": "none", "training.mode": "continuous"})
    paths = RunDir(run_dir).create()
    gens = Generations(cfg, paths, threading.Event())
    driver = LongLivedTrainer(gens, trainer_cmd=[sys.executable, "-c",
                                                 "import time; time.sleep(120)"])
    gens.ensure_first_model()
    shutil.copy(paths.model(0), paths.model(1))  # what the trainer writes for generation 1
    round_result.write(paths.round_result(1), _round_result(1, 0.5))
    blocked = paths.models / "model_000001.json"
    blocked.mkdir()
    try:
        with pytest.raises(OSError):
            driver.advance(Counts(total_games=10, target=10))
        assert gens.generation == 0 and gens.concluded == 0
        blocked.rmdir()
        seen = driver.advance(Counts(total_games=10, target=10))
    finally:
        driver.abandon()
    assert [e for e in seen if not isinstance(e, RoundStarted)] == [
        ModelPublished(1), RoundConcluded(1, True, seen[-1].train_s, None)]
    assert gens.generation == 1 and gens.last_loss == 0.5
