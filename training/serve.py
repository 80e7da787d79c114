"""The net server process: one per worker (several share a GPU), the net of its search processes.

    python -m training.serve --shm NAME --layout SLOTS,MAX_BATCH,C,N --signals FD:FD,...
                             (--model PATH | --stand-in-latency-ms MS) [--device cuda:0]
                             [--jit auto] [--dtype auto] [--graphs auto] [--gather-wait-ms 10]
                             [--lanes 1]

Owns:
- `ServerProcess`: what the worker daemon (or a test, or a benchmark) holds: the shared slots
  and eventfds of `training.search.net_server` (they outlive a server that dies), the server
  process itself (`start`, `restart_if_dead` with backoff, `stop`), a model switch
  (`load_model`: the server loads the file beside its serving and each lane swaps it in
  between two of its batches) and what a search process needs to attach (`client_args`, `client_fds`).
- `BucketEvaluator`: the net on a GPU: weights and inputs in bf16 (`net.inference_dtype`),
  one CUDA graph per power-of-two batch bucket (launches cost one replay instead of ~80
  kernel launches a call), pinned host buffers for uint8 planes in and priors and values out
  (one copy each way). Without graphs (`--graphs off`, or on a CPU for tests) the same
  buckets run eagerly.
- the server process's main: attach, build one evaluator per lane (on a CPU the plain
  `make_evaluator`, whose forms are the fast ones there; on a GPU a `BucketEvaluator` whose
  copies and graphs run on its own CUDA stream), serve (`NetServer`, a thread per lane: one
  gathers while another's batch is in the net), and load requested models in a thread.

A model switch: the supervisor writes the model's path into the control block and bumps
`model_request`; the server's loader thread reads and builds it while the serving goes on;
each lane puts it in between two of its batches (every result carries the generation that
computed it), and once every lane has, `generation` changes and `model_loaded` says so; a model that does not load sets
`model_failed` and its reason, and the old one keeps serving.

It must not: play games, or write anything but its log (stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from training.run.child_process import REPO, terminate
from training.search import net_server
from training.search.net_server import (
    C_EPOCH, C_GENERATION, C_MODEL_FAILED, C_MODEL_LOADED, C_MODEL_REQUEST, C_SERVER_PID,
    C_STOP, SharedSlots, Signals, SlotLayout, StandInNet,
)

log = logging.getLogger(__name__)

MIN_BUCKET = 64
"""The smallest batch bucket of `BucketEvaluator` (a graph per power of two from here)."""
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Waits before each restart of a server that keeps dying (the last repeats)."""
STOP_GRACE_S = 5.0


class ServerError(RuntimeError):
    """The net server did not start, or refused a model (the message says why)."""


# ------------------------------------------------------------------------ the GPU form


