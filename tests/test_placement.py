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


def test_automatic_mode_counts_cores_without_gpus_and_at_least_two_per_gpu():
    devices, messages = plan_workers(0, 0, False, 0, n_cpus=2)  # this 2-core machine
    assert devices == ["cpu", "cpu"]
    assert any("automatic: 2 self-play workers on the CPU" in m for m in messages)
    devices, messages = plan_workers(0, 0, False, 8, n_cpus=16)  # was 2 workers, 6 GPUs idle
    assert Counter(devices) == {f"cuda:{k}": 2 for k in range(8)}
    assert "2 on each of the 8 GPUs" in messages[0]
    devices, _ = plan_workers(0, 0, False, 2, n_cpus=32)
    assert Counter(devices) == {"cuda:0": 4, "cuda:1": 4}  # at most 4 a GPU
    devices, _ = plan_workers(0, 3, False, 2, n_cpus=32)
    assert Counter(devices) == {"cuda:0": 3, "cuda:1": 3}  # an asked per-GPU count holds


def test_without_a_per_gpu_cap_nine_workers_on_two_gpus_run_as_eight():
    devices, messages = plan_workers(9, 0, False, 2)  # the guide's example, default cap
    assert Counter(devices) == {"cuda:0": 4, "cuda:1": 4}
    assert len(messages) == 1 and "running 8" in messages[0]


@pytest.mark.parametrize("args", [(-1, 1, False, 1), (2, -1, False, 1), (2, 1, False, -1)])
def test_nonsense_requests_are_refused(args):
    with pytest.raises(ValueError):
        plan_workers(*args)
