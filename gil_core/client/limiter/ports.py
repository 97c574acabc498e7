"""The rate limiter port: one turn per model call, waited for or refused, and the error a refusal raises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gil_core.errors import RateLimitedError

__all__ = ["LimiterRefusedError", "LimiterSnapshot", "RateLimiter"]


class LimiterRefusedError(RateLimitedError):
    """Our own limiter refused a call because its turn is further away than the limiter waits.

    A transient error (a ``RateLimitedError``), so a fallback model may take the call. ``retry_after`` is
    how many seconds away the turn was; ``provider`` and ``tenant`` name the bucket that refused.
    """

    def __init__(self, reason: str, *, provider: str, tenant: str | None, retry_after: float) -> None:
        self.provider = provider
        self.tenant = tenant
        super().__init__(reason, endpoint=f"limiter://{provider}", status=None, retry_after=retry_after)


@dataclass(frozen=True, slots=True)
class LimiterSnapshot:
    """One bucket now: the tokens available (whole calls that need not wait), its capacity, and how many
    calls it has let through and refused."""

    provider: str
    tokens_available: float
    capacity: int
    allowed: int
    refused: int


@runtime_checkable
class RateLimiter(Protocol):
    """Turns for model calls, per provider (and per tenant when the limiter has a tenant limit)."""

    async def acquire(self, provider: str, *, tenant: str | None = None) -> None:
        """Return when the call may go; raise ``LimiterRefusedError`` at once when its turn is too far away."""
        ...

    def snapshot(self, provider: str, *, tenant: str | None = None) -> LimiterSnapshot:
        """The provider's bucket now (the tenant's bucket for that provider when ``tenant`` is given)."""
        ...
