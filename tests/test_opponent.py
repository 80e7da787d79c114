"""training.play.opponent and `python -m training.strength --opponent`: any GTP engine as an
opponent, played and judged like GNU Go, and held to bounds when it misbehaves."""

from __future__ import annotations

import json
import sys
import textwrap
import time

import pytest

from tests.conftest import REPO, gnugo_path, require_tool
from tests.test_strength import _cli, _cli_in_process, _fake_run
from training.play.gtp_client import MAX_LINE_CHARS, GtpClient, GtpEngineError
from training.play.opponent import OpponentError, clean_name, open_engine, parse_command
from training.run.metrics import engine_scores, plot_progress, record_metrics

TINY = str(REPO / "configs" / "tiny.yaml")

# A GTP engine that answers everything politely except `genmove`, which MODE (argv[1]) decides;
# it writes its pid to argv[2] so a test can check that the process is gone afterwards.
HOSTILE = textwrap.dedent(r'''
    import os, signal, sys, time
    mode, pidfile = sys.argv[1], sys.argv[2]
    with open(pidfile, "a") as f:
        f.write(f"{os.getpid()}\n")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only a kill ends it
    out = sys.stdout
    if mode == "mute":  # never says anything, not even its name
        time.sleep(3600)
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        cid, cmd = (parts[0], parts[1:]) if parts[0].isdigit() else ("", parts)
        if cmd[0] == "quit" and mode == "silent":
            time.sleep(3600)  # ignores quit too
        if cmd[0] == "name":
            out.write(f"={cid} Hostile\x07  engine\n\n")
        elif cmd[0] == "version":
            out.write(f"={cid} {mode}\n\n")
        elif cmd[0] == "time_settings" and mode == "fussy":
            out.write(f"?{cid} unknown command\n\n")
        elif cmd[0] == "genmove":
            if mode == "garbage":
                out.write(f"={cid} xyzzy\n\n")
            elif mode == "illegal":
                out.write(f"={cid} A1\n\n")  # legal once at most, then occupied
            elif mode == "protocol":
                out.write("hello there\n\n")
            elif mode == "endless":
                while True:
                    out.write("=" + "x" * 65536)
                    out.flush()
            elif mode == "silent":
                time.sleep(3600)
            else:
                out.write(f"={cid} pass\n\n")
        else:
            out.write(f"={cid}\n\n")
        out.flush()
''')


@pytest.fixture
def hostile(tmp_path):
    """(argv text of the hostile engine in MODE, pid file) for a mode."""
    script = tmp_path / "hostile_engine.py"
    script.write_text(HOSTILE)
    pids = tmp_path / "pids.txt"

    def command(mode: str) -> str:
        return f"{sys.executable} {script} {mode} {pids}"

    command.pids = pids
    return command


