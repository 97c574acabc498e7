"""Batches: queued tickets resolved with bounded concurrency, idempotent by ticket id, and verdicts applied.

A ticket's trace id is derived from its task and ticket id, so a rerun (after a crash, or by a scheduler that
fires twice) resolves only the tickets that have no trace yet, and never stores a second trace for a ticket.
One bad ticket is reported and skipped; the rest of the batch runs.

A batch spread over several processes is cut into chunks (``plan_chunks``); each process opens its own runtime
and resolves its chunks with ``resolve_batch``, and ``BatchReport.merged`` puts the reports back together. Since
the trace id depends only on task and ticket, it does not matter which process resolved a ticket.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import polars as pl

from gil_core.errors import ConfigurationError, GilError, SchemaViolationError, TelemetryError, UnknownTraceError
from gil_core.habits.attribution import habit_for_text
from gil_core.resolver import Resolver
from gil_core.settings import load_settings
from gil_core.taskfile import ModelSpec, TaskFile
from gil_core.tasks import TaskDefinition
from gil_core.telemetry import TelemetryStore

__all__ = [
    "BadInput",
    "BatchReport",
    "FeedbackReport",
    "Ticket",
    "Verdict",
    "apply_verdicts",
    "model_endpoints",
    "pending_tickets",
    "plan_chunks",
    "read_tickets",
    "read_verdicts",
    "resolve_batch",
    "share_client_budget",
    "ticket_trace_id",
    "write_results",
]

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class Ticket:
    id: str
    text: str


@dataclass(frozen=True, slots=True)
class Verdict:
    trace_id: str
    correct: bool
    correction: str | None = None


@dataclass(frozen=True, slots=True)
class BadInput:
    """An input line or ticket that could not be used: where it was and why."""

    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


@dataclass
class BatchReport:
    resolved: int = 0
    skipped: int = 0
    failed: list[BadInput] = field(default_factory=list)
    trace_ids: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "resolved": self.resolved,
            "skipped": self.skipped,
            "failed": [str(item) for item in self.failed],
            "tickets": len(self.trace_ids),
        }

    @classmethod
    def merged(cls, reports: Iterable[BatchReport]) -> BatchReport:
        """One report for a batch resolved in parts (chunks); the parts' tickets are disjoint."""
        total = cls()
        for report in reports:
            total.resolved += report.resolved
            total.skipped += report.skipped
            total.failed += report.failed
            total.trace_ids |= report.trace_ids
        return total


@dataclass
class FeedbackReport:
    applied: int = 0
    unchanged: int = 0
    failed: list[BadInput] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"applied": self.applied, "unchanged": self.unchanged, "failed": [str(item) for item in self.failed]}


def ticket_trace_id(task: str, ticket_id: str) -> str:
    """The trace id of a ticket: stable across runs, distinct across tasks."""
    return hashlib.sha256(f"{task}\x1f{ticket_id}".encode()).hexdigest()[:32]


def read_tickets(path: str | Path) -> tuple[list[Ticket], list[BadInput]]:
    """Tickets from JSONL (one ``{"id", "text"}`` per line) or Parquet (columns id, text)."""
    path = Path(path)
    if path.suffix == ".parquet":
        frame = pl.read_parquet(path)
        missing = {"id", "text"} - set(frame.columns)
        if missing:
            return [], [BadInput(str(path), f"missing columns {sorted(missing)}")]
        rows: Iterable[tuple[str, Any]] = (
            (f"{path}: row {index + 1}", row)
            for index, row in enumerate(frame.select("id", "text").iter_rows(named=True))
        )
    else:
        rows = _json_lines(path)
    tickets, bad = [], []
    seen: set[str] = set()
    for where, row in rows:
        if isinstance(row, BadInput):
            bad.append(row)
            continue
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("id"), str | int)
            or not isinstance(row.get("text"), str)
        ):
            bad.append(BadInput(where, 'a ticket needs "id" (string) and "text" (string)'))
            continue
        ticket = Ticket(str(row["id"]), row["text"])
        if not ticket.text.strip():
            bad.append(BadInput(where, f"ticket {ticket.id!r} has no text"))
        elif ticket.id in seen:
            bad.append(BadInput(where, f"ticket id {ticket.id!r} appears twice"))
        else:
            seen.add(ticket.id)
            tickets.append(ticket)
    return tickets, bad


def read_verdicts(path: str | Path) -> tuple[list[Verdict], list[BadInput]]:
    """Verdicts from JSONL: ``{"trace_id", "correct": true|false, "correction"?}`` per line."""
    verdicts, bad = [], []
    for where, row in _json_lines(Path(path)):
        if isinstance(row, BadInput):
            bad.append(row)
        elif (
            not isinstance(row, dict)
            or not isinstance(row.get("trace_id"), str)
            or not isinstance(row.get("correct"), bool)
            or not isinstance(row.get("correction"), str | None)
        ):
            bad.append(BadInput(where, 'a verdict needs "trace_id" (string), "correct" (true/false), "correction"?'))
        else:
            verdicts.append(Verdict(row["trace_id"], row["correct"], row.get("correction")))
    return verdicts, bad


