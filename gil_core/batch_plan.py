"""Which tickets of a batch to resolve, under which trace ids, in which chunks.

A ticket's trace id is derived from its task and ticket id (``ticket_trace_id``), so the store says which tickets
a batch resolved already, whichever process resolved them; the batch asks it a window at a time and resolves the
rest (``pending_chunks``), cut into chunks for its processes (``plan_chunks``). ``gil_core.batch`` re-exports
the public names.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence

from gil_core._ticket_files import Ticket
from gil_core.errors import ConfigurationError
from gil_core.telemetry import TelemetryStore

__all__ = [
    "WINDOW",
    "chunk_sizes",
    "pending_chunks",
    "pending_tickets",
    "plan_chunks",
    "ticket_trace_id",
    "traced_among",
]

WINDOW = 2_000
"""Tickets a batch takes from its input at a time: looked up in the store together (which have a trace already),
then resolved. A batch holds one window of tickets, not its whole input."""


def ticket_trace_id(task: str, ticket_id: str) -> str:
    """The trace id of a ticket: stable across runs, distinct across tasks, whatever characters the task name
    and the ticket id hold."""
    if "\x1f" in task or "\x1f" in ticket_id:
        # Joined by the separator, ("a\x1fb", "c") and ("a", "b\x1fc") would share a trace, one task's superseding
        # the other's. Such pairs are hashed as JSON, which holds no raw separator, so never meets a joined pair
        # (exactly one); every other pair keeps the id it always had.
        return hashlib.sha256(json.dumps([task, ticket_id]).encode()).hexdigest()[:32]
    return hashlib.sha256(f"{task}\x1f{ticket_id}".encode()).hexdigest()[:32]


def traced_among(store: TelemetryStore, task: str, trace_ids: Iterable[str]) -> set[str]:
    """Which of these trace ids of ``task`` the store holds a trace for (``TelemetryStore.traced``)."""
    return store.traced(task, trace_ids)


def pending_tickets(
    store: TelemetryStore, task: str, tickets: Iterable[Ticket], *, window: int = WINDOW
) -> list[Ticket]:
    """The tickets that have no trace yet, in order (looked up ``window`` at a time)."""
    return [ticket for chunk in pending_chunks(store, task, tickets, [], window=window) for ticket in chunk]


def pending_chunks(
    store: TelemetryStore, task: str, tickets: Iterable[Ticket], sizes: Sequence[int], *, window: int = WINDOW
) -> Iterator[list[Ticket]]:
    """The tickets without a trace, in order, cut into chunks of ``sizes`` (then chunks of the last size, or of
    ``window`` when ``sizes`` is empty); streamed: the store is asked ``window`` tickets at a time, and one
    chunk is held at once."""
    if window < 1:
        raise ConfigurationError(f"window must be ≥ 1, got {window}")
    sizes_left = iter(sizes)
    size = next(sizes_left, window)
    chunk: list[Ticket] = []
    source = iter(tickets)
    while part := list(itertools.islice(source, window)):
        by_trace = {ticket_trace_id(task, ticket.id): ticket for ticket in part}
        done = traced_among(store, task, by_trace)
        for trace_id, ticket in by_trace.items():
            if trace_id in done:
                continue
            chunk.append(ticket)
            if len(chunk) >= size:
                yield chunk
                chunk, size = [], next(sizes_left, size)
    if chunk:
        yield chunk


def chunk_sizes(
    tickets: int, workers: int, *, per_worker: int = 4, min_size: int = 25, max_size: int = WINDOW * 5
) -> list[int]:
    """The sizes ``plan_chunks`` would cut ``tickets`` tickets into, no chunk above ``max_size``."""
    if workers < 1 or per_worker < 1 or min_size < 1 or max_size < 1:
        raise ConfigurationError(
            f"workers, per_worker, min_size, max_size must be ≥ 1: {workers}, {per_worker}, {min_size}, {max_size}"
        )
    if tickets < 1:
        return []
    count = max(1, min(workers * per_worker, tickets // min_size), -(-tickets // max_size))
    size, larger = divmod(tickets, count)  # the first ``larger`` chunks take one ticket more
    return [size + (index < larger) for index in range(count)]


def plan_chunks(
    tickets: Sequence[Ticket], workers: int, *, per_worker: int = 4, min_size: int = 25
) -> list[list[Ticket]]:
    """Cut a batch into contiguous chunks for ``workers`` processes, sizes differing by one ticket at most.

    About ``per_worker`` chunks each, so a worker that finishes early takes more work instead of waiting for a
    slow one; never chunks below ``min_size`` tickets (each chunk opens a runtime). Every ticket is in exactly one
    chunk, in order; no chunk is empty.
    """
    if workers < 1 or per_worker < 1 or min_size < 1:
        raise ConfigurationError(f"workers, per_worker, min_size must be ≥ 1: {workers}, {per_worker}, {min_size}")
    if not tickets:
        return []
    count = max(1, min(workers * per_worker, len(tickets) // min_size))
    size, larger = divmod(len(tickets), count)  # the first ``larger`` chunks take one ticket more
    bounds = [index * size + min(index, larger) for index in range(count + 1)]
    return [list(tickets[start:end]) for start, end in itertools.pairwise(bounds)]
