"""Reading a config: YAML text or parsed data into the typed `Config` of `configs.schema`,
strictly (an unknown key lists the valid ones; a wrong type or value names the dotted key),
command-line overrides re-validated the same way, and a resolved config dumped back to YAML.

This module imports only the standard library, yaml and `configs.schema`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from configs.schema import DEFAULT_CONFIG_PATH, Config, ConfigError, DistributedConfig, Invalid


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is tuple:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Turn parsed YAML `value` into type `tp`, or raise Invalid naming `key`."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        others = [a for a in args if a is not type(None)]
        for option in others[:-1]:  # e.g. bool | str: true/false, or a word
            try:
                return _convert(value, option, key)
            except Invalid:
                pass
        return _convert(value, others[-1], key)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    if origin is tuple:
        if not isinstance(value, list):
            raise Invalid(key, f"must be a list, got {value!r}")
        (item_tp, _) = typing.get_args(tp)
        return tuple(_convert(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise Invalid(key, f"must be a mapping, got {value!r}")
        _, val_tp = typing.get_args(tp)
        return {str(k): _convert(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise Invalid(key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(key, f"must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Invalid(key, f"must be a number, got {value!r}")
        if not math.isfinite(value):
            raise Invalid(key, f"must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise Invalid(key, f"must be a string, got {value!r}")
        return value
    raise AssertionError(f"unsupported config type {tp!r} at {key}")


def _build(cls: type, data: Any, prefix: str) -> Any:
    """Build dataclass `cls` from a mapping, strictly."""
    where = prefix or "the top level"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise Invalid(prefix, f"must be a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            dotted = f"{prefix}.{key}" if prefix else str(key)
            raise Invalid(
                dotted, f"is not a known key in {where}; valid keys: {', '.join(fields)}"
            )
        dotted = f"{prefix}.{key}" if prefix else key
        kwargs[key] = _convert(value, hints[key], dotted)
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise Invalid(f"{prefix}.{missing[0]}" if prefix else missing[0], "is required")
    if cls is DistributedConfig:
        kwargs = _name_workers(kwargs)
    try:
        return cls(**kwargs)
    except Invalid as e:
        raise Invalid(f"{prefix}.{e.key}" if prefix else e.key, e.message) from None


def _name_workers(kwargs: dict) -> dict:
    """Give unnamed workers their default name worker<i+1> (node<i+1> for training nodes)."""
    for key, stem in (("workers", "worker"), ("training_nodes", "node")):
        specs = kwargs.get(key, ())
        kwargs[key] = tuple(
            dataclasses.replace(w, name=w.name or f"{stem}{i + 1}") for i, w in enumerate(specs)
        )
    return kwargs


def parse_config(data: Any, source: str = "<config>") -> Config:
    """Build a Config from already-parsed YAML data; errors name `source`."""
    try:
        return _build(Config, data, "")
    except Invalid as e:
        raise ConfigError(f"{source}: {e.key} {e.message}") from None


def load_config_text(text: str, source: str = "<config>") -> Config:
    """Parse YAML text into a Config (used to validate an edited config before writing it)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        # One line: PyYAML's own text spans several lines with a caret drawing.
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{source}: not valid YAML{where}: {problem}") from None
    return parse_config(data, source)


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Load and validate a config file (default configs/config.yaml)."""
    path = Path(path) if path is not None else DEFAULT_CONFIG_PATH
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file: {e.strerror}") from None
    return load_config_text(text, _display_path(path))


def _display_path(path: Path) -> str:
    """configs/config.yaml for a file under the current folder, else the absolute path."""
    absolute = path.resolve()
    try:
        return str(absolute.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(absolute)


def override(cfg: Config, overrides: dict[str, Any], source: str = "command line") -> Config:
    """Return cfg with dotted keys replaced (e.g. {"training.batch_size": 512}), re-validated."""
    data = to_dict(cfg)
    for dotted, value in overrides.items():
        node = data
        *parents, last = dotted.split(".")
        for p in parents:
            if p not in node or not isinstance(node[p], dict):
                raise ConfigError(f"{source}: {dotted} is not a config key")
            node = node[p]
        if last not in node:
            raise ConfigError(f"{source}: {dotted} is not a config key")
        node[last] = value
    return parse_config(data, source)


def to_dict(cfg: Any) -> Any:
    """A plain-data copy (dicts and lists) of a config, suitable for YAML or JSON."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def dump_config(cfg: Config) -> str:
    """YAML text of a resolved config (written into each run folder)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
