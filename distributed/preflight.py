"""What a worker host offers, read from the preflight snippet's report (one line of JSON the
host prints), and what is wrong with it for us.

`preflight_info` checks every key the coach reads for its type (the output comes from the
worker host: a missing key, a 400-digit number or brackets nested 2,000 deep are a clear
ValueError naming the key); `preflight_problems` says what would stop a worker there (an old
Python, another project version, no torch, a GPU the host lacks, a full disk);
`PreflightReport` is the answer `SSHConnector.preflight` returns. The snippet itself is
`distributed.remote.preflight_command`.

It must not: import `training` or torch, or speak SSH (`SSHConnector` runs the snippet).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from configs import WorkerSpec
from distributed.remote import ProjectInfo


def gpu_problem(key: str, gpu_id: int, gpus: int) -> str | None:
    """What is wrong with `gpu_id` on a host with `gpus` CUDA GPUs (None: nothing). -1 is the
    CPU; 0, the default, is the first GPU, or the CPU on a host without one (the daemon
    falls back, and a config written for GPU hosts also runs on CPU-only ones); a higher
    number must name a GPU the host has."""
    if gpu_id <= 0 or gpu_id < gpus:
        return None
    if gpus == 0:
        return (f"{key} is {gpu_id} but the host has no CUDA GPU: set {key.rsplit('.', 1)[-1]}"
                ": -1 to play on its CPU (0 also runs on the CPU where there is no GPU)")
    return (f"{key} is {gpu_id} but the host has {gpus} CUDA GPU(s): set it to one of "
            f"0..{gpus - 1}, or -1 for the CPU")


@dataclass(frozen=True)
class PreflightReport:
    """What a worker host offers, and what is wrong with it for us (`problems`)."""

    name: str
    host: str
    python: str
    project_version: str | None
    torch: str | None
    cuda: bool
    gpus: tuple[str, ...]
    free_disk_gb: float
    hostname: str = ""
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems



_PREFLIGHT_KEYS = {"python": (str,), "project_version": (str, type(None)),
                   "torch": (str, type(None)), "cuda": (bool,), "gpus": (list,),
                   "free_disk_gb": (int, float)}


def preflight_info(stdout: str) -> dict:
    """The preflight snippet's report (its output's last line), every key the coach reads
    checked for its type; ValueError naming the key otherwise (the output comes from the
    worker host: a missing key, a 400-digit number or brackets nested 2,000 deep are a
    clear error, never a bare KeyError, OverflowError or RecursionError)."""
    lines = stdout.strip().splitlines()
    try:
        info = json.loads(lines[-1]) if lines else None
    except (ValueError, RecursionError) as e:
        raise ValueError(f"unreadable output {stdout[-200:]!r}: {type(e).__name__}") from None
    if not isinstance(info, dict):
        raise ValueError(f"unreadable output {stdout[-200:]!r}: not a JSON object")
    for key, types in _PREFLIGHT_KEYS.items():
        if key not in info:
            raise ValueError(f"output lacks {key!r} (is the remote `python` a Python?): "
                             f"{stdout[-200:]!r}")
        v = info[key]
        if not isinstance(v, types) or (bool not in types and isinstance(v, bool)):
            raise ValueError(f"output key {key!r} is {type(v).__name__} {str(v)[:60]!r}, "
                             f"expected {' or '.join(t.__name__ for t in types)}")
    try:
        info["free_disk_gb"] = float(info["free_disk_gb"])
    except OverflowError:
        info["free_disk_gb"] = math.inf
    if not math.isfinite(info["free_disk_gb"]):
        raise ValueError("output key 'free_disk_gb' is not a finite number")
    if not re.fullmatch(r"\d{1,4}\.\d{1,4}(\.\w{1,20})?", info["python"]):
        raise ValueError(f"output key 'python' is {info['python'][:60]!r}, not a version")
    if not all(isinstance(g, str) for g in info["gpus"]):
        raise ValueError("output key 'gpus' is not a list of names")
    for key in ("hostname", "torch_error"):
        if not isinstance(info.get(key, ""), str):
            info[key] = str(info[key])[:200]
    return info



def preflight_problems(info: dict, *, spec: WorkerSpec, gpu_key: str, python: str,
                       project: ProjectInfo, deploy: bool, with_torch: bool) -> list[str]:
    """What is wrong for us with the host of worker `spec` that sent `info` (checked by
    `preflight_info`): its `python` (the worker's interpreter) is run from `python`, the
    coach's project is `project`, `deploy` is distributed.deploy, `gpu_key` names the
    worker's gpu_id key in messages."""
    problems = []
    major_minor = tuple(int(x) for x in info["python"].split(".")[:2])
    if major_minor < (3, 10):
        problems.append(f"python {info['python']} < 3.10")
    if deploy:
        pass  # deploy installs the right version; a mismatch now is expected
    elif info["project_version"] != project.version:
        problems.append(f"{project.dist} {info['project_version']} installed, coach has "
                        f"{project.version} (deploy is off: install it by hand)")
    if with_torch and info["torch"] is None:
        problems.append("torch not importable" + (f": {info.get('torch_error')}"
                                                  if info.get("torch_error") else "")
                        + f"; install torch for {python} on {spec.host} (the "
                        "worker's venv is made from that Python and sees its packages, "
                        f"not a venv's): `{python} -m pip install "
                        "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu` "
                        "(a GPU host: without --index-url); where that pip refuses "
                        "(externally-managed-environment), give the host a Python of its "
                        "own with torch and name it in distributed.python")
    if with_torch and info["torch"] is not None:
        problem = gpu_problem(gpu_key, spec.gpu_id, len(info["gpus"]))
        if problem:
            problems.append(problem)
    if info["free_disk_gb"] < 1.0:
        problems.append(f"only {info['free_disk_gb']:.2f} GB free")
    return problems
