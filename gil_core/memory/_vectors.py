"""One task's remembered entries with their vectors in one float32 matrix, ranked by exact float64 cosine.

Rows are slots in arrival order. A replaced or forgotten entry leaves a dead slot behind (so appending stays
amortised O(dimensions)); dead slots are compacted away once they outnumber the live ones.

Exactness. The similarity is the exact cosine of the vectors as the store holds them (float32) widened to float64:
``a·b / sqrt(|a|² |b|²)``, every sum computed by ``np.einsum``, whose loop over a row is the same whichever rows it
is given (BLAS ``gemv`` blocks rows, so identical rows could differ in the last bit). So identical vectors get
bit-identical similarities, and a vector's similarity to itself is exactly 1.0 (its dot product and its squared
length are the same sum, and sqrt(x·x) = |x| in IEEE).

Speed. That exact cosine is computed only for a shortlist. One float32 matrix-vector product (BLAS) over the raw
rows, scaled by each row's inverse norm (kept beside the rows), ranks every row by an approximate cosine whose
error is at most ``ε = γ_d + 8u`` (``u = 2⁻²⁴``, ``γ_d = d·u / (1 − d·u)``: any summation order of d float32
products is within ``γ_d Σ|aᵢbᵢ| ≤ γ_d |a||b|`` of the real dot product; the scalings add a few ``u``). The exact
top k — and every row tying with its last — lie within ``2ε`` of the k-th best approximate score, so the shortlist
is every row there; rows whose norm is outside ``[1e-15, 1e15]`` (where float32 could underflow or overflow) are
always shortlisted, and a query outside that range is scored exactly against every row.

Order. Equal similarities go to the entry remembered earliest: the smaller ``created_at`` (microseconds), then the
smaller key — the order a fresh load of the table gives. Rows learned from another process may arrive out of that
order; the rule does not depend on slot order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from gil_core.memory.ports import MemoryEntry

__all__ = ["TaskVectors", "approximation_margin", "exact_cosines", "squared_lengths", "widen"]

_T = TypeVar("_T", bound=np.generic)
_FloatMatrix = NDArray[np.float64]
_Matrix32 = NDArray[np.float32]
_UNIT_ROUNDOFF = 2.0**-24  # float32
_SAFE_SQUARED = (1e-30, 1e30)  # squared norms for which the float32 product neither underflows nor overflows
_BLOCK = 65_536  # rows widened to float64 at a time when computing squared lengths in bulk


def widen(vectors: NDArray[np.floating]) -> _FloatMatrix:
    """``vectors`` (n × d) rounded to float32 as the store holds them, then widened to float64."""
    return np.ascontiguousarray(np.asarray(vectors, dtype=np.float32), dtype=np.float64)


def squared_lengths(rows: _FloatMatrix) -> NDArray[np.float64]:
    """Each row's squared length; the same loop for a bulk load and for one row (pass 1 × d)."""
    lengths: NDArray[np.float64] = np.einsum("ij,ij->i", rows, rows)
    return lengths


def _bulk_squared_lengths(rows: _Matrix32) -> NDArray[np.float64]:
    """``squared_lengths(widen(rows))`` a block at a time (the float64 copy of a large task would not fit)."""
    lengths = np.empty(len(rows))
    for start in range(0, len(rows), _BLOCK):
        lengths[start : start + _BLOCK] = squared_lengths(widen(rows[start : start + _BLOCK]))
    return lengths


def exact_cosines(
    rows: _Matrix32, lengths: NDArray[np.float64], query: _FloatMatrix, query_length: float
) -> NDArray[np.float64]:
    """The exact cosine of each of ``rows`` (float32, their squared lengths beside) to ``query`` (float64, 1 × d)."""
    products = np.einsum("ij,j->i", widen(rows), query[0])
    scale = np.sqrt(lengths * query_length)
    # A zero vector (an empty text, say) is similar to nothing: 0 rather than 0/0.
    similarities = np.divide(products, scale, out=np.zeros(len(rows)), where=scale > 0.0)
    clipped: NDArray[np.float64] = np.clip(similarities, -1.0, 1.0)
    return clipped


def approximation_margin(dimensions: int) -> float:
    """How far below the k-th best approximate cosine a row of the exact top k can score (2ε, with slack for the
    float32 comparison itself)."""
    products = dimensions * _UNIT_ROUNDOFF
    if products >= 0.5:
        return math.inf  # no useful bound: score every row exactly
    error = products / (1.0 - products) + 8 * _UNIT_ROUNDOFF
    return 2 * error + 4 * _UNIT_ROUNDOFF


def _safe(squared: NDArray[np.float64] | float) -> NDArray[np.bool_]:
    low, high = _SAFE_SQUARED
    return np.asarray((squared == 0.0) | ((squared >= low) & (squared <= high)))


