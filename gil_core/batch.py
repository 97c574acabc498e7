"""Batches: queued tickets resolved with bounded concurrency, idempotent by ticket id.

A ticket's trace id is derived from its task and ticket id, so a rerun (after a crash, or by a scheduler that
fires twice) resolves only the tickets that have no trace yet, and never stores a second trace for a ticket.
One bad ticket is reported and skipped; the rest of the batch runs.

A batch spread over several processes is cut into chunks (``plan_chunks``); each process opens its own runtime
and resolves its chunks with ``resolve_batch``, and ``BatchReport.merged`` puts the reports back together. Since
the trace id depends only on task and ticket, it does not matter which process resolved a ticket.

Verdicts are applied by ``gil_core.batch_feedback``, and what a batch's processes share is said by
``gil_core.batch_workers``; this module re-exports their public names.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
from gil_core.atomic import atomic_open
from gil_core.batch_feedback import AnswerKey, FeedbackReport, apply_verdicts, graded, key_option, option_graded
from gil_core.batch_scope import batch_scope, new_batch_id
from gil_core.batch_workers import model_endpoints, share_client_budget
from gil_core.errors import BatchFileError, ConfigurationError, GilError, SchemaViolationError, TelemetryError
from gil_core.habits.attribution import habit_for_text
from gil_core.ontology import Option
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition
from gil_core.telemetry import TelemetryStore

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


WINDOW = 2_000
"""Tickets a batch takes from its input at a time: looked up in the store together (which have a trace already),
then resolved. A batch holds one window of tickets, not its whole input."""

_RESULTS_WINDOW = 20_000  # tickets whose trace rows are read together while the results file is written


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


def ticket_trace_id(task: str, ticket_id: str) -> str:
    """The trace id of a ticket: stable across runs, distinct across tasks, whatever characters the task name
    and the ticket id hold."""
    if "\x1f" in task or "\x1f" in ticket_id:
        # Joined by the separator, ("a\x1fb", "c") and ("a", "b\x1fc") would share a trace, one task's superseding
        # the other's. Such pairs are hashed as JSON, which holds no raw separator, so never meets a joined pair
        # (exactly one); every other pair keeps the id it always had.
        return hashlib.sha256(json.dumps([task, ticket_id]).encode()).hexdigest()[:32]
    return hashlib.sha256(f"{task}\x1f{ticket_id}".encode()).hexdigest()[:32]


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


def write_results(
    store: TelemetryStore, task: TaskDefinition, tickets: BatchReport | Iterable[Ticket], out: str | Path
) -> int:
    """Write one result line per ticket that has a trace (stable interface, see README), in ticket order,
    atomically. To ``.csv`` or ``.tsv``, a sheet for a person to judge instead: a header row, the same fields
    (the path's nodes joined by `` > ``), the request's ``text`` when ``tickets`` are the tickets and the task
    records its requests (not ``do_not_record``), then empty ``correct`` and ``correction`` columns, which make
    the file a verdicts file once filled in (``read_verdicts``); UTF-8 with a byte order mark, which spreadsheets
    read by.
    ``tickets``: a batch's report (its ``trace_ids``), or the tickets themselves, which may be a stream
    (``iter_tickets``): their traces are read ``_RESULTS_WINDOW`` at a time, one window held at once. A file that
    cannot be written (a folder in its place, a full disk) raises ``BatchFileError`` naming it; the file as it was
    is left."""
    triples: Iterable[tuple[str, str, str | None]] = (
        ((ticket_id, trace_id, None) for ticket_id, trace_id in tickets.trace_ids.items())
        if isinstance(tickets, BatchReport)
        else ((ticket.id, ticket_trace_id(task.name, ticket.id), ticket.text) for ticket in tickets)
    )
    lines = _result_lines(store, task, triples)
    if Path(out).suffix in CSV_DELIMITERS:
        texts = not isinstance(tickets, BatchReport) and not task.policy.do_not_record
        fields = (*_RESULT_FIELDS[:4], "text", *_RESULT_FIELDS[4:]) if texts else _RESULT_FIELDS
        rows = ([text if field == "text" else line[field] for field in fields] for line, text, _ in lines)
        return write_sheet(out, fields, rows)
    written = 0
    try:
        with atomic_open(out) as handle:
            for line, _, _ in lines:
                handle.write(json.dumps(line, ensure_ascii=False) + "\n")
                written += 1
    except OSError as exc:  # the store's own failures are TelemetryErrors already: this is the results file's
        raise BatchFileError(f"cannot write the results ({type(exc).__name__}: {exc})", path=str(out)) from exc
    return written


def key_verdicts(
    store: TelemetryStore, task: TaskDefinition, key: Iterable[Ticket | BadInput], *, by_option: bool = False
) -> tuple[list[Verdict], list[BadInput]]:
    """Verdicts from an answer key: each ``Ticket`` of ``key`` holds a ticket's id and, as its text, the answer it
    should have got (``iter_tickets`` reads a key file by its columns); its trace is read from ``store`` and
    ``graded``. With ``by_option``, the text names the tree answer instead (an option's id or label, or none of
    these: ``key_option``) and the trace is ``option_graded``; a name that is none of the tree's is a
    ``BadInput``. A ticket without a trace (not resolved yet) is a ``BadInput``, as are the key's own bad lines. A
    ``do_not_record`` task keeps no answers to compare: refused (``ConfigurationError``)."""
    if task.policy.do_not_record:
        raise ConfigurationError(f"task {task.name!r} records no answers (do_not_record): nothing to grade by a key")
    verdicts: list[Verdict] = []
    bad: list[BadInput] = []
    answers: list[tuple[str, str, str | None]] = []
    named: dict[str, Option | None] = {}
    for item in key:
        if isinstance(item, BadInput):
            bad.append(item)
        elif by_option and not (found_option := key_option(task, item.text))[0]:
            said = f"{item.text!r} names none of the tree's answers (an option's id or label, or none of these)"
            bad.append(BadInput(f"ticket {item.id!r}", said))
        else:
            if by_option:
                named[item.id] = found_option[1]
            answers.append((item.id, ticket_trace_id(task.name, item.id), item.text))
    found: set[str] = set()
    for line, expected, request in _result_lines(store, task, answers):
        found.add(line["id"])
        if by_option:
            option = named[line["id"]]
            args = (line["trace_id"], line["option_id"], line["output"], request, option)
            verdicts.append(option_graded(task, *args))
        else:
            verdicts.append(graded(line["trace_id"], line["output"], expected or ""))
    bad += [
        BadInput(f"ticket {ticket_id!r}", "no trace: resolve it first (gil resolve-batch)")
        for ticket_id, _, _ in answers
        if ticket_id not in found
    ]
    return verdicts, bad


def read_feedback(
    store: TelemetryStore,
    task: TaskDefinition,
    path: str | Path,
    *,
    encoding: str = "utf-8",
    key: AnswerKey | None = None,
) -> tuple[list[Verdict], list[BadInput]]:
    """The verdicts a feedback file gives and its bad lines: a verdicts file (``read_verdicts``), or with ``key``
    (where it names each ticket and its right answer) an answer key graded against the store (``key_verdicts``)."""
    if key is None:
        return read_verdicts(path, encoding=encoding)
    tickets = iter_tickets(path, columns=key.columns, encoding=encoding)
    return key_verdicts(store, task, tickets, by_option=key.by_option)


def _result_lines(
    store: TelemetryStore, task: TaskDefinition, triples: Iterable[tuple[str, str, str | None]]
) -> Iterator[tuple[dict[str, Any], str | None, str]]:
    """The result line of each (ticket id, trace id, text) that has a trace, in order, with its text and the
    request the trace keeps (empty for a do-not-record one); the traces read ``_RESULTS_WINDOW`` at a time."""
    source = iter(triples)
    while part := list(itertools.islice(source, _RESULTS_WINDOW)):
        rows = _result_rows(store, [trace_id for _, trace_id, _ in part])
        for ticket_id, trace_id, text in part:
            row = rows.get(trace_id)
            if row is not None:
                yield _result_line(task, ticket_id, trace_id, row), text, row["state"] or ""


_RESULT_FIELDS = ("id", "trace_id", "mode", "output", "option_id", "confidence", "energy", "path", "failure")


def _result_rows(store: TelemetryStore, trace_ids: list[str]) -> dict[str, dict[str, Any]]:
    traces = store.rescanning(
        lambda: (
            store.scan("traces", only={"trace_id": trace_ids})
            .select("trace_id", "state", "mode", "output", "label", "confidence", "energy", "path", "failure")
            .collect()
        )
    )
    return {row["trace_id"]: row for row in traces.iter_rows(named=True)}


def _result_line(task: TaskDefinition, ticket_id: str, trace_id: str, row: Mapping[str, Any]) -> dict[str, Any]:
    option_id = row["label"] if row["mode"].startswith("habit/") else habit_for_text(task.tree, row["output"])
    return {
        "id": ticket_id,
        "trace_id": trace_id,
        "mode": row["mode"],
        "output": row["output"],
        "option_id": option_id,
        "confidence": row["confidence"],
        "energy": row["energy"],
        "path": [step["node"] for step in json.loads(row["path"] or "[]")],
        "failure": row["failure"],
    }
