"""training.strength: a run's generations against generation 0 and a random player."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from tests.conftest import REPO, gnugo_path, require_tool
from training.go.rules import area_score
from training.learn.net import net_from_config, save_model
from training.run.model_store import publish_model
from training.play.strength import default_generations, play_vs_random, read_history


def area(sign: float):
    """An evaluator with uniform priors whose value is `sign` x the Tromp-Taylor area score of
    the side to move: +1 a sensible player, -1 one that wants to lose."""

    def evaluate(planes: np.ndarray, legal: np.ndarray):
        priors = legal.astype(np.float32)
        priors /= priors.sum(axis=1, keepdims=True)
        n = planes.shape[-1]
        boards = (planes[:, 0] - planes[:, 1]).reshape(len(planes), -1).astype(int)
        score = np.array([area_score(tuple(b), n) for b in boards], np.float32)
        return priors, np.tanh(sign * score / 5).astype(np.float32)

    return evaluate


@pytest.fixture
def fair_cfg(tiny_cfg):
    """5x5 with komi 2.5 (komi 0.5 would hand a random black player most games)."""
    return replace(tiny_cfg, go=replace(tiny_cfg.go, komi=2.5),
                   mcts=replace(tiny_cfg.mcts, simulations=64))


def test_greedy_search_beats_the_random_player_and_a_self_harming_one_loses(fair_cfg):
    good = play_vs_random(area(+1.0), fair_cfg, 20, seed=1)
    bad = play_vs_random(area(-1.0), fair_cfg, 20, seed=1)
    assert good.games == bad.games == 20
    assert good.score >= 0.7, good  # colours or scoring swapped would show up here
    assert bad.score <= 0.2, bad


def test_vs_random_is_deterministic_for_a_seed(fair_cfg):
    a = play_vs_random(area(+1.0), fair_cfg, 6, seed=3)
    b = play_vs_random(area(+1.0), fair_cfg, 6, seed=3)
    assert (a.wins, a.draws, a.losses) == (b.wins, b.draws, b.losses)


def test_default_generations_keep_zero_and_the_newest():
    assert default_generations([0]) == [0]
    assert default_generations([0, 1, 2]) == [0, 1, 2]
    picked = default_generations(list(range(21)))
    assert picked[0] == 0 and picked[-1] == 20 and len(picked) == 5
    assert default_generations([]) == []


def _fake_run(run_dir, cfg, generations, hours=None):
    """Models of `generations`; with `hours` ({gen: hours}) published too, generation g's
    manifest made that many hours after generation 0's."""
    (run_dir / "models").mkdir(parents=True)
    for g in generations:
        torch.manual_seed(g)
        save_model(run_dir / "models" / f"model_{g:06d}.pt",
                   net_from_config(cfg.net, cfg.go.board_size), g)
        if hours is not None:
            manifest = publish_model(run_dir / "models", g)
            path = run_dir / "models" / manifest.json_name
            data = json.loads(path.read_text())
            data["created"] = 1.8e9 + 3600 * hours[g]
            path.write_text(json.dumps(data))


def test_run_hours_leave_out_the_time_a_run_was_stopped(tiny_cfg, run_dir):
    """Generations 1-3 at 0.5 h steps, a stop of 8 hours, then 4-5 from a resumed coach:
    the hours come from the coach's elapsed seconds, the stop left out. Generation 3 has no
    elapsed seconds (its coach stopped before writing them): the manifests give its step."""
    from training.run import metrics
    from training.play.strength import run_hours

    made = {0: 0.0, 1: 0.5, 2: 1.0, 3: 1.5, 4: 9.7, 5: 10.2}
    _fake_run(run_dir, tiny_cfg, list(made), hours=made)
    for g, elapsed_h in {1: 0.5, 2: 1.0, 4: 0.2, 5: 0.7}.items():  # 4: 0.2 h after the restart
        metrics.record_metrics(run_dir, g, elapsed_s=3600 * elapsed_h)
    metrics.record_metrics(run_dir, 3, loss=1.0)  # the trainer's columns only
    hours = run_hours(run_dir, [1, 3, 4, 5, 6])
    assert hours == pytest.approx({1: 0.5, 3: 1.5, 4: 1.7, 5: 2.2}), hours
    # the coach's own count (`run_s`) wins where a row has it: a run that went on from
    # another (--from-run) starts its first coach with the source's hours already run
    metrics.record_metrics(run_dir, 4, run_s=3600 * 5.2)
    assert run_hours(run_dir, [3, 4, 5]) == pytest.approx({3: 1.5, 4: 5.2, 5: 5.7})
    # without metrics: the manifests alone, the stop counted in
    (run_dir / "metrics.json").unlink()
    (run_dir / "metrics.csv").unlink(missing_ok=True)
    assert run_hours(run_dir, [1, 5]) == pytest.approx({1: 0.5, 5: 10.2})


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "training.strength", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def _cli_in_process(capsys, *args):
    """`training.strength.main(args)` in this process, answered like `_cli`: for flags that are
    refused before any game, where a new interpreter would only add its torch import."""
    from training.strength import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["training.strength", *args], code, out.out, out.err)


