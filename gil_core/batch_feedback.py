"""Verdicts applied in order, a batch at a time: a verdict the trace already carries is not applied twice, so a
rerun after a crash counts nothing twice, and an unknown trace is reported while the rest go on.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gil_core._ticket_files import BadInput, Verdict
from gil_core.errors import ConfigurationError
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition

__all__ = ["VERDICT_CHUNK", "FeedbackReport", "apply_verdicts"]

VERDICT_CHUNK = 1_000  # verdicts stored in one append and taught to memory in one write


@dataclass
class FeedbackReport:
    applied: int = 0
    unchanged: int = 0
    failed: list[BadInput] = field(default_factory=list)
    not_learned: int = 0  # verdicts stored (applied or unchanged) that memory failed to learn: a rebuild replays them

    def to_json(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "unchanged": self.unchanged,
            "failed": [str(item) for item in self.failed],
            "not_learned": self.not_learned,
        }


async def apply_verdicts(
    resolver: Resolver, task: TaskDefinition, verdicts: Iterable[Verdict], *, chunk: int = VERDICT_CHUNK
) -> FeedbackReport:
    """Apply verdicts in order, ``chunk`` at a time (each chunk stored in one append and taught to memory in one
    write). A verdict the trace already carries is not applied twice (so a rerun after a crash counts nothing
    twice) but taught to memory again, before the chunk's new ones; an unknown trace is reported and the rest
    go on."""
    if chunk < 1:
        raise ConfigurationError(f"chunk must be at least 1, got {chunk}")
    report = FeedbackReport()
    given = _given_verdicts(resolver, task.name)
    stream = iter(verdicts)
    while part := list(itertools.islice(stream, chunk)):
        await _apply_chunk(resolver, task, part, given, report)
    if report.applied:
        await resolver.refresh_learned(task)  # the touched nodes refit before the next batch
    return report


async def _apply_chunk(
    resolver: Resolver,
    task: TaskDefinition,
    verdicts: list[Verdict],
    given: dict[str, tuple[str, str | None]],
    report: FeedbackReport,
) -> None:
    pending: dict[str, tuple[str, str | None]] = {}  # what this chunk gives, per trace
    plan: list[tuple[bool, Verdict]] = []  # (applied here, verdict) in order; else a repeat of a pending one
    carried: list[str] = []  # verdicts the traces already carry: taught to memory again
    for verdict in verdicts:
        correction = (verdict.correction or "").strip() or None
        wanted = ("correct" if verdict.correct else "wrong", None if verdict.correct else correction)
        if pending.get(verdict.trace_id) == wanted:
            plan.append((False, verdict))
        elif verdict.trace_id not in pending and given.get(verdict.trace_id) == wanted:
            report.unchanged += 1
            carried.append(verdict.trace_id)
        else:
            pending[verdict.trace_id] = wanted
            plan.append((True, verdict))
    # Memory may not have learnt the carried verdicts before a crash (idempotent: an entry is keyed by its trace
    # id); habit statistics are not counted twice.
    if carried and not await resolver.relearn(task, carried):
        report.not_learned += len(carried)
    outcome = await resolver.feedback_many(task, [verdict for applied, verdict in plan if applied])
    unknown = {error.trace_id: error for error in outcome.unknown}
    repeats = 0
    for applied, verdict in plan:
        error = unknown.get(verdict.trace_id)
        if error is not None:
            report.failed.append(BadInput(f"trace {verdict.trace_id!r}", str(error)))
        elif applied:
            report.applied += 1
        else:
            report.unchanged += 1
            repeats += 1
    given.update((trace_id, wanted) for trace_id, wanted in pending.items() if trace_id not in unknown)
    if not outcome.learned:  # stored, so applied; memory's failure was logged
        report.not_learned += outcome.stored + repeats


def _given_verdicts(resolver: Resolver, task: str) -> dict[str, tuple[str, str | None]]:
    store = resolver.store
    rows = store.rescanning(
        lambda: (
            store.scan("traces")
            .filter((pl.col("task") == task) & pl.col("feedback_verdict").is_not_null())
            .select("trace_id", "feedback_verdict", "feedback_correction")
            .collect()
        )
    )
    return {row[0]: (row[1], row[2]) for row in rows.iter_rows()}
