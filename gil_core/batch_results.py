"""A batch's files besides its tickets: the results file written from the traces (a sheet for a person to
judge, when it is a ``.csv`` or ``.tsv``), and the verdicts an answer key or a verdicts file gives.
``gil_core.batch`` re-exports the public names.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gil_core._sheet_files import write_sheet
from gil_core._ticket_files import CSV_DELIMITERS, BadInput, Ticket, Verdict, iter_tickets, read_verdicts
from gil_core.atomic import atomic_open
from gil_core.batch_feedback import AnswerKey, graded, key_option, option_graded
from gil_core.batch_plan import ticket_trace_id
from gil_core.errors import BatchFileError, ConfigurationError
from gil_core.habits.attribution import habit_for_text
from gil_core.ontology import Option
from gil_core.tasks import TaskDefinition
from gil_core.telemetry import TelemetryStore

__all__ = ["Resolved", "key_verdicts", "read_feedback", "write_results"]

_RESULTS_WINDOW = 20_000  # tickets whose trace rows are read together while the results file is written


@runtime_checkable
class Resolved(Protocol):
    """What a batch resolved, as its report (``gil_core.batch.BatchReport``) gives it: each ticket's trace id by
    ticket id."""

    @property
    def trace_ids(self) -> Mapping[str, str]: ...


def write_results(
    store: TelemetryStore, task: TaskDefinition, tickets: Resolved | Iterable[Ticket], out: str | Path
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
        if isinstance(tickets, Resolved)
        else ((ticket.id, ticket_trace_id(task.name, ticket.id), ticket.text) for ticket in tickets)
    )
    lines = _result_lines(store, task, triples)
    if Path(out).suffix in CSV_DELIMITERS:
        texts = not isinstance(tickets, Resolved) and not task.policy.do_not_record
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
