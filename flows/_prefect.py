"""Our defaults for Prefect tasks: no result caching (handles and stores are not hashable inputs), results kept
in memory only, retries only where a task does I/O that a retry can fix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE

F = TypeVar("F", bound=Callable[..., Any])


def gil_task(*, name: str, retries: int = 0, retry_delay_seconds: float = 2.0) -> Callable[[F], F]:
    """``prefect.task`` with Gil's defaults."""

    def wrap(function: F) -> F:
        return task(  # type: ignore[return-value]
            function,
            name=name,
            cache_policy=NO_CACHE,
            persist_result=False,
            retries=retries,
            retry_delay_seconds=retry_delay_seconds,
        )

    return wrap
