"""The GPU measurement in one command: a nine-minute run of the GPU config, its models kept.

    python3 benchmarks/gpu_run.py [--config configs/gpu.yaml] [--hours 0.15] [--out DIR]
                                  [--wheels .whl] [--keep 4] [--cpu-only] [-- START_MAIN FLAGS]

On the GPU machine it
1. installs the dependencies the machine lacks (paramiko, zstandard, watchdog, ruamel.yaml)
   from a wheels folder shipped beside the code, with no network: `pip install --no-index
   --find-links WHEELS`. Fill that folder on a machine with network first, for this Python
   and for the GPU machine's (3.12 on the boxes measured so far; 25 MB for both):
       pip download paramiko zstandard watchdog ruamel.yaml -d .whl
       pip download paramiko zstandard watchdog ruamel.yaml -d .whl --only-binary=:all: \
           --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64
   (`.whl/` is git-ignored; send it along, e.g. as a carried path);
2. runs `python3 start_main.py --config CONFIG --hours HOURS --run-dir RUN` in a fresh run
   folder (RUN = OUT/scratch/run, deleted at the end unless `--keep-run`), its output in
   OUT/start_main.log and its wall time bounded by HOURS plus a margin;
3. copies what the strength tool needs into OUT/run, a run folder of its own: the run's
   config.yaml, generation 0 and the newest `--keep` models (`models/model_<gen>.pt`),
   metrics.json, metrics.csv, progress.png and the final status table; and writes
   OUT/gpu_run.json (the command, its exit code, wall time, generations, games);
4. prints the follow-up command for the CPU box, where GNU Go is:
       python3 -m training.strength --run-dir OUT/run --generations G --seconds-per-move 1
           --gnugo 1,10 --gnugo-games 100 --games 2 --jobs 2

While it runs, the newest models are copied to OUT/run every 20 s, so a run stopped from
outside still leaves them; `--deadline S` stops start_main (SIGTERM, the coach's clean stop)
in time for the whole command to end within S seconds (a machine that ends commands after
600 s: `--deadline 590`; `--hours 0.15` is 540 s of it, start-up included).

OUT is `--out`, else $OUT when set, else benchmarks/out/gpu_run_<time>. `--cpu-only` passes
`--cpu-only` to start_main (self-play on the CPU): the rehearsal on a box without a GPU, e.g.
`python3 benchmarks/gpu_run.py --cpu-only --hours 0.02 --config configs/tiny.yaml`.
Flags after `--` go to start_main.py as they are. Exit code: start_main's, or 2 when no
model came out of the run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NEEDED = {"paramiko": "paramiko", "zstandard": "zstandard", "watchdog": "watchdog",
          "ruamel.yaml": "ruamel"}
"""Distribution name -> module to import: what a GPU machine's Python may lack."""
RUN_FILES = ("config.yaml", "metrics.json", "metrics.csv", "progress.png")
MODEL_RE = re.compile(r"^model_(\d+)\.pt$")
MARGIN_S = 600.0
"""start_main's wall time beyond --hours before it is stopped (start-up, last round)."""
COPY_EVERY_S = 20.0
"""How often the newest models are copied to OUT while the run goes on (a run cut short by
the machine's own limit still leaves them)."""


def missing_packages() -> list[str]:
    """The distributions of NEEDED whose module does not import here."""
    return [dist for dist, module in NEEDED.items()
            if importlib.util.find_spec(module) is None]


def install_from_wheels(wheels: Path, packages: list[str]) -> None:
    """`pip install --no-index --find-links wheels packages`; SystemExit naming what to do."""
    if not wheels.is_dir() or not any(wheels.glob("*.whl")):
        raise SystemExit(
            f"error: {', '.join(packages)} missing and no wheels in {wheels}; on a machine "
            f"with network run `pip download {' '.join(NEEDED)} -d {wheels}` and send the "
            "folder along")
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           "--no-index", "--find-links", str(wheels), *packages]
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"error: pip install from {wheels} failed (exit {done.returncode})")


