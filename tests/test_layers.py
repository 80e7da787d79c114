"""The import arrows of docs/DESIGN.md, checked by parsing every module with ast.

- distributed/ never imports training/ (it knows hosts, files and states, not Go or torch),
  and never torch.
- The rules, features, search, records and replay window import no torch and no paramiko.
- Only distributed/ imports paramiko; configs/ imports only the standard library and yaml.
- Nothing edits sys.path.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

PURE = ["coords", "go", "fastgo", "features", "mcts", "records", "replay_buffer", "placement"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules(folder: str) -> list[Path]:
    return sorted((REPO / folder).glob("*.py"))


def _top(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("path", _modules("distributed"), ids=lambda p: p.name)
def test_distributed_knows_no_go_and_no_torch(path):
    assert not _top(_imports(path)) & {"training", "torch", "numba"}, path


@pytest.mark.parametrize("name", PURE)
def test_core_imports_no_torch_and_no_paramiko(name):
    path = REPO / "training" / f"{name}.py"
    if not path.exists():
        pytest.skip(f"{path.name} not written yet")
    assert not _top(_imports(path)) & {"torch", "paramiko"}, path


def test_only_distributed_imports_paramiko():
    for folder in ("training", "configs", "benchmarks"):
        for path in _modules(folder):
            assert "paramiko" not in _top(_imports(path)), path


def test_configs_import_only_stdlib_and_yaml():
    for path in _modules("configs"):
        assert _top(_imports(path)) <= {
            "__future__", "dataclasses", "math", "os", "types", "typing", "pathlib", "yaml",
            "configs",
        }, path


def test_nothing_edits_sys_path():
    for folder in ("training", "distributed", "configs", "benchmarks", "tests", "."):
        for path in _modules(folder):
            if path.name == "test_layers.py":
                continue
            assert "sys.path.insert" not in path.read_text(), path
            assert "sys.path.append" not in path.read_text(), path
