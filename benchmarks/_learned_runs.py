"""Running one arm of the learned-reflex benchmark over a stream, chunk by chunk, prequentially: each chunk is
resolved as a batch (``gil_core.batch.resolve_batch``, what the resolve-batch flow runs), then every answer gets
its verdict from the stream's answer key (``apply_verdicts``, what the apply-feedback flow runs), so each request
is judged before its verdict arrives. Each finished chunk is written to its own file at once, and a run that is
started again resumes after the last finished chunk (a chunk cut short is resolved again: batches are idempotent
by ticket id), so a run may span several sittings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks._quality_streams import Request
from gil_core.atomic import atomic_write_text
from gil_core.batch import Ticket, Verdict, resolve_batch, ticket_trace_id
from gil_core.batch_feedback import apply_verdicts
from gil_core.llm import ChatModel
from gil_core.runtime import open_runtime
from gil_core.taskfile import TaskFile
from gil_core.tasks import TaskDefinition

__all__ = ["CHUNK", "JUDGING_ROLES", "Record", "normalized", "read_records", "run_chunks"]

CHUNK = 50
JUDGING_ROLES = frozenset({"embed", "judge", "verify"})
"""Calls that decide (memory lookups, judgments, verifications); the rest (generation, slot filling) produce."""


def normalized(text: str) -> str:
    """What "the same text" means for never-seen: lower case, white space collapsed."""
    return re.sub(r"\s+", " ", text.lower()).strip()


@dataclass(frozen=True, slots=True)
class Record:
    """One request of one arm: where it stood in the stream, what came back, who settled it, what it cost."""

    position: int
    id: str
    expected: str
    option: str | None
    category: str | None
    output: str | None
    mode: str
    decider: str | None
    never_seen: bool
    judging_energy: float
    producing_energy: float
    steps: tuple[tuple[str, str | None], ...]  # (node, decided_by) per step
    judgments: int = 0  # the LLM's judgment calls the trace made (audits included; chunks written before: 0)

    @property
    def right(self) -> bool:
        return (self.output or "").strip() == self.expected

    @property
    def energy(self) -> float:
        return self.judging_energy + self.producing_energy

    @property
    def guessed(self) -> bool:
        """A walk the LLM did not settle somewhere, settled there by the learned judge's guess."""
        return any(decided_by == "guess" for _, decided_by in self.steps)

    @property
    def settled_without_llm(self) -> bool:
        """Memory, or a walk every step of which the learned judge served, with an answer (no generation); a
        guess is no served step, even one made without asking the LLM (which counts for the learned decider)."""
        return self.decider in ("memory", "learned") and not self.guessed


def read_records(directory: Path) -> list[Record]:
    """Every finished chunk of an arm, in stream order."""
    records: list[Record] = []
    for path in sorted(directory.glob("chunk-*.json")):
        for item in json.loads(path.read_text(encoding="utf-8")):
            item["steps"] = tuple(tuple(step) for step in item["steps"])
            records.append(Record(**item))
    return records


