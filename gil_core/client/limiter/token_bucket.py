"""``TokenBucketLimiter``: one token bucket per provider (and optionally per provider and tenant).

A bucket holds up to ``burst`` tokens and gains ``requests_per_second`` a second. A call takes one token. When
none is left, the call reserves the next one (the bucket goes below zero) and sleeps until it is due, so
concurrent callers queue in arrival order; when that turn is more than ``max_wait`` seconds away, the call is
refused at once and reserves nothing. The clock and the sleep are injected so tests never really sleep.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gil_core.client.limiter.ports import LimiterRefusedError, LimiterSnapshot
from gil_core.errors import ConfigurationError

__all__ = ["DEFAULT_BURST", "DEFAULT_MAX_WAIT_SECONDS", "DEFAULT_REQUESTS_PER_SECOND", "TokenBucketLimiter"]

DEFAULT_REQUESTS_PER_SECOND = 5.0
DEFAULT_BURST = 10
DEFAULT_MAX_WAIT_SECONDS = 30.0


@dataclass
class _Bucket:
    rate: float
    capacity: int
    tokens: float
    updated: float
    allowed: int = 0
    refused: int = 0

    def refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + max(0.0, now - self.updated) * self.rate)
        self.updated = max(self.updated, now)

    def wait(self) -> float:
        """Seconds until one more token is due (0 when one is here)."""
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate


def _check_rate(rate: float, burst: int, what: str) -> None:
    if not (math.isfinite(rate) and rate > 0) or burst < 1:
        raise ConfigurationError(f"{what}: requests_per_second must be > 0 and burst >= 1 (got {rate!r}, {burst!r})")


class TokenBucketLimiter:
    """``RateLimiter`` with token buckets; see the module doc. A tenant limit, when set, applies on top of the
    provider's: a call needs a turn in both and waits for the later one."""

    def __init__(
        self,
        requests_per_second: float = DEFAULT_REQUESTS_PER_SECOND,
        burst: int = DEFAULT_BURST,
        *,
        max_wait: float = DEFAULT_MAX_WAIT_SECONDS,
        tenant_requests_per_second: float | None = None,
        tenant_burst: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        _check_rate(requests_per_second, burst, "provider limit")
        if tenant_requests_per_second is not None:
            _check_rate(tenant_requests_per_second, tenant_burst or burst, "tenant limit")
        if not (math.isfinite(max_wait) and max_wait >= 0):
            raise ConfigurationError(f"max_wait must be a finite number of seconds >= 0, got {max_wait!r}")
        self._rate = requests_per_second
        self._burst = burst
        self._tenant_rate = tenant_requests_per_second
        self._tenant_burst = tenant_burst or burst
        self._max_wait = max_wait
        self._clock = clock
        self._sleep = sleep
        self._buckets: dict[tuple[str, str | None], _Bucket] = {}
        self._lock = threading.Lock()

    async def acquire(self, provider: str, *, tenant: str | None = None) -> None:
        with self._lock:
            now = self._clock()
            buckets = [self._bucket(provider, None, now)]
            if tenant is not None and self._tenant_rate is not None:
                buckets.append(self._bucket(provider, tenant, now))
            wait = max(bucket.wait() for bucket in buckets)
            if wait > self._max_wait:
                for bucket in buckets:
                    bucket.refused += 1
                raise LimiterRefusedError(
                    f"the next turn is {wait:.3g} s away, more than the {self._max_wait:g} s the limiter waits",
                    provider=provider,
                    tenant=tenant,
                    retry_after=wait,
                )
            for bucket in buckets:
                bucket.tokens -= 1
                bucket.allowed += 1
        if wait > 0:
            await self._sleep(wait)

    def snapshot(self, provider: str, *, tenant: str | None = None) -> LimiterSnapshot:
        if tenant is not None and self._tenant_rate is None:
            raise ConfigurationError("this limiter has no tenant limit, so it keeps no bucket per tenant")
        with self._lock:
            bucket = self._bucket(provider, tenant, self._clock())
            return LimiterSnapshot(provider, max(0.0, bucket.tokens), bucket.capacity, bucket.allowed, bucket.refused)

    def _bucket(self, provider: str, tenant: str | None, now: float) -> _Bucket:
        bucket = self._buckets.get((provider, tenant))
        if bucket is None:
            if tenant is None or self._tenant_rate is None:
                rate, capacity = self._rate, self._burst
            else:
                rate, capacity = self._tenant_rate, self._tenant_burst
            bucket = _Bucket(rate, capacity, float(capacity), now)
            self._buckets[(provider, tenant)] = bucket
        bucket.refill(now)
        return bucket
