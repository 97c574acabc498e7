"""One task's remembered entries with their unit vectors in one matrix, ranked by exact float64 cosine.

Rows are slots in insertion order. A replaced or forgotten entry leaves a dead slot behind (so appending stays
amortised O(dimensions)); dead slots are compacted away once they outnumber the live ones.

Exactness: vectors are kept as float32 (what the store holds) widened to float64. The cosine is
``a·b / sqrt(|a|² |b|²)``, every sum computed by ``np.einsum`` — one loop per row, the same for every row and for
a single vector, unlike BLAS ``gemv``, whose blocking gives identical rows results that differ in the last bit
and would break the tie rule. So identical vectors get bit-identical similarities, and a vector's similarity to
itself is exactly 1.0 (its dot product and its squared length are the same sum, and sqrt(x·x) = |x| in IEEE).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from gil_core.memory._rules import search_results
from gil_core.memory.ports import MemoryEntry

__all__ = ["TaskVectors"]

_FloatMatrix = NDArray[np.float64]


def widen(vectors: NDArray[np.floating]) -> _FloatMatrix:
    """``vectors`` (n × d) rounded to float32 as the store holds them, then widened to float64."""
    return np.ascontiguousarray(np.asarray(vectors, dtype=np.float32), dtype=np.float64)


def squared_lengths(rows: _FloatMatrix) -> NDArray[np.float64]:
    """Each row's squared length; the same loop for a bulk load and for one row (pass 1 × d)."""
    lengths: NDArray[np.float64] = np.einsum("ij,ij->i", rows, rows)
    return lengths


class TaskVectors:
    """The entries of one task and their unit vectors, searchable by exact cosine."""

    def __init__(self, dimensions: int) -> None:
        self.dimensions = dimensions
        self.last_created_us = 0
        self._rows: _FloatMatrix = np.zeros((8, dimensions))
        self._lengths: NDArray[np.float64] = np.zeros(8)  # squared lengths of the rows
        self._alive: NDArray[np.bool_] = np.zeros(8, dtype=bool)
        self._slots: list[MemoryEntry | None] = []
        self._slot_of: dict[str, int] = {}

    @classmethod
    def from_rows(
        cls, entries: Sequence[MemoryEntry], vectors: NDArray[np.floating], *, dimensions: int, last_created_us: int
    ) -> TaskVectors:
        """The state of ``entries`` (insertion order) with their raw vectors (len(entries) × dimensions)."""
        state = cls(dimensions)
        if entries:
            state._rows = widen(np.reshape(vectors, (len(entries), dimensions)))
            state._lengths = squared_lengths(state._rows)
            state._alive = np.ones(len(entries), dtype=bool)
        state._slots = list(entries)
        state._slot_of = {entry.key: slot for slot, entry in enumerate(entries)}
        state.last_created_us = last_created_us
        return state

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, key: str) -> bool:
        return key in self._slot_of

    def entries(self) -> list[MemoryEntry]:
        """The live entries in insertion order."""
        return [entry for entry in self._slots if entry is not None]

    def upsert(self, entry: MemoryEntry, vector: NDArray[np.floating], created_us: int) -> None:
        """Hold ``entry`` as the newest entry (an older entry with its key is dropped)."""
        self.remove(entry.key)
        slot = len(self._slots)
        if slot == len(self._rows):
            self._resize(max(8, 2 * slot))
        row = widen(np.reshape(vector, (1, -1)))
        self._rows[slot] = row[0]
        self._lengths[slot] = squared_lengths(row)[0]
        self._alive[slot] = True
        self._slots.append(entry)
        self._slot_of[entry.key] = slot
        self.last_created_us = max(self.last_created_us, created_us)

    def remove(self, key: str) -> bool:
        """Drop the entry ``key``; whether there was one."""
        slot = self._slot_of.pop(key, None)
        if slot is None:
            return False
        self._slots[slot] = None
        self._alive[slot] = False
        if 2 * len(self._slot_of) < len(self._slots):
            self._compact()
        return True

    def nearest(self, query: NDArray[np.floating], k: int) -> list[MemoryEntry]:
        """Up to ``k`` live entries by exact cosine to ``query`` (a raw vector), best first, ties earliest."""
        size = len(self._slots)
        row = widen(np.reshape(query, (1, -1)))
        products = np.einsum("ij,j->i", self._rows[:size], row[0])
        scale = np.sqrt(self._lengths[:size] * squared_lengths(row)[0])
        # A zero vector (an empty text, say) is similar to nothing: 0 rather than 0/0.
        similarities = np.divide(products, scale, out=np.zeros(size), where=scale > 0.0)
        similarities = np.clip(similarities, -1.0, 1.0)
        similarities[~self._alive[:size]] = -np.inf
        return search_results(self._slots, similarities, min(k, len(self)))

    def _resize(self, capacity: int) -> None:
        rows = np.zeros((capacity, self.dimensions))
        lengths = np.zeros(capacity)
        alive = np.zeros(capacity, dtype=bool)
        kept = min(capacity, len(self._rows))
        rows[:kept] = self._rows[:kept]
        lengths[:kept] = self._lengths[:kept]
        alive[:kept] = self._alive[:kept]
        self._rows, self._lengths, self._alive = rows, lengths, alive

    def _compact(self) -> None:
        live = np.flatnonzero(self._alive[: len(self._slots)])
        self._rows[: len(live)] = self._rows[live]  # copies the bits: similarities do not change
        self._lengths[: len(live)] = self._lengths[live]
        self._alive[:] = False
        self._alive[: len(live)] = True
        self._slots = [self._slots[slot] for slot in live]
        self._slot_of = {entry.key: slot for slot, entry in enumerate(self._slots) if entry is not None}
        if len(self._rows) > 4 * max(8, len(live)):
            self._resize(max(8, 2 * len(live)))