def _json_lines(path: Path) -> Iterator[tuple[str, Any]]:
    # Bytes first, decoded per line: one line that is not UTF-8 is reported, and the rest still run.
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield where, BadInput(where, f"not UTF-8 (byte {exc.start + 1} of the line)")
                continue
            if not line.strip():
                continue
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                yield where, BadInput(where, f"not JSON ({exc.msg})")


async def resolve_batch(
    resolver: Resolver,
    task: TaskDefinition,
    tickets: Iterable[Ticket],
    *,
    concurrency: int = 4,
    progress: Progress | None = None,
    commit_rows: int | None = 1000,
    commit_delay_s: float | None = 0.2,
) -> BatchReport:
    """Resolve every ticket that has no trace yet, at most ``concurrency`` at a time.

    The batch's telemetry is group-committed (``TelemetryStore.group_commit`` with ``commit_rows`` and
    ``commit_delay_s``): a ticket counts as resolved, in the report and in ``progress``, only once its trace is
    flushed (durable). A crash loses at most the tickets not flushed yet, which a rerun resolves again (the trace
    id is the ticket's). ``commit_rows=None`` opens no group: each request is durable on its own when it returns
    (unless the caller holds a group open on the store). A ticket whose trace the store rejected is reported
    failed, with the reason.
    """
    tickets = list(tickets)
    report = BatchReport(trace_ids={t.id: ticket_trace_id(task.name, t.id) for t in tickets})
    # The learned judge meets the batch current: refit after feedback, or picked up from another process.
    await resolver.refresh_learned(task)
    done = existing_trace_ids(resolver.store, task.name)
    todo = [t for t in tickets if report.trace_ids[t.id] not in done]
    report.skipped = len(tickets) - len(todo)
    gate = asyncio.Semaphore(concurrency)
    tally = _Tally(report, len(tickets), progress, {report.trace_ids[t.id]: t.id for t in todo})
    stopped: list[TelemetryError] = []  # the store could not write (a full disk, …): no ticket starts after it

    async def one(ticket: Ticket) -> None:
        async with gate:
            if stopped:
                return  # left for a rerun, like every ticket not acknowledged
            try:
                await resolver.resolve(task, ticket.text, trace_id=report.trace_ids[ticket.id])
            except SchemaViolationError as exc:
                tally.failed(ticket.id, str(exc))
            except TelemetryError as exc:
                stopped.append(exc)
            except GilError as exc:  # the trace, when one was stored, says why; the batch goes on
                tally.failed(ticket.id, str(exc))
            else:
                tally.returned(report.trace_ids[ticket.id])

    tally.report_progress()
    if commit_rows is None:
        tally.durable_on_return = True
        await asyncio.gather(*(one(ticket) for ticket in todo))
        _raise_stopped(stopped, report, len(todo))
        return report
    rejected = "its trace was not stored"
    try:
        with resolver.store.group_commit(max_rows=commit_rows, max_delay_s=commit_delay_s, on_flush=tally.flushed):
            await asyncio.gather(*(one(ticket) for ticket in todo))
            if stopped:
                raise stopped[0]  # leaves the group without acknowledging what is still queued
    except SchemaViolationError as exc:  # rows of some requests were left out; the rest is durable
        rejected = str(exc)
    except TelemetryError as exc:  # the last flush failed as well, or the store stopped the batch
        if not stopped:
            stopped.append(exc)
    tally.settle(rejected if not stopped else "its trace was not stored: the batch stopped")
    _raise_stopped(stopped, report, len(todo))
    return report


def _raise_stopped(stopped: Sequence[TelemetryError], report: BatchReport, todo: int) -> None:
    """The store failed a write during the batch: say so, with what was acknowledged before it stopped."""
    if stopped:
        raise TelemetryError(
            f"{stopped[0]} — the batch stopped with {report.resolved} of its {todo} tickets acknowledged: run it "
            "again to resolve the others"
        ) from stopped[0]


class _Tally:
    """Which tickets are resolved: their ``resolve`` returned and their trace is durable, in either order (a
    flush in the store's thread can come first). The report and ``progress`` change only in the event loop."""

    def __init__(self, report: BatchReport, total: int, progress: Progress | None, tickets: dict[str, str]) -> None:
        self._report, self._total, self._progress, self._tickets = report, total, progress, tickets
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._durable: set[str] = set()  # trace ids of this batch flushed so far (any thread)
        self._returned: set[str] = set()  # resolve returned, trace not known durable yet
        self.durable_on_return = False

    def report_progress(self) -> None:
        if self._progress is not None:
            report = self._report
            self._progress(report.skipped + report.resolved + len(report.failed), self._total)

    def failed(self, ticket_id: str, reason: str) -> None:
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
        if ready:
            self._returned -= ready
            self._report.resolved += len(ready)
            self.report_progress()


def existing_trace_ids(store: TelemetryStore, task: str) -> set[str]:
    traces = store.scan("traces").filter(pl.col("task") == task).select("trace_id").collect()
    return set(traces["trace_id"].to_list())


