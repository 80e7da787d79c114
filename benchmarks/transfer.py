"""Benchmark: pushing a model to 1, 4 and 8 worker hosts over real SSH.

Hosts are network namespaces with their own sshd (`distributed.sshd_hosts.NetnsHosts`, needs
root) or, without root, loopback sshds on separate ports. Prints a table:
  - the model file: a realistic ~10 MB float32 state dict (torch.save of ResNet-shaped conv
    weights, init-scaled; numpy float32 normal bytes if torch is missing), its zstd ratio and
    compression time at the configured level,
  - time to push the compressed model to 1, 4 and 8 hosts with `SSHConnector.push_file`
    (temp name + posix-rename, connections already open; best of --repeats),
  - the median time to download it back from one host (`SSHConnector.get`),
  - SFTP MB/s against a plain `cat file | ssh host 'cat > file'` (OpenSSH client over an open
    ControlMaster connection) over the same link,
and as its last line one JSON object with push_1_s, push_8_s, fanout_ratio (push_8 / push_1),
sftp_vs_raw (SFTP MB/s / raw ssh MB/s), get_1_s and get_mb_s (the download) and
compression_ratio.

    python benchmarks/transfer.py [--size-mb 10] [--rate 1gbit] [--repeats 3]

`--rate` caps each host's link (tc tbf), as a separate NIC per worker would be; without it the
links are veths limited only by CPU (2 cores here: encryption dominates).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from configs import DistributedConfig, WorkerSpec
from distributed.sshd_hosts import NetnsHosts, SSHServer
from distributed.ssh_connector import SSHConnector
from distributed.transfer import compress_file, sha256_file


def make_model(path: Path, size_mb: float) -> str:
    """Write a realistic model file of about size_mb MB; returns what it is."""
    n_params = int(size_mb * 1e6 / 4)
    filters = 128
    try:
        import torch

        state, i = {}, 0
        while sum(t.numel() for t in state.values()) < n_params:
            std = (2.0 / (filters * 9)) ** 0.5  # He init, the scale of a trained conv
            state[f"blocks.{i // 2}.conv{i % 2 + 1}.weight"] = torch.randn(
                filters, filters, 3, 3) * std
            state[f"blocks.{i // 2}.bn{i % 2 + 1}.weight"] = 1 + 0.1 * torch.randn(filters)
            state[f"blocks.{i // 2}.bn{i % 2 + 1}.bias"] = 0.1 * torch.randn(filters)
            state[f"blocks.{i // 2}.bn{i % 2 + 1}.running_mean"] = 0.1 * torch.randn(filters)
            state[f"blocks.{i // 2}.bn{i % 2 + 1}.running_var"] = 1 + 0.1 * torch.rand(filters)
            i += 1
        buf = io.BytesIO()
        torch.save({"state_dict": state, "net": {"blocks": i // 2, "filters": filters}}, buf)
        path.write_bytes(buf.getvalue())
        return f"torch.save state dict, {i} convs of {filters}x{filters}x3x3 + batch norms"
    except ImportError:
        rng = np.random.default_rng(0)
        path.write_bytes((rng.standard_normal(n_params) * 0.03).astype(np.float32).tobytes())
        return "float32 normal(0, 0.03) bytes (torch not installed)"


def start_hosts(n: int, state: Path):
    """N hosts: network namespaces when root, else loopback sshds. Returns (specs, kh, closer)."""
    if os.geteuid() == 0 and shutil.which("ip"):
        hosts = NetnsHosts(state, n).up()
        specs = [WorkerSpec(host=hosts.addr(i), user=hosts.servers[0].user, name=f"worker{i}",
                            key_path=str(hosts.client_key), gpu_id=-1,
                            remote_dir=str(state / f"remote{i}")) for i in range(1, n + 1)]
        return specs, hosts.known_hosts, hosts.close, "network namespaces", hosts
    servers = [SSHServer(state / f"sshd{i}").start() for i in range(1, n + 1)]
    kh = state / "known_hosts"
    kh.write_text("".join(s.known_hosts_line() for s in servers))
    specs = [WorkerSpec(host=s.addr, port=s.port, user=s.user, name=f"worker{i}",
                        key_path=str(s.client_key), gpu_id=-1,
                        remote_dir=str(state / f"remote{i}"))
             for i, s in enumerate(servers, start=1)]

    def close():
        for s in servers:
            s.kill()

    return specs, kh, close, "loopback sshds", None


def raw_ssh_seconds(spec: WorkerSpec, known_hosts: Path, src: Path, dst: str,
                    control: Path, repeats: int) -> tuple[float, float]:
    """Best times of `cat src | ssh host 'cat > dst'` and of `ssh host true` over an already
    open OpenSSH connection (ControlMaster): the second is the remote shell's start-up (its rc
    files), which the first pays too and SFTP does not."""
    base = ["ssh", "-i", spec.key_path, "-p", str(spec.port), "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            "-o", "ControlMaster=auto", "-o", f"ControlPath={control}",
            "-o", "ControlPersist=60", f"{spec.user}@{spec.host}"]
    subprocess.run(base + ["true"], check=True)  # opens the master connection
    try:
        best, shell = float("inf"), float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run(base + ["true"], check=True)
            shell = min(shell, time.perf_counter() - t0)
            with open(src, "rb") as f:
                t0 = time.perf_counter()
                subprocess.run(base + [f"cat > '{dst}'"], stdin=f, check=True)
                best = min(best, time.perf_counter() - t0)
        return best, shell
    finally:
        subprocess.run(base[:-1] + ["-O", "exit", base[-1]], capture_output=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=float, default=10.0)
    ap.add_argument("--level", type=int, default=3, help="zstd level (distributed default 3)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rate", default=None, help="per-host link cap, e.g. 1gbit (netns only)")
    a = ap.parse_args(argv)
    counts = (1, 4, 8)
    with tempfile.TemporaryDirectory(prefix="azgo-bench-") as td:
        td = Path(td)
        model = td / "model_000001.pt"
        what = make_model(model, a.size_mb)
        t0 = time.perf_counter()
        csize = compress_file(model, td / "model_000001.pt.zst", a.level)
        t_compress = time.perf_counter() - t0
        model_size = model.stat().st_size
        ratio = model_size / csize
        packed = td / "model_000001.pt.zst"
        specs, kh, close, kind, hosts = start_hosts(max(counts), td / "hosts")
        try:
            if a.rate and hosts is not None:
                for i in range(1, hosts.n + 1):
                    hosts.rate(i, a.rate)
            cfg = DistributedConfig(enabled=True, workers=tuple(specs), known_hosts=str(kh),
                                    deploy=False, python=sys.executable)
            res: dict[int, float] = {}
            with SSHConnector(cfg) as c:
                c.for_each(lambda n: c.run(n, "true"))  # open every connection first
                for n in counts:
                    times = []
                    for r in range(a.repeats):
                        out = c.push_file(packed, f"models/m{n}_{r}.pt.zst",
                                          [s.name for s in specs[:n]])
                        bad = {k: v for k, v in out.items() if isinstance(v, Exception)}
                        assert not bad, bad
                        times.append(c.stats.last_push_s)
                    res[n] = min(times)
                gets = []
                for r in range(a.repeats):
                    back = td / f"back{r}.pt.zst"
                    got = c.get(specs[0].name, "models/m1_0.pt.zst", back,
                                expected_sha256=sha256_file(packed))
                    gets.append(got.seconds)
                    back.unlink()
                get_s = statistics.median(gets)
                raw_total, shell = raw_ssh_seconds(specs[0], kh, packed,
                                      f"{specs[0].remote_dir}/models/raw.bin",
                                      td / "cm", a.repeats)
        finally:
            close()
    mb = csize / 1e6
    raw = max(raw_total - shell, 1e-6)  # the transfer alone
    sftp_mb_s, raw_mb_s = mb / res[1], mb / raw
    print(f"hosts: {kind}" + (f", each link capped at {a.rate}" if a.rate else ""))
    print(f"model: {model_size / 1e6:.1f} MB ({what})")
    print(f"zstd level {a.level}: {csize / 1e6:.2f} MB, ratio {ratio:.3f}, "
          f"{t_compress:.2f} s ({model_size / 1e6 / t_compress:.0f} MB/s)")
    print()
    print(f"{'push to':<10}{'seconds':>10}{'MB/s total':>12}{'x one host':>12}")
    for n in counts:
        print(f"{n:>2} hosts  {res[n]:>10.3f}{n * mb / res[n]:>12.1f}{res[n] / res[1]:>12.2f}")
    print(f"{'raw ssh':<10}{raw:>10.3f}{raw_mb_s:>12.1f}{'':>12}   "
          f"(cat | ssh 'cat >', 1 host, open connection: {raw_total:.3f} s minus "
          f"{shell:.3f} s of remote shell start-up)")
    print(f"SFTP {sftp_mb_s:.1f} MB/s vs raw ssh {raw_mb_s:.1f} MB/s: "
          f"{sftp_mb_s / raw_mb_s:.2f}x")
    print(f"download from 1 host: {get_s:.3f} s, {mb / get_s:.1f} MB/s (median of "
          f"{a.repeats}; `SSHConnector.get`: bounded reads, sha256 checked)")
    print(json.dumps({
        "push_1_s": round(res[1], 4), "push_4_s": round(res[4], 4),
        "push_8_s": round(res[8], 4), "fanout_ratio": round(res[8] / res[1], 3),
        "sftp_vs_raw": round(sftp_mb_s / raw_mb_s, 3), "get_1_s": round(get_s, 4),
        "get_mb_s": round(mb / get_s, 2), "compression_ratio": round(ratio, 4),
        "size_mb": round(model_size / 1e6, 2), "hosts": kind, "rate": a.rate,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
