"""A sandbox cluster on one machine: N local SSH hosts and a config that points at them.

    python -m training.sandbox --hosts 2                   # keeps running; Ctrl-C ends it
    python start_main.py --config sandbox/config.yaml      # in a second terminal
    watch -n 1 cat distributed/status.txt

Each host is a private OpenSSH server on 127.0.0.1 with its own port, host key and state
folder (`distributed.sshd_hosts.SSHServer`; it never touches the system's sshd or ~/.ssh), all
accepting one generated client key. The written config is the base config (default
configs/config.yaml) with `distributed.enabled: true`, one worker per host (`worker1`,
`worker2`, ... each with its own `remote_dir` under the sandbox folder), the hosts' keys pinned
in `sandbox/known_hosts`, and the run folder `sandbox/run`. By default the workers run this
checkout's Python (`distributed.deploy: false`, as for hosts prepared by hand); `--deploy`
exercises the real deploy into a virtual environment per host instead.

`sandbox/hosts.json` lists the hosts (name, port, pid) while it runs. Adding a host to a
running coach is `python distributed/ssh_connector.py --config sandbox/config.yaml
--add-worker 127.0.0.1 $USER --port P --key-path sandbox/client_key --gpu-id -1` against a
host started with `--spare 1` (the command prints it); its remote_dir defaults to
`sandbox/added`.

It must not: listen on anything but loopback, or be used for a real cluster.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import sys
import threading
from pathlib import Path

from configs import Config, ConfigError, dump_config, load_config, override
from distributed.sshd_hosts import SSHServer, keygen
from training.run.signals import on_stop_signals

log = logging.getLogger(__name__)


def start_hosts(n: int, folder: str | os.PathLike) -> list[SSHServer]:
    """Start `n` loopback sshd hosts sharing one client key (`folder/client_key`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = keygen(folder / "client_key", "azgo-sandbox")
    servers = []
    try:
        for i in range(n):
            servers.append(SSHServer(folder / f"host{i + 1}", client_key=key).start())
    except (OSError, RuntimeError):
        for s in servers:
            s.kill()
        raise
    (folder / "known_hosts").write_text("".join(s.known_hosts_line() for s in servers))
    return servers


def sandbox_config(base: Config, servers: list[SSHServer], folder: str | os.PathLike, *,
                   deploy: bool = False, python: str | None = None) -> Config:
    """`base` with its workers replaced by the sandbox hosts."""
    folder = Path(folder).resolve()
    workers = [{"host": s.addr, "port": s.port, "user": s.user, "name": f"worker{i + 1}",
                "key_path": str(s.client_key), "gpu_id": -1,
                "remote_dir": str(folder / f"host{i + 1}" / "azgo")}
               for i, s in enumerate(servers)]
    return override(base, {
        "distributed.enabled": True,
        "distributed.workers": workers,
        "distributed.worker_weights": {},
        "distributed.known_hosts": str(folder / "known_hosts"),
        "distributed.remote_dir": str(folder / "added"),  # hosts added later stay in here
        "distributed.deploy": deploy,
        "distributed.python": python or sys.executable,
        "run.dir": str(folder / "run"),
    }, source="sandbox")


def write_config(cfg: Config, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.write_text("# written by python -m training.sandbox; edits add/remove workers of a "
                    "running coach\n" + dump_config(cfg))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="N local SSH hosts + a config for distributed mode")
    p.add_argument("--hosts", type=int, default=2, help="hosts in the config")
    p.add_argument("--spare", type=int, default=0, help="extra hosts not in the config")
    p.add_argument("--dir", default="sandbox", help="state folder (default sandbox/)")
    p.add_argument("--base-config", default=None, help="config to start from")
    p.add_argument("--deploy", action="store_true", help="deploy into a venv on each host")
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(message)s")
    try:
        base = load_config(args.base_config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    folder = Path(args.dir).resolve()
    servers = start_hosts(args.hosts + args.spare, folder)
    stop = threading.Event()
    on_stop_signals(stop.set)
    try:
        cfg = sandbox_config(base, servers[: args.hosts], folder, deploy=args.deploy)
        config = write_config(cfg, folder / "config.yaml")
        hosts = [{"name": f"host{i + 1}", "addr": s.addr, "port": s.port, "pid": s.proc.pid,
                  "in_config": i < args.hosts} for i, s in enumerate(servers)]
        (folder / "hosts.json").write_text(json.dumps(hosts, indent=2) + "\n")
        print(f"{len(servers)} SSH hosts on 127.0.0.1 ports "
              f"{', '.join(str(s.port) for s in servers)} (user {getpass.getuser()})")
        print(f"config: {config}\nnext:   python start_main.py --config {config}")
        for h in hosts[args.hosts:]:
            print(f"spare:  python distributed/ssh_connector.py --config {config} --add-worker "
                  f"127.0.0.1 {getpass.getuser()} --port {h['port']} --key-path "
                  f"{folder / 'client_key'} --gpu-id -1")
        print("Ctrl-C stops the hosts.", flush=True)
        stop.wait()
    finally:
        for s in servers:
            s.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
