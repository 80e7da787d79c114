"""One training round: replay window -> the next generation's model and checkpoint, alone or
DDP.

`train_round(cfg, run_dir, ...)` runs in every process of the group (alone, it is a group of
one); `python -m training.trainer` (the command, `training.trainer`) runs it alone, under
torchrun, on several nodes, or from the coach.

Vocabulary (torchrun's): `rank`, `local_rank`, `world_size`; rank 0 is the main process, the
only one that logs progress and writes files. A **round** trains `training.steps_per_generation`
optimizer steps (or `training.epochs` passes) and produces generation G+1 from generation G.
A **micro-batch** is one forward/backward; `accumulation` micro-batches make one optimizer step
(gradients are all-reduced only on the last, `no_sync` before).

Behaviour: the total batch `training.batch_size` is split across ranks; LR scaled linearly / by
sqrt from `lr_reference_batch`, with linear warmup; DistributedSampler with `set_epoch` and
`drop_last`; losses reduced across ranks; a process-group timeout (`training.timeout_s`); a
rank that fails makes the others exit (the collective raises, the launcher ends the group); an
out-of-memory micro-batch halves the micro-batch and accumulates twice as many. A checkpoint
resumes exactly (the next step's loss is the same).

Losses: policy cross-entropy + value MSE, plus the net's training-only heads where it has them
(KataGo's auxiliary targets, `TARGETS`): ownership (cross-entropy per point, mean), score
(Huber on margin / N) and the opponent's reply (cross-entropy), each masked per sample and
weighted by `training.ownership_weight`, `score_weight`, `opponent_policy_weight`. `loss` in
results and metrics stays policy + value, so that runs with and without the heads compare.

Files (rank 0, then a barrier), where run_dir.RunDir puts them:
checkpoints/checkpoint_<gen:06d>.pt (train_state), models/model_<gen:06d>.pt (net.save_model),
one metrics row (training.run.metrics) and rounds/round_<gen:06d>.json (round_result: what the
coach reads; the same as the JSON summary line).

A round is the phases of training.train.phases over one `Session`: plan (the batch
arithmetic), start the net, restore (the checkpoint), run steps (training.train.steps: what
one step is), finish (the files); under them samples (sample arrays, batches as tensors), ddp
(the process group and its collectives), node_relay (the window and the starting file for
nodes without the run folder) and train_state (LR schedule, RNG states, checkpoints, the file
a round starts from).

It must not: play games, read game batch files itself (the replay window does), parse the
command line, or talk to workers.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from configs import Config
from training.learn.samples import SampleDataset
from training.learn.training_error import TrainingError
from training.train import phases
from training.train.ddp import DistContext, init_distributed, set_cpu_threads, shutdown
from training.train.node_relay import open_replay_window, resolve_start_shared
from training.train.round_result import RoundResult
from training.train.steps import FaultHooks, IndexBatches, progress_bar

log = logging.getLogger(__name__)


def train_round(
    cfg: Config,
    run_dir: str | os.PathLike,
    *,
    dataset: SampleDataset | None = None,
    checkpoint: str | os.PathLike | None = None,
    steps: int | None = None,
    generation: int | None = None,
    progress: bool = True,
    hooks: FaultHooks | None = None,
    cache_dir: str | os.PathLike | None = None,
    run_hours: float | None = None,
    selfplay_cores: int = 0,
) -> RoundResult:
    """Train one round and write the next generation's model and checkpoint.

    Must be called in every process of the group (alone, it is a group of one). Starts from
    `checkpoint`, else the newest checkpoint in run_dir/checkpoints, else the newest model in
    run_dir/models, else a fresh net; "none" forces a fresh start. `dataset` defaults to the
    replay window over run_dir/replay. `steps` overrides the config's round length.
    `cache_dir`: this rank's node does not share rank 0's run folder; rank 0 sends the window's
    batch files and the starting checkpoint there, and run_dir is never read.
    `run_hours`: the hours the run had run when the round started (the coach's), which place
    the LR drops of a run with run.hours (training.lr_schedule_by_time).
    `selfplay_cores`: the cores local self-play workers hold on this node (a CPU rank takes
    the rest, at least one thread: `ddp.set_cpu_threads`).
    """
    run_dir = Path(run_dir)
    hooks = hooks or FaultHooks()
    tcfg = cfg.training
    try:
        ctx = init_distributed(tcfg.timeout_s, tcfg.backend)
    except ValueError as e:
        raise TrainingError(str(e)) from e
    set_cpu_threads(ctx, selfplay_cores, "trainer")
    try:
        return _train(cfg, run_dir, ctx, dataset, checkpoint, steps, generation, progress, hooks,
                      None if cache_dir is None else Path(cache_dir), run_hours)
    finally:
        shutdown(ctx)


def _train(cfg: Config, run_dir: Path, ctx: DistContext, dataset: SampleDataset | None,
           checkpoint: str | os.PathLike | None, steps: int | None, generation: int | None,
           progress: bool, hooks: FaultHooks, cache_dir: Path | None = None,
           run_hours: float | None = None) -> RoundResult:
    """One round in its phases (training.train.phases); see `train_round`."""
    tcfg = cfg.training
    if cache_dir is not None and ctx.is_main:
        raise TrainingError("--cache-dir is for the other training nodes; rank 0 reads run_dir")
    if dataset is None:
        dataset = open_replay_window(cfg, run_dir, ctx, cache_dir)
    ckpt, start_payload, base_gen = resolve_start_shared(run_dir, checkpoint, ctx, cache_dir)
    new_gen = generation if generation is not None else base_gen + 1

    plan = phases.plan(tcfg, ctx)
    trainee = phases.start_net(cfg, ctx, plan, start_payload, checkpoint or run_dir, run_hours)
    s = phases.Session(cfg, ctx, plan, trainee, dataset, hooks)
    epoch, offset = phases.restore(s, ckpt, str(checkpoint or "the newest checkpoint"))
    s.batches = IndexBatches(dataset, plan.per_rank, ctx, cfg.run.seed, epoch, offset)
    if steps is None:
        steps = (tcfg.epochs * s.batches.per_epoch if tcfg.epochs > 0
                 else tcfg.steps_per_generation)
    if ctx.is_main:
        log.info(
            "training generation %d from %s: steps=%d world_size=%d total_batch=%d "
            "micro_batch=%d accumulation=%d lr=%.4g device=%s backend=%s window=%d",
            new_gen, f"generation {base_gen}" if start_payload is not None else "a fresh net",
            steps, ctx.world_size, plan.total, plan.micro, plan.accumulation, trainee.peak_lr,
            ctx.device, ctx.backend or "none", len(dataset),
        )
    bar = progress_bar(steps, new_gen, enabled=progress and ctx.is_main)
    phases.run_steps(s, steps, bar)
    if bar is not None:
        bar.close()
    return phases.finish(s, run_dir, new_gen)
