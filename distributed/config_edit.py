"""Add and remove workers in configs/config.yaml without losing the user's comments or layout.

Uses ruamel.yaml's round-trip mode (comments, quotes and key order survive), validates the
edited text with `configs.load_config_text` BEFORE writing, and writes atomically
(`transfer.write_atomic`). Worker names are written explicitly: a new worker gets the first
free `worker<i>`, and removing an unnamed entry first pins the default names of the entries
after it, so no running worker is silently renamed by a shift in position.

It must not: start or stop anything (a running coach watches config.yaml and reconciles).
"""

from __future__ import annotations

import io
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from configs import ConfigError, WorkerSpec, load_config_text
from distributed.transfer import write_atomic


class ConfigEditError(ValueError):
    """The requested edit is not possible (duplicate or unknown worker name, bad values)."""


def _yaml() -> YAML:
    y = YAML()
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap the user's long lines
    y.indent(mapping=2, sequence=4, offset=2)
    return y


def _load(path: Path):
    y = _yaml()
    text = path.read_text()
    data = y.load(text)
    if data is None:
        data = CommentedMap()
    return y, data


def _dist(data) -> CommentedMap:
    if data.get("distributed") is None:
        data["distributed"] = CommentedMap()
    return data["distributed"]


def _workers(dist: CommentedMap) -> CommentedSeq:
    workers = dist.get("workers")
    if workers is None:
        workers = dist["workers"] = CommentedSeq()
    if workers.fa.flow_style():
        workers.fa.set_block_style()
    return workers


def _effective_names(workers) -> list[str]:
    return [w.get("name") or f"worker{i + 1}" for i, w in enumerate(workers)]


def _validate_and_write(path: Path, y: YAML, data) -> list[WorkerSpec]:
    buf = io.StringIO()
    y.dump(data, buf)
    text = buf.getvalue()
    try:
        cfg = load_config_text(text, str(path))
    except ConfigError as e:
        raise ConfigEditError(f"the edited config would be invalid, nothing written: {e}") from e
    write_atomic(path, text)
    return list(cfg.distributed.workers)


def add_worker(path: Path, host: str, user: str, *, name: str | None = None, port: int = 22,
               key_path: str | None = None, gpu_id: int = 0,
               weight: float | None = None) -> WorkerSpec:
    """Append a worker to `distributed.workers` (and its weight to `worker_weights`)."""
    path = Path(path)
    y, data = _load(path)
    dist = _dist(data)
    workers = _workers(dist)
    names = _effective_names(workers)
    if name is None:
        i = len(workers) + 1
        while f"worker{i}" in names:
            i += 1
        name = f"worker{i}"
    if name in names:
        raise ConfigEditError(f"{path}: a worker named {name!r} already exists")
    entry = CommentedMap()
    entry["name"] = name
    entry["host"] = host
    entry["user"] = user
    if port != 22:
        entry["port"] = port
    if key_path is not None:
        entry["key_path"] = key_path
    entry["gpu_id"] = gpu_id
    workers.append(entry)
    if weight is not None:
        if dist.get("worker_weights") is None:
            dist["worker_weights"] = CommentedMap()
        dist["worker_weights"][name] = float(weight)
    specs = _validate_and_write(path, y, data)
    return next(s for s in specs if s.name == name)


def remove_worker(path: Path, name: str) -> None:
    """Remove the worker called `name` (and its weight)."""
    path = Path(path)
    y, data = _load(path)
    dist = _dist(data)
    workers = dist.get("workers") or []
    names = _effective_names(workers)
    if name not in names:
        raise ConfigEditError(f"{path}: no worker named {name!r}; known: {names}")
    idx = names.index(name)
    for j in range(idx + 1, len(workers)):  # pin positional default names that would shift
        if not workers[j].get("name"):
            workers[j]["name"] = names[j]
    del workers[idx]
    if not workers:
        workers.fa.set_flow_style()  # an empty block list would be dumped as invalid YAML
    weights = dist.get("worker_weights")
    if weights is not None and name in weights:
        del weights[name]
        if not weights:
            weights.fa.set_flow_style()
    _validate_and_write(path, y, data)
