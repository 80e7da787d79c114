"""The import arrows of docs/DESIGN.md, checked by parsing every module with ast.

- Every module of configs/, distributed/, training/ and the two start scripts has a layer
  (`_layers()`: training/'s rooms by folder, `BASE` by name; a module in a folder that is not
  a room fails here), and imports only from its own layer or from the lower layers it names,
  wherever the import statement stands (module level, inside a function, under
  `if TYPE_CHECKING:` or `if __name__ == "__main__":`).
- No import circle among the project's modules: none through module-level imports (Python's
  circular-import failures), and none through the imports made inside functions either.
  Imports under `if TYPE_CHECKING:` (never run) and under `if __name__ == "__main__":` (the
  file run as a script, not imported) are left out of the circle search.
- distributed/ never imports training/ (it knows hosts, files and states, not Go or torch),
  and never torch.
- The rules, features, search, records and replay window import no torch and no paramiko.
- Only distributed/ imports paramiko; configs/ imports only the standard library and yaml.
- Nothing edits sys.path.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

from tests.conftest import REPO

# Layers, lowest first: (name, the layers it may import from besides its own, what it holds,
# its modules). In training/ a layer is a folder (a room): every module under training/<room>/
# is in that room, so a new module is placed by where it is saved. `hosts` builds on `base`
# but, by the test below, on none of training/. docs/DESIGN.md describes the same order.
BASE = ("configs", "configs.schema", "configs.loading", "configs.flags", "distributed",
        "distributed.transfer")
ROOMS = [
    ("go", ("base",), "the game: rules, array boards, features, records, SGF"),
    ("run", ("base",), "a run's files and processes: run folder, models, metrics, logs"),
    ("search", ("base", "go"), "tree search and self-play"),
    ("learn", ("base", "go", "run"), "the net, the replay window, samples"),
    ("train", ("base", "go", "run", "learn"),
     "the trainer's process: a round, the long-lived trainer, their phases and files"),
    ("play", ("base", "go", "run", "search", "learn"),
     "GTP players, referee, GNU Go series, arena, ratings"),
    ("fleet", ("base", "hosts", "go", "run", "learn", "train"),
     "the workers: supervision, local and SSH backends, the collector, balancing"),
]
PURE_ROOMS = ("go", "search")  # no torch, no paramiko; and these modules of other rooms:
PURE = ["training.learn.replay_buffer", "training.learn.sidecars", "training.learn.window_shares",
        "training.fleet.placement"]

PROJECT = ("configs", "distributed", "training", "start_main", "start_worker")


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


# ----------------------------------------------------------------------------- the import graph


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


@lru_cache(maxsize=1)
def project_modules() -> dict[str, Path]:
    """Every module the layer table must place, by dotted name."""
    paths = [REPO / "start_main.py", REPO / "start_worker.py"]
    for folder in ("configs", "distributed", "training"):
        paths += _modules(folder)
    for room in sorted(p for p in (REPO / "training").iterdir() if (p / "__init__.py").exists()):
        paths += _modules(str(room.relative_to(REPO)))
    return {_module_name(p): p for p in paths}


def _room_modules(room: str) -> tuple[str, ...]:
    return tuple(_module_name(p) for p in _modules(f"training/{room}"))


def _layers() -> list[tuple[str, tuple[str, ...], str, tuple[str, ...]]]:
    names = list(project_modules())
    hosts = tuple(m for m in names if m.startswith("distributed.") and m not in BASE)
    rooms = [(room, below, what, _room_modules(room)) for room, below, what in ROOMS]
    placed = {m for *_, mods in rooms for m in mods} | set(BASE) | set(hosts)
    top = tuple(m for m in names if m not in placed and (
        m.count(".") <= 1 and m.split(".")[0] in ("training", "start_main", "start_worker")))
    return [("base", (), "the config, and file transfer", BASE),
            ("hosts", ("base",), "distributed/: SSH to the worker hosts, status.txt", hosts),
            *rooms,
            ("top", ("base", "hosts", *(r for r, _, _ in ROOMS)),
             "training/*.py: the coach and the commands", top)]


WHERE = {"module": "at module level", "function": "inside a function",
         "typing": "under TYPE_CHECKING", "script": "under __name__ == '__main__'"}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    kind: str  # a key of WHERE


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__" and len(test.comparators) == 1
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` refers to: itself, else its longest existing prefix."""
    if name.split(".")[0] not in PROJECT:
        return None
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def _targets(node: ast.Import | ast.ImportFrom, source: str,
             modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        found = (_resolve(alias.name, modules) for alias in node.names)
        return [t for t in found if t]
    base = node.module or ""
    if node.level:  # relative: from the importing module's package
        package = source.split(".")
        is_package = modules[source].name == "__init__.py"
        package = package if is_package else package[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    out = []
    for alias in node.names:  # `from training import records` imports training.go.records
        sub = _resolve(f"{base}.{alias.name}", modules)
        out.append(sub if sub == f"{base}.{alias.name}" else _resolve(base, modules))
    return [t for t in out if t]


@lru_cache(maxsize=1)
def import_edges() -> tuple[Edge, ...]:
    """Every import of one project module by another, with where it stands."""
    modules = project_modules()
    edges: list[Edge] = []

    def visit(node: ast.AST, source: str, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = kind
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = "function" if kind == "module" else kind
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(child, source, modules):
                    if target != source:
                        edges.append(Edge(source, target, child.lineno, kind))
                continue
            elif isinstance(child, ast.If) and kind == "module":
                special = ("typing" if _is_type_checking(child.test) else
                           "script" if _is_main_guard(child.test) else None)
                if special:
                    for stmt in child.body:
                        visit(ast.Module(body=[stmt], type_ignores=[]), source, special)
                    for stmt in child.orelse:
                        visit(ast.Module(body=[stmt], type_ignores=[]), source, kind)
                    continue
            visit(child, source, inner)

    for name, path in modules.items():
        visit(ast.parse(path.read_text(), filename=str(path)), name, "module")
    return tuple(edges)


def layer_of() -> dict[str, str]:
    return {m: layer for layer, _, _, mods in _layers() for m in mods}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` as a path [a, b, ..., a], or None (depth-first search)."""
    white, grey, black = 0, 1, 2
    color = {n: white for n in graph}
    stack: list[str] = []

    def dfs(n: str) -> list[str] | None:
        color[n] = grey
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if color.get(m, white) == grey:
                return stack[stack.index(m):] + [m]
            if color.get(m, white) == white:
                found = dfs(m)
                if found:
                    return found
        stack.pop()
        color[n] = black
        return None

    for n in sorted(graph):
        if color[n] == white:
            found = dfs(n)
            if found:
                return found
    return None


def _graph(kinds: set[str]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in project_modules()}
    for e in import_edges():
        if e.kind in kinds:
            graph[e.source].add(e.target)
    return graph


# ----------------------------------------------------------------------------- layers


def test_layer_table_is_well_formed():
    layers = _layers()
    names = [layer for layer, _, _, _ in layers]
    assert len(set(names)) == len(names), names
    for i, (layer, below, _, mods) in enumerate(layers):
        assert set(below) <= set(names[:i]), f"{layer} may only build on layers listed before it"
        assert mods, f"layer {layer} has no modules (a room folder gone?)"
    placed = [m for _, _, _, mods in layers for m in mods]
    twice = sorted({m for m in placed if placed.count(m) > 1})
    assert not twice, f"modules placed in two layers: {twice}"


def test_every_module_has_a_layer():
    unplaced = sorted(set(project_modules()) - set(layer_of()))
    assert not unplaced, (f"modules without a layer: {unplaced}; a new room folder goes into "
                          "ROOMS here and into docs/DESIGN.md")


def test_every_placed_module_exists():
    gone = sorted(set(layer_of()) - set(project_modules()))
    assert not gone, f"BASE names modules that do not exist (renamed or removed?): {gone}"


def test_imports_point_only_to_the_same_layer_or_below():
    layer = layer_of()
    allowed = {name: {name, *below} for name, below, _, _ in _layers()}
    wrong = [f"{e.source} ({layer[e.source]}) imports {e.target} ({layer[e.target]}), "
             f"line {e.line}, {WHERE[e.kind]}"
             for e in import_edges()
             if e.source in layer and e.target in layer
             and layer[e.target] not in allowed[layer[e.source]]]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_import_circle_through_module_level_imports():
    cycle = _find_cycle(_graph({"module"}))
    assert cycle is None, "import circle at module level: " + " -> ".join(cycle)


def test_no_import_circle_even_through_imports_inside_functions():
    cycle = _find_cycle(_graph({"module", "function"}))
    assert cycle is None, "import circle (with imports inside functions): " + " -> ".join(cycle)


def test_cycle_search_finds_a_circle():
    """The search itself: a circle of three, beside a module outside it."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    cycle = _find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    assert _find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


# ----------------------------------------------------------------------------- arrows by name


@pytest.mark.parametrize("path", _modules("distributed"), ids=lambda p: p.name)
def test_distributed_knows_no_go_and_no_torch(path):
    assert not _top(_imports(path)) & {"training", "torch", "numba"}, path


def _pure() -> list[str]:
    return [m for room in PURE_ROOMS for m in _room_modules(room)] + PURE


@pytest.mark.parametrize("name", _pure())
def test_core_imports_no_torch_and_no_paramiko(name):
    path = project_modules().get(name)
    assert path is not None, f"{name} is gone: update PURE"
    assert not _top(_imports(path)) & {"torch", "paramiko"}, path


def test_only_distributed_imports_paramiko():
    for name, path in project_modules().items():
        if not name.startswith("distributed"):
            assert "paramiko" not in _top(_imports(path)), path
    for path in _modules("benchmarks"):
        assert "paramiko" not in _top(_imports(path)), path


def test_configs_import_only_stdlib_and_yaml():
    for path in _modules("configs"):
        assert _top(_imports(path)) <= {
            "__future__", "dataclasses", "math", "os", "types", "typing", "pathlib", "yaml",
            "configs",
        }, path


def test_nothing_edits_sys_path():
    for folder in ("training", "distributed", "configs", "benchmarks", "tests", ".",
                   *(f"training/{room}" for room, _, _ in ROOMS)):
        for path in _modules(folder):
            if path.name == "test_layers.py":
                continue
            assert "sys.path.insert" not in path.read_text(), path
            assert "sys.path.append" not in path.read_text(), path