class BucketEvaluator:
    """`evaluate(planes uint8 [B, C, N, N], legal bool [B, A+1]) -> (priors, values)` over a
    private copy of `net` on `device` in `dtype`, by batch buckets (powers of two from
    `MIN_BUCKET` up to `max_positions`), each a CUDA graph when `graphs` (CUDA only); with
    `score`, `(priors, values, scores)`, the score head's margin / N (zeros without it).

    `load_weights(net)` copies new weights into the same tensors, so the graphs stay valid.
    """

    def __init__(self, net: Any, device: Any, *, dtype: Any = "auto", max_positions: int,
                 graphs: bool = True, score: bool = False):
        import torch

        from training.learn.net import inference_dtype, resolve_device, unwrap

        self.torch = torch
        self.device = resolve_device(device)
        self.dtype = inference_dtype(dtype, self.device)
        self.graphs = graphs and self.device.type == "cuda"
        self.score = score
        model = copy.deepcopy(unwrap(net)).to(self.device).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.model = model.to(self.dtype)
        self.moves = model.num_moves
        self.shape = (model.in_planes, model.board_size, model.board_size)
        self.buckets = []
        b = MIN_BUCKET
        while True:
            self.buckets.append(b)
            if b >= max_positions:
                break
            b *= 2
        pin = self.device.type == "cuda"
        # each evaluator (a lane of the server) copies and computes on its own stream
        self._stream = torch.cuda.Stream(self.device) if pin else None
        self._runs = {}
        for b in self.buckets:
            self._runs[b] = self._bucket(b, pin)
        self.mode = "graphs" if self.graphs else "buckets"

    def _bucket(self, b: int, pin: bool) -> dict:
        torch = self.torch
        dev, a = self.device, self.moves
        run = {
            "host_in": torch.zeros((b, *self.shape), dtype=torch.uint8, pin_memory=pin),
            "host_legal": torch.ones((b, a), dtype=torch.bool, pin_memory=pin),
            "host_out": torch.zeros((b, a + 2), dtype=torch.float32, pin_memory=pin),
            "dev_in": torch.zeros((b, *self.shape), dtype=torch.uint8, device=dev),
            "dev_legal": torch.ones((b, a), dtype=torch.bool, device=dev),
            "dev_out": torch.zeros((b, a + 2), dtype=torch.float32, device=dev),
        }

        def forward() -> None:  # columns: priors, the value, the score (0 unless asked)
            logits, value, *score = self.model(run["dev_in"].to(self.dtype), score=self.score)
            logits = logits.float().masked_fill(~run["dev_legal"], float("-inf"))
            run["dev_out"][:, :a] = torch.nan_to_num(torch.softmax(logits, dim=1), nan=0.0)
            run["dev_out"][:, a] = value.float()
            if score:
                run["dev_out"][:, a + 1] = score[0].float()

        run["forward"] = forward
        if self.graphs:
            with torch.inference_mode():
                stream = torch.cuda.Stream(dev)
                stream.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(stream):  # warm-up off the capture (cuDNN's choices)
                    for _ in range(3):
                        forward()
                torch.cuda.current_stream(dev).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    forward()
            run["forward"] = graph.replay
        return run

    def __call__(self, planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, ...]:
        batch = planes.shape[0]
        priors = np.empty((batch, self.moves), np.float32)
        values = np.empty(batch, np.float32)
        scores = np.empty(batch, np.float32)
        top = self.buckets[-1]
        for lo in range(0, batch, top):
            hi = min(batch, lo + top)
            self._run(planes[lo:hi], legal[lo:hi], priors[lo:hi], values[lo:hi], scores[lo:hi])
        return (priors, values, scores) if self.score else (priors, values)

    def _run(self, planes, legal, priors, values, scores) -> None:
        torch = self.torch
        n = planes.shape[0]
        b = next(b for b in self.buckets if b >= n)
        run = self._runs[b]
        stream = (torch.cuda.stream(self._stream) if self._stream is not None
                  else contextlib.nullcontext())
        with torch.inference_mode(), stream:
            np.copyto(run["host_in"].numpy()[:n], planes, casting="unsafe")
            run["host_legal"].numpy()[:n] = legal
            # only the rows in use go over; the padded rows keep what an earlier call left
            # (legal rows all have a legal move: the softmax stays finite, results unused)
            run["dev_in"][:n].copy_(run["host_in"][:n], non_blocking=True)
            run["dev_legal"][:n].copy_(run["host_legal"][:n], non_blocking=True)
            run["forward"]()
            run["host_out"][:n].copy_(run["dev_out"][:n], non_blocking=True)
            if self._stream is not None:
                self._stream.synchronize()  # this lane's work only (the GIL is let go)
            out = run["host_out"].numpy()
            priors[:] = out[:n, : self.moves]
            values[:] = out[:n, self.moves]
            scores[:] = out[:n, self.moves + 1]

    def load_weights(self, net: Any) -> None:
        """New weights (same net config) into the same tensors: the graphs keep working."""
        from training.learn.net import plain_state_dict, unwrap

        source = unwrap(net)
        if source.config != self.model.config:
            raise ValueError(f"load_weights needs the same net config: {self.model.config} "
                             f"in use, {source.config} offered")
        with self.torch.no_grad():
            self.model.load_state_dict(plain_state_dict(source))


