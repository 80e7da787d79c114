"""benchmarks/gpu_run.py's parts that need no run: what it keeps, and its wheels."""

from __future__ import annotations


import pytest

from benchmarks.gpu_run import NEEDED, install_from_wheels, keep_run, missing_packages
from training.run.model_store import list_models


def test_it_keeps_generation_0_the_newest_models_and_the_plots_as_a_run_folder(tmp_path):
    run = tmp_path / "scratch" / "run"
    (run / "models").mkdir(parents=True)
    for g in range(7):
        (run / "models" / f"model_{g:06d}.pt").write_bytes(b"m%d" % g)
    (run / "models" / "model_000006.pt.zst").write_bytes(b"z")
    for name in ("config.yaml", "metrics.json", "progress.png"):
        (run / name).write_text(name)
    (run.parent / "status.txt").write_text("table")
    (run / "replay").mkdir()
    (run / "replay" / "w_000001_00000001.npz.zst").write_bytes(b"games")
    dest = tmp_path / "out" / "run"
    assert keep_run(run, dest, keep=3) == [0, 4, 5, 6]
    assert list_models(dest / "models") == [0, 4, 5, 6]
    assert (dest / "models" / "model_000005.pt").read_bytes() == b"m5"
    assert sorted(p.name for p in dest.iterdir()) == [
        "config.yaml", "metrics.json", "models", "progress.png", "status.txt"]
    (run / "models" / "model_000007.pt").write_bytes(b"m7")  # the run goes on
    assert keep_run(run, dest, keep=3) == [0, 5, 6, 7]
    assert list_models(dest / "models") == [0, 5, 6, 7]


def test_missing_packages_without_wheels_say_how_to_get_them(tmp_path):
    assert missing_packages() == []  # this machine has them all
    with pytest.raises(SystemExit, match=r"pip download paramiko zstandard watchdog "
                       r"ruamel.yaml -d .*wheels"):
        install_from_wheels(tmp_path / "wheels", ["zstandard"])
    assert set(NEEDED) == {"paramiko", "zstandard", "watchdog", "ruamel.yaml"}
