"""training.play.journal: an evaluation's games as they end, and `--resume` of a cut one."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, gnugo_path, require_tool
from tests.test_strength import _cli, _fake_run
from training.play.gnugo import GameSpec, Outcome
from training.play.journal import FILE, Journal, JournalError, series_key
from training.play.referee import GameResult

KEY = series_key(generation=3, model="ab" * 32, budget="1 s/move", opponent="gnugo 10",
                 identity="", bonus=0.0, size=9, komi=7.0, seed=0)


def _outcome(index: int, won: bool = True) -> Outcome:
    spec = GameSpec(index=index, opening=("E5", "C3"), we_are_black=index % 2 == 0,
                    seed=index + 1)
    game = GameResult(size=9, komi=7.0, moves=["E5", "C3", "D4", "pass", "pass"],
                      winner=1 if won == spec.we_are_black else -1, result="B+12",
                      end="two passes", score=12.0, engine_scores={"black azgo": "B+12"},
                      judgement="B+12.0", judged_dead=["C3"], think_max_s={"black": 0.9},
                      disputed_dead={"white": ["C3"]}, judgement_at_passes="B+12.0",
                      playout_from=3)
    return Outcome(spec=spec, game=game)


def test_games_are_read_back_whole_and_only_for_their_series_and_spec(tmp_path):
    journal = Journal(tmp_path)
    for i in range(3):
        journal.add(KEY, _outcome(i, won=i != 1))
    back = Journal(tmp_path, resume=True)
    assert back.games == 3
    for i in range(3):
        assert back.done(KEY, _outcome(i).spec) == _outcome(i, won=i != 1)
    assert back.done(KEY, _outcome(3).spec) is None  # not played yet
    other = series_key(generation=3, model="cd" * 32, budget="1 s/move", opponent="gnugo 10",
                       identity="", bonus=0.0, size=9, komi=7.0, seed=0)
    assert back.done(other, _outcome(0).spec) is None  # another model file
    moved = GameSpec(index=0, opening=("D4",), we_are_black=True, seed=1)
    assert back.done(KEY, moved) is None  # another opening for the same index
    assert Journal(tmp_path).games == 0  # without resume nothing is read


def test_a_line_cut_while_written_is_dropped_before_new_ones(tmp_path):
    journal = Journal(tmp_path)
    journal.add(KEY, _outcome(0))
    journal.add(KEY, _outcome(1))
    path = tmp_path / FILE
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])  # the tool killed inside its second line
    back = Journal(tmp_path, resume=True)
    assert back.games == 1 and back.done(KEY, _outcome(1).spec) is None
    back.add(KEY, _outcome(1))
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["series"] == KEY for line in lines)
    assert Journal(tmp_path, resume=True).games == 2


@pytest.mark.parametrize("line, says", [
    (b"{not json\n", "line 2: not a game of this tool"),
    (b'{"series": 7, "spec": {}, "game": {}}\n', "line 2: not a game of this tool"),
    (b'{"series": "k", "spec": {"index": 0, "opening": "E5", "we_are_black": true, '
     b'"seed": 1}, "game": {"size": 9, "komi": 7}}\n', "opening is not a list"),
    (b'{"series": "k", "spec": {"index": 0, "opening": [], "we_are_black": true, '
     b'"seed": 1}, "game": {"size": 9, "komi": 7, "evil": 1}}\n', "evil"),
])
def test_a_line_that_is_not_a_game_is_an_error_naming_the_file_and_line(tmp_path, line, says):
    Journal(tmp_path).add(KEY, _outcome(0))
    with open(tmp_path / FILE, "ab") as f:
        f.write(line)
    with pytest.raises(JournalError, match=says) as e:
        Journal(tmp_path, resume=True)
    assert str(tmp_path / FILE) in str(e.value) and "move the file aside" in str(e.value)


def test_resume_needs_the_file_and_refuses_an_oversized_one(tmp_path, monkeypatch):
    with pytest.raises(JournalError, match="not found; --resume takes a strength_games"):
        Journal(tmp_path, resume=True)
    Journal(tmp_path).add(KEY, _outcome(0))
    monkeypatch.setattr("training.play.journal.MAX_BYTES", 100)
    with pytest.raises(JournalError, match="over 100 bytes, not a journal"):
        Journal(tmp_path, resume=True)


@pytest.mark.gnugo
def test_a_cut_evaluation_resumes_with_the_games_it_had(tiny_cfg, run_dir):
    require_tool("GNU Go", gnugo_path() is not None, "apt-get install gnugo")
    _fake_run(run_dir, tiny_cfg, [0, 1])
    flags = ["--config", str(REPO / "configs" / "tiny.yaml"), "--run-dir", str(run_dir),
             "--generations", "1", "--games", "2", "--gnugo", "1", "--gnugo-games", "4",
             "--seconds-per-move", "0.02", "--jobs", "1"]
    out = _cli(*flags)
    assert out.returncode == 0, out.stderr
    (folder,) = (run_dir / "strength_games").iterdir()
    lines = (folder / FILE).read_text().splitlines()
    assert len(lines) == 2 + 4  # vs random, vs GNU Go level 1
    first = json.loads((run_dir / "strength.json").read_text())["rows"][0]
    # cut after three games and inside the fourth's line, as a killed evaluation leaves it
    (folder / FILE).write_text("\n".join(lines[:3]) + "\n" + lines[3][:50])
    out = _cli(*flags, "--resume", str(folder))
    assert out.returncode == 0, out.stderr
    assert "3 games read back" in out.stdout
    assert out.stdout.count("vs gnugo 1: game") + out.stdout.count("vs random: game") == 3
    again = json.loads((run_dir / "strength.json").read_text())["rows"][0]
    assert sum(again["vs_random"]) == 2 and sum(again["vs_gnugo"]["1"]["wdl"]) == 4
    assert again["vs_random"] == first["vs_random"]  # both games read back
    read_back = [first["vs_gnugo"]["1"]["games"][0], again["vs_gnugo"]["1"]["games"][0]]
    assert read_back[0] == read_back[1]  # the first game vs GNU Go, as it was played
    assert len((folder / FILE).read_text().splitlines()) == 6
    bad = _cli(*flags, "--resume", str(run_dir / "nowhere"))
    assert bad.returncode == 2 and "nowhere/games.jsonl: not found" in bad.stderr