def build_evaluator(path: str | os.PathLike, device: str, *, jit: Any = "auto",
                    dtype: Any = "auto", max_positions: int = 4096,
                    graphs: str = "auto") -> tuple[Callable, int, Any]:
    """The batch evaluator of the model file `path` on `device`: (evaluate, generation, net),
    scores included (for the clients that ask for them: one more output of the value head).
    On a GPU a `BucketEvaluator` (CUDA graphs unless `graphs` is "off"); on a CPU
    `make_evaluator` with the inference form `jit` (uint8 planes are cast on the way in)."""
    from training.learn.net import load_model, make_evaluator, resolve_device

    dev = resolve_device(device)
    net, info = load_model(path, dev)
    if dev.type == "cuda" or graphs == "on":
        evaluate: Callable = BucketEvaluator(net, dev, dtype=dtype, max_positions=max_positions,
                                             graphs=graphs != "off", score=True)
    else:
        evaluate = make_evaluator(net, dev, jit=jit, dtype=dtype, score=True)
    return evaluate, info.generation, net


# ------------------------------------------------------------------- the server process


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="the net server of a worker's search processes")
    p.add_argument("--shm", required=True, help="shared memory name (made by the supervisor)")
    p.add_argument("--layout", required=True, help="SLOTS,MAX_BATCH,CHANNELS,BOARD")
    p.add_argument("--signals", required=True, help="DOORBELL_FD:DONE_FD,DONE_FD,...")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model file to serve")
    src.add_argument("--stand-in-latency-ms", type=float,
                     help="serve a stand-in net that sleeps this long a call (benchmarks)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--jit", default="auto", help="inference form on a CPU (net.inference)")
    p.add_argument("--dtype", default="auto", help="net.inference_dtype")
    p.add_argument("--graphs", choices=("auto", "on", "off"), default="auto",
                   help="CUDA graphs by batch bucket (auto: on a GPU)")
    p.add_argument("--gather-wait-ms", type=float, default=net_server.GATHER_WAIT_S * 1000)
    p.add_argument("--max-positions", type=int, default=0,
                   help="most positions in one net call (default: every slot full)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--lanes", type=int, default=1,
                   help="batches in the net at once: threads, each with its own evaluator")
    args = p.parse_args(argv)
    if not 1 <= args.lanes <= 16:
        p.error(f"--lanes must be 1 to 16, got {args.lanes}")
    return args


def serve_main(argv: Sequence[str] | None = None) -> int:
    """The server process: attach, build, serve until stopped or orphaned."""
    from training.run.signals import die_with_parent

    die_with_parent()
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s net-server %(message)s")
    slots = SharedSlots.attach(args.shm, SlotLayout.from_text(args.layout))
    try:
        return _serve(args, slots)
    finally:
        slots.close()


