"""Per-generation metrics of a run: metrics.json, metrics.csv and the progress.png plot.

Owns the three files in the run folder (see docs/DESIGN.md; their names and paths are
`training.run.run_dir`'s, `RunDir.metrics_json`, `.metrics_csv`, `.progress_png`):
- `metrics.json`: a list of rows, one per generation, sorted by generation;
- `metrics.csv`: the same rows as a table (the union of all columns, empty where unknown);
- `progress.png`: loss, Elo, the win rate against GNU Go (when `evaluation.gnugo_games` plays
  it: `gnugo_score` with its Wilson interval `gnugo_ci_low`..`gnugo_ci_high`), the rating
  against the fixed pool (when `python -m training.strength` has rated generations: the newest
  rating of each generation and budget in `strength_history.jsonl`), the win rate against
  each outside engine the strength tool played (`--opponent`: its newest score by generation
  and budget in the same history, with its Wilson interval) and games/s over
  generations (matplotlib, Agg backend). The chained arena Elo is a sum of small noisy steps;
  the pool rating is anchored (GNU Go level 1 = 0), so a regression shows there.

Vocabulary: a **row** is a dict of plain numbers/strings with an int `generation` key. Several
parts add columns to the same generation's row (the trainer its losses, the arena its Elo, the
coach games/s): `record_metrics(run_dir, generation, **values)` merges them.

Writers: the coach, rank 0 of the trainer and the arena's child process, which may rate one
generation while the next trains; each merges under an exclusive `fcntl.flock` on
`metrics.lock`, so no column is lost, and every file is written to a temp name and renamed
(readers never take the lock). This module must not import torch.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import logging
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from distributed.transfer import write_atomic, write_json_atomic
from training.run.run_dir import RunDir

log = logging.getLogger(__name__)

_FIRST_COLUMNS = ("generation", "time", "loss", "policy_loss", "value_loss", "val_loss", "elo")


class MetricsError(Exception):
    """metrics.json exists but cannot be read as a list of rows."""


def _plain(value: Any) -> Any:
    """A JSON-friendly version of a number (numpy and torch scalars included)."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of metrics.json, sorted by generation ([] when the file does not exist)."""
    path = RunDir(run_dir).metrics_json
    try:
        rows = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, json.JSONDecodeError) as e:
        raise MetricsError(
            f"{path}: cannot read metrics ({e}); move the file away to start a new one"
        ) from e
    if not isinstance(rows, list) or not all(
        isinstance(r, dict) and "generation" in r for r in rows
    ):
        raise MetricsError(f"{path}: expected a list of rows with 'generation'; move it away")
    return sorted(rows, key=lambda r: r["generation"])


def seconds(value: object) -> float | None:
    """A metrics cell as seconds: a number >= 0, else None (missing, garbled or negative)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        return None
    return float(value)


def run_seconds(rows: list[dict[str, Any]]) -> float:
    """The seconds a run had run by its newest row, the time it was stopped left out.

    A row's `run_s` (the coach's count, resumes included) is taken as it is; without one, the
    coaches' `elapsed_s` (from each coach's start) are chained: where it falls, the run was
    resumed, and the seconds before are added on. 0 for a run without rows."""
    total = base = 0.0
    last_elapsed = None
    for row in sorted(rows, key=lambda r: int(r.get("generation", 0))):
        elapsed, run_s = seconds(row.get("elapsed_s")), seconds(row.get("run_s"))
        if run_s is not None:
            total = run_s
            base = total - elapsed if elapsed is not None else total
        elif elapsed is not None:
            if last_elapsed is not None and elapsed < last_elapsed:
                base = total  # a new coach: the run was resumed
            total = base + elapsed
        if elapsed is not None:
            last_elapsed = elapsed
    return total


def record_metrics(run_dir: str | os.PathLike, generation: int, **values: Any) -> dict:
    """Merge `values` into the row of `generation`; rewrite metrics.json and metrics.csv.

    Returns the merged row. Also logs it as one key=value line.
    """
    paths = RunDir(run_dir)
    paths.root.mkdir(parents=True, exist_ok=True)
    with _locked(paths):
        rows = read_metrics(paths.root)
        row = next((r for r in rows if r["generation"] == generation), None)
        if row is None:
            row = {"generation": int(generation)}
            rows.append(row)
            rows.sort(key=lambda r: r["generation"])
        row.update({k: _plain(v) for k, v in values.items()})
        _write(paths, rows)
    log.info(
        "metrics generation=%d %s",
        generation,
        " ".join(f"{k}={_fmt(v)}" for k, v in values.items()),
    )
    return row


def write_rows(run_dir: str | os.PathLike, rows: list[dict[str, Any]]) -> None:
    """Make `rows` the run's metrics.json and metrics.csv (a branched run's rows up to its
    generation; `training.branch`)."""
    paths = RunDir(run_dir)
    with _locked(paths):
        _write(paths, sorted(rows, key=lambda r: r["generation"]))


@contextmanager
def _locked(paths: RunDir):
    """Hold the run's metrics.lock (released when the file closes)."""
    with open(paths.metrics_lock, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        yield


def _write(paths: RunDir, rows: list[dict[str, Any]]) -> None:
    write_json_atomic(paths.metrics_json, rows)
    write_atomic(paths.metrics_csv, _csv_text(rows))


def _fmt(value: Any) -> str:
    value = _plain(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _csv_text(rows: list[dict[str, Any]]) -> str:
    columns = [c for c in _FIRST_COLUMNS if any(c in r for r in rows)]
    for r in rows:
        columns += [k for k in r if k not in columns and not isinstance(r[k], (list, dict))]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("" if r.get(k) is None else r.get(k, "")) for k in columns})
    return out.getvalue()


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(r["generation"])
            ys.append(float(v))
    return xs, ys


