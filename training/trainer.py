"""The trainer's command: `python -m training.trainer`, one training round or the long-lived
trainer, alone, DDP or multi-node.

The same command runs
- alone:                    python -m training.trainer --config FILE --run-dir DIR
- under torchrun:           torchrun --nproc_per_node=N -m training.trainer ...
- multi-node:               torchrun --nnodes M --node_rank R --master_addr A --master_port P ...
- relaunched by itself:     python -m training.trainer --gpus N [--nodes M --node-rank R ...]
                            (re-executes itself through torch.distributed.run)
- from the coach, as a subprocess of one of the above; the last stdout line is a JSON summary.
- long-lived, with --continuous (training.mode continuous): the coach starts one for the run;
  it trains from the run's admission log and publishes a generation every
  training.steps_per_generation steps until SIGTERM (training.train.continuous).

Here: the flags (`build_parser`, `config_from_args`), `--world-size`/`--rank` as torchrun's
environment (`apply_world_size`), the relaunch under torch.distributed.run
(`relaunch_command`), the cores local self-play holds (`selfplay_cores`, for the long-lived
trainer's CPU threads), and `main`. The round itself is `training.train.round.train_round`
(its vocabulary, behaviour, losses and files are described there).

It must not: train (the training room does), play games, or talk to workers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from configs import Config, ConfigError, load_config, override
from configs.flags import add_flags, overrides
from training.fleet.placement import plan_workers
from training.learn.samples import SampleArrays
from training.learn.training_error import TrainingError
from training.run.limits import raise_open_files_limit
from training.run.logsetup import configure_logging
from training.run.signals import die_with_parent, on_stop_signals
from training.train.admissions import AdmissionError
from training.train.continuous import train_continuously
from training.train.ddp import init_distributed, is_peer_failure, shutdown, under_torchrun
from training.train.round import train_round
from training.train.steps import FaultHooks

log = logging.getLogger(__name__)

__all__ = ["main"]


def selfplay_cores(cfg: Config, n_gpus: int, n_cpus: int) -> int:
    """The cores the coach's local self-play workers hold on this machine: each worker's
    `self_play.threads_per_worker`, on the CPU or beside its GPU (its search); none in
    distributed mode, where the workers are other hosts."""
    if cfg.distributed.enabled:
        return 0
    sp = cfg.self_play
    devices, _ = plan_workers(sp.workers, sp.workers_per_gpu, sp.cpu_only, n_gpus, n_cpus)
    return len(devices) * sp.threads_per_worker


def _train_continuously(cfg: Config, run_dir: Path, hooks: FaultHooks,
                        run_hours: float | None) -> None:
    """The long-lived trainer (training.train.continuous) in this process's group, until
    SIGTERM or SIGINT."""
    stop = threading.Event()
    on_stop_signals(stop.set)
    try:
        ctx = init_distributed(cfg.training.timeout_s, cfg.training.backend)
    except ValueError as e:
        raise TrainingError(str(e)) from e
    try:
        train_continuously(cfg, run_dir, ctx, run_hours=run_hours, hooks=hooks, stop=stop,
                           selfplay_cores=selfplay_cores(cfg, torch.cuda.device_count(),
                                                         os.cpu_count() or 1))
    except AdmissionError as e:
        raise TrainingError(str(e)) from e
    finally:
        shutdown(ctx)


# ------------------------------------------------------------------------------ command line


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m training.trainer",
        description="Train one generation from the replay window (alone, DDP or multi-node).",
    )
    ap.add_argument("--config", default=None, help="config file (default configs/config.yaml)")
    add_flags(ap, "--run-dir", "--gpus", "--nodes")
    ap.add_argument("--node-rank", type=int, default=0, help="this node's rank (0 = master)")
    ap.add_argument("--master-addr", default="127.0.0.1", help="address of node 0")
    add_flags(ap, "--master-port", "--batch-size", "--batch-size-per-gpu", "--backend",
              "--mixed-precision", "--epochs", "--lr", "--learning-rate")
    ap.add_argument("--world-size", type=int, default=None,
                    help="total training processes: alone, --nodes 1 runs this many here; "
                         "with --rank, this process is one of them, started by hand")
    ap.add_argument("--rank", type=int, default=None,
                    help="this process's global rank when each is started by hand (with "
                         "--world-size, --master-addr and --master-port)")
    ap.add_argument("--local-rank", "--local_rank", type=int, default=None,
                    help="set by python -m torch.distributed.launch (torchrun sets LOCAL_RANK)")
    ap.add_argument("--num-workers", type=int, default=None, metavar="N",
                    help="the 000 guide's data-loader workers: accepted and logged, and it "
                         "changes nothing (samples are batched in memory from the window's "
                         "arrays; there is no data loader)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps this round")
    ap.add_argument("--checkpoint", default=None,
                    help="resume from this checkpoint ('none' = fresh net; default newest)")
    ap.add_argument("--generation", type=int, default=None, help="number the new model so")
    ap.add_argument("--samples", default=None,
                    help="train from this .npz (planes, policy, value) instead of the window")
    ap.add_argument("--cache-dir", default=None,
                    help="this node does not see rank 0's run folder: receive the window and "
                         "the starting checkpoint from rank 0 into this folder")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--run-hours", type=float, default=None,
                    help="hours the run has run (the coach's): with run.hours, places the LR "
                         "drops of training.lr_schedule_by_time")
    ap.add_argument("--continuous", action="store_true",
                    help="the long-lived trainer of training.mode continuous: train from the "
                         "run's admission log and publish a generation every "
                         "training.steps_per_generation steps until stopped (the coach starts "
                         "it)")
    ap.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (default config)")
    # Fault injection for tests/test_ddp.py and tests/test_trainer.py.
    ap.add_argument("--test-fake-oom-at", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--test-kill-rank-at", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--test-hang-rank-at", default=None, help=argparse.SUPPRESS)
    return ap


def config_from_args(args: argparse.Namespace) -> Config:
    """load_config + the flags (configs.flags), validated again by the config's dataclasses."""
    cfg = load_config(args.config)
    changes = overrides(args)
    return override(cfg, changes) if changes else cfg


