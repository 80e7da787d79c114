"""Extra training nodes: the trainer's node ranks 1..K on the SSH hosts of
`distributed.training_nodes`, started for each training round by the coach.

Vocabulary: a **node** is one entry of `distributed.training_nodes` (a WorkerSpec; default
names node1, node2, ...); its node rank is its place among the nodes taking part in a round
(1, 2, ... in config order; the main node is node rank 0). A node is **benched** after it
failed a round (could not be brought up or started, or its trainer died during the round) and
takes part again after a backoff (`training.fleet.fleet.backoff_s` from `distributed.backoff_max_s`,
doubling, at most an hour). Each node's runtime record is a `training.fleet.fleet.Member`, like a
worker's.

Per round, for each node taking part: bring it up once (`ssh_workers.prepare_host`: preflight,
deploy unless `distributed.deploy` is off, the run's config redacted as for workers) exactly
like a worker, then start, detached
under the connector's pid file and log (`<remote_dir>/logs/worker_<node>.log`),

    python -m training.trainer --config <root>/config.yaml --run-dir <root>/workers/<node>
        --cache-dir <root>/workers/<node>/cache --generation G --nodes K+1 --node-rank i
        --master-addr A --master-port P --no-progress

`--cache-dir` tells the trainer that this node does not see the main node's run folder: rank 0
sends it the window's batch files and the starting checkpoint over the process group, and only
rank 0 (the coach's local trainer) writes models and checkpoints. A is
`distributed.master_addr` when the config has it, else the main node's address as the first
node sees it (the client end of its SSH connection, `$SSH_CONNECTION`).

Nothing here may stall the coach's loop: `start_round` (network work on every node, in
parallel) is run by the coach in a thread of its own (`training.fleet.fleet.Job`) with a deadline;
`check` answers at once from the last check made in the background; `finish_round` and
`stop_round` stop the nodes' trainers in the background; `abort` closes every connection.

It must not: import torch or paramiko, decide when to train (the coach does), or touch the
self-play workers.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any

from configs import Config
from distributed.ssh_connector import SSHConnector, SSHError
from distributed.transfer import TransferError
from training.fleet.fleet import Member, backoff_s
from training.fleet.ssh_workers import prepare_host, write_worker_config
from training.train.command import trainer_command
from training.run.run_dir import RunDir

log = logging.getLogger(__name__)

_ERRORS = (SSHError, TransferError, OSError)
MAX_BENCH_S = 3600.0


class NodeStartError(Exception):
    """The nodes of a round could not all be started (the round is not begun)."""


def trainer_argv(generation: int, nodes: int, node_rank: int, master_addr: str,
                 master_port: int, run_hours: float | None = None) -> tuple[str, ...]:
    """The node's trainer argv template (SSHConnector fills {python}, {config}, {dir})."""
    return tuple(trainer_command("{python}", "{config}", "{dir}", generation, nodes=nodes,
                                 node_rank=node_rank, master_addr=master_addr,
                                 master_port=master_port, cache_dir="{dir}/cache",
                                 run_hours=run_hours))


