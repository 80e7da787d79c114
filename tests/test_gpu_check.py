"""benchmarks/gpu.py, the GPU acceptance check: its visible skip line without CUDA, and on a
machine with CUDA the whole check (marker `gpu`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO


def _check(timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/gpu.py", "--steps", "10", "--seconds",
                           "10"], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_without_cuda_the_check_says_it_skipped():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: test_the_check_passes_on_a_gpu runs the check")
    out = _check(120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("SKIP: GPU acceptance check: no CUDA device")
    assert json.loads(out.stdout.splitlines()[-1]) == {"skipped": "no CUDA device"}


@pytest.mark.gpu
def test_the_check_passes_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the GPU acceptance check needs one")
    out = _check(900)
    report = json.loads(out.stdout.splitlines()[-1])
    failed = [r for r in report["rows"] if not r["ok"]]
    assert out.returncode == 0 and not failed, (failed, out.stderr[-3000:])
