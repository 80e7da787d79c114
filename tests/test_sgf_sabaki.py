"""Our SGF files as Sabaki reads them: its own parser (@sabaki/sgf from npm, under node).

A self-play record (`sgf.to_sgf`) and an evaluation game (`sgf.game_sgf`) are parsed by
Sabaki's parser; the moves, board size, komi, result and per-move win rates (SBKV, which
Sabaki graphs) must come back as we wrote them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from tests.conftest import REPO
from training.go import records
from training.go.sgf import game_sgf, to_sgf

JS = REPO / "tests" / "js"


def _sabaki(text: str) -> dict:
    node = shutil.which("node")
    module = JS / "node_modules" / "@sabaki" / "sgf"
    if node is None or not module.is_dir():
        why = ("node is not installed (apt-get install nodejs npm)" if node is None else
               f"{module} missing (npm ci --prefix {JS})")
        if os.environ.get("CI"):
            pytest.fail(why + "; .ci/install.sh installs it")
        pytest.skip(why)
    out = subprocess.run([node, str(JS / "read_sgf.js")], input=text, capture_output=True,
                         text=True, timeout=60, cwd=JS)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _point(move: int, n: int) -> str:
    return "" if move == n * n else "abcdefghijklmnopqrs"[move % n] + "abcdefghijklmnopqrs"[move // n]


def test_a_self_play_record_reads_back_in_sabaki_with_its_win_rates():
    rng = np.random.default_rng(5)
    rec = records.random_record(9, 7.0, rng, simulations=8, seed=3)
    parsed = _sabaki(to_sgf(rec))
    assert parsed["root"]["SZ"] == ["9"] and float(parsed["root"]["KM"][0]) == 7.0
    line = parsed["line"]
    assert [n["move"] for n in line] == [_point(m, 9) for m in rec.moves.tolist()]
    assert [n["color"] for n in line] == ["B" if t % 2 == 0 else "W" for t in range(len(line))]
    values = rec.values.astype(np.float64)
    for t, node in enumerate(line[:-1]):  # after move t: the search of move t + 1
        black = values[t + 1] if (t + 1) % 2 == 0 else -values[t + 1]
        assert node["winrate"] == pytest.approx(100 * (1 + black) / 2, abs=0.06)
    assert line[-1]["winrate"] is None


def test_an_evaluation_game_with_passes_and_a_comment_reads_back_in_sabaki():
    moves = [40, 81, 30, 81]  # E5, pass, D6, pass on 9x9 (black first)
    text = game_sgf(9, 7.0, moves, "W+12.0", player_black="azgo gen 48", player_white="gnugo 10",
                    comment="judge [GNU Go] W+12.0; dead C3\\ x", winrates=[0.4, 0.35, None, 0.2])
    parsed = _sabaki(text)
    root = parsed["root"]
    assert root["RE"] == ["W+12.0"] and root["PB"] == ["azgo gen 48"]
    assert root["C"] == ["judge [GNU Go] W+12.0; dead C3\\ x"], "escapes undone as written"
    assert [n["move"] for n in parsed["line"]] == ["ee", "", "dd", ""]
    assert [n["winrate"] for n in parsed["line"]] == [40.0, 35.0, None, 20.0]


def test_the_sgf_parser_is_locked_and_ci_installs_exactly_the_lock():
    """tests/js/package-lock.json (written by npm) pins every package by version and sha512,
    and CI installs it with `npm ci`, which refuses a lock that disagrees with package.json
    (a plain `npm install` resolves the newest versions the ranges allow)."""
    package = json.loads((JS / "package.json").read_text())
    lock = json.loads((JS / "package-lock.json").read_text())
    assert lock["lockfileVersion"] >= 2
    assert lock["packages"][""]["dependencies"] == package["dependencies"]
    modules = {k: v for k, v in lock["packages"].items() if k.startswith("node_modules/")}
    sabaki = modules["node_modules/@sabaki/sgf"]
    assert sabaki["version"] == package["dependencies"]["@sabaki/sgf"]
    for name, entry in modules.items():
        assert entry.get("version") and entry.get("integrity", "").startswith("sha512-"), name
    install = (REPO / ".ci" / "install.sh").read_text()
    npm_lines = [ln for ln in install.splitlines() if ln.startswith("npm ")]
    assert npm_lines and all(ln.startswith("npm ci --prefix tests/js") for ln in npm_lines)
