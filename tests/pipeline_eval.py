"""Evaluate a run's generations: vs generation 0, a uniform-prior search, a random player; Elo.

    python -m tests.pipeline_eval RUN_DIR GENS [GAMES] [full]

GENS is a comma list: each is played against generation 0, the uniform-prior search with no
net and `training.gtp.RandomPlayer`, then each against the previous one in the list. Search
as in self-play (mcts.simulations), no noise, the first 4 moves sampled; `full` lets both
sides pass first (the full rules), otherwise nobody passes first while a real move is left.
Prints W-D-L from the first-named side's view with its Elo and 95% interval. A tool for
helper "learning"'s report, not a test (pytest does not collect it).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

from configs import load_config
from training import elo
from training.go import Position
from training.gtp import RandomPlayer
from training.net import load_model, make_evaluator
from training.selfplay import MctsPlayer, play_match


def uniform(planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Uniform priors over the legal moves, value 0: search without a net."""
    priors = legal.astype(np.float32)
    priors /= priors.sum(axis=1, keepdims=True)
    return priors, np.zeros(len(priors), np.float32)


def main(argv: list[str]) -> None:
    run = Path(argv[0])
    gens = [int(x) for x in argv[1].split(",")]
    games = int(argv[2]) if len(argv) > 2 else 40
    early_pass = len(argv) > 3 and argv[3] == "full"
    torch.set_num_threads(1)
    cfg = load_config(run / "config.yaml")
    history = cfg.net.history
    rules = "no pass first while a real move is left"
    print("rules:", "full (early passes allowed)" if early_pass else rules, flush=True)

    def evaluator(g: int):
        net, _ = load_model(run / "models" / f"model_{g:06d}.pt")
        return make_evaluator(net, max_batch=256)

    def match(a, b, seed: int) -> tuple[int, int, int, int]:
        pairs = play_match(a, b, games, cfg.go, cfg.mcts, seed, history=history,
                           early_pass=early_pass)
        wins = sum((r.result > 0) == a_black for r, a_black in pairs if r.result != 0)
        draws = sum(r.result == 0 for r, _ in pairs)
        black = sum(r.result > 0 for r, _ in pairs)
        return wins, draws, games - wins - draws, black

    def vs_random(evaluate, seed: int) -> int:
        player = MctsPlayer(evaluate, cfg.go, cfg.mcts, history=history, early_pass=early_pass)
        wins = 0
        for k in range(games):
            pos = Position(cfg.go.board_size, komi=cfg.go.komi, max_moves=cfg.go.move_cap)
            opponent = RandomPlayer(seed * 100_003 + k)
            color = 1 if k % 2 == 0 else -1
            while not pos.is_over():
                if pos.to_play == color:
                    move = player.genmove(pos.moves, pos.komi)
                else:
                    move = opponent.genmove(pos, pos.to_play)
                pos.play(move)
            wins += (pos.score() > 0) == (color == 1)
        return wins

    def line(name: str, w: int, d: int, losses: int, extra: str = "") -> None:
        e = elo.estimate(w, d, losses)
        print(f"{name:28s} W-D-L {w:2d}-{d}-{losses:2d}  score {(w + d / 2) / games:.2f}  "
              f"Elo {e.elo:+7.0f} [{e.ci_low:+.0f}, {e.ci_high:+.0f}] {extra}", flush=True)

    t0 = time.time()
    e0 = evaluator(0)
    for g in gens:
        eg = evaluator(g)
        w, d, loss, black = match(eg, e0, 7 + g)
        line(f"gen {g} vs gen 0", w, d, loss, f"black won {black}")
        w, d, loss, black = match(eg, uniform, 11 + g)
        line(f"gen {g} vs uniform search", w, d, loss, f"black won {black}")
        r = vs_random(eg, 13 + g)
        line(f"gen {g} vs random player", r, 0, games - r)
    for a, b in zip(gens, gens[1:]):
        w, d, loss, black = match(evaluator(b), evaluator(a), 17 + b)
        line(f"gen {b} vs gen {a}", w, d, loss, f"black won {black}")
    w, d, loss, black = match(e0, uniform, 5)
    line("gen 0 vs uniform search", w, d, loss, f"black won {black}")
    r = vs_random(e0, 3)
    line("gen 0 vs random player", r, 0, games - r)
    black = match(uniform, uniform, 19)[3]
    print(f"uniform vs uniform: black won {black} of {games}")
    print(f"eval seconds {time.time() - t0:.0f}")


if __name__ == "__main__":
    main(sys.argv[1:])
