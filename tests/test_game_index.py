"""The collector's index of ingested games: exact against a dict, through growth, in little
memory."""

from __future__ import annotations

import hashlib

import numpy as np

from training.fleet.game_index import GameIndex, key_bits


def _key(i: int) -> str:
    return hashlib.blake2b(str(i).encode(), digest_size=10).hexdigest()


def test_the_index_answers_as_a_dict_does_through_growth_and_repeats():
    index, expected = GameIndex(capacity=16), {}
    rng = np.random.default_rng(0)
    for batch in range(400):
        keys = [_key(int(i)) for i in rng.integers(0, 30_000, size=rng.integers(1, 60))]
        index.add(f"b{batch}", keys)
        for k in keys:
            expected.setdefault(k, f"b{batch}")  # a key indexed before keeps its first batch
    index.add_batches([(f"c{i}", [_key(100_000 + i), _key(i)]) for i in range(3_000)])
    for i in range(3_000):
        expected.setdefault(_key(100_000 + i), f"c{i}")
        expected.setdefault(_key(i), f"c{i}")
    assert len(index) == len(expected)
    for k, batch in expected.items():
        assert index.get(k) == batch, k
    for i in range(200_000, 202_000):
        assert index.get(_key(i)) is None and _key(i) not in index


def test_colliding_slots_and_the_zero_key_are_kept_apart():
    index = GameIndex(capacity=16)
    same_slot = [format(j << 14, "016x") + "0000" for j in range(1, 6)]  # multiples of 2^14
    assert len({key_bits(k) % 16 for k in same_slot}) == 1  # all probe the same first slot
    zero = "0" * 20  # its bits would be the empty mark: kept as 1
    index.add("a", same_slot + [zero])
    assert [index.get(k) for k in same_slot + [zero]] == ["a"] * 6


def test_a_game_costs_the_index_at_most_48_bytes():
    index = GameIndex()
    index.add_batches((f"b{b}", [_key(b * 100 + g) for g in range(100)]) for b in range(2_000))
    assert len(index) == 200_000
    assert index.nbytes / len(index) <= 48, index.nbytes / len(index)
