"""configs/schema.py: strict loading, with errors that name the file, the key and the fix."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from configs import Config, ConfigError, load_config, load_config_text, override, to_dict
from tests.conftest import REPO

GUIDE_WORKERS = """
distributed:
  enabled: true
  workers:
    - host: "worker1.example.com"
      user: "username"
      key_path: "~/.ssh/id_rsa"
      gpu_id: 0
    - host: "worker2.example.com"
      user: "username"
      key_path: "~/.ssh/id_rsa"
      gpu_id: 1
  compression: true
  batch_size: 100
  sync_interval: 50
  load_balancing: true
  worker_weights:
    worker1: 1.0
    worker2: 2.0
self_play:
  games_per_worker: 1000
  parallel_games: 4
  batch_size: 8
"""


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_config_text(text, "configs/config.yaml")
    return str(e.value)


def test_default_config_file_equals_schema_defaults():
    # config.yaml documents every key; it must stay in step with the dataclass defaults.
    assert load_config(REPO / "configs" / "config.yaml") == Config()


def test_every_schema_key_appears_in_default_config_file():
    data = yaml.safe_load((REPO / "configs" / "config.yaml").read_text())
    for section, values in to_dict(Config()).items():
        assert section in data, section
        assert set(values) == set(data[section]), section


def test_tiny_config_has_the_same_keys_as_the_default():
    default = yaml.safe_load((REPO / "configs" / "config.yaml").read_text())
    tiny = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    assert {s: set(v) for s, v in default.items()} == {s: set(v) for s, v in tiny.items()}
    assert load_config(REPO / "configs" / "tiny.yaml").go.board_size == 5


def test_gpu_config_has_the_same_keys_and_is_bigger_than_the_default():
    default = yaml.safe_load((REPO / "configs" / "config.yaml").read_text())
    gpu = yaml.safe_load((REPO / "configs" / "gpu.yaml").read_text())
    assert {s: set(v) for s, v in default.items()} == {s: set(v) for s, v in gpu.items()}
    cpu, big = load_config(REPO / "configs" / "config.yaml"), load_config(
        REPO / "configs" / "gpu.yaml")
    assert big.net.filters > cpu.net.filters and big.mcts.simulations > cpu.mcts.simulations
    assert big.go == cpu.go and big.distributed == cpu.distributed


def test_user_guide_example_loads_with_default_worker_names():
    cfg = load_config_text(GUIDE_WORKERS)
    workers = cfg.distributed.workers
    assert [w.name for w in workers] == ["worker1", "worker2"]
    assert workers[1].gpu_id == 1 and workers[1].port == 22
    assert cfg.distributed.worker_weights == {"worker1": 1.0, "worker2": 2.0}
    assert cfg.self_play.parallel_games == 4


def test_unknown_key_lists_valid_keys():
    msg = _error("go:\n  board_sise: 9\n")
    assert msg.startswith("configs/config.yaml: go.board_sise is not a known key")
    assert "board_size" in msg


def test_unknown_section_is_an_error():
    assert "selfplay is not a known key" in _error("selfplay:\n  workers: 2\n")


def test_wrong_type_names_dotted_key_and_expected_type():
    assert "go.board_size must be an integer, got '9'" in _error("go:\n  board_size: '9'\n")
    assert "distributed.compression must be true or false" in _error(
        "distributed:\n  compression: yes please\n"
    )
    assert "mcts.c_puct must be a number" in _error("mcts:\n  c_puct: [1]\n")


def test_bool_is_not_an_integer():
    assert "self_play.workers must be an integer, got True" in _error(
        "self_play:\n  workers: true\n"
    )


def test_out_of_range_names_worker_index():
    text = GUIDE_WORKERS.replace("gpu_id: 1", "gpu_id: -5")
    msg = _error(text)
    assert "distributed.workers[1].gpu_id must be between -1 and 1024, got -5" in msg


def test_board_size_range():
    assert "go.board_size must be between 5 and 19, got 21" in _error("go:\n  board_size: 21\n")


def test_choice_lists_options():
    msg = _error("training:\n  lr_scaling: cubic\n")
    assert "training.lr_scaling must be one of linear, sqrt, none, got 'cubic'" in msg


def test_lr_schedule_is_checked_entry_by_entry():
    ok = load_config_text("training:\n  lr_schedule: [[1000, 0.3], [2000, 0.1]]\n")
    assert ok.training.lr_schedule == ((1000.0, 0.3), (2000.0, 0.1))
    assert "training.lr_schedule[1] step must be a whole number above the entry before it" in (
        _error("training:\n  lr_schedule: [[1000, 0.3], [1000, 0.1]]\n"))
    assert "training.lr_schedule[0] must be [global_step, multiplier], got [1000.0]" in (
        _error("training:\n  lr_schedule: [[1000]]\n"))
    assert "training.lr_schedule[0] multiplier must be in (0, 100], got 0" in (
        _error("training:\n  lr_schedule: [[10, 0]]\n"))
    assert "training.lr_schedule[0][1] must be a number" in (
        _error("training:\n  lr_schedule: [[10, fast]]\n"))


def test_lr_schedule_by_time_takes_shares_of_the_hours():
    ok = load_config_text("run:\n  hours: 2\ntraining:\n  lr_schedule_by_time: [[0.5, 0.3], [0.8, 0.1]]\n")
    assert ok.run.hours == 2.0
    assert ok.training.lr_schedule_by_time == ((0.5, 0.3), (0.8, 0.1))
    assert Config().training.lr_schedule_by_time == ((0.8, 0.1),)  # a tenth for the last fifth
    assert "training.lr_schedule_by_time[1] share must be above the entry before it and below 1" \
        in _error("training:\n  lr_schedule_by_time: [[0.5, 0.3], [0.4, 0.1]]\n")
    assert "below 1 (0.8: from 80% of run.hours on), got 80" in (
        _error("training:\n  lr_schedule_by_time: [[80, 0.1]]\n"))
    assert "training.lr_schedule_by_time[0] multiplier must be in (0, 100], got 0" in (
        _error("training:\n  lr_schedule_by_time: [[0.8, 0]]\n"))
    assert "run.hours must be between" in _error("run:\n  hours: -1\n")


def test_missing_required_worker_field():
    msg = _error("distributed:\n  workers:\n    - host: a\n")
    assert "distributed.workers[0].user is required" in msg


def test_duplicate_worker_names_rejected():
    text = "distributed:\n  workers:\n    - {host: a, user: u, name: w}\n    - {host: b, user: u, name: w}\n"
    assert "worker names must be unique, 'w' appears twice" in _error(text)


def test_weight_for_unknown_worker_rejected():
    text = "distributed:\n  workers:\n    - {host: a, user: u}\n  worker_weights: {worker9: 2.0}\n"
    assert "distributed.worker_weights.worker9 names no worker" in _error(text)


def test_negative_weight_rejected():
    text = "distributed:\n  workers:\n    - {host: a, user: u}\n  worker_weights: {worker1: -1}\n"
    assert "distributed.worker_weights.worker1 must be a number > 0" in _error(text)


def test_shell_metacharacters_in_worker_name_rejected():
    text = "distributed:\n  workers:\n    - {host: a, user: u, name: 'w;rm -rf /'}\n"
    assert "distributed.workers[0].name may hold only letters" in _error(text)


def test_section_must_be_a_mapping():
    assert "go must be a mapping" in _error("go: 9\n")


def test_invalid_yaml_names_file():
    assert _error("go: [\n").startswith("configs/config.yaml: not valid YAML")


def test_missing_file_names_path(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "nope.yaml")


def test_cross_field_check():
    msg = _error("replay:\n  min_positions: 100\n  max_positions: 10\n")
    assert "replay.max_positions must be >= replay.min_positions (100), got 10" in msg


def test_override_revalidates():
    cfg = override(Config(), {"training.batch_size": 512, "distributed.enabled": True})
    assert cfg.training.batch_size == 512 and cfg.distributed.enabled
    with pytest.raises(ConfigError, match="command line: training.batch_size must be between"):
        override(cfg, {"training.batch_size": 0})
    with pytest.raises(ConfigError, match="is not a config key"):
        override(cfg, {"training.nope": 1})


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().go.board_size = 13  # type: ignore[misc]


def test_worker_class_must_be_module_colon_class():
    assert load_config_text("self_play:\n  worker_class: custom_worker:CustomWorker\n")
    msg = _error("self_play:\n  worker_class: 'custom_worker.CustomWorker'\n")
    assert "self_play.worker_class must be module:Class" in msg


def _keys_read_by(source: str, section_class: type) -> set[str]:
    """The keys of `section_class` that `source` reads: as `.key`, as its dotted name, or
    through a derived property of configs/schema.py (`wire_level` reads `compression_level`)
    that `source` reads."""
    import ast
    import dataclasses
    import re

    from tests.conftest import REPO

    through = set()
    tree = ast.parse((REPO / "configs" / "schema.py").read_text())
    for cls in ast.walk(tree):
        if not (isinstance(cls, ast.ClassDef) and cls.name == section_class.__name__):
            continue
        for fn in cls.body:
            if (isinstance(fn, ast.FunctionDef)
                    and any(getattr(d, "id", None) == "property" for d in fn.decorator_list)
                    and re.search(rf"\.{fn.name}\b", source)):
                through |= {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)
                            and getattr(n.value, "id", None) == "self"}
    return {key.name for key in dataclasses.fields(section_class)
            if re.search(rf"\.{key.name}\b", source) or key.name in through}


def _unread_keys(source: str) -> list[str]:
    import dataclasses

    from configs import Config

    unread = []
    for section in dataclasses.fields(Config):
        sub = getattr(Config(), section.name)
        if not dataclasses.is_dataclass(sub):
            continue
        read = _keys_read_by(source, type(sub))
        unread += [f"{section.name}.{key.name}" for key in dataclasses.fields(sub)
                   if key.name not in read and f"{section.name}.{key.name}" not in source]
    return unread


def _product_source() -> str:
    """The product's code, without configs/: the schema and the flag table name every key,
    so a key named only there is read by nothing."""
    from tests.conftest import REPO

    files = [p for folder in ("training", "distributed") for p in (REPO / folder).rglob("*.py")]
    files += [REPO / "start_main.py", REPO / "start_worker.py"]
    return "\n".join(p.read_text() for p in files)


def test_every_config_key_is_read_by_the_code():
    """Walk the schema: each key must be read somewhere in the product (as `.key`, as its
    dotted name, or through a derived property of the schema that the product reads), so no
    documented setting is accepted and ignored."""
    unread = _unread_keys(_product_source())
    assert unread == [], f"config keys nothing reads: {unread}"


def test_a_key_named_only_in_configs_is_unread():
    """The check above can fail: a key that only configs/ names (its schema, its flag table,
    its comments) counts as read by nothing, and so does one read only through a property
    nothing reads."""
    from tests.conftest import REPO

    source = _product_source()
    configs_source = "\n".join(p.read_text() for p in (REPO / "configs").glob("*.py"))
    without = source.replace(".compression_level", ".compression_levle").replace(
        "distributed.compression_level", "distributed.compression_levle")
    assert "compression_level" in configs_source  # named there ...
    assert ".wire_level" in source
    assert "distributed.compression_level" not in _unread_keys(source)
    # ... read only through wire_level: unread once nothing reads wire_level
    assert "distributed.compression_level" in _unread_keys(
        without.replace(".wire_level", ".wire_levle"))
    # a key of the flag table (configs/flags.py) that the product stopped reading
    assert "training.master_port" in _unread_keys(
        source.replace(".master_port", ".master_prot").replace(
            "training.master_port", "training.master_prot"))


def test_every_config_key_is_documented_in_config_yaml():
    """configs/config.yaml documents every key once, with a comment on its line; a worker
    entry's keys (WorkerSpec) in the commented example of distributed.workers."""
    import dataclasses
    import re

    from configs.schema import WorkerSpec

    text = (REPO / "configs" / "config.yaml").read_text()
    undocumented = []
    for section, values in to_dict(Config()).items():
        block = re.search(rf"^{section}:.*?(?=^\S|\Z)", text, re.S | re.M).group(0)
        for key in values:
            line = re.search(rf"^  {key}:.*$", block, re.M)
            if line is None or "#" not in line.group(0):
                undocumented.append(f"{section}.{key}")
    for key in dataclasses.fields(WorkerSpec):
        if not re.search(rf"^  #\s+(?:-\s+)?{key.name}:.*#", text, re.M):
            undocumented.append(f"distributed.workers[].{key.name}")
    assert undocumented == [], f"keys without a comment in configs/config.yaml: {undocumented}"



def test_the_schema_docstring_shows_the_error_the_code_prints():
    import configs.schema

    (example,) = [line.strip() for line in configs.schema.__doc__.splitlines()
                  if line.strip().startswith("configs/config.yaml: ")]
    assert _error(GUIDE_WORKERS.replace("gpu_id: 1", "gpu_id: -5")) == example
