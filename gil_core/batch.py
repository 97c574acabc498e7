"""Batches: queued tickets resolved with bounded concurrency, idempotent by ticket id.

A ticket's trace id is derived from its task and ticket id, so a rerun (after a crash, or by a scheduler that
fires twice) resolves only the tickets that have no trace yet, and never stores a second trace for a ticket.
One bad ticket is reported and skipped; the rest of the batch runs.

A batch spread over several processes is cut into chunks (``plan_chunks``); each process opens its own runtime
and resolves its chunks with ``resolve_batch``, and ``BatchReport.merged`` puts the reports back together. Since
the trace id depends only on task and ticket, it does not matter which process resolved a ticket.

Which tickets to resolve and in which chunks is ``gil_core.batch_plan``'s; the results file and the verdicts an
answer key gives are ``gil_core.batch_results``'s; verdicts are applied by ``gil_core.batch_feedback``, and what a
batch's processes share is said by ``gil_core.batch_workers``. This module re-exports their public names.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gil_core._sheet_files import write_sheet
from gil_core._ticket_files import (
    CSV_DELIMITERS,
    DEFAULT_FORMAT,
    MAX_LINE_BYTES,
    BadInput,
    Ticket,
    TicketColumns,
    TicketFormat,
    Verdict,
    count_lines,
    iter_tickets,
    read_tickets,
    read_verdicts,
    text_encoding,
)
from gil_core.batch_feedback import AnswerKey, FeedbackReport, apply_verdicts
from gil_core.batch_plan import (
    WINDOW,
    chunk_sizes,
    pending_chunks,
    pending_tickets,
    plan_chunks,
    ticket_trace_id,
    traced_among,
)
from gil_core.batch_results import key_verdicts, read_feedback, write_results
from gil_core.batch_scope import batch_scope, new_batch_id
from gil_core.batch_workers import model_endpoints, share_client_budget
from gil_core.errors import ConfigurationError, GilError, SchemaViolationError, TelemetryError
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition

__all__ = [
    "CSV_DELIMITERS",
    "DEFAULT_FORMAT",
    "MAX_LINE_BYTES",
    "WINDOW",
    "AnswerKey",
    "BadInput",
    "BatchReport",
    "FeedbackReport",
    "Ticket",
    "TicketColumns",
    "TicketFormat",
    "Verdict",
    "apply_verdicts",
    "chunk_sizes",
    "count_lines",
    "iter_tickets",
    "key_verdicts",
    "model_endpoints",
    "pending_chunks",
    "pending_tickets",
    "plan_chunks",
    "read_feedback",
    "read_tickets",
    "read_verdicts",
    "resolve_batch",
    "share_client_budget",
    "text_encoding",
    "ticket_trace_id",
    "traced_among",
    "write_results",
    "write_sheet",
]

Progress = Callable[[int, int], None]


@dataclass
class BatchReport:
    """What a batch did. ``tickets`` counts the valid tickets it was given; ``trace_ids`` maps ticket id to trace
    id when the batch was given a sequence of tickets (derived from it on access, no copy), and is empty when it
    was given a stream: ``ticket_trace_id`` derives any ticket's."""

    resolved: int = 0
    skipped: int = 0
    failed: list[BadInput] = field(default_factory=list)
    trace_ids: Mapping[str, str] = field(default_factory=dict)
    tickets: int | None = None  # None: as many as ``trace_ids`` holds
    batch_id: str | None = None  # what the batch's traces record (``gil_core.batch_scope``)

    def to_json(self) -> dict[str, Any]:
        return {
            "resolved": self.resolved,
            "skipped": self.skipped,
            "failed": [str(item) for item in self.failed],
            "tickets": len(self.trace_ids) if self.tickets is None else self.tickets,
            **({"batch_id": self.batch_id} if self.batch_id is not None else {}),
        }

    @classmethod
    def merged(cls, reports: Iterable[BatchReport]) -> BatchReport:
        """One report for a batch resolved in parts (chunks); the parts' tickets are disjoint."""
        total = cls(tickets=0)
        parts: list[Mapping[str, str]] = []
        for report in reports:
            total.resolved += report.resolved
            total.skipped += report.skipped
            total.failed += report.failed
            total.tickets = (total.tickets or 0) + (report.to_json()["tickets"])
            parts.append(report.trace_ids)
            total.batch_id = total.batch_id or report.batch_id  # a flow's chunks share the batch's id
        total.trace_ids = _TraceIds.joined(parts)
        return total


