"""Start the coach: flags -> load_config -> Coach(cfg).run().

    python start_main.py                                   # local workers, configs/config.yaml
    python start_main.py --config configs/tiny.yaml --iterations 2
    python start_main.py --workers 4 --workers-per-gpu 2   # local parallel self-play
    python start_main.py --distributed                     # the workers in the config, over SSH

A run folder that exists is resumed (`--resume` says so explicitly; `--fresh` moves the old
one aside first); `--from-run DIR --from-generation N --run-dir NEW` starts a new one that
goes on from generation N of the run in DIR (`training.branch`). One coach per run folder:
a second one is refused with the running coach's pid (exit code 2). The coach logs to logs/distributed_training.log and keeps
distributed/status.txt current (`watch -n 1 cat distributed/status.txt`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from configs import DEFAULT_CONFIG_PATH, ConfigError, load_config, override
from configs.flags import add_flags, overrides
from training.run.limits import raise_open_files_limit
from training.run.logsetup import configure_logging
from training.run.run_dir import absolute_paths

log = logging.getLogger("start_main")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="AZ-Go coach: self-play workers + training")
    p.add_argument("--config", default=None, help="config file (default configs/config.yaml)")
    add_flags(p, "--distributed", "--accept-new-host-keys", "--iterations", "--hours",
              "--workers", "--workers-per-gpu", "--cpu-only", "--run-dir")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true",
                   help="continue the run folder (the default when it exists)")
    g.add_argument("--fresh", action="store_true",
                   help="move an existing run folder aside and start from generation 0")
    p.add_argument("--status-file", default=None,
                   help="where to write the status table (default distributed/status.txt)")
    p.add_argument("--worker-class", default=None,
                   help="module:Class, a training.worker.Worker subclass every worker runs, "
                        "local or over SSH (its module goes to each worker host)")
    p.add_argument("--no-watch", action="store_true", help="do not watch the config file")
    p.add_argument("--checkpoint", default=None, metavar="FILE",
                   help="a new run starts from this model or trainer checkpoint (its "
                        "generation 0); a run folder that has models resumes as it is")
    p.add_argument("--from-run", default=None, metavar="DIR",
                   help="start a new run folder (--run-dir) that goes on from generation "
                        "--from-generation of the run in DIR: its models, checkpoint, games "
                        "and metrics up to then (DIR is only read)")
    p.add_argument("--from-generation", type=int, default=None, metavar="N",
                   help="the generation of --from-run to go on from")
    p.add_argument("--serve-status", type=int, default=None, metavar="PORT",
                   help="serve the run page, status.json and Prometheus /metrics read-only on "
                        "127.0.0.1:PORT (0: any free port, logged)")
    p.add_argument("--status-host", action="append", default=[], metavar="NAME",
                   help="a Host name the status server also answers (a name this machine is "
                        "reached by through a tunnel or proxy; 127.0.0.1 and localhost always "
                        "are); other names get 421. May be given more than once")
    # the training guides' options, applied to the config's training section
    add_flags(p, "--gpus", "--batch-size", "--mixed-precision", "--lr", "--learning-rate",
              "--window-passes")
    p.add_argument("--epochs", dest="cycles", type=int, default=None,
                   help="self-play + training cycles, then stop (the same as --iterations); "
                        "the trainer's passes over the window are --window-passes here")
    add_flags(p, "--filters", "--blocks", "--simulations")
    p.add_argument("--games-per-epoch", type=int, default=None,
                   help="new games per generation over all workers (sets "
                        "self_play.games_per_worker to this / number of workers)")
    return p.parse_args(argv)


def overrides_from_args(args: argparse.Namespace) -> dict:
    """The dotted config keys the flags set (configs.flags; validated again by the schema).
    `--epochs N` (the parallel self-play guide's: N cycles of self-play and training) sets
    run.iterations."""
    changes = overrides(args)
    if getattr(args, "cycles", None) is not None:
        changes["run.iterations"] = args.cycles
    return changes


def check_initial_model(path: str, cfg) -> str | None:
    """Why `--checkpoint path` cannot start this run (None when it can): a missing or
    unreadable file, or a net other than the config's."""
    if not Path(path).is_file():
        return f"--checkpoint {path}: no such file"
    from training.learn.net import ModelError, load_model, net_from_config

    try:
        net, _ = load_model(path)
    except ModelError as e:
        return f"--checkpoint {e}"
    want = net_from_config(cfg.net, cfg.go.board_size).config
    differ = ", ".join(f"{k} {net.config.get(k)} (config: {want[k]})" for k in sorted(want)
                       if want[k] != net.config.get(k))
    if differ:
        return (f"--checkpoint {path}: its net differs from the config's: {differ}; set "
                "net.* and go.board_size to match it")
    return None


def check_branch(args: argparse.Namespace, run_dir: Path) -> str | None:
    """Why --from-run/--from-generation cannot start `run_dir` (None when they can or are not
    given); the source and its generation are checked by `training.branch`."""
    if args.from_run is None and args.from_generation is None:
        return None
    if args.from_run is None or args.from_generation is None:
        return "--from-run DIR and --from-generation N go together"
    if args.checkpoint is not None or args.resume or args.fresh:
        return ("--from-run starts a new run folder from another run's generation: leave out "
                "--checkpoint, --resume and --fresh")
    if run_dir.exists():
        return (f"{run_dir} exists; --from-run starts a new run folder: name another one with "
                "--run-dir")
    return None


def games_per_worker(games_per_epoch: int, cfg) -> int:
    """--games-per-epoch spread over the workers the run will have (at least 1 each)."""
    if cfg.distributed.enabled:
        workers = len(cfg.distributed.workers)
    else:
        from training.fleet.local_workers import plan_devices

        workers = len(plan_devices(cfg, quiet=True))  # the count the run will start
    return max(1, -(-games_per_epoch // max(1, workers)))


def _config(args: argparse.Namespace) -> tuple:
    """(the config with the command line's overrides, absolute paths; the overrides);
    ConfigError naming what is wrong."""
    cfg = load_config(args.config)
    overrides = overrides_from_args(args)
    if overrides:
        cfg = override(cfg, overrides)
    if args.games_per_epoch is not None:
        if args.games_per_epoch < 1:
            raise ConfigError(f"command line: --games-per-epoch must be >= 1, "
                              f"got {args.games_per_epoch}")
        overrides["self_play.games_per_worker"] = games_per_worker(args.games_per_epoch, cfg)
        cfg = override(cfg, overrides)
    # one meaning for a relative run.dir and logging.dir: this working directory's
    cfg = absolute_paths(cfg)
    return cfg, overrides


def _take_run_folder(args: argparse.Namespace, run_dir: Path) -> str | None:
    """Resume the run in `run_dir`, or with --fresh move it aside, under its lock; what is
    wrong (another coach holds it, --resume without a run), or None."""
    from training.run.run_lock import RunFolderBusy, RunLock

    if run_dir.exists():
        try:  # refused while a coach runs on it; held while --fresh moves it aside
            lock = RunLock(run_dir).acquire()
        except RunFolderBusy as e:
            return str(e)
        try:
            if args.fresh:
                aside = run_dir.with_name(
                    f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
                run_dir.rename(aside)
                log.info("moved the old run folder to %s", aside)
            else:
                log.info("resuming the run in %s", run_dir)
        finally:
            lock.release()
    elif args.resume:
        return (f"--resume: no run folder {run_dir} to resume (run.dir in the config, or "
                "--run-dir)")
    return None


def _config_problem(args: argparse.Namespace, cfg) -> str | None:
    """What the config asks that cannot run (workers, training nodes, TensorBoard, the
    initial model), or None."""
    if cfg.distributed.enabled and not cfg.distributed.workers:
        return (f"{args.config or 'configs/config.yaml'}: distributed mode needs "
                "distributed.workers (add one with `python distributed/ssh_connector.py "
                "--add-worker HOST USER`)")
    if cfg.distributed.training_nodes and not cfg.distributed.enabled:
        return (f"{args.config or 'configs/config.yaml'}: distributed.training_nodes are "
                "used with distributed self-play only: add --distributed (or "
                "distributed.enabled: true), or remove the training nodes")
    if cfg.logging.tensorboard:
        from training.run.tensorboard import check_available

        problem = check_available()
        if problem:
            return f"{args.config or 'configs/config.yaml'}: {problem}"
    if args.checkpoint is not None:
        problem = check_initial_model(args.checkpoint, cfg)
        if problem:
            return problem
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg, overrides = _config(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_dir = Path(cfg.run.dir)
    problem = check_branch(args, run_dir)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from training.run.run_lock import RunFolderBusy

    configure_logging(Path(cfg.logging.dir) / "distributed_training.log", cfg.logging.level)
    problem = _take_run_folder(args, run_dir) or _config_problem(args, cfg)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.from_run is not None:
        from training.branch import BranchError, branch_run

        try:
            branch_run(args.from_run, run_dir, args.from_generation)
        except BranchError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    from training.coach import Coach

    raise_open_files_limit()  # the coach and the trainers and workers it starts
    coach = Coach(cfg, config_path=args.config or DEFAULT_CONFIG_PATH, overrides=overrides,
                  status_path=args.status_file, worker_class=args.worker_class,
                  watch_config=not args.no_watch, serve_status=args.serve_status,
                  status_hosts=tuple(args.status_host),
                  initial_model=args.checkpoint)
    coach.install_signal_handlers()
    try:
        summary = coach.run()
    except RunFolderBusy as e:  # another coach took the folder since the check above
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"generations={summary.generations} last_generation={summary.last_generation} "
          f"games={summary.games} batches={summary.batches} rejected={summary.rejected} "
          f"seconds={summary.seconds:.0f}")
    return 0


if __name__ == "__main__":
    os.umask(0o077)  # run and worker folders, logs and models: the user's alone
    sys.exit(main())
