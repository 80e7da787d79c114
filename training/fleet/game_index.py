"""The run's index of ingested games, for refusing a repeated game: game key -> its batch.

A game key (`validation.game_key`) is a hash of a game's moves, 20 hex digits. The index keeps
the first 64 bits of each key and the number of its batch in two open-addressing numpy tables
(linear probing, at most half full): 24 bytes a game when the tables are at their fullest and
48 right after they double, where a dict of the hex strings took about 110 (plus the batch
names, which the ledger's entries hold anyway). Keys are inserted a batch at a time with
numpy, so doubling the tables of a hundred million games takes seconds, not minutes.

Two games whose keys share their first 64 bits count as one (the second is dropped as a
repeat): about one pair in a run of 6 billion games.

It must not: read or write files (the collector rebuilds it from the ledger at start).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

_EMPTY = np.uint64(0)
_MASK = (1 << 64) - 1


def key_bits(key: str) -> int:
    """The 64 bits of a game key the index keeps (never 0, the empty slot's mark)."""
    return (int(key[:16], 16) & _MASK) or 1


class GameIndex:
    """Game key -> the name of the batch it was ingested in (see the module docstring)."""

    def __init__(self, capacity: int = 1 << 12):
        size = 1 << max(4, (int(capacity) - 1).bit_length())
        self._keys = np.zeros(size, np.uint64)
        self._batches = np.zeros(size, np.int32)
        self._names: list[str] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        """Bytes of the two tables (the batch names are the ledger's strings)."""
        return self._keys.nbytes + self._batches.nbytes

    def add(self, batch: str, keys: Iterable[str]) -> None:
        """Index the games `keys` of `batch` (a key indexed before keeps its first batch)."""
        bits = np.array([key_bits(k) for k in keys], np.uint64)
        if not len(bits):
            return
        number = len(self._names)
        self._names.append(batch)
        if 2 * (self._count + len(bits)) > len(self._keys):
            self._grow(self._count + len(bits))
        self._put(bits, np.full(len(bits), number, np.int32))

    def add_batches(self, batches: Iterable[tuple[str, Iterable[str]]]) -> None:
        """`add` for many (batch, keys) at once (a ledger read at start): one insertion."""
        bits: list[int] = []
        numbers: list[int] = []
        for batch, keys in batches:
            before = len(bits)
            bits.extend(key_bits(k) for k in keys)
            if len(bits) > before:
                numbers.extend([len(self._names)] * (len(bits) - before))
                self._names.append(batch)
        if not bits:
            return
        if 2 * (self._count + len(bits)) > len(self._keys):
            self._grow(self._count + len(bits))
        self._put(np.array(bits, np.uint64), np.array(numbers, np.int32))

    def get(self, key: str) -> str | None:
        """The batch that holds the game `key`, or None."""
        keys, mask = self._keys, len(self._keys) - 1
        bits = np.uint64(key_bits(key))
        i = int(bits) & mask
        while True:
            k = keys[i]
            if k == _EMPTY:
                return None
            if k == bits:
                return self._names[int(self._batches[i])]
            i = (i + 1) & mask

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def _put(self, bits: np.ndarray, numbers: np.ndarray) -> None:
        """Insert keys `bits` with their batch numbers, all at once: each round places, of
        the keys that probe the same slot, the first, if the slot is empty; a key found there
        is done; the others probe the next slot."""
        mask = np.uint64(len(self._keys) - 1)
        slots = (bits & mask).astype(np.int64)
        while len(bits):
            _, first = np.unique(slots, return_index=True)
            there = self._keys[slots[first]]
            empty = first[there == _EMPTY]
            self._keys[slots[empty]] = bits[empty]
            self._batches[slots[empty]] = numbers[empty]
            self._count += len(empty)
            done = np.zeros(len(bits), bool)
            done[empty] = True
            done |= self._keys[slots] == bits  # placed now, or indexed before
            bits, numbers, slots = bits[~done], numbers[~done], slots[~done]
            moved = self._keys[slots] != _EMPTY  # taken: probe on (a tie retries its slot)
            slots[moved] = (slots[moved] + 1) & int(mask)

    def _grow(self, need: int) -> None:
        size = len(self._keys)
        while 2 * need > size:
            size *= 2
        full = self._keys != _EMPTY
        bits, numbers = self._keys[full], self._batches[full]
        self._keys = np.zeros(size, np.uint64)
        self._batches = np.zeros(size, np.int32)
        self._count = 0
        self._put(bits, numbers)
