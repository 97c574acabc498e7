"""The memory port: confirmed answers per task, looked up by similarity, and the value objects it returns.

Rules every adapter keeps (tests run the same checks over each of them):

- Tenants live in the task name. No ``lookup``, ``nearest``, ``forget`` or ``rebuild`` ever sees or touches
  another task's entries, whatever characters the task name holds.
- Ranking is by similarity, best first; equal similarities go to the entry remembered EARLIEST. ``remember``
  of a key the task already holds replaces the entry and makes it the newest (it is remembered again, now).
- ``change`` makes a task's remembers and forgets one write, as if they were made one by one in order: per key
  the last one counts. ``remember`` and ``forget`` are a change of one.
- A hit means similarity ≥ the threshold given to ``lookup``. Each adapter has its own similarity scale, so a
  threshold chosen for one adapter (or one embedding model) means nothing for another.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from gil_core.errors import InvalidArgumentError

__all__ = ["Memory", "MemoryChanges", "MemoryEntry", "Recall"]


@dataclass(frozen=True, slots=True)
class Recall:
    """What a lookup found: the nearest confirmed entry of the task, and whether it is similar enough.

    ``source`` is the nearest entry's key (a trace id), ``answer`` and ``text`` its confirmed answer and the
    request it answered. ``error`` says why the lookup failed when the caller turned a failure into a miss
    (``Recall(threshold, hit=False, error=...)``, the other fields left None). ``refused`` says why a hit was
    taken back by a check after the lookup (the hit guard, memory's cut read from the log, the learned judge, a
    verification that could not be made): memory worked, and the request is a miss.
    """

    threshold: float
    hit: bool
    source: str | None = None
    similarity: float | None = None
    answer: str | None = None
    text: str | None = None
    error: str | None = None
    verified: bool | None = None
    refused: str | None = None

    @classmethod
    def from_nearest(cls, nearest: MemoryEntry, *, threshold: float) -> Recall:
        """The recall of ``nearest`` (a search result, so it carries its similarity) at ``threshold``."""
        if nearest.similarity is None:
            raise InvalidArgumentError(f"entry {nearest.key!r} is not a search result: it has no similarity")
        return cls(
            threshold=threshold,
            hit=nearest.similarity >= threshold,
            source=nearest.key,
            similarity=nearest.similarity,
            answer=nearest.answer,
            text=nearest.text,
        )

    def to_json(self) -> dict[str, Any]:
        """The ``recall`` column's JSON: ``{source, similarity, threshold, hit, error, verified, refused}`` without
        None fields (``verified`` only when the hit was put to a verification, ``refused`` only when a check took
        the hit back)."""
        fields = {
            "source": self.source,
            "similarity": self.similarity,
            "threshold": self.threshold,
            "hit": self.hit,
            "error": self.error,
            "verified": self.verified,
            "refused": self.refused,
        }
        return {name: value for name, value in fields.items() if value is not None}


@dataclass(frozen=True, slots=True)
class MemoryEntry:
    """One confirmed answer: ``key`` (the trace id that confirmed it), the request ``text`` and its ``answer``.

    ``similarity`` is set on search results (``Memory.nearest``) and None otherwise.
    """

    key: str
    text: str
    answer: str
    similarity: float | None = None


class MemoryChanges:
    """Remembers and forgets for one task, in the order they were made, to be written at once (``Memory.change``).

    Per key the last one counts: ``entries`` are the keys last remembered, in the order of that last remember
    (so a key remembered again is the newest), and ``forgotten`` the keys last forgotten, never one of them.
    """

    __slots__ = ("_latest",)

    def __init__(self) -> None:
        self._latest: dict[str, MemoryEntry | None] = {}  # per key, its last change: None forgets

    def remember(self, key: str, text: str, answer: str) -> MemoryChanges:
        self._latest.pop(key, None)  # to the end: the newest
        self._latest[key] = MemoryEntry(key=key, text=text, answer=answer)
        return self

    def forget(self, key: str) -> MemoryChanges:
        self._latest.pop(key, None)
        self._latest[key] = None
        return self

    @property
    def entries(self) -> list[MemoryEntry]:
        return [entry for entry in self._latest.values() if entry is not None]

    @property
    def forgotten(self) -> list[str]:
        return [key for key, entry in self._latest.items() if entry is None]

    def __len__(self) -> int:
        return len(self._latest)

    def __repr__(self) -> str:
        return f"MemoryChanges({len(self.entries)} remembered, {len(self.forgotten)} forgotten)"


@runtime_checkable
class Memory(Protocol):
    """Confirmed answers per task. Adapters raise ``MemoryUnavailableError`` when they cannot answer."""

    async def lookup(self, task: str, text: str, *, threshold: float) -> Recall | None:
        """The recall of the entry nearest to ``text``; None when ``task`` holds no entries at all."""
        ...

    async def nearest(self, task: str, text: str, k: int) -> list[MemoryEntry]:
        """Up to ``k`` entries of ``task`` nearest to ``text``, best first (ties: earliest remembered)."""
        ...

    async def remember(self, task: str, key: str, text: str, answer: str) -> None:
        """Hold ``answer`` for ``text`` under ``key``; an entry with the same key is replaced."""
        ...

    async def forget(self, task: str, key: str) -> None:
        """Drop the entry ``key`` of ``task``; nothing happens when there is none."""
        ...

    async def change(self, task: str, changes: MemoryChanges) -> None:
        """Make ``changes`` to ``task`` in one write: its ``entries`` remembered (in order), its ``forgotten``
        dropped; all of them or, when it raises, none (an adapter that cannot promise that says so)."""
        ...

    async def rebuild(self, task: str, entries: Iterable[MemoryEntry]) -> None:
        """Replace everything ``task`` holds by ``entries``, remembered in the order given."""
        ...

    async def entries(self, task: str) -> list[MemoryEntry]:
        """Everything ``task`` holds, in insertion order (earliest remembered first)."""
        ...