def pending_tickets(store: TelemetryStore, task: str, tickets: Iterable[Ticket]) -> list[Ticket]:
    """The tickets that have no trace yet, in order."""
    done = existing_trace_ids(store, task)
    return [ticket for ticket in tickets if ticket_trace_id(task, ticket.id) not in done]


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


def model_endpoints(task_file: TaskFile) -> tuple[str, ...]:
    """The model servers a task file's batch talks to, one key per server (``host:port``, or ``local`` for the
    embedded server): what a concurrency bound shared by several processes is keyed by. In-process models
    (``hash``, ``none``, the ``local`` embedder) are no server and have no key."""
    specs = [task_file.chat_model, task_file.embedding_model]
    if task_file.fallback_chat_model is not None:
        specs.append(task_file.fallback_chat_model)
    keys = [_endpoint(spec, chat=spec is not task_file.embedding_model) for spec in specs]
    return tuple(dict.fromkeys(key for key in keys if key is not None))


def _endpoint(spec: ModelSpec, *, chat: bool) -> str | None:
    if spec.kind == "local":
        return "local" if chat else None
    if spec.kind != "remote" or spec.url is None:
        return None
    url = httpx.URL(spec.url)
    return f"{url.host}:{url.port or (443 if url.scheme == 'https' else 80)}"


def share_client_budget(task_file: TaskFile, workers: int) -> TaskFile:
    """The task file as one of ``workers`` processes should run it: each process has its own rate limiter (a
    token bucket in memory), so each gets ``1/workers`` of the requests per second and of the burst, and the
    processes together stay within the configured rate. A limiter that is off stays off."""
    if workers < 1:
        raise ConfigurationError(f"workers must be ≥ 1, got {workers}")
    settings = load_settings(**task_file.client)
    local_unlimited = task_file.chat_model.kind == "local" and "requests_per_second" not in task_file.client
    if workers == 1 or settings.requests_per_second == 0 or local_unlimited:
        return task_file
    client = {
        **task_file.client,
        "requests_per_second": settings.requests_per_second / workers,
        "burst": max(1, settings.burst // workers),
    }
    return replace(task_file, client=client)


def write_results(store: TelemetryStore, task: TaskDefinition, report: BatchReport, out: str | Path) -> int:
    """Write one result line per ticket that has a trace (stable interface, see README), atomically."""
    by_trace = {trace_id: ticket_id for ticket_id, trace_id in report.trace_ids.items()}
    traces = (
        store.scan("traces")
        .filter(pl.col("trace_id").is_in(list(by_trace)))
        .select("trace_id", "mode", "output", "label", "confidence", "energy", "path", "failure")
        .collect()
    )
    rows = {row["trace_id"]: row for row in traces.iter_rows(named=True)}
    out = Path(out)
    temporary = out.with_name(f".{out.name}.tmp")
    written = 0
    with temporary.open("w", encoding="utf-8") as handle:
        for ticket_id, trace_id in report.trace_ids.items():
            row = rows.get(trace_id)
            if row is None:
                continue
            option_id = row["label"] if row["mode"].startswith("habit/") else habit_for_text(task.tree, row["output"])
            line = {
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
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
            written += 1
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, out)
    return written


async def apply_verdicts(resolver: Resolver, task: TaskDefinition, verdicts: Iterable[Verdict]) -> FeedbackReport:
    """Apply verdicts in order. A verdict the trace already carries is not applied twice (so a rerun after a
    crash counts nothing twice); an unknown trace is reported and the rest go on."""
    report = FeedbackReport()
    given = _given_verdicts(resolver, task.name)
    stored: list[str] = []
    for verdict in verdicts:
        correction = (verdict.correction or "").strip() or None
        wanted = ("correct" if verdict.correct else "wrong", None if verdict.correct else correction)
        if given.get(verdict.trace_id) == wanted:
            report.unchanged += 1
            stored.append(verdict.trace_id)
            continue
        try:
            await resolver.feedback(task, verdict.trace_id, verdict.correct, verdict.correction)
        except UnknownTraceError as exc:
            report.failed.append(BadInput(f"trace {verdict.trace_id!r}", str(exc)))
            continue
        given[verdict.trace_id] = wanted
        report.applied += 1
    # Verdicts already stored (a rerun): memory may not have learnt them before a crash, so teach them again
    # (idempotent: an entry is keyed by its trace id); habit statistics are not counted twice.
    for trace_id in stored:
        await resolver.relearn(task, trace_id)
    if report.applied:
        await resolver.refresh_learned(task)  # the touched nodes refit before the next batch
    return report


def _given_verdicts(resolver: Resolver, task: str) -> dict[str, tuple[str, str | None]]:
    rows = (
        resolver.store.scan("traces")
        .filter((pl.col("task") == task) & pl.col("feedback_verdict").is_not_null())
        .select("trace_id", "feedback_verdict", "feedback_correction")
        .collect()
    )
    return {row[0]: (row[1], row[2]) for row in rows.iter_rows()}