class _TraceIds(Mapping[str, str]):
    """The trace id of each ticket of a batch by ticket id, derived on access from the tickets the caller holds (no
    copy, no string per ticket); the first lookup by id indexes the ids."""

    def __init__(self, task: str, parts: Sequence[Sequence[Ticket]]) -> None:
        self._task, self._parts = task, tuple(parts)
        self._ids: set[str] | None = None

    @classmethod
    def joined(cls, parts: Sequence[Mapping[str, str]]) -> Mapping[str, str]:
        views = [part for part in parts if isinstance(part, _TraceIds)]
        if len(views) == len(parts) and len({view._task for view in views}) <= 1:
            return cls(views[0]._task if views else "", [ticket for view in views for ticket in view._parts])
        joined: dict[str, str] = {}
        for part in parts:
            joined |= part
        return joined

    def __iter__(self) -> Iterator[str]:
        return (ticket.id for part in self._parts for ticket in part)

    def __len__(self) -> int:
        return sum(len(part) for part in self._parts)

    def __getitem__(self, ticket_id: str) -> str:
        if self._ids is None:
            self._ids = set(self)
        if ticket_id not in self._ids:
            raise KeyError(ticket_id)
        return ticket_trace_id(self._task, ticket_id)


async def resolve_batch(
    resolver: Resolver,
    task: TaskDefinition,
    tickets: Iterable[Ticket],
    *,
    concurrency: int = 4,
    progress: Progress | None = None,
    commit_rows: int | None = 1000,
    commit_delay_s: float | None = 0.2,
    total: int | None = None,
    window: int = WINDOW,
    batch_id: str | None = None,
    flow_run_id: str | None = None,
) -> BatchReport:
    """Resolve every ticket that has no trace yet, at most ``concurrency`` at a time.

    The traces record the batch (``gil_core.batch_scope``): ``batch_id`` when given (a flow that resolves one
    batch in chunks gives each chunk its own), else a new one, which the report holds; and ``flow_run_id``.

    ``tickets`` may be a stream (``iter_tickets``): the batch takes ``window`` tickets at a time, asks the store
    which of them have a trace already, and resolves the others, so it holds one window of tickets (and the
    tickets resolving but not yet acknowledged), never its whole input. ``progress(done, total)`` is called as
    tickets settle; ``total`` is the caller's (a line count, say), else the length of a sequence of tickets, else
    how many tickets were read so far.

    The batch's telemetry is group-committed (``TelemetryStore.group_commit`` with ``commit_rows`` and
    ``commit_delay_s``): a ticket counts as resolved, in the report and in ``progress``, only once its trace is
    flushed (durable). A crash loses at most the tickets not flushed yet, which a rerun resolves again (the trace
    id is the ticket's). ``commit_rows=None`` opens no group: each request is durable on its own when it returns
    (unless the caller holds a group open on the store). A ticket whose trace the store rejected is reported
    failed, with the reason.
    """
    if window < 1 or concurrency < 1:  # (no worker would take a ticket)
        raise ConfigurationError(f"window and concurrency must be ≥ 1, got {window} and {concurrency}")
    batch_id = batch_id or new_batch_id()
    with batch_scope(batch_id, flow_run_id):
        return await _resolve_batch(
            resolver, task, tickets, concurrency, progress, commit_rows, commit_delay_s, total, window, batch_id
        )


async def _resolve_batch(
    resolver: Resolver,
    task: TaskDefinition,
    tickets: Iterable[Ticket],
    concurrency: int,
    progress: Progress | None,
    commit_rows: int | None,
    commit_delay_s: float | None,
    total: int | None,
    window: int,
    batch_id: str,
) -> BatchReport:
    given = tickets if isinstance(tickets, Sequence) else None
    report = BatchReport(trace_ids=_TraceIds(task.name, [given]) if given is not None else {}, tickets=0)
    report.batch_id = batch_id
    if total is None and given is not None:
        total = len(given)
    # The learned judge meets the batch current: refit after feedback, or picked up from another process.
    await resolver.refresh_learned(task)
    tally = _Tally(report, total, progress)
    stopped: list[TelemetryError] = []  # the store could not write (a full disk, …): no ticket starts after it
    taken = 0  # tickets taken up to be resolved (without a trace when their window was looked up)

    async def work(queue: Iterator[tuple[str, Ticket]]) -> None:
        """One of ``concurrency`` workers: resolves the window's next ticket until none is left. (Workers, not a
        task per ticket behind a semaphore: no task, wake-up and context copy per ticket.)"""
        for trace_id, ticket in queue:  # shared by the workers: each ticket is taken once, in order
            if stopped:
                return  # left for a rerun, like every ticket not acknowledged
            try:
                await resolver.resolve(task, ticket.text, trace_id=trace_id)
            except SchemaViolationError as exc:
                tally.failed(trace_id, ticket.id, str(exc))
            except TelemetryError as exc:
                stopped.append(exc)
            except GilError as exc:  # the trace, when one was stored, says why; the batch goes on
                tally.failed(trace_id, ticket.id, str(exc))
            else:
                tally.returned(trace_id)

    async def run_windows() -> None:
        nonlocal taken
        source = iter(tickets)
        while part := list(itertools.islice(source, window)):
            by_trace = {ticket_trace_id(task.name, ticket.id): ticket for ticket in part}
            done = traced_among(resolver.store, task.name, by_trace)
            todo = [(trace_id, ticket) for trace_id, ticket in by_trace.items() if trace_id not in done]
            del part
            report.tickets = (report.tickets or 0) + len(by_trace)
            report.skipped += len(by_trace) - len(todo)
            taken += len(todo)
            tally.expect((trace_id, ticket.id) for trace_id, ticket in todo)
            tally.report_progress()
            queue = iter(todo)
            await asyncio.gather(*(work(queue) for _ in range(min(concurrency, len(todo)))))
            if stopped:
                return

    if commit_rows is None:
        tally.durable_on_return = True
        try:
            await run_windows()
        except TelemetryError as exc:  # a window's lookup failed
            stopped.append(exc)
        tally.report_progress()
        _raise_stopped(stopped, report, taken)
        return report
    rejected = "its trace was not stored"
    try:
        with resolver.store.group_commit(max_rows=commit_rows, max_delay_s=commit_delay_s, on_flush=tally.flushed):
            await run_windows()
            if stopped:
                raise stopped[0]  # leaves the group without acknowledging what is still queued
    except SchemaViolationError as exc:  # rows of some requests were left out; the rest is durable
        rejected = str(exc)
    except TelemetryError as exc:  # the last flush failed as well, or the store stopped the batch
        if not stopped:
            stopped.append(exc)
    tally.settle(rejected if not stopped else "its trace was not stored: the batch stopped")
    _raise_stopped(stopped, report, taken)
    return report


