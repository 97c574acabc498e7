"""``InProcessRequestCache``: the request cache in this process's memory, LRU with a TTL per entry."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from cachetools import TLRUCache

from gil_core.client.cache.ports import CacheStats
from gil_core.errors import ConfigurationError

__all__ = ["DEFAULT_CAPACITY", "DEFAULT_TTL_SECONDS", "InProcessRequestCache"]

DEFAULT_CAPACITY = 1_000
DEFAULT_TTL_SECONDS = 3_600.0


class _Stored(NamedTuple):
    payload: bytes
    ttl: float


def _expires(_key: str, value: _Stored, now: float) -> float:
    return now + value.ttl


class InProcessRequestCache:
    """``RequestCache`` on ``cachetools.TLRUCache``: at most ``capacity`` entries (the least recently used goes
    first), each living ``ttl`` seconds (per entry, ``default_ttl`` when not given). ``timer`` is injectable so
    tests can move time. Thread-safe: cachetools caches are not, so one lock guards every access.
    """

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        default_ttl: float = DEFAULT_TTL_SECONDS,
        *,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ConfigurationError(f"cache capacity must be at least 1, got {capacity}")
        _check_ttl(default_ttl)
        self._capacity = capacity
        self._default_ttl = default_ttl
        self._entries: TLRUCache[str, _Stored, float] = TLRUCache(capacity, _expires, timer)
        self._lock = threading.Lock()
        self._hits = self._misses = self._writes = 0

    async def get(self, key: str) -> bytes | None:
        with self._lock:
            stored = self._entries.get(key)
            if stored is None:
                self._misses += 1
                return None
            self._hits += 1
            return stored.payload

    async def set(self, key: str, payload: bytes, ttl: float | None = None) -> None:
        ttl = self._default_ttl if ttl is None else ttl
        _check_ttl(ttl)
        with self._lock:
            self._entries[key] = _Stored(payload, ttl)
            self._writes += 1

    async def delete(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)

    async def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._hits = self._misses = self._writes = 0

    def stats(self) -> CacheStats:
        with self._lock:
            self._entries.expire()
            return CacheStats(len(self._entries), self._capacity, self._hits, self._misses, self._writes)


def _check_ttl(ttl: float) -> None:
    if not (math.isfinite(ttl) and ttl > 0):
        raise ConfigurationError(f"a cache TTL must be a positive number of seconds, got {ttl!r}")