def generations(models: Path) -> list[int]:
    """Generations with a `model_<gen>.pt` in `models`, ascending."""
    if not models.is_dir():
        return []
    found = (MODEL_RE.match(p.name) for p in models.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def keep_run(run: Path, dest: Path, keep: int) -> list[int]:
    """Make the run folder `dest` hold generation 0 and the newest `keep` models of `run`,
    and its config, metrics and plot; returns the generations it holds."""
    gens = generations(run / "models")
    chosen = sorted(set(gens[-keep:]) | ({0} & set(gens)))
    (dest / "models").mkdir(parents=True, exist_ok=True)
    for g in chosen:
        name = f"model_{g:06d}.pt"
        if not (dest / "models" / name).exists():  # models are written once, atomically
            shutil.copy2(run / "models" / name, dest / "models" / name)
    for g in set(generations(dest / "models")) - set(chosen):  # kept earlier, now older
        (dest / "models" / f"model_{g:06d}.pt").unlink()
    for name in RUN_FILES:
        if (run / name).is_file():
            shutil.copy2(run / name, dest / name)
    status = run.parent / "status.txt"
    if status.is_file():
        shutil.copy2(status, dest / "status.txt")
    return chosen


def games_played(run: Path) -> int | None:
    """Games of the run by its metrics (the last row's cumulative count), if it has one."""
    try:
        rows = json.loads((run / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
    if not isinstance(rows, list) or not rows or not isinstance(rows[-1], dict):
        return None
    for key in ("games_total", "total_games", "games"):
        if isinstance(rows[-1].get(key), (int, float)):
            return int(rows[-1][key])
    return None


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/gpu.yaml", help="config (default gpu.yaml)")
    p.add_argument("--hours", type=float, default=0.15, help="run length (default 0.15: 9 min)")
    p.add_argument("--out", default=None, help="output folder (default $OUT, else "
                   "benchmarks/out/gpu_run_<time>)")
    p.add_argument("--wheels", default=str(REPO / ".whl"),
                   help="folder of wheels for missing packages (default .whl)")
    p.add_argument("--keep", type=int, default=4, help="newest models kept (default 4)")
    p.add_argument("--cpu-only", action="store_true", help="self-play on the CPU (rehearsal)")
    p.add_argument("--keep-run", action="store_true", help="keep the whole run folder")
    p.add_argument("--deadline", type=float, default=None, metavar="S",
                   help="finish within S seconds of starting, whatever --hours says (a "
                   "machine that stops commands after 600 s: --deadline 590)")
    args = p.parse_args(argv)
    if args.hours <= 0 or args.keep < 1:
        p.error("--hours must be > 0 and --keep >= 1")
    return args, extra


STARTED = time.monotonic()


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(argv)
    out = Path(args.out or os.environ.get("OUT") or
               REPO / "benchmarks" / "out" / time.strftime("gpu_run_%Y%m%dT%H%M%SZ",
                                                           time.gmtime())).resolve()
    out.mkdir(parents=True, exist_ok=True)
    missing = missing_packages()
    if missing:
        install_from_wheels(Path(args.wheels), missing)
    scratch = out / "scratch"
    run = scratch / "run"
    if run.exists():
        shutil.rmtree(run)
    cmd = [sys.executable, "start_main.py", "--config", args.config, "--hours",
           str(args.hours), "--run-dir", str(run), "--status-file", str(scratch / "status.txt"),
           *(["--cpu-only"] if args.cpu_only else []), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    print("+", " ".join(cmd), f"  (output in {out / 'start_main.log'})", flush=True)
    t0 = time.monotonic()
    limit = args.hours * 3600 + MARGIN_S
    if args.deadline:  # the whole script's: leave time to stop the coach and copy
        limit = min(limit, args.deadline - (time.monotonic() - STARTED) - 45.0)
    with open(out / "start_main.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        rc = None
        while rc is None:
            left = limit - (time.monotonic() - t0)
            try:
                rc = proc.wait(timeout=max(1.0, min(COPY_EVERY_S, left)))
            except subprocess.TimeoutExpired:
                keep_run(run, out / "run", args.keep)
                if time.monotonic() - t0 < limit:
                    continue
                print(f"stopping start_main after {limit:.0f} s (SIGTERM)", flush=True)
                proc.terminate()  # the coach stops its workers and trainer on SIGTERM
                try:
                    rc = proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    rc = proc.wait()
    wall = time.monotonic() - t0
    kept = keep_run(run, out / "run", args.keep)
    summary = {"command": cmd, "exit_code": rc, "wall_s": round(wall, 1),
               "generations": generations(run / "models"), "kept": kept,
               "games": games_played(run), "cpu_only": args.cpu_only}
    (out / "gpu_run.json").write_text(json.dumps(summary, indent=1) + "\n")
    if not args.keep_run:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(summary), flush=True)
    if not kept:
        print(f"error: the run made no model; see {out / 'start_main.log'}", file=sys.stderr)
        return 2
    newest = kept[-1]
    print("\nOn the CPU box with GNU Go, after copying", out / "run", "there:\n"
          f"  python3 -m training.strength --run-dir {out / 'run'} --generations {newest} "
          "--seconds-per-move 1 --gnugo 1,10 --gnugo-games 100 --games 2 --jobs 2", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