def lr_changes(rows: list[dict]) -> list[tuple[int, float]]:
    """(generation, new LR) wherever a round's LR differs from the round before: a drop of
    training.lr_schedule, or a run resumed with another --lr."""
    xs, ys = _series(rows, "lr")
    return [(g, lr) for g, lr, before in zip(xs[1:], ys[1:], ys)
            if not math.isclose(lr, before, rel_tol=1e-6)]


def pool_ratings(history: Path) -> dict[str, list[tuple[int, float, float, float]]]:
    """budget -> [(generation, rating, ci low, ci high)] by generation: the newest rating of
    each (generation, budget) in the strength tool's history, among the evaluations anchored
    like the newest one (a rating only compares with ratings on the same anchor; unreadable
    lines skipped). `pool_anchor(history)` names that anchor."""
    newest: dict[tuple[str, int], tuple[float, float, float]] = {}
    anchor = pool_anchor(history)
    try:
        text = history.read_text(encoding="utf-8")
    except OSError:
        return {}
    for line in text.splitlines():
        try:
            report = json.loads(line)
            if _anchor_name(report) != anchor:
                continue
            for row in report["rows"]:
                if row.get("rating") is None:
                    continue
                budget = _budget_name(row)
                lo, hi = row["rating_ci"]
                newest[(budget, int(row["generation"]))] = (
                    float(row["rating"]), float(lo), float(hi))
        except (ValueError, KeyError, TypeError):
            continue
    out: dict[str, list[tuple[int, float, float, float]]] = {}
    for (budget, g), (r, lo, hi) in sorted(newest.items()):
        out.setdefault(budget, []).append((g, r, lo, hi))
    return out


def _budget_name(row: dict) -> str:
    return (f"{row['seconds_per_move']:g} s/move" if row.get("seconds_per_move") is not None
            else f"{row['simulations']} sims")


def engine_scores(history: Path) -> dict[str, list[tuple[int, float, float, float]]]:
    """"<engine label>, <budget>" -> [(generation, win rate, ci low, ci high)] by generation:
    the newest score of each generation at each budget against each outside engine
    (`--opponent`) in the strength tool's history (unreadable lines skipped)."""
    newest: dict[tuple[str, int], tuple[float, float, float]] = {}
    try:
        text = history.read_text(encoding="utf-8")
    except OSError:
        return {}
    for line in text.splitlines():
        try:
            for row in json.loads(line)["rows"]:
                for label, s in (row.get("vs_engines") or {}).items():
                    if s.get("win_rate") is None:
                        continue
                    lo, hi = s["ci"]
                    newest[(f"{label}, {_budget_name(row)}", int(row["generation"]))] = (
                        float(s["win_rate"]), float(lo), float(hi))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    out: dict[str, list[tuple[int, float, float, float]]] = {}
    for (key, g), (w, lo, hi) in sorted(newest.items()):
        out.setdefault(key, []).append((g, w, lo, hi))
    return out


def _anchor_name(report: Any) -> str | None:
    anchor = report.get("anchor") if isinstance(report, dict) else None
    return anchor.get("player") if isinstance(anchor, dict) else None


def pool_anchor(history: Path) -> str | None:
    """The pool player the newest rated evaluation in the history is anchored on."""
    try:
        lines = history.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            name = _anchor_name(json.loads(line))
        except ValueError:
            continue
        if name:
            return name
    return None


