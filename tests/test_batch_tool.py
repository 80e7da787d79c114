"""The batch command-line tool (`python -m training.go.batch_tool`): a summary, SGF export, a
rejected batch, the validation benchmark."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO
from tests.test_records import N, _games, _sgfmill_moves, write_batch_to


def test_cli_prints_a_summary_and_writes_sgf(run_dir):
    games = _games(3)
    path = write_batch_to(run_dir, games)
    out_dir = run_dir / "sgf"
    proc = subprocess.run(
        [sys.executable, "-m", "training.go.batch_tool", str(path), "--sgf-dir", str(out_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "3 games" in proc.stdout and "worker w1" in proc.stdout
    files = sorted(out_dir.glob("*.sgf"))
    assert len(files) == 3
    assert _sgfmill_moves(files[1].read_text(), N) == games[1].moves.tolist()


def test_cli_reports_a_rejected_batch(run_dir):
    path = write_batch_to(run_dir, _games(2))
    path.write_bytes(path.read_bytes()[:40])
    proc = subprocess.run([sys.executable, "-m", "training.go.batch_tool", str(path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "rejected" in proc.stderr and path.name in proc.stderr


def test_cli_bench_prints_one_json_line():
    proc = subprocess.run(
        [sys.executable, "-m", "training.go.batch_tool", "--bench", "5", "--bench-games", "3"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["board_size"] == 5 and figures["validate_games_per_s"] > 0
