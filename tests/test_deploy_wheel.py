"""The wheel the coach ships to worker hosts: what it holds, that its bytes name its code, and
that pip installs it where no build backend is (no setuptools, no `wheel`)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from distributed.remote import build_wheel, local_project

REPO = Path(__file__).resolve().parent.parent


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_our_wheel_holds_the_packages_and_nothing_beside_them(tmp_path):
    project = local_project(REPO)
    assert project.packages == ("training*", "distributed*", "configs*")
    assert any(r.startswith("torch") for r in project.requires)
    wheel = build_wheel(project, tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        record = zf.read("azgo-0.1.0.dist-info/RECORD").decode().splitlines()
        metadata = zf.read("azgo-0.1.0.dist-info/METADATA").decode()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"training", "distributed", "configs", "azgo-0.1.0.dist-info"}, tops
    assert "training/worker.py" in names and "configs/config.yaml" in names
    assert {line.split(",", 1)[0] for line in record} == set(names)
    assert [line[len("Requires-Dist: "):] for line in metadata.splitlines()
            if line.startswith("Requires-Dist: ")] == list(project.requires)


def test_the_wheel_bytes_change_with_the_code_and_only_with_it(tmp_path):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("X = 1\n")
    (root / "setup.cfg").write_text("[metadata]\nname = proj\nversion = 0.1\n\n"
                                    "[options]\npackages = pkg\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    first = _sha(build_wheel(local_project(root), tmp_path / "a"))
    (root / "untracked.txt").write_text("not shipped\n")
    assert _sha(build_wheel(local_project(root), tmp_path / "b")) == first
    (root / "pkg" / "__init__.py").write_text("X = 2\n")
    assert _sha(build_wheel(local_project(root), tmp_path / "c")) != first


def test_pip_installs_the_wheel_into_a_python_without_a_build_backend(tmp_path):
    """A worker host whose Python has no setuptools (or one too old to build a wheel without
    the `wheel` package) still installs the project: pip only unpacks a wheel."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    probe = "import importlib.util as u; print(u.find_spec('setuptools'), u.find_spec('wheel'))"
    assert subprocess.run([vpy, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.split() == ["None", "None"]
    wheel = build_wheel(local_project(REPO), tmp_path / "out")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "--quiet",
                    "--disable-pip-version-check", "--no-deps", "--no-index", str(wheel)],
                   check=True)
    check = ("from importlib.metadata import requires, version; import distributed.remote as r; "
             "print(version('azgo')); print(len(requires('azgo'))); print(r.__file__)")
    out = subprocess.run([vpy, "-c", check], capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout.split()
    assert out[:2] == ["0.1.0", str(len(local_project(REPO).requires))]
    assert out[2].startswith(str(venv)), out
