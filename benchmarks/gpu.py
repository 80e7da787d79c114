"""The GPU acceptance check: what the guides promise on GPUs, run in one command.

    python3 benchmarks/gpu.py [--steps 30] [--seconds 20]

On a machine without CUDA it prints one SKIP line saying so and exits 0 (never a silent pass).
With CUDA it runs each check as its own subprocess with a deadline and prints one table row
per check (ok / FAILED, the figure, the command), then one JSON line:

- devices: `torch.cuda.device_count()`, names, bf16 support; CUDA_VISIBLE_DEVICES honoured (a
  child with CUDA_VISIBLE_DEVICES=0 sees one device);
- DDP over NCCL on every visible GPU: `torchrun --nproc_per_node=N -m training.trainer` on
  synthetic samples of configs/gpu.yaml's net, its step losses against one process on one GPU
  with the same total batch (within 5%: BatchNorm sees each rank's part), samples/s of both;
- mixed precision: the same round with `--mixed-precision`, `training.amp_dtype` bf16 and fp16
  (fp16 with a GradScaler), samples/s against float32, losses finite;
- out of memory: with all but 4 GiB of the GPU taken by this process, a round with a total
  batch too big for the rest recovers by halving the micro-batch (the round result's
  `micro_batch` is smaller than the batch per rank);
- placement: `plan_workers` for `--workers 4 --workers-per-gpu 2` on the visible GPUs (every
  GPU gets its workers as `cuda:N`);
- a worker daemon on a GPU: with CUDA_VISIBLE_DEVICES naming the last GPU, the coach's
  placement (`local_workers.plan_devices`, run under that variable as the coach would be) picks
  the worker's device, and a real `start_worker.py` plays configs/tiny.yaml's games there as
  the coach starts it (`--device`, the same environment) until `--max-games`: exit 0, its
  heartbeat's device is the placement's, and its batches are in its outbox;
- self-play: `benchmarks/selfplay.py --device cuda --config configs/gpu.yaml` (that config's
  board, net with its liberty planes, search and games in flight: moves/s and the ratio to
  the network-only limit), and `--breakdown configs/gpu.yaml` in float32 and in bfloat16
  (`net.inference_dtype`): net evaluations/s and where the time goes;
- model switch: `benchmarks/switch.py --device cuda --config configs/gpu.yaml`, a worker's
  median switch time within 2 s.

Every check is bounded (`--timeout` seconds each); the whole check is sized to run in under
10 minutes on one GPU. Record its table in docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GPU_CONFIG = REPO / "configs" / "gpu.yaml"


def _run(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **(env or {})})
        return p.returncode, p.stdout, p.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        return 124, str(e.stdout or ""), f"timed out after {timeout:.0f}s", timeout


def _summary(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON summary line")


class Table:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, check: str, ok: bool, figure: str, command: str = "") -> None:
        self.rows.append({"check": check, "ok": ok, "figure": figure, "command": command})
        print(f"{'ok    ' if ok else 'FAILED'}  {check:<34} {figure}", flush=True)


def _trainer(args: list[str], run_dir: Path, samples: Path, steps: int, nproc: int,
             timeout: float, extra_env: dict | None = None) -> tuple[int, str, str, float]:
    base = ["-m", "training.trainer", "--config", str(GPU_CONFIG), "--run-dir", str(run_dir),
            "--samples", str(samples), "--steps", str(steps), "--no-progress", *args]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", *base]
    else:
        cmd = [sys.executable, *base, "--gpus", "1"]
    return _run(cmd, timeout, extra_env)


def _worker_on_gpu(table: Table, n: int, games: int, timeout: float) -> dict | None:
    """The "worker daemon on a GPU" row (see the module docstring); returns its figures."""
    from configs import dump_config, load_config, override
    from training.learn.net import net_from_config, save_model
    from training.run import model_store

    visible = {"CUDA_VISIBLE_DEVICES": str(n - 1)}
    cfg = override(load_config(REPO / "configs" / "tiny.yaml"),
                   {"self_play.cpu_only": False, "self_play.workers": 1})
    with tempfile.TemporaryDirectory(prefix="azgo-gpu-worker-") as tmp:
        tmp = Path(tmp)
        config = tmp / "config.yaml"
        config.write_text(dump_config(override(cfg, {"run.dir": str(tmp / "run"),
                                                     "logging.dir": str(tmp / "logs")})))
        code, out, err, _ = _run(
            [sys.executable, "-c", "import sys; from configs import load_config; "
             "from training.fleet.local_workers import plan_devices; "
             "print(plan_devices(load_config(sys.argv[1]), quiet=True)[0])", str(config)],
            120, visible)
        device = out.strip()
        if code != 0 or not device.startswith("cuda"):
            table.add(f"placement, CUDA_VISIBLE_DEVICES={n - 1}", False,
                      f"device {device or err.strip()[-200:]!r}, expected cuda:0")
            return None
        folder = tmp / "run" / "workers" / "worker1"
        save_model(tmp / "published" / "model_000000.pt",
                   net_from_config(cfg.net, cfg.go.board_size), 0)
        manifest = model_store.publish_model(tmp / "published", 0, cfg.distributed.wire_level)
        model_store.copy_published(tmp / "published", manifest, folder / "models")
        code, out, err, secs = _run(
            [sys.executable, "start_worker.py", "--config", str(config), "--name", "worker1",
             "--dir", str(folder), "--log-dir", str(tmp / "logs"), "--device", device,
             "--max-games", str(games)], timeout, visible)
        try:
            hb = json.loads((folder / "status.json").read_text())
        except (OSError, ValueError):
            hb = {}
        batches = sorted((folder / "outbox").glob("*.npz.zst"))
        ok = (code == 0 and hb.get("device") == device and hb.get("games_done", 0) >= games
              and bool(batches))
        table.add(f"worker daemon on {device}, CUDA_VISIBLE_DEVICES={n - 1}", ok,
                  f"{hb.get('games_done', 0)} games in {secs:.1f}s, {len(batches)} batches, "
                  f"heartbeat device {hb.get('device')}" if code == 0
                  else f"exit {code}: {err.strip()[-200:]}")
        return {"device": device, "visible": visible["CUDA_VISIBLE_DEVICES"],
                "games": hb.get("games_done"), "seconds": secs} if ok else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="training steps per round")
    ap.add_argument("--seconds", type=float, default=20, help="self-play seconds")
    ap.add_argument("--timeout", type=float, default=240, help="deadline of each check")
    ap.add_argument("--worker-games", type=int, default=64,
                    help="games the worker daemon on a GPU plays")
    ap.add_argument("--only-worker", action="store_true",
                    help="run only the devices rows and the worker daemon on a GPU")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("SKIP: GPU acceptance check: no CUDA device here (torch.cuda.is_available() is "
              "False); run it on a machine with a GPU")
        print(json.dumps({"skipped": "no CUDA device"}))
        return 0
    from configs import load_config
    from training.fleet.placement import plan_workers
    from training.learn.samples import config_samples

    table = Table()
    n = torch.cuda.device_count()
    names = [torch.cuda.get_device_name(k) for k in range(n)]
    table.add("devices", n >= 1, f"{n}: {', '.join(names)}; bf16 "
              f"{'yes' if torch.cuda.is_bf16_supported() else 'no'}")
    code, out, err, _ = _run([sys.executable, "-c", "import torch; "
                              "print(torch.cuda.device_count())"], 120,
                             {"CUDA_VISIBLE_DEVICES": "0"})
    table.add("CUDA_VISIBLE_DEVICES=0", code == 0 and out.strip() == "1",
              f"child sees {out.strip() or err.strip()[-80:]} device(s)")
    cfg = load_config(GPU_CONFIG)
    figures: dict = {"devices": names}
    figures["worker_on_gpu"] = _worker_on_gpu(table, n, args.worker_games, args.timeout)
    if args.only_worker:
        print(json.dumps({"ok": all(r["ok"] for r in table.rows), "rows": table.rows,
                          "figures": figures}))
        return 0 if all(r["ok"] for r in table.rows) else 1
    with tempfile.TemporaryDirectory(prefix="azgo-gpu-") as tmp:
        tmp = Path(tmp)
        samples = tmp / "samples.npz"
        batch = cfg.training.batch_size
        config_samples(cfg, max(4096, batch * 4), seed=1).save(samples)
        code, out, err, secs = _trainer([], tmp / "one", samples, args.steps, 1, args.timeout)
        one = _summary(out) if code == 0 else None
        table.add("train, one GPU, float32", one is not None,
                  f"{one['samples_per_s']:.0f} samples/s" if one else err.strip()[-200:])
        if n > 1:
            code, out, err, _ = _trainer([], tmp / "ddp", samples, args.steps, n, args.timeout)
            ddp = _summary(out) if code == 0 else None
            close = bool(ddp and one) and all(
                abs(a - b) <= 0.05 * abs(b) for a, b in zip(ddp["step_losses"],
                                                           one["step_losses"]))
            table.add(f"DDP NCCL on {n} GPUs", close,
                      f"{ddp['samples_per_s']:.0f} samples/s, world {ddp['world_size']}, step "
                      "losses within 5% of one GPU" if ddp else err.strip()[-200:])
            figures["ddp_samples_per_s"] = ddp and ddp["samples_per_s"]
        else:
            table.add("DDP NCCL", True, "one GPU only: nothing to spread over")
        figures["one_gpu_samples_per_s"] = one and one["samples_per_s"]
        for dtype in ("bf16", "fp16"):
            cfg_file = tmp / f"{dtype}.yaml"
            text = GPU_CONFIG.read_text().replace("amp_dtype: auto", f"amp_dtype: {dtype}")
            cfg_file.write_text(text)
            code, out, err, _ = _run(
                [sys.executable, "-m", "training.trainer", "--config", str(cfg_file),
                 "--run-dir", str(tmp / dtype), "--samples", str(samples), "--steps",
                 str(args.steps), "--no-progress", "--gpus", "1", "--mixed-precision"],
                args.timeout)
            res = _summary(out) if code == 0 else None
            good = res is not None and res["loss"] == res["loss"]
            speed = (f"{res['samples_per_s']:.0f} samples/s "
                     f"({res['samples_per_s'] / one['samples_per_s']:.2f}x float32)"
                     if res and one else err.strip()[-200:])
            table.add(f"mixed precision {dtype}" + (" + GradScaler" if dtype == "fp16" else ""),
                      good, speed)
            figures[f"{dtype}_samples_per_s"] = res and res["samples_per_s"]
        # A real out-of-memory: this process takes all but HEADROOM of the GPU's free
        # memory, and the trainer gets a batch whose activations (an estimate from the net's
        # size) need several times the rest; its first step runs out of memory and it halves
        # its micro-batch until the step fits. (Sizing the batch to the whole card's memory
        # did not work: an H100 fitted a batch of 99,350 that the estimate put at twice its
        # free memory.)
        headroom = 4 << 30
        free, _total = torch.cuda.mem_get_info(0)
        hold = torch.empty(max(0, free - headroom), dtype=torch.uint8, device="cuda:0")
        per_sample = (cfg.net.blocks * 12 + 10) * cfg.net.filters * cfg.go.board_size ** 2 * 4
        oom_batch = int(min(8 * headroom // per_sample + 1, 400_000))
        oom_samples = tmp / "oom.npz"
        # the trainer holds back replay.validation_fraction of the positions: make the
        # training part at least one batch
        count = int(oom_batch / (1 - cfg.replay.validation_fraction)) + 1024
        config_samples(cfg, count, seed=2).save(oom_samples)
        code, out, err, _ = _trainer(["--batch-size", str(oom_batch)], tmp / "oom",
                                     oom_samples, 1, 1, args.timeout)
        del hold
        torch.cuda.empty_cache()
        res = _summary(out) if code == 0 else None
        table.add("CUDA out of memory recovered", bool(res) and res["accumulation"] > 1,
                  f"batch {oom_batch} in {headroom >> 30} GiB: micro-batch "
                  f"{res['micro_batch']} x {res['accumulation']}" if res
                  else err.strip()[-200:])
    devices, messages = plan_workers(4, 2, False, n)
    used = {f"cuda:{k}" for k in range(min(n, 4))}
    table.add("placement --workers 4 --workers-per-gpu 2", set(devices) == used,
              f"{devices} {' '.join(messages)}".strip())
    code, out, err, _ = _run([sys.executable, "benchmarks/selfplay.py", "--device", "cuda",
                              "--config", str(GPU_CONFIG), "--seconds", str(args.seconds),
                              "--no-processes"], args.timeout * 2)
    sp = _summary(out) if code == 0 else None
    table.add("self-play gpu.yaml on cuda", sp is not None,
              f"{sp['moves_per_s']:.0f} moves/s, {sp['ratio']:.2f} of the net-only limit"
              if sp else err.strip()[-200:])
    figures["selfplay"] = sp
    for dtype in ("float32", "bfloat16"):  # net.inference_dtype: auto is bf16 on CUDA
        code, out, err, _ = _run([sys.executable, "benchmarks/selfplay.py", "--device", "cuda",
                                  "--breakdown", str(GPU_CONFIG), "--dtype", dtype,
                                  "--seconds", str(args.seconds)], args.timeout)
        b = _summary(out) if code == 0 else None
        table.add(f"self-play breakdown {dtype}", b is not None,
                  f"{b['positions_per_s']:.0f} evals/s, net {b['shares']['net']:.0%}, search "
                  f"{b['shares']['search']:.0%}, moves {b['shares']['moves and games']:.0%}"
                  if b else err.strip()[-200:])
        figures[f"breakdown_{dtype}"] = b
    code, out, err, _ = _run([sys.executable, "benchmarks/switch.py", "--device", "cuda",
                              "--config", str(GPU_CONFIG), "--models", "3", "--interval", "3"],
                             args.timeout)
    sw = _summary(out) if code == 0 else None
    table.add("model switch within 2 s", bool(sw) and sw["median_switch_s"] <= 2.0,
              f"median {sw['median_switch_s']:.2f} s" if sw else err.strip()[-200:])
    figures["switch"] = sw
    print(json.dumps({"ok": all(r["ok"] for r in table.rows), "rows": table.rows,
                      "figures": figures}))
    return 0 if all(r["ok"] for r in table.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
