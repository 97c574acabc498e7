"""The port's rules every adapter shares: argument checks, the ranking (best first, ties to the earliest) and
what a sequence of remembers leaves behind."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from gil_core.errors import InvalidArgumentError
from gil_core.memory.ports import MemoryEntry

__all__ = ["best_first", "check_k", "check_threshold", "latest_per_key", "search_results"]


def check_threshold(threshold: float) -> float:
    """``threshold`` if a similarity can be compared with it (it is not NaN)."""
    if math.isnan(threshold):
        raise InvalidArgumentError("a memory threshold must be a number, got NaN")
    return threshold


def check_k(k: int) -> int:
    """``k`` if it is a usable result count (0 asks for no results)."""
    if k < 0:
        raise InvalidArgumentError(f"k must be at least 0, got {k}")
    return k


def best_first(similarities: NDArray[np.float64], k: int) -> list[int]:
    """Positions of the ``k`` highest similarities, best first.

    Positions are insertion order, and equal similarities keep position order (argmax returns the first
    maximum, the sort is stable): ties go to the entry remembered earliest. Removed slots hold −∞.
    """
    if k == 1 and len(similarities):
        return [int(np.argmax(similarities))]
    return [int(position) for position in np.argsort(-similarities, kind="stable")[:k]]


def search_results(
    entries: Sequence[MemoryEntry | None], similarities: NDArray[np.float64], k: int
) -> list[MemoryEntry]:
    """The ``k`` best of ``entries`` (position-aligned with ``similarities``; None for removed slots)."""
    found: list[MemoryEntry] = []
    for position in best_first(similarities, k):
        entry = entries[position]
        if entry is not None:  # −∞ sorts last, so a removed slot only shows up when k exceeds the live count
            found.append(replace(entry, similarity=float(similarities[position])))
    return found


def latest_per_key(entries: Iterable[MemoryEntry]) -> list[MemoryEntry]:
    """``entries`` as remembering them in order leaves them: a repeated key keeps its last value at its last
    place (``remember`` makes an entry the newest). Similarities are dropped."""
    latest: dict[str, MemoryEntry] = {}
    for entry in entries:
        latest.pop(entry.key, None)
        latest[entry.key] = MemoryEntry(key=entry.key, text=entry.text, answer=entry.answer)
    return list(latest.values())
