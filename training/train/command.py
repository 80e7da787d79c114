"""The trainer's command line, spelled once for everyone who starts a training round.

`trainer_command(...)` is `python -m training.trainer` with the flags a round needs: the
config, the run folder, the generation to write (or `--continuous` for the long-lived
trainer of training.mode continuous), no progress bar, the hours the run has run
(for a run with a time limit, whose LR drops they place), and for multi-node rounds the node
count, this node's rank and the rendezvous address (the coach's rank 0 with
`training.rounds`, every other node over SSH with `training.fleet.remote_training`, whose
connector fills the `{python}`, `{config}` and `{dir}` placeholders on each host).

It must not import torch (the coach and the fleet build commands; the trainer runs them).
"""

from __future__ import annotations


def run_hours_flag(hours: float | None) -> list[str]:
    """`--run-hours H` for a run with a time limit, nothing for one without."""
    return [] if hours is None else ["--run-hours", f"{hours:.6f}"]


def trainer_command(python: str, config: str, run_dir: str, generation: int | None = None, *,
                    continuous: bool = False, nodes: int = 1, node_rank: int = 0,
                    master_addr: str = "", master_port: int | None = None,
                    cache_dir: str | None = None, run_hours: float | None = None) -> list[str]:
    """The argv of one training round, or with `continuous` of the long-lived trainer (no
    generation: it numbers its own) (see the module docstring)."""
    cmd = [python, "-m", "training.trainer", "--config", config, "--run-dir", run_dir]
    if cache_dir is not None:
        cmd += ["--cache-dir", cache_dir]
    cmd += ["--continuous"] if continuous else ["--generation", str(generation)]
    cmd += ["--no-progress"]
    cmd += run_hours_flag(run_hours)
    if nodes > 1:
        cmd += ["--nodes", str(nodes), "--node-rank", str(node_rank), "--master-addr",
                master_addr, "--master-port", str(master_port)]
    return cmd
