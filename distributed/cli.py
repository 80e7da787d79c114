"""The command line of `python distributed/ssh_connector.py` (also `python -m distributed.cli`).

    --restart NAME                 through a running coach (a request file it claims), else
                                   directly over SSH after --wait seconds; --direct skips the coach
    --add-worker HOST USER         [--name --port --key-path --gpu-id --weight] edits the config
    --remove-worker NAME           edits the config (comments and layout kept, validated first)
    --check [NAME]                 preflight of one or all workers, as a table (exit 1 on problems)
    --status                       distributed/status.txt, parsed and summarised
    --config FILE                  default configs/config.yaml
    --accept-new-host-keys         record unknown host keys (a changed key is always refused)

Output is for people (print); errors are one line on stderr and exit code 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

from configs import DEFAULT_CONFIG_PATH, ConfigError
from distributed import config_edit, restart_requests
from distributed.ssh_connector import (
    PreflightReport,
    SSHConnector,
    SSHError,
    UnknownWorkerError,
)
from distributed.status import DEFAULT_STATUS_PATH, read_status, run_time
from distributed.transfer import TransferError


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def _check_rows(results: dict[str, PreflightReport | Exception]) -> list[list[str]]:
    rows = [["NAME", "HOST", "PYTHON", "VERSION", "TORCH", "CUDA", "GPUS", "DISK_GB", "RESULT"]]
    for name, r in results.items():
        if isinstance(r, Exception):
            rows.append([name, "-", "-", "-", "-", "-", "-", "-",
                         f"{type(r).__name__}: {r}"])
        else:
            rows.append([name, r.host, r.python, r.project_version or "-", r.torch or "-",
                         "yes" if r.cuda else "no", str(len(r.gpus)), f"{r.free_disk_gb:.1f}",
                         "ok" if r.ok else "; ".join(r.problems)])
    return rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python distributed/ssh_connector.py",
        description="Manage the SSH self-play workers listed in the config.")
    p.add_argument("--config", default=str(DEFAULT_CONFIG_PATH),
                   help="config file (default: configs/config.yaml)")
    p.add_argument("--accept-new-host-keys", action="store_true",
                   help="record keys of hosts not yet in known_hosts (a changed key is refused)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--restart", metavar="NAME",
                   help="restart a worker: through the running coach if there is one, "
                        "else directly over SSH")
    g.add_argument("--add-worker", nargs=2, metavar=("HOST", "USER"))
    g.add_argument("--remove-worker", metavar="NAME")
    g.add_argument("--check", nargs="?", const="", metavar="NAME",
                   help="preflight one worker, or all")
    g.add_argument("--status", action="store_true", help="print distributed/status.txt parsed")
    p.add_argument("--name")
    p.add_argument("--port", type=int, default=22)
    p.add_argument("--key-path")
    p.add_argument("--gpu-id", type=int, default=0)
    p.add_argument("--weight", type=float)
    p.add_argument("--direct", action="store_true",
                   help="with --restart: do it over SSH now, without asking the coach")
    p.add_argument("--wait", type=float, default=10.0,
                   help="with --restart: seconds to wait for the coach to take the request")
    p.add_argument("--requests-dir", default=str(restart_requests.DEFAULT_DIR))
    p.add_argument("--status-file", default=str(DEFAULT_STATUS_PATH))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.status:
            try:
                snap = read_status(args.status_file)
            except FileNotFoundError:
                print(f"error: no {args.status_file} yet; the coach writes it while it runs "
                      "(start_main.py --distributed)", file=sys.stderr)
                return 1
            print(f"Games/second: {snap.games_per_s:.1f}")
            print(f"Workers active: {snap.workers_active}/{snap.workers_total}")
            print("Model sync time: " + ("-" if snap.model_sync_s is None
                                         else f"{snap.model_sync_s:.1f}s"))
            print(f"Network usage: {snap.network_mb_per_min:.1f} MB/min")
            print(f"Generation: {'-' if snap.generation is None else snap.generation}")
            print(f"Run time: {run_time(snap)}")
            rows = [["NAME", "HOST", "STATE", "GEN", "GAMES", "PLAYED", "GAMES/S", "HEARTBEAT",
                     "LAST ERROR"]]
            for w in snap.workers:
                rows.append([w.name, w.host, w.state.value,
                             "-" if w.generation is None else str(w.generation),
                             str(w.games), "-" if w.played is None else str(w.played),
                             f"{w.games_per_s:.2f}",
                             "-" if w.heartbeat_age_s is None else f"{w.heartbeat_age_s:.1f}s",
                             w.last_error or "-"])
            _print_table(rows)
            return 0
        if args.add_worker:
            host, user = args.add_worker
            spec = config_edit.add_worker(Path(args.config), host, user, name=args.name,
                                          port=args.port, key_path=args.key_path,
                                          gpu_id=args.gpu_id, weight=args.weight)
            print(f"added {spec.name} ({spec.user}@{spec.host}:{spec.port}) to {args.config}")
            return 0
        if args.remove_worker:
            config_edit.remove_worker(Path(args.config), args.remove_worker)
            print(f"removed {args.remove_worker} from {args.config}")
            return 0
        connector = SSHConnector(config_path=args.config,
                                 accept_new_host_keys=args.accept_new_host_keys or None)
        with connector:
            if args.check is not None:
                names = [args.check] if args.check else None
                results = connector.preflight_all(names)
                _print_table(_check_rows(results))
                return 0 if all(isinstance(r, PreflightReport) and r.ok
                                for r in results.values()) else 1
            name = args.restart
            # Local-mode workers (worker1..N, processes of the coach) are not SSH workers: only
            # the running coach can restart them, so the request goes to it either way.
            is_ssh_worker = name in connector.workers
            if args.direct:
                connector.spec(name)  # UnknownWorkerError names the known workers
            if not args.direct:
                req = restart_requests.request_restart(name, Path(args.requests_dir))
                if restart_requests.wait_taken(req, args.wait):
                    print(f"restart of {name} handed to the running coach")
                    return 0
                if not restart_requests.withdraw(req):
                    print(f"restart of {name} handed to the running coach")
                    return 0
                if not is_ssh_worker:
                    print(f"error: no running coach took the restart of {name} within "
                          f"{args.wait:g}s, and {name} is not an SSH worker in {args.config}",
                          file=sys.stderr)
                    return 1
                print(f"no coach took the request within {args.wait:g}s; restarting directly")
            pid = connector.restart(name)
            print(f"restarted {name}: pid {pid}")
            return 0
    except (SSHError, TransferError, UnknownWorkerError, ConfigError, OSError,
            config_edit.ConfigEditError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
