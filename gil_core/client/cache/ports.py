"""The request cache port: stored model replies by request key, with a time to live."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["CacheStats", "RequestCache"]


@dataclass(frozen=True, slots=True)
class CacheStats:
    """What a cache holds and how it has been used since it was made (or last cleared)."""

    entries: int
    capacity: int
    hits: int
    misses: int
    writes: int


@runtime_checkable
class RequestCache(Protocol):
    """Opaque payloads by key. The caching decorator owns the payload format (and its checksum), so an
    adapter only stores bytes: in process, or in any shared store.
    """

    async def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None when absent or expired."""
        ...

    async def set(self, key: str, payload: bytes, ttl: float | None = None) -> None:
        """Store ``payload`` under ``key`` for ``ttl`` seconds (None: the cache's default)."""
        ...

    async def delete(self, key: str) -> None:
        """Forget ``key`` (a no-op when absent): how a corrupt or outdated entry is discarded."""
        ...

    async def clear(self) -> None:
        """Forget every entry."""
        ...

    def stats(self) -> CacheStats:
        """Entries, capacity and counters."""
        ...
