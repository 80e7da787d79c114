"""Extra training nodes: the trainer's node ranks 1..K on the SSH hosts of
`distributed.training_nodes`, started for each training round by the coach.

Vocabulary: a **node** is one entry of `distributed.training_nodes` (a WorkerSpec; default
names node1, node2, ...); its node rank is its place among the nodes taking part in a round
(1, 2, ... in config order; the main node is node rank 0). A node is **benched** after it
failed a round (could not be brought up or started, or its trainer died during the round) and
takes part again after a backoff (from `distributed.backoff_max_s`, doubling, at most an hour).

Per round, for each node taking part: bring it up once (preflight, deploy unless
`distributed.deploy` is off, the run's config) exactly like a worker, then start, detached
under the connector's pid file and log (`<remote_dir>/logs/worker_<node>.log`),

    python -m training.trainer --config <root>/config.yaml --run-dir <root>/workers/<node>
        --cache-dir <root>/workers/<node>/cache --generation G --nodes K+1 --node-rank i
        --master-addr A --master-port P --no-progress

`--cache-dir` tells the trainer that this node does not see the main node's run folder: rank 0
sends it the window's batch files and the starting checkpoint over the process group, and only
rank 0 (the coach's local trainer) writes models and checkpoints. A is
`distributed.master_addr` when the config has it, else the main node's address as the first
node sees it (the client end of its SSH connection, `$SSH_CONNECTION`).

It must not: import torch or paramiko, decide when to train (the coach does), or touch the
self-play workers.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

from configs import Config
from distributed.ssh_connector import SSHConnector, SSHError
from distributed.transfer import TransferError

log = logging.getLogger(__name__)

_ERRORS = (SSHError, TransferError, OSError)
MAX_BENCH_S = 3600.0


class NodeStartError(Exception):
    """The nodes of a round could not all be started (the round is not begun)."""


@dataclass
class _Node:
    up: bool = False  # preflight, deploy and config done
    benched_until: float = 0.0
    bench_s: float = 0.0
    error: str = ""


def trainer_argv(generation: int, nodes: int, node_rank: int, master_addr: str,
                 master_port: int) -> tuple[str, ...]:
    """The node's trainer argv template (SSHConnector fills {python}, {config}, {dir})."""
    return ("{python}", "-m", "training.trainer", "--config", "{config}", "--run-dir", "{dir}",
            "--cache-dir", "{dir}/cache", "--generation", str(generation), "--no-progress",
            "--nodes", str(nodes), "--node-rank", str(node_rank),
            "--master-addr", master_addr, "--master-port", str(master_port))


class TrainingNodes:
    """The coach's handle on `distributed.training_nodes` (see the module docstring)."""

    def __init__(self, cfg: Config, config_file: str, *, connector: SSHConnector | None = None):
        self.cfg = cfg
        self.config_file = config_file
        specs = cfg.distributed.training_nodes
        self.connector = connector or SSHConnector(
            dataclasses.replace(cfg.distributed, workers=specs))
        self.nodes = {s.name: _Node() for s in specs}
        self.in_round: list[str] = []  # nodes started for the running round
        self.dead: set[str] = set()  # nodes whose trainer died during the running round
        self._last_check = 0.0
        self._master_addr: str | None = getattr(cfg.distributed, "master_addr", None)

    def names(self) -> list[str]:
        return list(self.nodes)

    def available(self) -> list[str]:
        """Nodes that take part in the next round (config order, benched ones left out)."""
        now = time.monotonic()
        return [n for n, s in self.nodes.items() if now >= s.benched_until]

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
        s.bench_s = min(MAX_BENCH_S, s.bench_s * 2 or self.cfg.distributed.backoff_max_s)
        s.benched_until = time.monotonic() + s.bench_s
        s.error = why
        s.up = False  # preflight, deploy (a no-op when current) and config again next time
        log.error("training node %s: %s; training goes on without it for %.0fs", name, why,
                  s.bench_s)

    def _bring_up(self, name: str) -> None:
        if self.nodes[name].up:
            return
        report = self.connector.preflight(name)
        if not report.ok:
            raise SSHError(f"{name}: preflight: " + "; ".join(report.problems), worker=name)
        if self.cfg.distributed.deploy:
            self.connector.deploy(name)
        self.connector.put(name, self.config_file, self.connector.paths(name).config)
        self.nodes[name].up = True

    def start_round(self, generation: int, master_port: int) -> tuple[int, str]:
        """Start node ranks 1..K of generation G's round; returns (K, master address).

        Nodes that cannot be brought up are benched first; (0, "") when none is left. A node
        that fails to start stops the others and raises NodeStartError (retry next pass).
        """
        ready = []
        for name in self.available():
            try:
                self._bring_up(name)
                ready.append(name)
            except _ERRORS as e:
                self.bench(name, f"cannot be brought up: {type(e).__name__}: {e}")
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
                                                        master_port)
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
        """Nodes of the running round whose trainer is gone (polled at most so often)."""
        now = time.monotonic()
        if not self.in_round or now - self._last_check < min_interval_s:
            return []
        self._last_check = now
        gone = []
        for name in self.in_round:
            if name in self.dead:
                continue
            try:
                alive = self.connector.is_running(name) is not None
            except _ERRORS as e:
                log.warning("training node %s: cannot check its trainer: %s", name, e)
                continue
            if not alive:
                self.dead.add(name)
                gone.append(name)
        return gone

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

    def stop_round(self) -> None:
        results: dict[str, Any] = self.connector.for_each(self.connector.stop, self.in_round)
        for name, res in results.items():
            if isinstance(res, Exception):
                log.warning("training node %s: could not stop its trainer: %s", name, res)
        self.in_round, self.dead = [], set()

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
            elif now < s.benched_until:
                parts.append(f"{name} Benched {s.benched_until - now:.0f}s: {s.error}")
            else:
                parts.append(f"{name} {'Ready' if s.up else 'Idle'}")
        return "; ".join(parts)

    def close(self) -> None:
        self.connector.close()