def _raise_stopped(stopped: Sequence[TelemetryError], report: BatchReport, taken: int) -> None:
    """The store failed a write during the batch: say so, with what was acknowledged before it stopped."""
    if stopped:
        raise TelemetryError(
            f"{stopped[0]} — the batch stopped with {report.resolved} of its {taken} tickets acknowledged: run it "
            "again to resolve the others"
        ) from stopped[0]


class _Tally:
    """Which tickets are resolved: their ``resolve`` returned and their trace is durable, in either order (a
    flush in the store's thread can come first). The report and ``progress`` change only in the event loop.
    A ticket is tracked from its window's start until it is acknowledged or failed, no longer."""

    def __init__(self, report: BatchReport, total: int | None, progress: Progress | None) -> None:
        self._report, self._total, self._progress = report, total, progress
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._tickets: dict[str, str] = {}  # trace id → ticket id, of the tickets not settled yet
        self._durable: set[str] = set()  # of those, the trace ids flushed so far (any thread)
        self._returned: set[str] = set()  # resolve returned, trace not known durable yet
        self.durable_on_return = False

    def expect(self, tickets: Iterable[tuple[str, str]]) -> None:
        with self._lock:
            self._tickets.update(tickets)

    def report_progress(self) -> None:
        if self._progress is not None:
            report = self._report
            seen = report.tickets or 0
            self._progress(report.skipped + report.resolved + len(report.failed), max(self._total or 0, seen))

    def failed(self, trace_id: str, ticket_id: str, reason: str) -> None:
        with self._lock:
            self._tickets.pop(trace_id, None)
            self._durable.discard(trace_id)
        self._report.failed.append(BadInput(f"ticket {ticket_id!r}", reason))
        self.report_progress()

    def returned(self, trace_id: str) -> None:
        self._returned.add(trace_id)
        if self.durable_on_return:
            with self._lock:
                self._durable.add(trace_id)
        self._acknowledge()

    def flushed(self, written: Mapping[str, pl.DataFrame]) -> None:
        """The store's ``on_flush``: note the batch's traces it made durable (in whichever thread flushed)."""
        traces = written.get("traces")
        if traces is None:
            return
        with self._lock:
            self._durable.update(trace_id for trace_id in traces.get_column("trace_id") if trace_id in self._tickets)
        try:
            in_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:  # the store's flush thread runs no loop
            in_loop = False
        if in_loop:
            self._acknowledge()
        else:
            self._loop.call_soon_threadsafe(self._acknowledge)

    def settle(self, rejected: str) -> None:
        """After the group's last flush (whose listeners, like every earlier flush's, have run by then): every
        returned ticket whose trace never became durable failed."""
        self._acknowledge()
        for trace_id, ticket_id in self._tickets.items():
            if trace_id in self._returned:
                self._report.failed.append(BadInput(f"ticket {ticket_id!r}", rejected))
        self._returned.clear()
        self.report_progress()

    def _acknowledge(self) -> None:
        with self._lock:
            ready = self._returned & self._durable
            self._durable -= ready
            for trace_id in ready:
                del self._tickets[trace_id]
        if ready:
            self._returned -= ready
            self._report.resolved += len(ready)
            self.report_progress()
