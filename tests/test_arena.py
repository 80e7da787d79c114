"""Arena games, gating, chained Elo in the metrics row, and play against GNU Go over GTP."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from configs import override
from tests.conftest import REPO, gnugo_path, require_tool
from training.run import model_store
from training.play.arena import (
    MatchResult,
    decide,
    evaluate_generation,
    play_arena,
)
from training.learn.net import load_model, make_evaluator, net_from_config, save_model
from training.play.gnugo import engine_command
from training.run.metrics import read_metrics


def _save_net(cfg, path, generation, seed):
    torch.manual_seed(seed)
    save_model(path, net_from_config(cfg.net, cfg.go.board_size), generation)


def _evaluator(path):
    net, _ = load_model(path)
    return make_evaluator(net, max_batch=64)


def test_arena_plays_every_game_and_counts_from_the_new_models_view(tiny_cfg, tmp_path):
    _save_net(tiny_cfg, tmp_path / "a.pt", 1, seed=1)
    _save_net(tiny_cfg, tmp_path / "b.pt", 0, seed=2)
    a, b = _evaluator(tmp_path / "a.pt"), _evaluator(tmp_path / "b.pt")
    ab = play_arena(a, b, 6, tiny_cfg, seed=5, simulations=4)
    assert ab.games == 6
    # the same net on both sides: black's and white's results decide, not the model;
    # counting from A's view must then give the mirror of counting from B's view
    aa = play_arena(a, a, 6, tiny_cfg, seed=5, simulations=4)
    assert aa.games == 6


def test_gating_rules(tiny_cfg):
    ev = tiny_cfg.evaluation
    assert decide(MatchResult(0, 0, 10), ev)[0] == "promote"  # gating none
    thr = override(tiny_cfg, {"evaluation.gating": "threshold"}).evaluation
    assert decide(MatchResult(11, 0, 9), thr)[0] == "promote"  # 0.55 >= 0.55
    assert decide(MatchResult(10, 0, 10), thr)[0] == "reject"
    sprt = override(tiny_cfg, {"evaluation.gating": "sprt"}).evaluation
    assert decide(MatchResult(90, 0, 10), sprt)[0] == "promote"
    assert decide(MatchResult(300, 0, 300), sprt)[0] == "reject"
    verdict, llr = decide(MatchResult(3, 0, 2), sprt)
    assert verdict == "continue" and llr is not None


def test_evaluate_generation_chains_elo_and_writes_the_metrics_row(tiny_cfg, run_dir):
    cfg = override(tiny_cfg, {"evaluation.games": 4, "evaluation.simulations": 4,
                              "evaluation.gating": "threshold"})
    models = run_dir / "models"
    _save_net(cfg, models / "model_000000.pt", 0, seed=1)
    model_store.publish_model(models, 0)
    _save_net(cfg, models / "model_000001.pt", 1, seed=2)
    _save_net(cfg, models / "model_000002.pt", 2, seed=3)  # trained but not promoted
    _save_net(cfg, models / "model_000003.pt", 3, seed=4)
    result = evaluate_generation(cfg, run_dir, 3, device="cpu")
    assert result.opponent == 0  # the newest PROMOTED model, not generation 2
    assert result.match.games == 4
    assert result.promote == (result.match.score >= 0.55)
    assert result.elo == pytest.approx(result.elo_diff)  # generation 0 is rated 0
    assert result.elo_ci_low < result.elo <= result.elo_ci_high
    row = read_metrics(run_dir)[-1]
    assert row["generation"] == 3 and row["arena_opponent"] == 0
    assert row["elo"] == pytest.approx(result.elo) and row["promoted"] == result.promote


def test_the_arena_plays_with_one_thread_on_the_cpu_and_gives_the_threads_back(
        tiny_cfg, run_dir, monkeypatch):
    from training.play import arena

    cfg = override(tiny_cfg, {"evaluation.games": 2, "evaluation.simulations": 2})
    models = run_dir / "models"
    for g in range(2):
        _save_net(cfg, models / f"model_{g:06d}.pt", g, seed=g + 1)
        model_store.publish_model(models, g)
    seen = []

    def play(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return play_arena(*args, **kwargs)

    monkeypatch.setattr(arena, "play_arena", play)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = evaluate_generation(cfg, run_dir, 1, device="cpu")
        assert result.match.games == 2 and seen == [1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_arena_benchmark_plays_the_same_games_under_each_thread_count(
        tiny_cfg, run_dir, capsys):
    """benchmarks/arena.py on the tiny config: a figure per thread count (not a timing) and
    the same result under each; a run's generations; what it refuses."""
    from benchmarks import arena as bench

    before = torch.get_num_threads()
    tiny = str(REPO / "configs" / "tiny.yaml")
    try:
        assert bench.main(["--config", tiny, "--games", "2", "--simulations", "2",
                           "--rounds", "1", "--threads", "1,2"]) == 0
        out = capsys.readouterr()
        result = json.loads(out.out.strip().splitlines()[-1])
        assert set(result) >= {"threads_1", "threads_2", "cpu_ratio", "games"}
        assert result["threads_1"]["cpu_s"] > 0 and result["games"] == 2
        outcomes = [line.rsplit("new ", 1)[1] for line in out.err.splitlines()
                    if "thread(s):" in line]
        assert len(outcomes) == 2 and outcomes[0] == outcomes[1]
        models = run_dir / "models"
        for g in range(2):
            _save_net(tiny_cfg, models / f"model_{g:06d}.pt", g, seed=g + 1)
        assert bench.main(["--config", tiny, "--run-dir", str(run_dir), "--generation", "1",
                           "--games", "2", "--simulations", "2", "--rounds", "1",
                           "--threads", "1"]) == 0
        with pytest.raises(SystemExit, match="model_000002.pt"):
            bench.main(["--config", tiny, "--run-dir", str(run_dir), "--generation", "3"])
        with pytest.raises(SystemExit, match="--threads 'x'"):
            bench.main(["--config", tiny, "--threads", "x"])
    finally:
        torch.set_num_threads(before)


