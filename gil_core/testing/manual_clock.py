"""``ManualClock``: monotonic seconds that move only when a test moves them, for an injected ``clock``."""

from __future__ import annotations

__all__ = ["ManualClock"]


class ManualClock:
    """Monotonic seconds that move only when a test moves them (``now``, or ``advance``), for an injected
    ``clock``. ``sleep`` records each wait and, when ``advance_on_sleep``, moves time on by it; nothing ever
    really sleeps."""

    def __init__(self, *, start: float = 1_000.0, advance_on_sleep: bool = False) -> None:
        self.now = start
        self.sleeps: list[float] = []
        self._advance_on_sleep = advance_on_sleep

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self._advance_on_sleep:
            self.now += seconds
