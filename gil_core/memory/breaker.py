"""A circuit breaker in front of any ``Memory``: after a failure, stop calling it for a while.

When the memory's embedder or store is down, every request would otherwise wait for the same failure. After a
failed ``lookup``/``nearest``/``remember``/``rebuild`` the circuit opens: calls are refused at once with
``MemoryUnavailableError`` for ``cooldown`` seconds. Then it is half-open: ONE trial call passes (concurrent
callers are refused meanwhile); its success closes the circuit, its failure opens it again.

``forget`` always passes and never changes the circuit: dropping a wrong answer must not wait for a cooldown.
``entries`` passes too (it is for tests and replay checks). With ``guard_writes=False`` (what a task file's
runtime uses) ``remember`` and ``rebuild`` pass as well and never change the circuit: the breaker then spares the
endpoint on the hot path (lookups) while a verdict, which is rare and must be learnt, is always tried.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Literal, TypeVar

from gil_core.errors import ConfigurationError, MemoryUnavailableError
from gil_core.memory.ports import Memory, MemoryChanges, MemoryEntry, Recall

__all__ = ["BreakerState", "CircuitBreakingMemory"]

BreakerState = Literal["closed", "open", "half_open"]

_T = TypeVar("_T")


class CircuitBreakingMemory:
    """``Memory`` that wraps ``inner`` with a circuit breaker; ``clock`` (seconds) is injectable for tests."""

    def __init__(
        self,
        inner: Memory,
        *,
        cooldown: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        guard_writes: bool = True,
    ) -> None:
        if not (math.isfinite(cooldown) and cooldown >= 0):
            raise ConfigurationError(f"cooldown must be a finite number of seconds >= 0, got {cooldown!r}")
        self._inner = inner
        self._guard_writes = guard_writes
        self._cooldown = cooldown
        self._clock = clock
        self._open_until: float | None = None  # None: closed
        self._trial_in_flight = False
        self._last_failure = ""
        # Each opening starts a new generation; an outcome only counts for the generation it was admitted in,
        # so a slow call that started before the circuit opened cannot close it.
        self._generation = 0

    @property
    def state(self) -> BreakerState:
        """``closed`` (calls pass), ``open`` (refused until the cooldown ends) or ``half_open`` (the cooldown
        ended: the next call, or the one in flight, is the trial)."""
        if self._open_until is None:
            return "closed"
        if self._trial_in_flight or self._clock() >= self._open_until:
            return "half_open"
        return "open"

    def __repr__(self) -> str:
        return f"CircuitBreakingMemory({self._inner!r}, state={self.state!r})"

    async def lookup(self, task: str, text: str, *, threshold: float) -> Recall | None:
        return await self._guarded(task, lambda: self._inner.lookup(task, text, threshold=threshold))

    async def nearest(self, task: str, text: str, k: int) -> list[MemoryEntry]:
        return await self._guarded(task, lambda: self._inner.nearest(task, text, k))

    async def remember(self, task: str, key: str, text: str, answer: str) -> None:
        if not self._guard_writes:
            return await self._inner.remember(task, key, text, answer)
        await self._guarded(task, lambda: self._inner.remember(task, key, text, answer))

    async def rebuild(self, task: str, entries: Iterable[MemoryEntry]) -> None:
        if not self._guard_writes:
            return await self._inner.rebuild(task, entries)
        await self._guarded(task, lambda: self._inner.rebuild(task, entries))

    async def forget(self, task: str, key: str) -> None:
        await self._inner.forget(task, key)

    async def change(self, task: str, changes: MemoryChanges) -> None:
        if not self._guard_writes or not changes.entries:  # forgetting is never refused, as ``forget``
            return await self._inner.change(task, changes)
        await self._guarded(task, lambda: self._inner.change(task, changes))

    async def entries(self, task: str) -> list[MemoryEntry]:
        return await self._inner.entries(task)

    async def _guarded(self, task: str, call: Callable[[], Awaitable[_T]]) -> _T:
        trial = self._admit(task)
        generation = self._generation
        try:
            result = await call()
        except Exception as exc:
            if generation == self._generation:
                self._open(exc)
            raise
        except BaseException:  # cancelled: no verdict, so a trial slot is freed for the next caller
            if trial and generation == self._generation:
                self._trial_in_flight = False
            raise
        if trial and generation == self._generation:
            self._open_until, self._trial_in_flight = None, False
        return result

    def _admit(self, task: str) -> bool:
        """Whether this call is the half-open trial; raises when the circuit refuses it."""
        if self._open_until is None:
            return False
        now = self._clock()
        if now < self._open_until:
            raise MemoryUnavailableError(
                f"circuit open after a failure ({self._last_failure}); calls are refused until "
                f"{self._open_until:.3f} on the breaker's clock (another {self._open_until - now:.1f} s)",
                task=task,
                open_until=self._open_until,
            )
        if self._trial_in_flight:
            raise MemoryUnavailableError(
                f"circuit half-open after a failure ({self._last_failure}); a trial call is in flight",
                task=task,
                open_until=self._open_until,
            )
        self._trial_in_flight = True
        return True

    def _open(self, failure: Exception) -> None:
        self._generation += 1
        self._open_until = self._clock() + self._cooldown
        self._trial_in_flight = False
        self._last_failure = f"{type(failure).__name__}: {failure}"