def _all_gone(pidfile) -> bool:
    """Every process that wrote its pid to `pidfile` is gone (or a zombie no longer ours)."""
    for pid in map(int, pidfile.read_text().split()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[-1][0] != "Z":
                    return False
        except FileNotFoundError:
            continue
    return True


def test_a_command_line_is_split_without_a_shell_and_must_name_a_program():
    assert parse_command(f"{sys.executable} -c 'print(1); x = 2'") == [
        sys.executable, "-c", "print(1); x = 2"]
    for bad, says in (("", "command line of a GTP engine"), ("'unclosed", "quote it"),
                      ("no-such-engine-here gtp", "not an executable")):
        with pytest.raises(OpponentError, match=says):
            parse_command(bad)
    assert clean_name("Leela\x00 Zero\n 0.17 " + "x" * 99) == ("Leela Zero 0.17 " + "x" * 99)[:40]


@pytest.mark.gnugo
def test_an_engine_is_labelled_by_its_name_and_version_and_its_commands_probed():
    require_tool("GNU Go", gnugo_path() is not None, "apt-get install gnugo")
    engine = open_engine(f"{gnugo_path()} --mode gtp --level 1")
    assert engine.name.startswith("GNU Go 3.") and engine.playout
    assert engine.command(7) == [gnugo_path(), "--mode", "gtp", "--level", "1"]
    assert open_engine(f"{gnugo_path()} --mode gtp", name=" my  gnugo ").name == "my gnugo"
    with pytest.raises(OpponentError, match="taken by the tool's own players"):
        open_engine(f"{gnugo_path()} --mode gtp", name="gnugo 1")


def test_an_engine_that_says_nothing_is_refused_within_its_timeout(hostile):
    t0 = time.monotonic()
    with pytest.raises(OpponentError, match=r"no answer to 'name' within 1 s") as e:
        open_engine(hostile("mute"), timeout_s=1.0)
    assert hostile("mute") in str(e.value)  # the engine's command, as the user gave it
    assert time.monotonic() - t0 < 30
    assert _all_gone(hostile.pids)


@pytest.mark.parametrize("mode, says", [
    ("endless", f"with a line longer than {MAX_LINE_CHARS} characters"),
    ("protocol", "bad reply to 'genmove black'"),
    ("silent", "no answer to 'genmove black' within 1 s"),
])
def test_a_misbehaving_engine_is_killed_with_an_error_naming_its_command(hostile, mode, says):
    t0 = time.monotonic()
    engine = GtpClient(parse_command(hostile(mode)), timeout_s=1.0, name="hostile")
    assert engine.send("name") == "Hostile\x07  engine"
    with pytest.raises(GtpEngineError) as e:
        engine.send("genmove black")
    assert says in str(e.value) and hostile(mode) in str(e.value), e.value
    engine.close()
    assert engine.returncode is not None and _all_gone(hostile.pids)
    assert time.monotonic() - t0 < 30


def test_a_reply_must_be_whole_within_the_timeout_however_its_lines_are_spaced(tmp_path):
    # blank lines every 0.3 s, then it exits after 20 s: a timeout per line never fires
    drip = tmp_path / "drip.py"
    drip.write_text("import sys, time\nsys.stdin.readline()\nfor _ in range(66):\n"
                    "    print(flush=True)\n    time.sleep(0.3)\n")
    t0 = time.monotonic()
    engine = GtpClient([sys.executable, str(drip)], timeout_s=1.0)
    with pytest.raises(GtpEngineError, match=r"no answer to 'name' within 1 s"):
        engine.send("name")
    assert time.monotonic() - t0 < 15
    engine.close()


def test_a_flood_of_lines_waits_in_the_pipe_not_in_memory(tmp_path):
    flood = tmp_path / "flood.py"
    flood.write_text("import sys\nsys.stdin.readline()\nwhile True:\n    print('=', flush=False)\n")
    engine = GtpClient([sys.executable, str(flood)], timeout_s=2.0)
    with pytest.raises(GtpEngineError, match="sent only blank lines|more than"):
        engine.send("name")
    engine.close()
    assert engine._lines.qsize() <= 256 + 1


@pytest.mark.gnugo
def test_cli_plays_gnugo_as_an_opponent_judged_and_plotted_like_a_gnugo_level(
        tiny_cfg, run_dir):
    require_tool("GNU Go", gnugo_path() is not None, "apt-get install gnugo")
    _fake_run(run_dir, tiny_cfg, [0, 1])
    for g in (0, 1):
        record_metrics(run_dir, g, loss=2.0 - g, games_per_s=1.0)
    plain = _png_height(plot_progress(run_dir))
    out = _cli("--config", TINY, "--run-dir", str(run_dir), "--generations", "1", "--games",
               "2", "--simulations", "4", "--gnugo", "1", "--jobs", "1",
               "--opponent", f"{gnugo_path()} --mode gtp --level 1")
    assert out.returncode == 0, out.stderr
    report = json.loads((run_dir / "strength.json").read_text())
    (label,) = report["opponents"]
    assert label.startswith("GNU Go 3.")
    assert report["opponents"][label] == f"{gnugo_path()} --mode gtp --level 1"
    assert f"{label} = {gnugo_path()} --mode gtp --level 1" in out.stdout
    assert out.stdout.count(f"vs {label}: game") == 2
    assert set(report["pool"]) == {"gnugo 1", label, "random"}  # rated in the same pool
    (row,) = report["rows"]
    s = row["vs_engines"][label]
    assert sum(s["wdl"]) == 2 and s["forfeits"] == 0
    games = s["games"]
    assert [g["we"] for g in games] == ["black", "white"]  # colours alternate
    assert games[0]["opening"] == games[1]["opening"]  # an opening played with both
    assert games[0]["opening"] == row["vs_gnugo"]["1"]["games"][0]["opening"]  # same series
    assert all(g["judge"] and g["forfeit"] is None for g in games)  # GNU Go judged
    assert f"vs {label} {s['wdl'][0]}-{s['wdl'][1]}-{s['wdl'][2]}" in out.stdout
    (folder,) = (run_dir / "strength_games").iterdir()
    assert len(list(folder.glob("*vs_GNUGo3.*.sgf"))) == 2
    # progress.png gains the engine's panel; the history keeps its score by generation
    scores = engine_scores(run_dir / "strength_history.jsonl")
    assert list(scores) == [f"{label}, 4 sims"]
    assert scores[f"{label}, 4 sims"] == [(1, s["win_rate"], *s["ci"])]
    assert _png_height(run_dir / "progress.png") > plain


@pytest.mark.gnugo
def test_cli_an_engine_that_plays_illegal_or_unreadable_moves_forfeits(
        tiny_cfg, run_dir, hostile):
    require_tool("GNU Go", gnugo_path() is not None, "apt-get install gnugo")
    _fake_run(run_dir, tiny_cfg, [0])
    out = _cli("--config", TINY, "--run-dir", str(run_dir), "--games", "2", "--simulations",
               "4", "--jobs", "1", "--opponent", hostile("illegal"), "--opponent-name", "liar",
               "--opponent", hostile("garbage"))  # a name labels the --opponent in its place
    assert out.returncode == 0, out.stderr
    (row,) = json.loads((run_dir / "strength.json").read_text())["rows"]
    assert set(row["vs_engines"]) == {"liar", "Hostile engine garbage"}
    for label, reason in (("liar", "illegal"), ("Hostile engine garbage", "'xyzzy'")):
        s = row["vs_engines"][label]
        assert s["wdl"] == [2, 0, 0] and s["forfeits"] == 2
        for g in s["games"]:
            assert g["end"] == "forfeit" and reason in g["forfeit"], g
            assert g["judge"] is None and g["area"] == ("B+F" if g["we"] == "black" else "W+F")
    assert "2 forfeited" in out.stdout
    assert _all_gone(hostile.pids)


@pytest.mark.gnugo
@pytest.mark.parametrize("mode, says, budget", [
    ("silent", "no answer to 'genmove ", ["--simulations", "4"]),
    ("endless", "a line longer than", ["--simulations", "4"]),
    # a setting it refuses (our engine thinks 0.1 s a move against the random player first)
    ("fussy", "'time_settings 0 0.1 1' failed: unknown command", ["--time-settings", "0,0.1,1"]),
])
def test_cli_an_engine_that_overruns_stops_with_an_error_naming_it(
        tiny_cfg, run_dir, hostile, mode, says, budget):
    require_tool("GNU Go", gnugo_path() is not None, "apt-get install gnugo")
    _fake_run(run_dir, tiny_cfg, [0])
    t0 = time.monotonic()
    out = _cli("--config", TINY, "--run-dir", str(run_dir), "--games", "4", *budget,
               "--jobs", "2", "--opponent", hostile(mode), "--opponent-timeout", "2")
    assert out.returncode == 1, out.stdout
    (err,) = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert err.startswith(f"error: Hostile engine {mode}") and says in err, err
    assert hostile(mode) in err or mode == "fussy"  # a refusal names the engine by its label
    assert time.monotonic() - t0 < 120  # 4 games of 2 s bounds, not 4 x 120 s
    assert not (run_dir / "strength.json").exists()
    assert _all_gone(hostile.pids)


def test_cli_refuses_a_bad_opponent_before_any_game(tiny_cfg, run_dir, hostile, capsys):
    _fake_run(run_dir, tiny_cfg, [0])
    # the first through a new interpreter, the others through the same main in this process
    for run, args, says in (
            (_cli, ["--opponent", "no-such-engine-here"], "not an executable"),
            (_in_process(capsys), ["--opponent-name", "x"], "--opponent-name needs an --opponent"),
            (_in_process(capsys), ["--opponent", hostile("mute"), "--opponent-timeout", "1"],
             "no answer to 'name' within 1 s")):
        out = run("--config", TINY, "--run-dir", str(run_dir), *args)
        assert out.returncode == 2 and "error: " in out.stderr and says in out.stderr, (
            args, out.stderr)


def _in_process(capsys):
    return lambda *args: _cli_in_process(capsys, *args)


def _png_height(path) -> int:
    from PIL import Image

    with Image.open(path) as im:
        return im.size[1]

