"""Verdicts applied in order, a batch at a time: a verdict the trace already carries is not applied twice, so a
rerun after a crash counts nothing twice, and an unknown trace is reported while the rest go on.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gil_core._ticket_files import BadInput, Verdict
from gil_core.errors import ConfigurationError
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition

__all__ = ["VERDICT_CHUNK", "FeedbackReport", "apply_verdicts", "graded"]

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


def graded(trace_id: str, output: str | None, expected: str) -> Verdict:
    """The verdict an answer key gives a trace: right when its output is the expected answer (spaces around either
    aside), else wrong, with the expected answer as the correction."""
    if (output or "").strip() == expected.strip():
        return Verdict(trace_id, True)
    return Verdict(trace_id, False, expected.strip())


async def apply_verdicts(
    resolver: Resolver, task: TaskDefinition, verdicts: Iterable[Verdict], *, chunk: int = VERDICT_CHUNK
) -> FeedbackReport:
    """Apply verdicts in order, ``chunk`` at a time (each chunk stored in one append and taught to memory in one
    write). A verdict the trace already carries is not applied twice (so a rerun after a crash counts nothing
    twice) but taught to memory again; an unknown trace is reported and the rest go on."""
    if chunk < 1:
        raise ConfigurationError(f"chunk must be at least 1, got {chunk}")
    report = FeedbackReport()
    stream = iter(verdicts)
    while part := list(itertools.islice(stream, chunk)):
        outcome = await resolver.feedback_many(task, part, skip_carried=True)
        report.applied += outcome.stored
        report.unchanged += outcome.carried
        report.failed.extend(BadInput(f"trace {error.trace_id!r}", str(error)) for error in outcome.unknown)
        if not outcome.learned:  # stored, so applied; memory's failure was logged
            report.not_learned += outcome.stored + outcome.carried
    if report.applied:
        await resolver.refresh_learned(task)  # the touched nodes refit before the next batch
    return report