def save_png(fig: Any, axes: Any, path: Path) -> None:
    """A figure's panels gridded, laid out and written as a PNG (atomically: the page and
    watchers read it while runs go on); the figure is closed."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    write_atomic(path, buf.getvalue())


def plot_progress(run_dir: str | os.PathLike) -> Path:
    """Draw progress.png from metrics.json: losses, Elo (with its CI), the win rate against
    GNU Go (with its CI; a panel only when some generation played it), the win rate against
    outside engines and the pool rating (panels only when the strength tool measured them)
    and games/s."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must come before pyplot
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    paths = RunDir(run_dir)
    rows = read_metrics(paths.root)
    gnugo = _series(rows, "gnugo_score")
    pool = pool_ratings(paths.strength_history)
    engines = engine_scores(paths.strength_history)
    panels = 3 + bool(gnugo[0]) + bool(engines) + bool(pool)
    fig, axes = plt.subplots(panels, 1, figsize=(8, 3 * panels), sharex=True)
    _plot_losses(axes[0], rows)
    _plot_elo(axes[1], rows)
    if gnugo[0]:
        _plot_gnugo(axes[2], rows, gnugo)
    if engines:
        _plot_engines(axes[2 + bool(gnugo[0])], engines)
    if pool:
        _plot_pool(axes[-2], pool, pool_anchor(paths.strength_history))
    ax = axes[-1]
    xs, ys = _series(rows, "games_per_s")
    if xs:
        ax.plot(xs, ys, marker=".", color="tab:orange")
    ax.set_ylabel("self-play games/s")
    ax.set_xlabel("generation")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no generation 1.5
    save_png(fig, axes, paths.progress_png)
    return paths.progress_png


def _plot_losses(ax, rows: list[dict]) -> None:
    """The losses by generation, and where the learning rate changed."""
    for key, label in (
        ("loss", "train loss"),
        ("policy_loss", "policy loss"),
        ("value_loss", "value loss"),
        ("val_loss", "validation loss"),
    ):
        xs, ys = _series(rows, key)
        if xs:
            ax.plot(xs, ys, marker=".", label=label)
    for gen, lr in lr_changes(rows):  # named in the legend, never a label over the lines
        ax.axvline(gen, color="grey", lw=0.8, ls=":", label=f"LR {lr:.3g} from gen {gen}")
    ax.set_ylabel("loss")
    if ax.lines:
        ax.legend(loc="best", fontsize="small")


def _plot_elo(ax, rows: list[dict]) -> None:
    """The arena's chained Elo with its 95% interval."""
    xs, ys = _series(rows, "elo")
    if xs:
        ax.plot(xs, ys, marker=".", color="tab:green", label="Elo")
        lo = dict(zip(*_series(rows, "elo_ci_low")))
        hi = dict(zip(*_series(rows, "elo_ci_high")))
        band = [g for g in xs if g in lo and g in hi]
        if band:
            ax.fill_between(
                band, [lo[g] for g in band], [hi[g] for g in band], alpha=0.2, color="tab:green"
            )
    ax.set_ylabel("Elo (95% CI)")


def _plot_gnugo(ax, rows: list[dict], gnugo: tuple[list, list]) -> None:
    """The win rate against GNU Go with its interval."""
    xs, ys = gnugo
    ax.plot(xs, [100 * y for y in ys], marker=".", color="tab:red")
    lo = dict(zip(*_series(rows, "gnugo_ci_low")))
    hi = dict(zip(*_series(rows, "gnugo_ci_high")))
    band = [g for g in xs if g in lo and g in hi]
    if band:
        ax.fill_between(band, [100 * lo[g] for g in band], [100 * hi[g] for g in band],
                        alpha=0.2, color="tab:red")
    levels = sorted({r["gnugo_level"] for r in rows if isinstance(r.get("gnugo_level"), int)})
    ax.set_ylim(0, 100)
    ax.axhline(50, color="grey", lw=0.8, ls="--")
    ax.set_ylabel(f"% won vs GNU Go {'/'.join(map(str, levels))}")


def _plot_engines(ax, engines: dict) -> None:
    """The win rates against outside engines (the strength tool's)."""
    for key, points in engines.items():
        gens = [p[0] for p in points]
        ax.plot(gens, [100 * p[1] for p in points], marker="o", label=f"vs {key}")
        ax.fill_between(gens, [100 * p[2] for p in points], [100 * p[3] for p in points],
                        alpha=0.15)
    ax.set_ylim(0, 100)
    ax.axhline(50, color="grey", lw=0.8, ls="--")
    ax.set_ylabel("% won (95% CI)")
    ax.legend(loc="upper left", fontsize="small")


def _plot_pool(ax, pool: dict, anchor: str | None) -> None:
    """The pool rating by budget (the strength tool's), `anchor` at 0."""
    for budget, points in pool.items():
        gens = [p[0] for p in points]
        ax.plot(gens, [p[1] for p in points], marker="o", label=budget)
        ax.fill_between(gens, [p[2] for p in points], [p[3] for p in points], alpha=0.15)
    ax.axhline(0, color="grey", lw=0.8, ls="--")
    ax.set_ylabel(f"Elo vs pool ({anchor} = 0)")
    ax.legend(loc="upper left", fontsize="small")