class TrainingNodes:
    """The coach's handle on `distributed.training_nodes` (see the module docstring)."""

    def __init__(self, cfg: Config, config_file: str, *, connector: SSHConnector | None = None):
        self.cfg = cfg
        # the nodes get the run's config without the other machines' hosts, users and keys
        self.config_file = write_worker_config(
            cfg, RunDir(Path(config_file).parent).node_config)
        specs = cfg.distributed.training_nodes
        self.connector = connector or SSHConnector(
            dataclasses.replace(cfg.distributed, workers=specs))
        self.nodes = {s.name: Member(s.name, host=s.host) for s in specs}
        self.in_round: list[str] = []  # nodes started for the running round
        self.dead: set[str] = set()  # nodes whose trainer died during the running round
        self._last_check = 0.0
        self._checking: threading.Thread | None = None
        self._found_dead: list[str] = []  # the background check's finding, not yet reported
        self._master_addr: str | None = getattr(cfg.distributed, "master_addr", None)

    def names(self) -> list[str]:
        return list(self.nodes)

    def available(self) -> list[str]:
        """Nodes that take part in the next round (config order, benched ones left out)."""
        now = time.monotonic()
        return [n for n, s in self.nodes.items() if now >= s.next_try]

    def master_addr(self, name: str) -> str:
        """The main node's address as the nodes see it (config, else from node `name`)."""
        if not self._master_addr:
            out = self.connector.run(name, 'printf "%s\\n" "$SSH_CONNECTION"', retry=True)
            words = out.stdout.split()
            if not words:
                raise SSHError(f"{name}: $SSH_CONNECTION is empty; set distributed.master_addr "
                               "to the main node's address as the training nodes see it",
                               worker=name)
            self._master_addr = words[0]
        return self._master_addr

    def bench(self, name: str, why: str) -> None:
        s = self.nodes[name]
        s.backoff_s = backoff_s(s.backoff_s, self.cfg.distributed.backoff_max_s, MAX_BENCH_S)
        s.next_try = time.monotonic() + s.backoff_s
        s.error = why
        s.prepared = False  # preflight, deploy (a no-op when current) and config again
        log.error("training node %s: %s; training goes on without it for %.0fs", name, why,
                  s.backoff_s)

    def _bring_up(self, name: str) -> None:
        if self.nodes[name].prepared:
            return
        prepare_host(self.connector, name, self.config_file, self.cfg.distributed.deploy)
        self.nodes[name].prepared = True

    def start_round(self, generation: int, master_port: int,
                    run_hours: float | None = None) -> tuple[int, str]:
        """Start node ranks 1..K of generation G's round; returns (K, master address).
        `run_hours` goes to every rank's trainer, as to rank 0's (the LR drops of a run with
        a time limit).

        Nodes that cannot be brought up are benched first; (0, "") when none is left. A node
        that fails to start stops the others and raises NodeStartError (retry next pass).
        """
        ready = []
        for name, res in self.connector.for_each(self._bring_up, self.available()).items():
            if isinstance(res, _ERRORS):
                self.bench(name, f"cannot be brought up: {type(res).__name__}: {res}")
            elif isinstance(res, Exception):
                raise res
            else:
                ready.append(name)
        if not ready:
            return 0, ""
        try:
            addr = self.master_addr(ready[0])
        except _ERRORS as e:
            self.bench(ready[0], f"unreachable: {e}")
            raise NodeStartError(f"{ready[0]}: cannot learn the master address: {e}") from e
        self.in_round, self.dead = [], set()
        for rank, name in enumerate(ready, 1):
            self.connector.start_command = trainer_argv(generation, len(ready) + 1, rank, addr,
                                                        master_port, run_hours)
            try:
                self.connector.stop(name)  # a trainer left from an abandoned round
                pid = self.connector.start(name)
            except _ERRORS as e:
                self.bench(name, f"trainer did not start: {e}")
                self.stop_round()
                raise NodeStartError(f"{name}: trainer did not start: {e}") from e
            self.in_round.append(name)
            log.info("training node %s: node rank %d of %d, pid %d, master %s:%d", name, rank,
                     len(ready) + 1, pid, addr, master_port)
        return len(ready), addr

    def check(self, min_interval_s: float = 5.0) -> list[str]:
        """Nodes of the running round whose trainer is gone, as found by the last background
        check (one is started at most every `min_interval_s`); never waits on a host."""
        now = time.monotonic()
        gone, self._found_dead = self._found_dead, []
        if (self.in_round and now - self._last_check >= min_interval_s
                and (self._checking is None or not self._checking.is_alive())):
            self._last_check = now
            names = [n for n in self.in_round if n not in self.dead]
            self._checking = threading.Thread(target=self._check, args=(names,),
                                              name="check-nodes", daemon=True)
            self._checking.start()
        return gone

    def _check(self, names: list[str]) -> None:
        for name, res in self.connector.for_each(self.connector.is_running, names).items():
            if isinstance(res, Exception):
                log.warning("training node %s: cannot check its trainer: %s", name, res)
            elif res is None and name in self.in_round and name not in self.dead:
                self.dead.add(name)
                self._found_dead.append(name)

    def finish_round(self, ok: bool) -> None:
        """The local trainer exited: stop the nodes' trainers; after a failed round bench the
        nodes whose trainer died first (all of them when none is known to have)."""
        nodes, dead = list(self.in_round), set(self.dead)
        if not ok and nodes:
            blamed = [n for n in nodes if n in dead] or nodes
            for name in blamed:
                self.bench(name, "its trainer died during the round" if name in dead
                           else "the round failed with it")
        self.stop_round()

    def stop_round(self, *, wait: bool = False) -> None:
        """Stop the round's trainers on the nodes, in the background unless `wait`."""
        names, self.in_round, self.dead = list(self.in_round), [], set()
        if not names:
            return

        def stop() -> None:
            results: dict[str, Any] = self.connector.for_each(self.connector.stop, names)
            for name, res in results.items():
                if isinstance(res, Exception):
                    log.warning("training node %s: could not stop its trainer: %s", name, res)

        t = threading.Thread(target=stop, name="stop-nodes", daemon=True)
        t.start()
        if wait:
            t.join(timeout=self.cfg.distributed.command_timeout_s
                   + self.cfg.distributed.stop_grace_s + 10)

    def abort(self) -> None:
        """Close every connection (an operation blocked on one fails now)."""
        self.connector.close()

    def describe(self) -> str:
        """The nodes for status.txt: "node1 Training; node2 Benched 60s: why; node3 Ready".

        Training: its trainer runs in this round (Lost: it died during the round); Benched:
        left out for the seconds shown after a failure; Ready: set up, waiting for a round;
        Idle: not contacted yet (the first round sets it up)."""
        now = time.monotonic()
        parts = []
        for name, s in self.nodes.items():
            if name in self.in_round:
                parts.append(f"{name} {'Lost' if name in self.dead else 'Training'}")
            elif now < s.next_try:
                parts.append(f"{name} Benched {s.next_try - now:.0f}s: {s.error}")
            else:
                parts.append(f"{name} {'Ready' if s.prepared else 'Idle'}")
        return "; ".join(parts)

    def close(self) -> None:
        self.connector.close()
