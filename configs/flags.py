"""Command-line flags that set config keys: one table for the coach's and the trainer's flags.

Each `Flag` names the option, the dotted config key it sets, its value's type and its help.
A flag without a type is a switch: given, it sets its key to True; absent, it leaves the key
alone. An entry point adds the flags it offers with `add_flags(parser, "--lr", ...)` (in the
order given, so that its --help reads as before) and turns what was parsed into the changes for
`configs.override` with `overrides(args)`; the config's dataclasses then validate the result
as they validate the file. Flags that set no config key (`--config`, `--steps`, ...) stay with
their entry point.

    start_main.py               --distributed --iterations --workers ... --simulations
                                (its --epochs is the user guide's: self-play and training
                                cycles, run.iterations; it is not in this table)
    python -m training.trainer  --run-dir --gpus --nodes --master-port --batch-size ...

It must not: import anything but the standard library (argparse's parser is passed in), read
a config, or parse the command line itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Flag:
    """One option and the config key it sets."""

    name: str
    """The option as typed, e.g. `--batch-size`."""
    key: str
    """The dotted config key it sets, e.g. `training.batch_size`."""
    value_type: type | None
    """int, float or str; None for a switch that sets True."""
    help: str

    @property
    def dest(self) -> str:
        """Its attribute on the parsed arguments, as argparse spells it (`batch_size`)."""
        return self.name.lstrip("-").replace("-", "_")


_TABLE = (
    # order: the order of the changes `overrides` returns
    Flag("--iterations", "run.iterations", int,
         "stop after N new generations (run.iterations; 0 = endless)"),
    Flag("--hours", "run.hours", float,
         "stop once the run has run H hours, a resume's earlier hours counted; the LR "
         "drops by then (training.lr_schedule_by_time) (run.hours; 0 = no limit)"),
    Flag("--workers", "self_play.workers", int, "local worker processes"),
    Flag("--workers-per-gpu", "self_play.workers_per_gpu", int, "local workers per GPU"),
    Flag("--cpu-only", "self_play.cpu_only", None, "self-play on the CPU only"),
    Flag("--run-dir", "run.dir", str, "run folder (default run.dir)"),
    Flag("--distributed", "distributed.enabled", None,
         "self-play on distributed.workers over SSH (else local processes)"),
    Flag("--accept-new-host-keys", "distributed.accept_new_host_keys", None,
         "record the key of a host not yet in known_hosts (a changed key is always refused)"),
    Flag("--gpus", "training.gpus", int,
         "training processes per node: one per GPU, CPU processes when no GPU (training.gpus)"),
    Flag("--nodes", "training.nodes", int, "training nodes (multi-node)"),
    Flag("--master-port", "training.master_port", int, "rendezvous port on node 0"),
    Flag("--batch-size", "training.batch_size", int,
         "total training batch over all ranks (training.batch_size)"),
    Flag("--batch-size-per-gpu", "training.batch_size_per_gpu", int,
         "each rank's batch; the total is this x ranks (training.batch_size_per_gpu)"),
    Flag("--backend", "training.backend", str,
         "torch.distributed backend: auto, nccl or gloo (training.backend)"),
    Flag("--mixed-precision", "training.mixed_precision", None,
         "bf16/fp16 autocast on GPUs (training.mixed_precision)"),
    Flag("--lr", "training.lr", float, "LR at training.lr_reference_batch (training.lr)"),
    Flag("--learning-rate", "training.lr", float, "the same as --lr (the DDP guides' name)"),
    Flag("--epochs", "training.epochs", int, "passes over the replay window (training.epochs)"),
    Flag("--window-passes", "training.epochs", int,
         "passes over the replay window per training round (training.epochs)"),
    Flag("--filters", "net.filters", int, "net.filters (new runs)"),
    Flag("--blocks", "net.blocks", int, "net.blocks (new runs)"),
    Flag("--simulations", "mcts.simulations", int, "mcts.simulations per move"),
)

FLAGS: dict[str, Flag] = {flag.name: flag for flag in _TABLE}
"""Every flag that sets a config key, by its name."""


def add_flags(parser: Any, *names: str) -> None:
    """Add the flags `names` (keys of FLAGS) to an argparse parser, in that order."""
    for name in names:
        flag = FLAGS[name]
        if flag.value_type is None:
            parser.add_argument(name, action="store_true", help=flag.help)
        else:
            parser.add_argument(name, type=flag.value_type, default=None, help=flag.help)


def overrides(args: Any) -> dict[str, Any]:
    """The dotted config keys the parsed `args` set: each flag of the table that the parser
    has and that was given (a switch only when on)."""
    changes: dict[str, Any] = {}
    for flag in _TABLE:
        value = getattr(args, flag.dest, None)
        if flag.value_type is None:
            value = True if value else None
        if value is not None:
            changes[flag.key] = value
    return changes
