"""Which batch a request belongs to: every ``resolve_batch`` call makes a batch id (or is given one, when a flow
resolves one batch in several chunks), and the traces of its requests record it, with the orchestrator's run id
when there is one (``batch_id``, ``flow_run_id``: Gil's own columns at the end of the traces table). Savings and
accuracy can then be read per batch over time (``gil_core.telemetry.savings``).

A context variable carries it from the batch to the resolver, so the tasks a batch starts inherit it and a
request resolved outside any batch records none.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["BatchScope", "batch_columns", "batch_scope", "current_batch", "new_batch_id"]


@dataclass(frozen=True, slots=True)
class BatchScope:
    batch_id: str
    flow_run_id: str | None = None


_CURRENT: ContextVar[BatchScope | None] = ContextVar("gil_batch", default=None)


def new_batch_id() -> str:
    """A fresh batch id: the time in milliseconds (so ids sort by start) and 48 random bits, in hex."""
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(6)}"


@contextmanager
def batch_scope(batch_id: str, flow_run_id: str | None = None) -> Iterator[BatchScope]:
    """Requests resolved inside belong to this batch."""
    scope = BatchScope(batch_id, flow_run_id)
    token = _CURRENT.set(scope)
    try:
        yield scope
    finally:
        _CURRENT.reset(token)


def current_batch() -> BatchScope | None:
    """The batch the running request belongs to (None outside any batch)."""
    return _CURRENT.get()


def batch_columns() -> dict[str, str]:
    """The batch the running request belongs to, as its trace's columns (nothing outside a batch)."""
    scope = current_batch()
    if scope is None:
        return {}
    columns = {"batch_id": scope.batch_id}
    if scope.flow_run_id is not None:
        columns["flow_run_id"] = scope.flow_run_id
    return columns