def test_cli_plays_the_table_and_writes_json_and_plot(tiny_cfg, run_dir):
    _fake_run(run_dir, tiny_cfg, [0, 1, 2])
    out = _cli("--config", str(REPO / "configs" / "tiny.yaml"), "--run-dir", str(run_dir),
               "--games", "4")
    assert out.returncode == 0, out.stderr
    assert "gen    2       8 sims  vs random" in out.stdout and "vs gen 0" in out.stdout
    assert "rating" not in out.stdout  # no GNU Go games, no anchored rating
    report = json.loads((run_dir / "strength.json").read_text())
    rows = report["rows"]
    assert [r["generation"] for r in rows] == [0, 1, 2]
    assert rows[0]["vs_gen0"] is None
    for r in rows:
        assert sum(r["vs_random"]) == 4
    for r in rows[1:]:
        assert sum(r["vs_gen0"]) == 4
        lo, hi = r["vs_gen0_ci"]
        assert lo <= r["vs_gen0_elo"] <= hi
    assert (run_dir / "strength.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A second evaluation replaces strength.json and adds a line to the history.
    out = _cli("--config", str(REPO / "configs" / "tiny.yaml"), "--run-dir", str(run_dir),
               "--games", "2", "--generations", "2")
    assert out.returncode == 0, out.stderr
    history = read_history(run_dir / "strength_history.jsonl")
    assert [[r["generation"] for r in h["rows"]] for h in history] == [[0, 1, 2], [2]]
    assert history[0]["rows"] == rows and history[1]["games"] == 2
    assert "--games 2" in history[1]["command"]
    assert json.loads((run_dir / "strength.json").read_text()) == history[1]


def test_cli_errors_name_what_is_wrong(tiny_cfg, run_dir, capsys):
    tiny = str(REPO / "configs" / "tiny.yaml")
    out = _cli("--config", tiny, "--run-dir", str(run_dir))  # the refusal as a process sees it
    assert out.returncode == 2 and "no model in" in out.stderr
    main = lambda *args: _cli_in_process(capsys, *args)  # noqa: E731 - the same, in here
    (run_dir / "models").mkdir()
    torch.manual_seed(3)
    save_model(run_dir / "models" / "model_000003.pt",
               net_from_config(tiny_cfg.net, tiny_cfg.go.board_size), 3)
    out = main("--config", tiny, "--run-dir", str(run_dir))  # a simulation budget needs gen 0
    assert out.returncode == 2 and "model_000000.pt not found" in out.stderr
    assert "--seconds-per-move" in out.stderr
    shutil.rmtree(run_dir / "models")
    _fake_run(run_dir, tiny_cfg, [0, 1])
    out = main("--config", tiny, "--run-dir", str(run_dir), "--generations", "0,5")
    assert out.returncode == 2 and "generation(s) [5]" in out.stderr
    out = main("--config", tiny, "--run-dir", str(run_dir), "--generations", "zero")
    assert out.returncode == 2 and "comma list" in out.stderr
    for flag, value in (("--simulations", "0"), ("--seconds-per-move", "nan"),
                        ("--gnugo", "one")):
        out = main("--config", tiny, "--run-dir", str(run_dir), flag, value)
        assert out.returncode == 2 and f"{flag} {value!r}" in out.stderr, out.stderr
    for bad in ("11", "10+0.3", "10+-2", "3+100"):
        out = main("--config", tiny, "--run-dir", str(run_dir), "--gnugo", bad)
        assert out.returncode == 2 and "levels 1..10" in out.stderr, (bad, out.stderr)


def test_gnugo_keys_name_a_level_and_the_points_it_receives():
    from training.strength import parse_gnugo, split_gnugo

    assert parse_gnugo("1, 10,10+5,10+2.5") == ["1", "10", "10+5", "10+2.5"]
    assert split_gnugo("10+5") == (10, 5.0) and split_gnugo(3) == (3, 0.0)
    assert parse_gnugo(None) == []


@pytest.mark.gnugo
def test_cli_against_gnugo_writes_per_level_rows_and_an_anchored_rating(tiny_cfg, run_dir):
    require_tool("GNU Go", gnugo_path() is not None, "apt-get install gnugo")
    _fake_run(run_dir, tiny_cfg, [0, 1], hours={0: 0.0, 1: 1.5})
    out = _cli("--config", str(REPO / "configs" / "tiny.yaml"), "--run-dir", str(run_dir),
               "--generations", "1", "--games", "2", "--gnugo", "1,2+3", "--simulations", "4",
               "--seconds-per-move", "0.02", "--jobs", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("vs gnugo 1: game") == 4  # progress: 2 games x 2 budgets
    assert out.stdout.count("@ 0.02 s/move vs random: game") == 2  # judged too
    report = json.loads((run_dir / "strength.json").read_text())
    assert report["anchor"] == {"player": "gnugo 1", "elo": 0.0}
    assert set(report["pool"]) == {"gnugo 1", "gnugo 2+3", "random"}
    rows = report["rows"]
    assert [(r["generation"], r["simulations"], r["seconds_per_move"]) for r in rows] == [
        (1, 4, None), (1, None, 0.02)]
    assert rows[1]["vs_gen0"] is None and sum(rows[1]["vs_random"]) == 2
    for r in rows:
        assert set(r["vs_gnugo"]) == {"1", "2+3"}
        for level in ("1", "2+3"):
            s = r["vs_gnugo"][level]
            assert sum(s["wdl"]) == 2 and len(s["games"]) == 2
            lo, hi = s["ci"]
            assert 0 <= lo <= s["win_rate"] <= hi <= 1
            assert [g["we"] for g in s["games"]] == ["black", "white"]
            assert s["games"][0]["opening"] == s["games"][1]["opening"]
            assert all(g["judge"] for g in s["games"])
            assert s["disagreements"] == sum(g["disagree"] for g in s["games"])
            assert s["wipeouts"] == sum(g["wiped_out"] for g in s["games"])
            assert s["we_disagree"] == sum(g["we_agree"] is False for g in s["games"])
        assert r["rating_ci"][0] <= r["rating"] <= r["rating_ci"][1]
        assert f"rating {r['rating']:+.0f}" in out.stdout
        assert r["hours"] == pytest.approx(1.5)
    assert "(1.50 h into the run)" in out.stdout
    # Every game through GTP is kept as SGF that a library we did not write reads back.
    from sgfmill import sgf as sgfmill

    (folder,) = (run_dir / "strength_games").iterdir()
    files = sorted(folder.glob("*.sgf"))
    assert len(files) == 2 * 2 * 2 + 2  # 2 budgets x 2 levels x 2 games, + 2 timed vs random
    game = rows[1]["vs_gnugo"]["1"]["games"][0]
    (file,) = [f for f in files if f.name == "gen1_0.02spermove_vs_gnugo1_001.sgf"]
    parsed = sgfmill.Sgf_game.from_bytes(file.read_bytes())
    played = [node.get_move() for node in parsed.get_main_sequence()[1:]]
    assert len(played) == game["moves"] and parsed.get_size() == tiny_cfg.go.board_size
    assert parsed.get_root().get("RE") == game["judge"]
    # each move carries black's win rate by the generation's net (Sabaki's SBKV, percent)
    rates = [float(node.get("SBKV")) for node in parsed.get_main_sequence()[1:]]
    assert len(rates) == len(played) and all(0 <= r <= 100 for r in rates)
    # How each game ended, by the judge at the opponent's first pass and at the end
    out = _cli("--endings", str(folder))
    assert out.returncode == 0, out.stderr
    counts = json.loads(out.stdout.splitlines()[-1])
    assert counts["games"] == len(files)
    assert counts["dead_at_first_pass"] + counts["lost_in_the_ending"] <= counts["wiped_out"]
    assert counts["wiped_out"] <= counts["lost"] <= counts["games"]
    assert out.stdout.count(".sgf: we ") == len(files)
    # where each lost game turned, by our net's win rates in the SGFs, and a panel per game
    assert sum(counts[f"turned_{p}"] for p in
               ("opening", "middle", "endgame", "misjudged")) == counts["lost"]
    assert (folder / "endings.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {folder / 'endings.png'}" in out.stdout
    missing = _cli("--endings", str(folder / "nowhere"))
    assert missing.returncode == 2 and "nowhere: not a folder" in missing.stderr
    # level 2 receiving 3 points: komi + 3 with GNU Go white, komi - 3 with GNU Go black
    for k, shift in ((1, 3), (2, -3)):
        (handicapped,) = [f for f in files if f.name == f"gen1_4sims_vs_gnugo2+3_00{k}.sgf"]
        km = sgfmill.Sgf_game.from_bytes(handicapped.read_bytes()).get_komi()
        assert km == tiny_cfg.go.komi + shift
    assert (run_dir / "strength.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gnugo
def test_a_generation_without_generation_0_is_rated_by_time(tiny_cfg, run_dir):
    # a model copied from another machine, alone in its folder: at a time budget nothing
    # plays generation 0, so it is not needed
    require_tool("GNU Go", gnugo_path() is not None, "apt-get install gnugo")
    _fake_run(run_dir, tiny_cfg, [3])
    out = _cli("--config", str(REPO / "configs" / "tiny.yaml"), "--run-dir", str(run_dir),
               "--games", "2", "--seconds-per-move", "0.02", "--gnugo", "1",
               "--jobs", "1")
    assert out.returncode == 0, out.stderr
    rows = json.loads((run_dir / "strength.json").read_text())["rows"]
    assert [r["generation"] for r in rows] == [3]
    assert sum(rows[0]["vs_gnugo"]["1"]["wdl"]) == 2 and rows[0]["hours"] is None


@pytest.mark.gnugo
def test_a_frozen_model_joins_the_pool_by_its_content(tiny_cfg, run_dir, tmp_path):
    require_tool("GNU Go", gnugo_path() is not None, "apt-get install gnugo")
    import hashlib

    _fake_run(run_dir, tiny_cfg, [0, 1])
    frozen = tmp_path / "anchor.pt"  # a generation of another run, kept fixed
    frozen.write_bytes((run_dir / "models" / "model_000000.pt").read_bytes())
    name = f"model {hashlib.sha256(frozen.read_bytes()).hexdigest()[:8]}"
    tiny = str(REPO / "configs" / "tiny.yaml")
    out = _cli("--config", tiny, "--run-dir", str(run_dir), "--generations", "1", "--games",
               "2", "--gnugo", "1", "--pool-model", str(frozen), "--simulations", "4",
               "--jobs", "1")
    assert out.returncode == 0, out.stderr
    assert f"{name} = {frozen}" in out.stdout and out.stdout.count(f"vs {name}: game") == 2
    report = json.loads((run_dir / "strength.json").read_text())
    assert report["pool_models"] == {name: str(frozen)}
    assert set(report["pool"]) == {"gnugo 1", name, "random"}
    (row,) = report["rows"]
    s = row["vs_models"][name]
    assert sum(s["wdl"]) == 2 and [g["we"] for g in s["games"]] == ["black", "white"]
    assert all(g["judge"] for g in s["games"])
    assert f"vs {name} " in out.stdout and row["rating"] is not None
    # a missing file, or a model of another board, is refused before any game
    nine = tmp_path / "nine.pt"
    save_model(nine, net_from_config(tiny_cfg.net, 9), 0)
    for bad, says in ((tmp_path / "none.pt", "no such file"), (nine, "a 9x9 model")):
        out = _cli("--config", tiny, "--run-dir", str(run_dir), "--gnugo", "1",
                   "--pool-model", str(bad))
        assert out.returncode == 2 and f"--pool-model {bad}: " in out.stderr, out.stderr
        assert says in out.stderr