def test_the_chain_goes_on_past_a_generation_whose_arena_was_stopped(tiny_cfg, run_dir):
    """Generation 2's coach was stopped during its arena (no Elo in its row); the resumed
    coach rates generation 3 against generation 1, the newest rated one (gating none): the
    chain goes on from its 500, not 0, with a measured link."""
    from training.run.metrics import record_metrics

    cfg = override(tiny_cfg, {"evaluation.games": 4, "evaluation.simulations": 4})
    models = run_dir / "models"
    for g in range(4):
        _save_net(cfg, models / f"model_{g:06d}.pt", g, seed=g + 1)
        model_store.publish_model(models, g)
    record_metrics(run_dir, 1, elo=500.0, elo_ci_low=450.0, elo_ci_high=550.0)
    record_metrics(run_dir, 2, loss=1.0)  # the trainer's columns only
    result = evaluate_generation(cfg, run_dir, 3, device="cpu")
    assert result.opponent == 1
    assert result.elo == pytest.approx(500.0 + result.elo_diff)
    assert result.elo_ci_high - result.elo_ci_low > 100.0  # generation 1's interval carried


def test_first_generation_without_an_opponent_is_promoted(tiny_cfg, run_dir):
    _save_net(tiny_cfg, run_dir / "models" / "model_000000.pt", 0, seed=1)
    result = evaluate_generation(tiny_cfg, run_dir, 0, device="cpu")
    assert result.opponent is None and result.promote and result.match.games == 0


def test_our_gtp_engine_answers_genmove_with_a_model(tiny_cfg, tmp_path):
    _save_net(tiny_cfg, tmp_path / "m.pt", 1, seed=1)
    cmd = engine_command(tmp_path / "m.pt", simulations=4, config=REPO / "configs" / "tiny.yaml")
    commands = "boardsize 5\nclear_board\ngenmove b\nboardsize 9\ngenmove w\nquit\n"
    proc = subprocess.run(cmd, input=commands, capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    replies = [r for r in proc.stdout.split("\n\n") if r.strip()]
    assert replies[0] == "=" and replies[1] == "="
    move = replies[2][2:]
    assert move.lower() == "pass" or (move[0] in "ABCDE" and move[1:] in "12345"), replies
    assert replies[3] == "=" and replies[4].startswith("?") and "5x5" in replies[4], replies


@pytest.mark.gnugo
def test_the_coach_evaluation_against_gnugo_is_judged_and_reaches_the_metrics(tiny_cfg, run_dir):
    require_tool("GNU Go", gnugo_path() is not None, "apt-get install gnugo")
    cfg = override(tiny_cfg, {"evaluation.games": 0, "evaluation.gnugo_games": 2,
                              "evaluation.gnugo_level": 1, "evaluation.simulations": 4})
    _save_net(cfg, run_dir / "models" / "model_000000.pt", 0, seed=1)
    _save_net(cfg, run_dir / "models" / "model_000001.pt", 1, seed=2)
    result = evaluate_generation(cfg, run_dir, 1, device="cpu")
    g = result.gnugo
    assert g.games == 2 and g.level == 1
    # the same runner as the strength tool: one opening with both colours, GNU Go judging
    specs = [o.spec for o in g.outcomes]
    assert [s.we_are_black for s in specs] == [True, False] and specs[0].opening == \
        specs[1].opening and specs[0].seed != specs[1].seed
    assert all(o.game.judgement for o in g.outcomes)
    row = read_metrics(run_dir)[-1]
    assert row["gnugo_games"] == 2 and row["gnugo_level"] == 1
    assert row["gnugo_ci_low"] <= row["gnugo_score"] <= row["gnugo_ci_high"]
    assert row["gnugo_disagreements"] == g.disagreements
    assert "gnugo_ci_low" in (run_dir / "metrics.csv").read_text().splitlines()[0]
    print(f"untrained net vs GNU Go level 1 on 5x5: W{g.wins} D{g.draws} L{g.losses}")


def test_arena_cli_requires_a_subcommand():
    proc = subprocess.run([sys.executable, "-m", "training.play.arena"], capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "evaluate" in proc.stderr
