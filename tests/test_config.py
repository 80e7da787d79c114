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


def test_every_config_key_is_read_by_the_code():
    """Walk the schema: each key must be read somewhere in the product (as `.key` or as its
    dotted name), so no documented setting is accepted and ignored."""
    import dataclasses
    import re

    from configs import Config
    from tests.conftest import REPO

    files = [p for folder in ("training", "distributed", "configs")
             for p in (REPO / folder).rglob("*.py")]  # schema.py: derived values read keys
    files += [REPO / "start_main.py", REPO / "start_worker.py"]
    source = "\n".join(p.read_text() for p in files)
    unread = []
    for section in dataclasses.fields(Config):
        sub = getattr(Config(), section.name)
        if not dataclasses.is_dataclass(sub):
            continue
        for key in dataclasses.fields(sub):
            if not (re.search(rf"\.{key.name}\b", source)
                    or f"{section.name}.{key.name}" in source):
                unread.append(f"{section.name}.{key.name}")
    assert unread == [], f"config keys nothing reads: {unread}"

