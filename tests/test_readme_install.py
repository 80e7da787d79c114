"""The README's install works where the system's pip refuses system-wide installs (PEP 668).

The test makes a Python with an EXTERNALLY-MANAGED marker in its standard library, as Debian 12
and Ubuntu 24.04 ship theirs (a copy of this interpreter's base Python: its binary, its
standard library linked file by file, the marker, and pip), checks that a plain `pip install`
there is refused, then runs the README's install block itself, read from README.md, with that
Python first on PATH: the clone (of this repository), the venv, torch from the CPU index, the
project; then it starts the main job, waits for its first status.txt and stops it with Ctrl-C.
torch must come without CUDA.

Slow (minutes: torch alone is a large wheel), so it runs in CI (`CI=true`, where it never
skips) or with `AZGO_INSTALL_TEST=1`. `AZGO_TORCH_INDEX=URL` stands in for PyTorch's CPU index
on a machine without the internet; by default a `file://` index that pip is configured with
and that holds torch does (a machine that reaches packages through a local mirror).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.conftest import IN_CI, REPO

CPU_INDEX = "https://download.pytorch.org/whl/cpu"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not IN_CI and os.environ.get("AZGO_INSTALL_TEST") != "1",
                       reason="installs torch into a fresh venv (minutes): runs in CI, or here "
                       "with AZGO_INSTALL_TEST=1 (and AZGO_TORCH_INDEX=<local index> offline)"),
]


def readme_install_block() -> list[str]:
    """The README's install commands: the first bash block that makes a venv, one command a
    line, comments dropped."""
    text = (REPO / "README.md").read_text()
    for body in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        if "python3 -m venv" in body:
            lines = [line.split(" #")[0].strip() for line in body.splitlines()]
            return [line for line in lines if line]
    raise AssertionError("README.md has no bash block with `python3 -m venv`")


def local_torch_index() -> str:
    """A `file://` package index this machine's pip is configured with that holds torch (a
    machine whose only way to packages is a local mirror, as CI's), or ""."""
    shown = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                           text=True).stdout
    for url in re.findall(r"index-url='([^']*)'", shown):
        for one in url.split():
            if one.startswith("file://") and (Path(one[7:]) / "torch").is_dir():
                return one
    return ""


def marked_python(folder: Path) -> Path:
    """A Python whose standard library carries PEP 668's EXTERNALLY-MANAGED marker: this
    interpreter's base Python copied into `folder` (binary copied, standard library linked
    entry by entry, pip linked into its site-packages)."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    stdlib = Path(sysconfig.get_paths(vars={"base": sys.base_prefix,
                                            "installed_base": sys.base_prefix})["stdlib"])
    binary = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    lib = folder / "lib" / version
    (folder / "bin").mkdir(parents=True)
    (lib / "site-packages").mkdir(parents=True)
    shutil.copy2(binary, folder / "bin" / version)
    (folder / "bin" / "python3").symlink_to(version)
    for entry in stdlib.iterdir():
        if entry.name not in ("site-packages", "dist-packages", "EXTERNALLY-MANAGED"):
            (lib / entry.name).symlink_to(entry)
    import pip

    # pip where the copy looks for packages: lib/pythonX.Y/site-packages, or Debian's
    # lib/python3/dist-packages
    sites = subprocess.run([str(folder / "bin" / "python3"), "-I", "-c",
                            "import site; print('\\n'.join(site.getsitepackages()))"],
                           capture_output=True, text=True, check=True).stdout.split()
    site = next(Path(p) for p in sites if Path(p).is_relative_to(folder))
    site.mkdir(parents=True, exist_ok=True)
    (site / "pip").symlink_to(Path(pip.__file__).parent)
    (lib / "EXTERNALLY-MANAGED").write_text(
        "[externally-managed]\nError=This Python is managed by the system (test marker).\n")
    return folder / "bin" / "python3"


def _env(bin_dir: Path) -> dict[str, str]:
    """This environment with the marked Python first on PATH and no venv active."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CI")}
    venv = os.environ.get("VIRTUAL_ENV")
    path = [p for p in env.get("PATH", "").split(os.pathsep)
            if p and not (venv and p.startswith(venv))]
    env["PATH"] = os.pathsep.join([str(bin_dir), *path])
    return env


def test_the_readme_install_runs_where_pip_refuses_system_installs(tmp_path):
    t0 = time.monotonic()
    lines = readme_install_block()
    apt = [line for line in lines if "apt-get install" in line]
    assert apt and {"python3-venv", "git"} <= set(apt[0].split()), apt
    assert lines[-1] == "python3 start_main.py", lines
    assert any(CPU_INDEX in line and "torch==" in line for line in lines), lines

    python = marked_python(tmp_path / "system")
    env = _env(python.parent)
    refused = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "six"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "externally-managed-environment" in (
        refused.stdout + refused.stderr), refused
    assert subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], env=env,
                          capture_output=True, text=True).stdout.strip() == str(python)

    script = []
    for line in lines[:-1]:
        if "apt-get" in line:
            continue  # the packages it names are here already (python3-venv: the copied stdlib)
        line = line.replace("<repository URL>", str(REPO))
        index = os.environ.get("AZGO_TORCH_INDEX") or local_torch_index()
        if index:
            line = line.replace(CPU_INDEX, index)
        script.append(line)
    script.append('python3 -c "import torch, sys; print(torch.__version__, torch.version.cuda,'
                  ' sys.prefix)"')
    script.append("python3 -m pip list --format=freeze")
    work = tmp_path / "home"
    work.mkdir()
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(script)], cwd=work,
                         env=env, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, f"{script}\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    clone = work / "azgo"
    version, cuda, prefix = next(line for line in run.stdout.splitlines()
                                 if line.startswith("2.")).split()
    assert cuda == "None", f"torch {version} was built with CUDA {cuda}"
    assert prefix == str(clone / ".venv")
    assert not [p for p in run.stdout.splitlines() if p.lower().startswith("nvidia-")], run.stdout
    installed_s = time.monotonic() - t0

    # the README's last line: the main job starts (its first status.txt), Ctrl-C stops it
    coach = subprocess.Popen(["bash", "-c", ". .venv/bin/activate && exec python3 start_main.py"],
                             cwd=clone, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    status = clone / "distributed" / "status.txt"
    try:
        deadline = time.monotonic() + 300
        while not status.exists() and coach.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        assert status.exists(), f"no status.txt from the main job: {coach.poll()}"
        coach.send_signal(signal.SIGINT)
        out, _ = coach.communicate(timeout=120)
    finally:
        if coach.poll() is None:
            os.killpg(coach.pid, signal.SIGKILL)
            coach.wait()
    assert coach.returncode == 0, out[-4000:]
    print(f"README install in {installed_s:.0f} s (torch {version}), main job started and "
          f"stopped in {time.monotonic() - t0 - installed_s:.0f} s")
