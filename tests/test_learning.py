"""The whole loop learns: self-play -> batch files -> replay window -> trainer -> a better net.

On a 5x5 board, three generations of real self-play (selfplay.SelfPlay, records.write_batch),
each followed by a real training round over the replay window (trainer.train_round), make a
net whose search beats a uniformly random player (training.play.players.RandomPlayer: any legal move
that does not fill its own eye) far more often than chance, while the untrained net with the
same search does not. The win rate and a one-sided binomial p-value are printed.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from configs import override
from training.go.records import BatchMeta, batch_name, write_batch
from training.go.rules import Position
from training.play.players import RandomPlayer
from training.learn.net import load_model, make_evaluator
from training.train.train_state import write_initial_model
from training.play.players import MctsPlayer
from training.search.selfplay import SelfPlay
from training.train.round import train_round

GENERATIONS = 3
GAMES_PER_GENERATION = 200
STEPS_PER_ROUND = 150
EVAL_SIMULATIONS = 16


def binomial_p_value(wins: int, games: int, p: float = 0.5) -> float:
    """P(X >= wins) for X ~ Binomial(games, p): the one-sided p-value against chance."""
    return sum(math.comb(games, k) * p**k * (1 - p) ** (games - k)
               for k in range(wins, games + 1))


def _win_rate_against_random(cfg, model_path, games: int, seed: int) -> float:
    net, _ = load_model(model_path)
    player = MctsPlayer(make_evaluator(net), cfg.go, cfg.mcts, EVAL_SIMULATIONS,
                        history=cfg.net.history)
    wins = 0
    for k in range(games):
        position = Position(cfg.go.board_size, komi=cfg.go.komi, max_moves=cfg.go.move_cap)
        opponent = RandomPlayer(seed * 100_003 + k)
        net_color = 1 if k % 2 == 0 else -1  # colours alternate
        while not position.is_over():
            if position.to_play == net_color:
                move = player.genmove(position.moves, position.komi)
            else:
                move = opponent.genmove(position, position.to_play)
            position.play(move)
        wins += (position.score() > 0) == (net_color == 1)
    return wins / games


@pytest.mark.slow
def test_a_short_run_beats_a_random_player_far_more_often_than_chance(tiny_cfg, run_dir):
    torch.set_num_threads(1)
    cfg = override(tiny_cfg, {
        "mcts.simulations": 32, "self_play.parallel_games": 32, "self_play.batch_size": 32,
        "training.batch_size": 64, "training.lr_reference_batch": 64,
        "training.warmup_steps": 10,
    })
    t0 = time.monotonic()
    write_initial_model(cfg, run_dir)
    (run_dir / "replay").mkdir()
    for gen in range(GENERATIONS):
        net, _ = load_model(run_dir / "models" / f"model_{gen:06d}.pt")
        selfplay = SelfPlay(make_evaluator(net, max_batch=32), cfg.go, cfg.mcts, cfg.self_play,
                            history=cfg.net.history, generation=gen, seed=100 + gen)
        records = []
        while len(records) < GAMES_PER_GENERATION:
            records += selfplay.step()
        write_batch(run_dir / "replay" / batch_name("worker1", gen, 0), records,
                    BatchMeta.from_records("worker1", records, max_moves=cfg.go.max_moves))
        result = train_round(cfg, run_dir, steps=STEPS_PER_ROUND, progress=False)
        assert result.generation == gen + 1
    trained = run_dir / "models" / f"model_{GENERATIONS:06d}.pt"
    games = 150
    rate = _win_rate_against_random(cfg, trained, games, seed=1)
    p_value = binomial_p_value(round(rate * games), games)
    baseline = _win_rate_against_random(cfg, run_dir / "models" / "model_000000.pt", 60, seed=2)
    print(f"\ntrained generation {GENERATIONS} vs random: win rate {rate:.3f} over {games} games, "
          f"p-value {p_value:.2e}; untrained net with the same search: {baseline:.3f}; "
          f"{time.monotonic() - t0:.0f}s")
    assert p_value < 1e-3
    assert rate > baseline + 0.25
    # benchmarks/learning.py's common held-out losses: the trained net predicts the games it
    # never trained on (the held-out ones) far better than the untrained one
    from benchmarks.learning import held_out_losses

    runs = {"trained": (run_dir, cfg), "untrained": (run_dir, cfg)}
    held = {}
    for name, gen in (("trained", GENERATIONS), ("untrained", 0)):
        held.update(held_out_losses({name: runs[name]}, {name: {"generation": gen}}, 2048))
    print(f"held-out: {held}")
    assert held["trained"]["positions"] == held["untrained"]["positions"] > 100
    assert held["trained"]["policy_loss"] < held["untrained"]["policy_loss"] - 0.3
    assert held["trained"]["value_mse"] < held["untrained"]["value_mse"]
    assert 0.0 <= held["untrained"]["accuracy"] < held["trained"]["accuracy"] <= 1.0