def _serve(args: argparse.Namespace, slots: SharedSlots) -> int:
    from training.run.signals import on_stop_signals

    layout = slots.layout
    signals = Signals.from_text(args.signals)
    stop = threading.Event()
    on_stop_signals(stop.set)
    max_positions = args.max_positions or layout.n_slots * layout.max_batch
    lanes = args.lanes

    build: Callable[[str], tuple[Callable, int, Any]] | None = None
    if args.stand_in_latency_ms is not None:
        evaluators = [StandInNet(args.stand_in_latency_ms / 1000.0) for _ in range(lanes)]
        generation = 0
    else:
        import torch

        torch.set_num_threads(args.threads)

        def build(path: str) -> tuple[Callable, int, Any]:  # type: ignore[no-redef]
            return build_evaluator(path, args.device, jit=args.jit, dtype=args.dtype,
                                   max_positions=max_positions, graphs=args.graphs)

        try:
            built = [build(args.model) for _ in range(lanes)]
        except Exception as e:  # noqa: BLE001 - any failure: say it on the last line, exit 2
            print(f"error: {args.model}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        evaluators, generation = [e for e, _, _ in built], built[0][1]
    models = _Models(evaluators, generation, slots)
    server = net_server.NetServer(slots, signals, max_positions=max_positions,
                                  gather_wait_s=args.gather_wait_ms / 1000.0, lanes=lanes)

    def loader() -> None:
        """Build each requested model beside the serving; each lane swaps it in."""
        ctl = slots.ctl
        done = max(ctl[C_MODEL_LOADED], ctl[C_MODEL_FAILED])
        while not stop.is_set():
            request = ctl[C_MODEL_REQUEST]
            if request <= done or models.pending is not None:
                stop.wait(0.02)
                continue
            path = slots.text("model_path")
            started = time.perf_counter()
            try:
                if build is None:
                    raise ServerError("a stand-in net takes no models")
                models.offer(_prepare(models.evaluators[0], build, path, lanes), request)
                log.info("model %s ready in %.2fs", path, time.perf_counter() - started)
            except Exception as e:  # noqa: BLE001 - a bad model is refused, the old one serves
                log.error("model %s refused: %s: %s", path, type(e).__name__, e)
                slots.set_text("model_error", f"{path}: {type(e).__name__}: {e}")
                ctl[C_MODEL_FAILED] = request
            done = request

    threading.Thread(target=loader, name="model-loader", daemon=True).start()
    server.start(generation)
    log.info("serving generation %d to %d slots on %s with %d lane(s) (pid %d)", generation,
             layout.n_slots, args.device, lanes, os.getpid())
    parent = os.getppid()

    errors: list[BaseException] = []

    def lane(k: int) -> None:
        try:
            server.serve(lambda: models.current(k),
                         should_stop=lambda: stop.is_set() or os.getppid() != parent,
                         between=lambda: models.swap_in(k))
        except BaseException as e:
            errors.append(e)
            raise
        finally:
            stop.set()  # a lane that fails stops the server (and is restarted with it)

    threads = [threading.Thread(target=lane, args=(k,), name=f"lane-{k}", daemon=True)
               for k in range(1, lanes)]
    for t in threads:
        t.start()
    lane(0)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    log.info("stopped after %d batches, %d positions", server.batches, server.positions)
    return 0


class _Models:
    """The evaluator of each lane, the generation it computes, and a model on its way in:
    each lane swaps it in between two of its own batches; when the last has, the control
    block says which generation serves and that the request is loaded."""

    def __init__(self, evaluators: list[Any], generation: int, slots: SharedSlots):
        self.evaluators = evaluators
        self.generations = [generation] * len(evaluators)
        self.slots = slots
        self.pending: tuple[str, list[Any], int, int] | None = None
        self._swapped: set[int] = set()
        self._lock = threading.Lock()

    def current(self, lane: int) -> tuple[Callable, int]:
        return self.evaluators[lane], self.generations[lane]

    def offer(self, prepared: tuple[str, list[Any], int], request: int) -> None:
        with self._lock:
            self.pending = (*prepared, request)
            self._swapped = set()

    def swap_in(self, lane: int) -> None:
        """Lane `lane`, between two of its batches: the pending model goes in."""
        if self.pending is None or lane in self._swapped:  # the common case, without the lock
            return
        with self._lock:
            if self.pending is None or lane in self._swapped:
                return
            kind, objs, generation, request = self.pending
            if kind == "weights":
                self.evaluators[lane].load_weights(objs[0])
            else:
                self.evaluators[lane] = objs[lane]
            self.generations[lane] = generation
            self._swapped.add(lane)
            if len(self._swapped) == len(self.evaluators):
                self.slots.ctl[C_GENERATION] = generation
                self.slots.ctl[C_MODEL_LOADED] = request
                self.pending = None
                log.info("generation %d serves", generation)


def _prepare(current: Any, build: Callable[[str], tuple[Callable, int, Any]], path: str,
             lanes: int) -> tuple[str, list[Any], int]:
    """("weights", [net], generation) for new weights of the graphs' net (the one
    `current` serves), else ("swap", [an evaluator per lane], generation) from `build`."""
    if isinstance(current, BucketEvaluator):
        from training.learn.net import load_model

        net, info = load_model(path, "cpu")
        if net.config == current.model.config:  # into the captured graphs' tensors
            return "weights", [net], info.generation
    built = [build(path) for _ in range(lanes)]
    return "swap", [e for e, _, _ in built], built[0][1]


# ------------------------------------------------------------------------ supervision


class ServerProcess:
    """A net server process and the shared slots it serves; restarted when it dies.

    Args:
        layout: the slots (one per search process).
        model: the model file to start with (None with `stand_in_latency_s`).
        stand_in_latency_s: serve a `StandInNet` with this latency instead (benchmarks).
        device, jit, dtype, graphs: the server's device, CPU inference form, dtype and
            CUDA graph choice (`build_evaluator`).
        lanes: batches in the net at once (`NetServer`'s lanes, each its own evaluator).
        stderr_path: the server's log (appended; None: inherit).
    """

    def __init__(self, layout: SlotLayout, *, model: str | os.PathLike | None = None,
                 stand_in_latency_s: float | None = None, device: str = "cpu",
                 jit: Any = "auto", dtype: Any = "auto", graphs: str = "auto",
                 gather_wait_s: float = net_server.GATHER_WAIT_S, max_positions: int = 0,
                 threads: int = 1, lanes: int = 1,
                 stderr_path: str | os.PathLike | None = None, nice: int = 0):
        if (model is None) == (stand_in_latency_s is None):
            raise ValueError("a net server serves a model file or a stand-in net (one of them)")
        self.layout = layout
        self.model = str(model) if model is not None else None
        self.stand_in_latency_s = stand_in_latency_s
        self.device, self.jit, self.dtype, self.graphs = device, str(jit), str(dtype), graphs
        self.gather_wait_s = gather_wait_s
        self.max_positions = max_positions
        self.threads = threads
        self.lanes = lanes
        self.stderr_path = Path(stderr_path) if stderr_path else None
        self.nice = nice
        self.slots = SharedSlots.create(layout)
        self.signals = Signals.create(layout.n_slots)
        self.proc: subprocess.Popen | None = None
        self._lock = threading.RLock()  # the worker's loader and main loop may both restart
        self._closed = False
        self.restarts = 0
        self._next_start = 0.0
        self._failures = 0

    # -------------------------------------------------------------- lifecycle

    def _command(self) -> list[str]:
        src = (["--model", self.model] if self.model is not None
               else ["--stand-in-latency-ms", str(self.stand_in_latency_s * 1000.0)])
        return [sys.executable, "-m", "training.serve", "--shm", self.slots.name,
                "--layout", *self.layout.to_args(), "--signals", *self.signals.to_args(),
                *src, "--device", self.device, "--jit", self.jit, "--dtype", self.dtype,
                "--graphs", self.graphs, "--gather-wait-ms", str(self.gather_wait_s * 1000.0),
                "--max-positions", str(self.max_positions), "--threads", str(self.threads),
                "--lanes", str(self.lanes)]

    def start(self, timeout_s: float = 300.0) -> None:
        """Start the server and wait until it serves (ServerError naming why not)."""
        with self._lock:
            self._start(timeout_s)

    def _start(self, timeout_s: float) -> None:
        epoch = self.slots.ctl[C_EPOCH]
        err = open(self.stderr_path, "ab") if self.stderr_path else None
        try:
            self.proc = subprocess.Popen(
                self._command(), pass_fds=self.signals.fds(), stdin=subprocess.DEVNULL,
                stdout=err, stderr=err, cwd=str(REPO),
                preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None)
        finally:
            if err is not None:
                err.close()
        deadline = time.monotonic() + timeout_s
        while self.slots.ctl[C_EPOCH] == epoch or self.slots.ctl[C_SERVER_PID] != self.proc.pid:
            if self.proc.poll() is not None:
                raise ServerError(f"the net server exited with code {self.proc.returncode} "
                                  f"before serving{self._last_words()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise ServerError(f"the net server did not serve within {timeout_s:g} s"
                                  f"{self._last_words()}")
            time.sleep(0.01)

    def _last_words(self) -> str:
        if self.stderr_path is None or not self.stderr_path.exists():
            return ""
        with open(self.stderr_path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 2048))
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        return f": {lines[-1]}" if lines else ""

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def restart_if_dead(self) -> bool:
        """Start a new server when the last one died (waiting between tries that fail);
        True when a new one serves now. The clients' requests wait in their slots."""
        with self._lock:
            return self._restart_if_dead()

    def _restart_if_dead(self) -> bool:
        if self.is_alive() or self.proc is None or time.monotonic() < self._next_start:
            return False
        log.warning("net server (pid %d) exited with code %s; restarting", self.proc.pid,
                    self.proc.returncode)
        try:
            self._start(300.0)
        except ServerError as e:
            wait = RESTART_BACKOFF_S[min(self._failures, len(RESTART_BACKOFF_S) - 1)]
            self._failures += 1
            self._next_start = time.monotonic() + wait
            log.error("net server restart failed (%s); next try in %.0fs", e, wait)
            return False
        self._failures = 0
        self.restarts += 1
        return True

    def load_model(self, path: str | os.PathLike, timeout_s: float = 300.0) -> int:
        """Have the server switch to the model file `path` (it keeps serving meanwhile);
        returns the generation that now serves. ServerError when it refuses the file."""
        ctl = self.slots.ctl
        self.slots.set_text("model_path", str(path))
        request = max(ctl[C_MODEL_REQUEST], ctl[C_MODEL_LOADED], ctl[C_MODEL_FAILED]) + 1
        ctl[C_MODEL_REQUEST] = request
        net_server.ring(self.signals.doorbell)
        deadline = time.monotonic() + timeout_s
        while ctl[C_MODEL_LOADED] < request:
            if ctl[C_MODEL_FAILED] >= request:
                raise ServerError(f"the net server refused {path}: "
                                  f"{self.slots.text('model_error')}")
            if not self.is_alive():
                self.model = str(path)  # a restarted server starts with it
                if self.restart_if_dead():
                    return ctl[C_GENERATION]
            if time.monotonic() > deadline:
                raise ServerError(f"the net server did not load {path} within {timeout_s:g} s")
            time.sleep(0.005)
        self.model = str(path)
        return ctl[C_GENERATION]

    @property
    def generation(self) -> int:
        """The generation serving now (-1 before the first start)."""
        return self.slots.ctl[C_GENERATION]

    def client_args(self, slot: int) -> list[str]:
        """Command-line words a search process attaches to slot `slot` with
        (`training.search_processes`): the shared memory, its layout and the eventfds."""
        return ["--shm", self.slots.name, "--layout", *self.layout.to_args(),
                "--signals", *self.signals.to_args(), "--slot", str(slot)]

    def client_fds(self, slot: int) -> tuple[int, ...]:
        """The fds a search process on slot `slot` must inherit."""
        return (self.signals.doorbell, self.signals.done[slot])

    def stop(self) -> None:
        """Stop the server (asked, then SIGTERM, then SIGKILL); the slots and eventfds go.
        A second call does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            self.slots.ctl[C_STOP] = 1
            net_server.ring(self.signals.doorbell)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                terminate(proc, STOP_GRACE_S)
        self.slots.close()
        self.signals.close()


if __name__ == "__main__":
    sys.exit(serve_main())
