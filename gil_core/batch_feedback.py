"""Verdicts applied in order, a batch at a time: a verdict the trace already carries is not applied twice, so a
rerun after a crash counts nothing twice, and an unknown trace is reported while the rest go on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gil_core._ticket_files import BadInput, Verdict
from gil_core.errors import UnknownTraceError
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition

__all__ = ["FeedbackReport", "apply_verdicts"]


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
            learned = await resolver.feedback(task, verdict.trace_id, verdict.correct, verdict.correction)
        except UnknownTraceError as exc:
            report.failed.append(BadInput(f"trace {verdict.trace_id!r}", str(exc)))
            continue
        given[verdict.trace_id] = wanted
        report.applied += 1
        report.not_learned += not learned  # stored, so applied; memory's failure was logged
    # Verdicts already stored (a rerun): memory may not have learnt them before a crash, so teach them again
    # (idempotent: an entry is keyed by its trace id); habit statistics are not counted twice.
    for trace_id in stored:
        report.not_learned += not await resolver.relearn(task, trace_id)
    if report.applied:
        await resolver.refresh_learned(task)  # the touched nodes refit before the next batch
    return report


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
