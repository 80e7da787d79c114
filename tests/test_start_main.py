"""start_main.py flags: each one lands on its config key, validated by the schema."""

from __future__ import annotations

import start_main
from configs import load_config, override
from tests.conftest import REPO


def _cfg(*argv: str):
    args = start_main.parse_args(["--config", str(REPO / "configs" / "tiny.yaml"), *argv])
    cfg = override(load_config(args.config), start_main.overrides_from_args(args))
    return args, cfg


def test_guide_flags_set_their_config_keys():
    _, cfg = _cfg("--workers", "3", "--workers-per-gpu", "2", "--cpu-only", "--simulations",
                  "50", "--batch-size", "64", "--lr", "0.1", "--epochs", "2", "--filters", "32",
                  "--blocks", "3", "--iterations", "4", "--mixed-precision", "--gpus", "2")
    assert cfg.self_play.workers == 3 and cfg.self_play.workers_per_gpu == 2
    assert cfg.self_play.cpu_only and cfg.mcts.simulations == 50
    assert cfg.training.batch_size == 64 and cfg.training.lr == 0.1 and cfg.training.epochs == 2
    assert cfg.net.filters == 32 and cfg.net.blocks == 3 and cfg.run.iterations == 4
    assert cfg.training.mixed_precision and cfg.training.gpus == 2


def test_games_per_epoch_is_spread_over_the_workers():
    _, cfg = _cfg("--workers", "3")
    assert start_main.games_per_worker(100, cfg) == 34
    assert start_main.games_per_worker(1, cfg) == 1


def test_bad_flag_value_is_a_one_line_error_with_exit_code_2(capsys):
    rc = start_main.main(["--config", str(REPO / "configs" / "tiny.yaml"), "--simulations", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "mcts.simulations must be between 1 and 100000, got 0" in err[0]
