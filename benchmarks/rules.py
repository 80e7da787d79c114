"""Uniformly random playout speed of our Go rules vs OpenSpiel's C++ Go, one core.

Every engine plays whole games of uniformly random legal moves (pass included) from the
empty board: each move generates the full legal-move set (suicide and ko/superko checks
included), picks one and plays it, until two passes or the 2*N*N move cap. Engines:

- ours, numba loop:   `fastgo.playouts`, the whole game loop inside numba (the hot path)
- ours, Python API:   `fastgo.FastBoard`, Python picks each move: legal_moves() + play()
- ours, reference:    `go.Position`, the plain-Python reference rules
- OpenSpiel:          `pyspiel` Go, Python picks each move: legal_actions() + apply_action()

(OpenSpiel has simple ko and ends a game on a repeated position; we forbid the repeating
move. Repetitions are rare in random games, so the games have the same length on average:
the mean moves per game are printed.) Everything runs in one thread, one engine after the
other in the same process, timed in CPU seconds of the process (robust to other load on a
shared machine); JIT compilation is done before timing; each figure is the median of several
timed repeats. The last line is one JSON object with the 9x9 figures (`ours_moves_per_s`,
`openspiel_moves_per_s`, `ratio`) and extras.

Usage: python benchmarks/rules.py [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import numba
import numpy as np

from training.go import fastgo
from training.go.rules import Position


def time_runs(run, repeats: int) -> tuple[float, float]:
    """Median (moves per CPU second, moves/game) over `repeats` calls of run() -> (moves, games).

    CPU time of this process, not wall time: everything here is single-threaded, and on a
    shared machine wall-clock figures swing with the other processes' load.
    """
    speeds, lengths = [], []
    for _ in range(repeats):
        t0 = time.process_time()
        moves, games = run()
        dt = time.process_time() - t0
        speeds.append(moves / dt)
        lengths.append(moves / games)
    return statistics.median(speeds), statistics.mean(lengths)


def numba_loop(n: int, games: int):
    boards = fastgo.new_boards(1, n)
    fastgo.seed(1)
    fastgo.playouts(boards, 0, 2)  # compile (or load from cache) before timing

    def run():
        return fastgo.playouts(boards, 0, games), games

    return run


def python_api(n: int, games: int):
    rng = random.Random(2)
    fastgo.FastBoard(n).legal_moves()  # compile before timing

    def run():
        moves = 0
        for _ in range(games):
            board = fastgo.FastBoard(n)
            while True:
                legal = board.legal_moves()
                if legal.size == 0:
                    break
                board.play(int(legal[rng.randrange(legal.size)]))
            moves += board.n_moves
        return moves, games

    return run


def reference(n: int, games: int):
    rng = random.Random(3)

    def run():
        moves = 0
        for _ in range(games):
            pos = Position(n)
            while not pos.is_over():
                pos.play(rng.choice(pos.legal_moves()))
            moves += len(pos.moves)
        return moves, games

    return run


def openspiel(n: int, games: int):
    import pyspiel

    game = pyspiel.load_game("go", {"board_size": n, "komi": 7.5})
    rng = random.Random(4)

    def run():
        moves = 0
        for _ in range(games):
            state = game.new_initial_state()
            while not state.is_terminal():
                state.apply_action(rng.choice(state.legal_actions()))
                moves += 1
        return moves, games

    return run


# games per timed repeat, (9x9, 19x19): each repeat takes roughly 0.2 to 1 s here
GAMES = {
    "ours, numba loop (fastgo.playouts)": (numba_loop, 3000, 150),
    "ours, Python API (FastBoard)": (python_api, 40, 2),
    "ours, reference (go.Position)": (reference, 10, 1),
    "OpenSpiel C++ Go from Python": (openspiel, 1500, 60),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per figure")
    parser.add_argument("--quick", action="store_true", help="a tenth of the games, 3 repeats")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    scale = 0.1 if args.quick else 1.0
    print("Uniformly random playouts, one thread: legal moves (suicide, ko) + play, every move")
    print(f"moves per CPU second of this process, median of {repeats} repeats; "
          f"numba {numba.__version__}, numpy {np.__version__}")
    print()
    header = f"{'size':5} {'engine':36} {'moves/s':>11} {'moves/game':>11} {'vs OpenSpiel':>13}"
    print(header)
    print("-" * len(header))
    figures: dict[tuple[int, str], float] = {}
    for n, column in ((9, 1), (19, 2)):
        rows = []
        for name, spec in GAMES.items():
            make, games = spec[0], max(1, int(spec[column] * scale))
            speed, length = time_runs(make(n, games), repeats)
            figures[n, name] = speed
            rows.append((name, speed, length))
        base = figures[n, "OpenSpiel C++ Go from Python"]
        for name, speed, length in rows:
            print(f"{n}x{n:<3} {name:36} {speed:11,.0f} {length:11.1f} {speed / base:12.2f}x")
    print()
    fast, api, ref, spiel = (figures[9, name] for name in GAMES)
    print(json.dumps({
        "ours_moves_per_s": round(fast),
        "openspiel_moves_per_s": round(spiel),
        "ratio": round(fast / spiel, 2),
        "ours_python_api_moves_per_s": round(api),
        "ours_reference_moves_per_s": round(ref),
        "ours_19x19_moves_per_s": round(figures[19, "ours, numba loop (fastgo.playouts)"]),
        "openspiel_19x19_moves_per_s": round(figures[19, "OpenSpiel C++ Go from Python"]),
        "ratio_19x19": round(figures[19, "ours, numba loop (fastgo.playouts)"]
                             / figures[19, "OpenSpiel C++ Go from Python"], 2),
        "repeats": repeats,
    }))


if __name__ == "__main__":
    main()
