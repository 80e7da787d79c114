"""metrics.json / metrics.csv merging and the progress plot (real files, real matplotlib)."""

from __future__ import annotations

import csv
import json

import pytest

from training.run.metrics import (
    MetricsError,
    lr_changes,
    plot_progress,
    read_metrics,
    record_metrics,
    run_seconds,
    seconds,
)


def test_values_from_several_parts_merge_into_one_row_per_generation(run_dir):
    record_metrics(run_dir, 2, loss=1.5, policy_loss=1.2, value_loss=0.3)
    record_metrics(run_dir, 1, loss=2.0)
    record_metrics(run_dir, 2, elo=35.0, elo_ci_low=10.0, elo_ci_high=60.0)
    rows = read_metrics(run_dir)
    assert [r["generation"] for r in rows] == [1, 2]
    assert rows[1] == {
        "generation": 2, "loss": 1.5, "policy_loss": 1.2, "value_loss": 0.3,
        "elo": 35.0, "elo_ci_low": 10.0, "elo_ci_high": 60.0,
    }
    with open(run_dir / "metrics.csv") as f:
        table = list(csv.DictReader(f))
    assert [t["generation"] for t in table] == ["1", "2"]
    assert table[0]["elo"] == "" and float(table[1]["elo"]) == 35.0
    assert not list(run_dir.glob("*.tmp"))


def test_run_seconds_chain_the_coaches_of_a_resumed_run():
    assert run_seconds([]) == 0.0
    # two coaches (elapsed_s falls at generation 3), then a third that writes run_s
    rows = [{"generation": 1, "elapsed_s": 100.0}, {"generation": 2, "elapsed_s": 250.0},
            {"generation": 3, "elapsed_s": 40.0}, {"generation": 4, "elapsed_s": 90.0}]
    assert run_seconds(rows) == pytest.approx(340.0)
    assert run_seconds(list(reversed(rows))) == pytest.approx(340.0)  # by generation
    rows += [{"generation": 5, "elapsed_s": 10.0, "run_s": 400.0},
             {"generation": 6, "elapsed_s": 30.0}]  # the same coach, no run_s
    assert run_seconds(rows) == pytest.approx(420.0)
    rows.append({"generation": 7, "loss": 1.0})  # a row without times changes nothing
    assert run_seconds(rows) == pytest.approx(420.0)


@pytest.mark.parametrize("bad", ["90", -5.0, True, None, float("nan")])
def test_a_garbled_time_cell_is_skipped_not_counted(bad):
    assert seconds(bad) is None
    rows = [{"generation": 1, "elapsed_s": 100.0}, {"generation": 2, "elapsed_s": bad},
            {"generation": 3, "elapsed_s": 150.0, "run_s": bad}]
    assert run_seconds(rows) == pytest.approx(150.0)


def test_non_finite_numbers_are_stored_as_null(run_dir):
    record_metrics(run_dir, 1, val_loss=float("nan"))
    assert json.loads((run_dir / "metrics.json").read_text())[0]["val_loss"] is None


def test_progress_plot_is_a_png(run_dir):
    for g in range(1, 4):
        record_metrics(run_dir, g, loss=3.0 - g * 0.5, elo=g * 20.0, games_per_s=1.5 * g)
    path = plot_progress(run_dir)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_progress_plot_marks_where_the_lr_changed(run_dir, monkeypatch):
    for g, lr in ((1, 0.02), (2, 0.02), (3, 0.002), (4, 0.002), (5, 0.0002)):
        record_metrics(run_dir, g, loss=2.0, lr=lr)
    record_metrics(run_dir, 6, loss=2.0)  # a round without its LR (an older run's row)
    assert lr_changes(read_metrics(run_dir)) == [(3, 0.002), (5, 0.0002)]
    from matplotlib.figure import Figure

    saved = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig",
                        lambda fig, *a, **kw: (saved.append(fig), real_savefig(fig, *a, **kw)))
    assert plot_progress(run_dir).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loss_panel = saved[0].axes[0]
    # the markers are named in the legend, not by text drawn over the lines
    assert [t.get_text() for t in loss_panel.get_legend().get_texts()] == [
        "train loss", "LR 0.002 from gen 3", "LR 0.0002 from gen 5"]
    assert not loss_panel.texts


def test_plot_of_an_empty_run_still_draws(run_dir):
    assert plot_progress(run_dir).stat().st_size > 0


def test_damaged_metrics_file_is_reported_by_name(run_dir):
    (run_dir / "metrics.json").write_text("{not json")
    with pytest.raises(MetricsError, match="metrics.json"):
        record_metrics(run_dir, 1, loss=1.0)


def test_progress_plot_gains_a_gnugo_panel_when_generations_played_it(run_dir):
    from PIL import Image

    record_metrics(run_dir, 1, loss=2.0, games_per_s=1.0)
    plain = Image.open(plot_progress(run_dir)).size
    record_metrics(run_dir, 2, loss=1.5, gnugo_level=1, gnugo_score=0.25, gnugo_ci_low=0.1,
                   gnugo_ci_high=0.5)
    with_gnugo = Image.open(plot_progress(run_dir)).size
    assert with_gnugo[1] > plain[1]  # one more panel


def test_progress_plot_gains_a_pool_rating_panel_from_the_strength_history(run_dir):
    from PIL import Image

    from training.run.metrics import pool_ratings

    record_metrics(run_dir, 1, loss=2.0, games_per_s=1.0)
    plain = Image.open(plot_progress(run_dir)).size

    def report(rows, anchor="gnugo 1"):
        return json.dumps({"rows": rows, "anchor": {"player": anchor, "elo": 0.0}}) + "\n"

    def row(g, rating, seconds=None):
        return {"generation": g, "simulations": None if seconds else 64,
                "seconds_per_move": seconds, "rating": rating,
                "rating_ci": [rating - 50, rating + 50] if rating is not None else None}

    history = run_dir / "strength_history.jsonl"
    history.write_text(report([row(1, -300.0), row(5, -100.0), row(5, 20.0, seconds=1.0)])
                       + "{torn line\n"
                       + report([row(5, -80.0), row(9, None)]))
    assert pool_ratings(history) == {
        "64 sims": [(1, -300.0, -350.0, -250.0), (5, -80.0, -130.0, -30.0)],  # newest wins
        "1 s/move": [(5, 20.0, -30.0, 70.0)],
    }
    with_pool = Image.open(plot_progress(run_dir)).size
    assert with_pool[1] > plain[1]  # one more panel
    # an evaluation on another anchor: only its ratings count from then on
    with history.open("a") as f:
        f.write(report([row(9, 50.0)], anchor="gnugo 10"))
    assert pool_ratings(history) == {"64 sims": [(9, 50.0, 0.0, 100.0)]}