class TaskVectors:
    """The entries of one task and their vectors, searchable by exact cosine.

    Each slot also carries its ``created_at`` (microseconds: the tie order) and an opaque ``address`` the store
    gives the row (LanceDB's row address), so that a store can tell which rows another process has deleted.
    """

    def __init__(self, dimensions: int) -> None:
        self.dimensions = dimensions
        self.last_created_us = 0
        self.watermark = -1  # the highest store address among the rows ever held (rows above it are new)
        self.index_requested = False  # whether a vector index was asked for on behalf of this task
        self._margin = approximation_margin(dimensions)
        self._rows: _Matrix32 = np.zeros((8, dimensions), dtype=np.float32)
        self._lengths: NDArray[np.float64] = np.zeros(8)  # exact squared lengths (float64) of the rows
        self._scales: NDArray[np.float32] = np.zeros(8, dtype=np.float32)  # 1 / norm, for the float32 ranking
        self._created: NDArray[np.int64] = np.zeros(8, dtype=np.int64)
        self._addresses: NDArray[np.int64] = np.full(8, -1, dtype=np.int64)
        self._alive: NDArray[np.bool_] = np.zeros(8, dtype=bool)
        self._unsafe: set[int] = set()  # live slots always shortlisted (norm out of the float32-safe range)
        self._slots: list[MemoryEntry | None] = []
        self._slot_of: dict[str, int] = {}

    @classmethod
    def from_rows(
        cls,
        entries: Sequence[MemoryEntry],
        vectors: NDArray[np.floating],
        *,
        dimensions: int,
        created: Sequence[int] | NDArray[np.int64],
        addresses: Sequence[int] | NDArray[np.int64] | None = None,
    ) -> TaskVectors:
        """The state of ``entries`` (a key at most once) with their raw vectors (len(entries) × dimensions), their
        ``created_at`` microseconds and store addresses."""
        state = cls(dimensions)
        count = len(entries)
        if count:
            rows = np.asarray(np.reshape(vectors, (count, dimensions)), dtype=np.float32)
            state._allocate(count + max(8, count // 8))
            state._rows[:count] = rows
            state._lengths[:count] = _bulk_squared_lengths(rows)
            state._scales[:count] = _inverse_norms(state._lengths[:count])
            state._created[:count] = np.asarray(created, dtype=np.int64)
            if addresses is not None:
                state._addresses[:count] = np.asarray(addresses, dtype=np.int64)
                state.watermark = int(state._addresses[:count].max())
            state._alive[:count] = True
            state._unsafe = {int(slot) for slot in np.flatnonzero(~_safe(state._lengths[:count]))}
            state.last_created_us = int(state._created[:count].max())
        state._slots = list(entries)
        state._slot_of = {entry.key: slot for slot, entry in enumerate(entries)}
        return state

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, key: str) -> bool:
        return key in self._slot_of

    def created_of(self, key: str) -> int | None:
        slot = self._slot_of.get(key)
        return None if slot is None else int(self._created[slot])

    def entries(self) -> list[MemoryEntry]:
        """The live entries, earliest remembered first."""
        live = self._live()
        order = self._tie_order(live)
        return [self._entry(int(live[position])) for position in order]

    def addresses(self) -> dict[int, str]:
        """The store address of each live entry (rows held without one are left out)."""
        live = self._live()
        return {int(self._addresses[slot]): self._entry(int(slot)).key for slot in live if self._addresses[slot] >= 0}

    def upsert(self, entry: MemoryEntry, vector: NDArray[np.floating], created_us: int, address: int = -1) -> None:
        """Hold ``entry`` with its ``created_at``; an older entry with its key is dropped."""
        self.remove(entry.key)
        slot = len(self._slots)
        if slot == len(self._rows):
            self._allocate(max(8, 2 * slot))
        row = np.asarray(np.reshape(vector, (1, -1)), dtype=np.float32)
        self._rows[slot] = row[0]
        self._lengths[slot] = squared_lengths(widen(row))[0]
        self._scales[slot] = _inverse_norms(self._lengths[slot : slot + 1])[0]
        self._created[slot] = created_us
        self._addresses[slot] = address
        self._alive[slot] = True
        if not _safe(self._lengths[slot]):
            self._unsafe.add(slot)
        self._slots.append(entry)
        self._slot_of[entry.key] = slot
        self.last_created_us = max(self.last_created_us, created_us)
        self.watermark = max(self.watermark, address)

    def learn(self, entry: MemoryEntry, vector: NDArray[np.floating], created_us: int, address: int) -> None:
        """A row another process wrote (or this one, seen again): held unless the same row is held already."""
        slot = self._slot_of.get(entry.key)
        if slot is not None and int(self._created[slot]) >= created_us:
            if int(self._created[slot]) == created_us:
                self._addresses[slot] = address  # the same row, moved (compaction rewrites addresses)
            self.watermark = max(self.watermark, address)  # (an older row of the key is never served)
            return
        self.upsert(entry, vector, created_us, address)

    def remove(self, key: str) -> bool:
        """Drop the entry ``key``; whether there was one."""
        slot = self._slot_of.pop(key, None)
        if slot is None:
            return False
        self._slots[slot] = None
        self._alive[slot] = False
        self._unsafe.discard(slot)
        if 2 * len(self._slot_of) < len(self._slots):
            self._compact()
        return True

    def nearest(self, query: NDArray[np.floating], k: int) -> list[MemoryEntry]:
        """Up to ``k`` live entries by exact cosine to ``query`` (a raw vector), best first, ties earliest."""
        k = min(k, len(self))
        if k <= 0:
            return []
        target = widen(np.reshape(query, (1, -1)))
        target_length = float(squared_lengths(target)[0])
        candidates = self._shortlist(target, target_length, k)
        similarities = exact_cosines(self._rows[candidates], self._lengths[candidates], target, target_length)
        order = self._tie_order(candidates, similarities)[:k]
        return [
            replace(self._entry(int(candidates[position])), similarity=float(similarities[position]))
            for position in order
        ]

    # -- internals -----------------------------------------------------------------------------------------

    def _shortlist(self, target: _FloatMatrix, target_length: float, k: int) -> NDArray[np.intp]:
        """Slots that surely hold the exact top ``k`` (and whatever ties with its last), in slot order."""
        size = len(self._slots)
        if k >= len(self) or not bool(_safe(target_length)) or target_length == 0.0 or math.isinf(self._margin):
            return self._live()
        query32 = target[0].astype(np.float32)
        scores = self._rows[:size] @ query32  # one float32 matrix-vector product (BLAS)
        scores *= self._scales[:size]
        scores *= np.float32(1.0 / math.sqrt(target_length))
        if len(self) < size:
            scores[~self._alive[:size]] = -np.inf
        unsafe = np.fromiter(self._unsafe, dtype=np.intp, count=len(self._unsafe))
        scores[unsafe] = -np.inf  # scored exactly whatever their approximate score
        kth = scores.max() if k == 1 else np.partition(scores, size - k)[size - k]
        shortlist = np.flatnonzero(scores >= np.float32(float(kth) - self._margin))
        shortlist = shortlist[self._alive[shortlist]]  # −∞ ≥ −∞ when every live row is out of range
        if len(unsafe):
            shortlist = np.union1d(shortlist, unsafe)
        return shortlist

    def _tie_order(self, slots: NDArray[np.intp], similarities: NDArray[np.float64] | None = None) -> list[int]:
        """Positions into ``slots`` by similarity (best first, if given), then earliest ``created_at``, then key."""
        created = self._created[slots]
        keys = [self._entry(int(slot)).key for slot in slots]
        if similarities is None:
            return sorted(range(len(slots)), key=lambda i: (int(created[i]), keys[i]))
        return sorted(range(len(slots)), key=lambda i: (-float(similarities[i]), int(created[i]), keys[i]))

    def _entry(self, slot: int) -> MemoryEntry:
        entry = self._slots[slot]
        assert entry is not None, "a live slot holds an entry"
        return entry

    def _live(self) -> NDArray[np.intp]:
        return np.flatnonzero(self._alive[: len(self._slots)])

    def _allocate(self, capacity: int) -> None:
        kept = min(capacity, len(self._rows))
        rows = np.zeros((capacity, self.dimensions), dtype=np.float32)
        rows[:kept] = self._rows[:kept]
        self._rows = rows
        self._lengths = _grown(self._lengths, capacity, 0.0)
        self._scales = _grown(self._scales, capacity, 0.0)
        self._created = _grown(self._created, capacity, 0)
        self._addresses = _grown(self._addresses, capacity, -1)
        self._alive = _grown(self._alive, capacity, False)

    def _compact(self) -> None:
        live = self._live()
        count = len(live)
        self._rows[:count] = self._rows[live]  # copies the bits: similarities do not change
        for name in ("_lengths", "_scales", "_created", "_addresses"):
            column = getattr(self, name)
            column[:count] = column[live]
        self._alive[:] = False
        self._alive[:count] = True
        self._slots = [self._slots[slot] for slot in live]
        self._slot_of = {entry.key: slot for slot, entry in enumerate(self._slots) if entry is not None}
        self._unsafe = {int(slot) for slot in np.flatnonzero(~_safe(self._lengths[:count]))}
        if len(self._rows) > 4 * max(8, count):
            self._allocate(max(8, 2 * count))


def _inverse_norms(lengths: NDArray[np.float64]) -> NDArray[np.float32]:
    norms = np.sqrt(lengths)
    inverse = np.divide(1.0, norms, out=np.zeros(len(lengths)), where=norms > 0.0)
    return inverse.astype(np.float32)


def _grown(column: NDArray[_T], capacity: int, fill: object) -> NDArray[_T]:
    grown: NDArray[_T] = np.full(capacity, fill, dtype=column.dtype)
    kept = min(capacity, len(column))
    grown[:kept] = column[:kept]
    return grown
