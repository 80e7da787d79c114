"""Shared fixtures: a tiny config and a temporary run folder.

In CI (CI=true) the tools the tests check us against (sshd, GNU Go, OpenSpiel) must be present:
`require_tool` fails there instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable

import pytest

from configs import Config, load_config

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_tool(what: str, found: bool, hint: str) -> None:
    """Skip on a developer machine without `what`; fail in CI, where .ci/run installs it."""
    if found:
        return
    if IN_CI:
        pytest.fail(f"{what} is missing in CI: {hint}")
    pytest.skip(f"{what} not available here: {hint}")


def gnugo_path() -> str | None:
    return shutil.which("gnugo") or (
        "/usr/games/gnugo" if os.path.exists("/usr/games/gnugo") else None
    )


def pytest_collection_modifyitems(config, items) -> None:
    """Modules with a slow test first, each module's tests kept together and in order: with
    `-n 2` (the README's test command) each module runs whole on one process, and the long
    ones started last would leave the other process idle at the end."""
    slow_modules = {item.module.__name__ for item in items
                    if item.get_closest_marker("slow") is not None}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (item.module.__name__ not in slow_modules, order[id(item)]))


@pytest.fixture
def tiny_cfg() -> Config:
    """configs/tiny.yaml: 5x5 board, 2-block net, 8 simulations."""
    return load_config(REPO / "configs" / "tiny.yaml")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    return d


def wait_until(predicate: Callable[[], object], timeout_s: float = 60.0,
               what: str = "condition", interval_s: float = 0.1) -> float:
    """Seconds until `predicate()` is true; AssertionError naming `what` after `timeout_s`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A model file of configs/tiny.yaml's net (5x5, random weights), one per test module."""
    from training.learn.net import net_from_config, save_model

    cfg = load_config(REPO / "configs" / "tiny.yaml")
    path = tmp_path_factory.mktemp("model") / "model_000001.pt"
    save_model(path, net_from_config(cfg.net, cfg.go.board_size), generation=1)
    return str(path)