async def run_chunks(
    task_file: TaskFile,
    task: TaskDefinition,
    requests: Sequence[Request],
    directory: Path,
    *,
    categories: Mapping[str, str | None],
    chat: ChatModel | None = None,
    feedback: bool = True,
    log: Any = print,
    written_only: bool = False,
) -> list[Record]:
    """Resolve ``requests`` in chunks of ``CHUNK`` with feedback after each (module doc); returns every record,
    the resumed chunks' included. ``categories`` maps a request id to the top category of its answer.
    ``written_only``: run nothing, return the records of the chunks written so far (up to the first missing)."""
    if written_only:
        records_so_far: list[Record] = []
        for start in range(0, len(requests), CHUNK):
            if not (directory / f"chunk-{start // CHUNK:04d}.json").exists():
                break
            records_so_far += [r for r in read_records(directory) if start <= r.position < start + CHUNK]
        return records_so_far
    directory.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    records: list[Record] = []
    async with open_runtime(task_file, chat=chat) as runtime:
        for start in range(0, len(requests), CHUNK):
            chunk = list(requests[start : start + CHUNK])
            never_seen = []
            for request in chunk:
                never_seen.append(normalized(request.text) not in seen)
                seen.add(normalized(request.text))
            path = directory / f"chunk-{start // CHUNK:04d}.json"
            if path.exists():
                records += [r for r in read_records(directory) if start <= r.position < start + len(chunk)]
                continue
            tickets = [Ticket(request.id, request.text) for request in chunk]
            report = await resolve_batch(runtime.resolver, task, tickets, concurrency=task_file.concurrency)
            for failure in report.failed:
                log(f"  {failure}")
            rows = _rows(runtime.store, task.name, [ticket_trace_id(task.name, t.id) for t in tickets])
            done = []
            for offset, (request, fresh) in enumerate(zip(chunk, never_seen, strict=True)):
                row = rows.get(ticket_trace_id(task.name, request.id))
                done.append(_record(start + offset, request, fresh, row, categories.get(request.id)))
            if feedback:
                verdicts = [
                    Verdict(ticket_trace_id(task.name, r.id), r.right, None if r.right else r.expected) for r in done
                ]
                await apply_verdicts(runtime.resolver, task, verdicts)
            _write(path, done)
            records += done
            right = sum(r.right for r in done)
            served = sum(r.settled_without_llm for r in done)
            # A model that could not be reached answers nothing and costs nothing: say so where it happens.
            broken = sum(1 for t in tickets if str((rows.get(ticket_trace_id(task.name, t.id)) or {}).get("failure")
                                                   or "").startswith("model failed"))  # fmt: skip
            failed = f", {broken} model failures" if broken else ""
            log(
                f"  {task.name} chunk {start // CHUNK + 1}: {right}/{len(done)} right, {served} without the LLM{failed}"
            )
    return records


def _rows(store: Any, task: str, trace_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Per trace: its row, and the energy of its calls split into judging and producing."""
    traces = store.scan("traces").filter(pl.col("trace_id").is_in(trace_ids)).collect()
    calls = (
        store.scan("calls")
        .filter(pl.col("trace_id").is_in(trace_ids))
        .group_by("trace_id", pl.col("role").is_in(list(JUDGING_ROLES)).alias("judging"))
        .agg(pl.col("energy").sum(), judgments=(pl.col("role") == "judge").sum())
        .collect()
    )
    energy: dict[tuple[str, bool], float] = {(row[0], row[1]): row[2] for row in calls.iter_rows()}
    judgments: dict[str, int] = {}
    for row in calls.iter_rows():
        judgments[row[0]] = judgments.get(row[0], 0) + int(row[3])
    out = {}
    for row in traces.iter_rows(named=True):
        row["judging_energy"] = energy.get((row["trace_id"], True), 0.0)
        row["producing_energy"] = energy.get((row["trace_id"], False), 0.0)
        row["judgments"] = judgments.get(row["trace_id"], 0)
        out[row["trace_id"]] = row
    return out


def _record(
    position: int, request: Request, never_seen: bool, row: Mapping[str, Any] | None, category: str | None
) -> Record:
    if row is None:  # the ticket failed (its reason was logged): no answer, nothing spent that was stored
        return Record(
            position, request.id, request.expected, request.option_id, category, None, "failed", None, never_seen,
            0.0, 0.0, (),
        )  # fmt: skip
    steps = tuple((step["node"], step.get("decided_by")) for step in json.loads(row["path"] or "[]"))
    return Record(
        position=position,
        id=request.id,
        expected=request.expected,
        option=request.option_id,
        category=category,
        output=row["output"],
        mode=row["mode"],
        decider=row["decider"],
        never_seen=never_seen,
        judging_energy=float(row["judging_energy"]),
        producing_energy=float(row["producing_energy"]),
        steps=steps,
        judgments=int(row["judgments"]),
    )


def _write(path: Path, records: Sequence[Record]) -> None:
    atomic_write_text(path, json.dumps([asdict(record) for record in records], ensure_ascii=False))