def apply_world_size(args: argparse.Namespace, cfg: Config) -> Config:
    """The 000 guide's `--world-size N [--rank R]`: alone, N processes over `--nodes` nodes
    (training.gpus = N / nodes, launched through torch.distributed.run); with `--rank`, this
    process is rank R of N started by hand: the environment torchrun would set is set here
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). ConfigError when they cannot
    mean anything."""
    if args.rank is not None and args.world_size is None:
        raise ConfigError("command line: --rank needs --world-size (the total processes)")
    if args.world_size is None:
        return cfg
    n, nodes = args.world_size, cfg.training.nodes
    if n < 1 or n % nodes:
        raise ConfigError(f"command line: --world-size {n} must be a positive multiple of "
                          f"--nodes {nodes}")
    if under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != n:
            raise ConfigError(f"command line: --world-size {n}, but the launcher started "
                              f"{os.environ['WORLD_SIZE']} processes")
        return cfg
    if args.rank is not None:
        if not 0 <= args.rank < n:
            raise ConfigError(f"command line: --rank {args.rank} outside 0..{n - 1}")
        local = args.local_rank if args.local_rank is not None else args.rank % (n // nodes)
        os.environ.update(RANK=str(args.rank), WORLD_SIZE=str(n), LOCAL_RANK=str(local),
                          MASTER_ADDR=args.master_addr,
                          MASTER_PORT=str(cfg.training.master_port))
        return cfg
    return override(cfg, {"training.gpus": n // nodes})


def _rank_step(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    rank, step = text.split(":")
    return int(rank), int(step)


def relaunch_command(args: argparse.Namespace, argv: list[str], cfg: Config) -> list[str] | None:
    """The torch.distributed.run command that re-executes this trainer, or None to run here."""
    if under_torchrun():
        return None
    nproc = cfg.training.gpus
    if nproc == 0:
        nproc = torch.cuda.device_count() or 1
    nodes = cfg.training.nodes
    if nproc * nodes <= 1:
        return None
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    if nodes == 1 and args.master_port is None:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={nodes}", f"--node_rank={args.node_rank}",
                f"--master_addr={args.master_addr}",
                f"--master_port={cfg.training.master_port}"]
    return cmd + ["-m", "training.trainer", *argv]


@record
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.num_workers is not None and args.num_workers < 0:
        parser.error(f"--num-workers must be >= 0, got {args.num_workers}")
    if args.local_rank is not None and "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = str(args.local_rank)  # torch.distributed.launch's way
    try:
        cfg = config_from_args(args)
        cfg = apply_world_size(args, cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", "0"))
    if under_torchrun():
        die_with_parent()  # the launcher's death ends this rank
    level = args.log_level or cfg.logging.level
    configure_logging(None, level if rank == 0 else "WARNING")  # other ranks: problems only
    raise_open_files_limit()  # a window of many batch files; torchrun's ranks inherit it
    if args.num_workers is not None:
        log.info("--num-workers %d: noted; samples are batched in memory from the replay "
                 "window's arrays (no data loader), so there are no loader workers to start",
                 args.num_workers)
    cmd = relaunch_command(args, argv, cfg)
    if cmd is not None:
        log.info("relaunching through torch.distributed.run: %s", " ".join(cmd))
        return subprocess.call(cmd, preexec_fn=die_with_parent)
    run_dir = Path(cfg.run.dir)
    hooks = FaultHooks(
        fake_oom_at_micro_batch=args.test_fake_oom_at,
        kill_rank_at_step=_rank_step(args.test_kill_rank_at),
        hang_rank_at_step=_rank_step(args.test_hang_rank_at),
    )
    if args.continuous:
        given = [flag for flag, value in (("--samples", args.samples), ("--steps", args.steps),
                                          ("--checkpoint", args.checkpoint),
                                          ("--generation", args.generation),
                                          ("--cache-dir", args.cache_dir)) if value is not None]
        if given:
            log.error("--continuous trains from the run's admission log and resumes from its "
                      "newest checkpoint: leave out %s", ", ".join(given))
            return 2
    try:
        if args.continuous:
            _train_continuously(cfg, run_dir, hooks, args.run_hours)
            return 0
        dataset = None
        if args.samples:
            dataset = SampleArrays.load(args.samples, cfg.replay.validation_fraction)
        result = train_round(cfg, run_dir, dataset=dataset, checkpoint=args.checkpoint,
                             steps=args.steps, generation=args.generation,
                             progress=not args.no_progress, hooks=hooks,
                             cache_dir=args.cache_dir, run_hours=args.run_hours,
                             selfplay_cores=selfplay_cores(cfg, torch.cuda.device_count(),
                                                           os.cpu_count() or 1))
    except (TrainingError, ConfigError) as e:
        log.error("%s", e)
        return 1
    except RuntimeError as e:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and is_peer_failure(e):
            log.error(
                "rank %d: training stopped: another rank failed or a collective timed out "
                "(training.timeout_s=%s): %s", rank, cfg.training.timeout_s,
                str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__,
            )
            return 1
        raise
    if rank == 0:
        print(json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    if code is None:  # @record turns SystemExit(0) (--help under a launcher) into None
        code = 0
    if under_torchrun():
        # HACK: a finished rank's interpreter teardown can abort in C++ ("terminate called
        # without an active exception", seen on a training node), which torchrun reports as a
        # failed rank while the other node's agent waits out its 300 s exit barrier. The round
        # is done and written by now, so leave without the teardown.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
