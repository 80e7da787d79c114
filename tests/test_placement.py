"""plan_workers: even spread over GPUs, caps, CPU-only, and a message for every adjustment."""

from __future__ import annotations

from collections import Counter

import pytest

from training.fleet.placement import plan_workers


def test_workers_spread_evenly_over_gpus():
    devices, messages = plan_workers(8, 4, False, 2)
    assert Counter(devices) == {"cuda:0": 4, "cuda:1": 4}
    assert messages == []


def test_a_count_that_does_not_divide_is_lowered_to_a_multiple_with_a_message():
    devices, messages = plan_workers(9, 8, False, 2)  # the user guide's example
    assert Counter(devices) == {"cuda:0": 4, "cuda:1": 4}
    assert len(messages) == 1
    assert "asked for 9" in messages[0] and "running 8" in messages[0]
    assert "4 per GPU" in messages[0]


def test_workers_per_gpu_caps_the_count_with_a_message():
    devices, messages = plan_workers(10, 2, False, 3)
    assert Counter(devices) == {"cuda:0": 2, "cuda:1": 2, "cuda:2": 2}
    assert len(messages) == 1 and "asked for 10" in messages[0] and "running 6" in messages[0]
    assert "--workers-per-gpu" in messages[0]


def test_fewer_workers_than_gpus_leaves_gpus_idle_and_says_so():
    devices, messages = plan_workers(1, 1, False, 4)
    assert devices == ["cuda:0"]
    assert len(messages) == 1 and "3 GPU(s) run no self-play" in messages[0]


def test_one_gpu_takes_every_worker_up_to_its_cap():
    assert plan_workers(3, 4, False, 1) == (["cuda:0"] * 3, [])


def test_cpu_only_ignores_gpus():
    devices, messages = plan_workers(3, 1, True, 8, n_cpus=16)
    assert devices == ["cpu"] * 3 and messages == []


def test_no_gpu_falls_back_to_cpu_with_a_message():
    devices, messages = plan_workers(2, 1, False, 0, n_cpus=4)
    assert devices == ["cpu", "cpu"]
    assert messages == ["no GPU found: self-play workers run on the CPU"]


def test_cpu_workers_are_capped_at_the_core_count():
    devices, messages = plan_workers(5, 1, True, 0, n_cpus=2)
    assert devices == ["cpu", "cpu"]
    assert len(messages) == 1 and "asked for 5" in messages[0] and "2 CPU cores" in messages[0]


def test_without_a_core_count_cpu_workers_are_not_capped():
    assert plan_workers(5, 1, True, 0) == (["cpu"] * 5, [])


@pytest.mark.parametrize("args", [(0, 1, False, 1), (2, 0, False, 1), (2, 1, False, -1)])
def test_nonsense_requests_are_refused(args):
    with pytest.raises(ValueError):
        plan_workers(*args)
