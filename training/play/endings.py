"""Where a lost game was lost, read from our net's win rate along it, and a picture of each.

The strength tool writes every game it plays through GTP as SGF with black's win rate by the
rated generation's net after each move (Sabaki's SBKV). For a lost game, the *turning point*
is the first move after which our win rate stays below one half until the opponent's first
pass (or the end): where the net saw the game go. It falls in

- `opening`: in the first quarter of the board's points in moves (20 on 9x9);
- `endgame`: in the last quarter of the moves before that pass;
- `middle`: in between;
- `misjudged`: nowhere: the net still thought we were ahead when the opponent passed
  (typically a group it believed alive, or a count it got wrong).

`turning_point(...)` finds it; `plot_lost_games(...)` draws one small panel per lost game
(our win rate by move, the turning point and the opponent's first pass marked) into one PNG.
`training.play.gnugo.explain_endings` calls both for `python3 -m training.strength --endings`.

It must not: play games, import torch, or read SGF files (the caller parses them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

PHASES = ("opening", "middle", "endgame", "misjudged")


@dataclass
class LostGame:
    """One lost game as the picture shows it."""

    name: str
    ours: np.ndarray
    """float [T]: our win rate after each move (NaN where the SGF had none)."""
    their_pass: int | None
    """The move index of the opponent's first pass, if any."""
    turn: int | None
    phase: str
    end: str
    wiped_out: bool


def our_winrates(black: np.ndarray | None, we_black: bool, moves: int) -> np.ndarray:
    """Our side's win rate after each move from black's (NaN where there is none)."""
    if black is None:
        return np.full(moves, np.nan)
    return black.copy() if we_black else 1.0 - black


def turning_point(ours: np.ndarray, their_pass: int | None,
                  board_points: int) -> tuple[int | None, str]:
    """(move index, phase) of the first move after which `ours` stays below 0.5 up to
    `their_pass` (exclusive; the whole game without one); (None, "misjudged") when the last
    known rate before it is 0.5 or more, or none is known."""
    stop = len(ours) if their_pass is None else their_pass
    known = [t for t in range(min(stop, len(ours))) if math.isfinite(ours[t])]
    if not known or ours[known[-1]] >= 0.5:
        return None, "misjudged"
    turn = known[-1]
    for t in reversed(known):
        if ours[t] >= 0.5:
            break
        turn = t
    if turn < board_points // 4:
        return turn, "opening"
    if turn >= 0.75 * stop:
        return turn, "endgame"
    return turn, "middle"


def plot_lost_games(games: Sequence[LostGame], path: Path, title: str = "") -> Path:
    """One panel per lost game (our win rate by move; the turning point and the opponent's
    first pass marked; the panel's title says the phase and the result) in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"opening": "tab:purple", "middle": "tab:orange", "endgame": "tab:green",
              "misjudged": "tab:red"}
    n = max(1, len(games))
    cols = min(6, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.0 * rows + 0.6), squeeze=False)
    for ax in axes.flat[len(games):]:
        ax.axis("off")
    if not games:
        axes[0, 0].text(0.5, 0.5, "no lost game", ha="center", va="center")
    for ax, g in zip(axes.flat, games):
        x = np.arange(1, len(g.ours) + 1)
        ax.plot(x, g.ours, color="tab:blue", lw=1.0)
        ax.axhline(0.5, color="grey", lw=0.6, ls="--")
        if g.their_pass is not None:
            ax.axvline(g.their_pass + 1, color="black", lw=0.8, ls=":")
        if g.turn is not None:
            ax.axvline(g.turn + 1, color=colors[g.phase], lw=1.2)
        ax.set_ylim(0, 1)
        ax.set_xlim(1, max(2, len(g.ours)))
        ax.tick_params(labelsize=6)
        ax.set_title(f"{g.name}\n{g.phase}, {g.end}{', all dead' if g.wiped_out else ''}",
                     fontsize=6, color=colors[g.phase])
    counts = {p: sum(g.phase == p for g in games) for p in PHASES}
    fig.suptitle((title + "\n" if title else "") + f"{len(games)} lost games, our net's win "
                 "rate by move (coloured line: where it turned for good; dotted: their first "
                 "pass): " + ", ".join(f"{p} {c}" for p, c in counts.items()), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
