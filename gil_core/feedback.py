"""Feedback: a verdict stored on its trace, then taught to the habit statistics, the shadows, the learned judge and
memory; and what verdicts taught, as the request path reads it (per-entry memory evidence, the shadow index).

The verdict is durable first, so everything else can be rebuilt from the traces table: a memory that fails to
learn is left to a rebuild from the history (``rebuild_memory``), a missed refit to the next ``refresh_learned``.
Such a memory failure is recorded in the store's ``unlearned_verdicts`` table (``gil stats`` counts it, in any
process, until a relearn of that verdict or a rebuild catches up). See docs/architecture.md, "The way of one
verdict".
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any, cast

import polars as pl
from cachetools import FIFOCache

from gil_core.errors import GilError, SchemaViolationError, UnknownTraceError
from gil_core.habits.attribution import attribute_verdict
from gil_core.habits.costs import evidence_from_row
from gil_core.habits.counters import reliability_rows
from gil_core.habits.shadows import build_shadow_index
from gil_core.judge import Candidate
from gil_core.learned import LearnedState, Learner
from gil_core.memory import FeedbackEvent, Memory, Verdict, rebuild_memory
from gil_core.memory.evidence import MemoryEvidence
from gil_core.tasks import TaskDefinition
from gil_core.telemetry import TelemetryStore
from gil_core.traverse import Step
from gil_core.verdicts import confirmed_answer
from gil_core.wiring import require_learner

__all__ = ["Feedback", "TraceRow"]

_log = logging.getLogger(__name__)

_RECENT_TRACES = 10_000


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One row of the ``traces`` table as stored: its columns in order, ``path`` and ``recall`` as their JSON text
    (``TraceRecord`` is what a request records; this is what the table gives back)."""

    trace_id: str
    created_at: datetime
    task: str
    state: str
    mode: str
    path: str
    output: str | None
    confidence: float | None
    energy: float
    feedback_verdict: str | None
    feedback_correction: str | None
    implicit_signal: str | None
    label: str | None
    explored_output: str | None
    recall: str | None
    failure: str | None
    decider: str | None = None
    batch_id: str | None = None
    flow_run_id: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TraceRow:
        """The row a read (or ``TelemetryStore.record_trace``) gives; a column it leaves out is null."""
        unknown = sorted(set(row) - set(_COLUMNS))
        if unknown:
            raise SchemaViolationError(f"unknown columns {unknown}; TraceRow holds {list(_COLUMNS)}", table="traces")
        values: dict[str, Any] = {name: row.get(name) for name in _COLUMNS}
        return cls(**values)

    def to_row(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _COLUMNS}

    def steps(self) -> list[Step]:
        """The walk's steps, as much of them as a verdict's attribution reads."""
        return [
            Step(
                node=item["node"],
                layer=item.get("layer") or 0,
                outcome=item["outcome"],
                chosen=item.get("chosen"),
                p=item.get("p"),
            )
            for item in json.loads(self.path or "[]")
        ]

    @property
    def recall_source(self) -> str | None:
        """The key of the memory entry the request recalled, if any."""
        return (json.loads(self.recall) or {}).get("source") if self.recall else None

    def event(self) -> FeedbackEvent:
        """The verdict this row carries, as memory's replay reads it."""
        return FeedbackEvent(
            trace_id=self.trace_id,
            text=self.state,
            mode=self.mode,
            output=self.output,
            verdict=cast(Verdict, self.feedback_verdict),
            correction=self.feedback_correction,
            recall_source=self.recall_source,
        )


_COLUMNS: tuple[str, ...] = tuple(item.name for item in fields(TraceRow))

_REASON_CHARS = 500  # of a failure's text kept in ``unlearned_verdicts``: the log has it whole


def _unlearned_row(task: str, trace_id: str, reason: str | None) -> dict[str, Any]:
    """A row of ``unlearned_verdicts``: memory failed to learn the verdict on ``trace_id`` (``reason``), or, with no
    reason, it caught up."""
    return {"trace_id": trace_id, "task": task, "at": datetime.now(UTC), "learned": reason is None, "reason": reason}


class Feedback:
    """Verdicts on one store's traces and what they teach: habit statistics (in the store), the shadows and each
    memory entry's evidence (kept here), the learned judges (``learner``) and ``memory``."""

    def __init__(self, store: TelemetryStore, *, memory: Memory | None, learner: Learner | None) -> None:
        self._store = store
        self._memory = memory
        self._learner = learner
        # Rows of traces this resolver stored recently: feedback usually follows soon, and a scan of the
        # traces table costs a read of every file in it. The oldest stored goes first: a read keeps a row no longer.
        self._recent: FIFOCache[str, TraceRow] = FIFOCache(_RECENT_TRACES)
        self._recent_lock = threading.Lock()  # cachetools caches are not thread-safe
        self._evidence_by_task: dict[str, MemoryEvidence] = {}
        self._shadows: dict[str, Mapping[str, list[Candidate]]] = {}
        # Per task, the traces whose verdict memory has not learned (``unlearned_verdicts``), read on first need.
        self._unlearned: dict[str, set[str]] = {}

    def keep(self, row: Mapping[str, Any]) -> None:
        """Keep the row of a trace just stored, for the verdict that usually follows."""
        self._keep(TraceRow.from_row(row))

    async def give(self, task: TaskDefinition, trace_id: str, correct: bool, correction: str | None = None) -> bool:
        """Record a verdict on a trace, then teach habit statistics and memory from it.

        The verdict is durable first. Returns whether memory learned it: a memory that fails is logged as a
        warning, recorded in ``unlearned_verdicts`` (``gil stats`` counts it) and returns False (never swallowed:
        ``apply_verdicts`` counts it as ``not_learned``), the verdict standing and a rebuild from the history
        replaying it. A failure to record that raises (``TelemetryError``).
        """
        row = self._trace(task.name, trace_id)
        verdict = "correct" if correct else "wrong"
        correction = correction.strip() if correction and correction.strip() else None
        judged = replace(row, feedback_verdict=verdict, feedback_correction=correction if not correct else None)
        deltas = attribute_verdict(
            task.tree, mode=row.mode, steps=row.steps(), output=row.output, correct=correct, correction=correction
        )
        self._store.append_many({"traces": [judged.to_row()], "habit_reliability": reliability_rows(task.name, deltas)})
        self._keep(judged)
        self._shadows.pop(task.name, None)
        if task.policy.learned is not None and self._learner is not None:
            self._learner.note_feedback(task.name)
        return await self._learn(task, row, correct, correction)

    async def relearn(self, task: TaskDefinition, trace_id: str) -> bool:
        """Teach memory the verdict ``trace_id`` already carries (after a crash between storing a verdict and
        memory learning it). Idempotent; habit statistics are not touched. A trace without a verdict: nothing."""
        row = self._trace(task.name, trace_id)
        if row.feedback_verdict is None or task.policy.memory_threshold is None or self._memory is None:
            return True
        correct = row.feedback_verdict == "correct"
        return await self._learn(task, row, correct, row.feedback_correction, count=False)

    async def refresh_learned(self, task: TaskDefinition, *, force: bool = False) -> LearnedState | None:
        """Bring the task's learned judge up to the log: refit it when feedback arrived, when it is missing,
        stale or unreadable (or ``force``), else pick up a newer one another process stored. None when the task
        has no ``learned_reflex``."""
        if task.policy.learned is None:
            return None
        return await require_learner(self._learner, task).refresh(task, force=force)

    def history(self, task: str) -> list[FeedbackEvent]:
        """Every verdict the store holds for ``task`` (the latest on each trace), in the order they were given, as
        live feedback taught memory: the store's write order (its order key, which no clock skew reorders), not
        the requests' ``created_at``."""
        return [TraceRow.from_row(row).event() for row in self._judged(task).iter_rows(named=True)]

    async def rebuild_memory(self, task: TaskDefinition) -> int:
        """Make the task's memory hold what its feedback history confirms (after a loss, or for a new store).

        Returns how many entries it holds afterwards.
        """
        if self._memory is None:
            return 0
        await rebuild_memory(self._memory, task.name, self.history(task.name))
        self._unlearned.pop(task.name, None)  # read again: another process may have recorded failures
        caught_up = self._unlearned_of(task.name)
        if caught_up:
            self._store.append("unlearned_verdicts", [_unlearned_row(task.name, key, None) for key in caught_up])
            caught_up.clear()
        return len(await self._memory.entries(task.name))

    def memory_evidence(self, task: TaskDefinition) -> MemoryEvidence:
        """The task's per-entry evidence, read off the log once and then kept current by ``give``."""
        evidence = self._evidence_by_task.get(task.name)
        if evidence is None:
            evidence = self._evidence_by_task[task.name] = self._store.rescanning(
                lambda: MemoryEvidence.from_log(self._store.scan("traces"), task.name)
            )
        return evidence

    def shadows(self, task: TaskDefinition) -> Mapping[str, list[Candidate]]:
        """The answers confirmed at the task's leaves that are not habits yet, per node; read again after a verdict."""
        cached = self._shadows.get(task.name)
        if cached is None:
            judged = self._judged(
                task.name,
                "state",
                "path",
                "mode",
                "output",
                "feedback_verdict",
                "feedback_correction",
                "explored_output",
            )
            evidence = [row for row in map(evidence_from_row, judged.iter_rows(named=True)) if row is not None]
            cached = build_shadow_index(task.tree, evidence, exclude=(task.language.none_of_these,))
            self._shadows[task.name] = cached
        return cached

    async def _learn(
        self, task: TaskDefinition, row: TraceRow, correct: bool, correction: str | None, *, count: bool = True
    ) -> bool:
        """Memory learns a verdict: a wrong memory hit forgets its source; the confirmed answer is remembered.
        True when it did (or had nothing to learn), False when memory failed (logged, and recorded in
        ``unlearned_verdicts``; a later success on the same trace records that it caught up)."""
        if task.policy.memory_threshold is None or self._memory is None:
            return True
        source = row.recall_source
        if count and row.mode == "memory" and source and task.name in self._evidence_by_task:
            self._evidence_by_task[task.name].record(row.trace_id, source, correct)
        try:
            if row.mode == "memory" and not correct and source:
                await self._memory.forget(task.name, source)
            answer = confirmed_answer("correct" if correct else "wrong", row.output, correction)
            if answer and row.state:  # a private trace has no text to remember
                await self._memory.remember(task.name, row.trace_id, row.state, answer)
            else:  # nothing confirmed: a verdict given earlier on this trace no longer stands
                await self._memory.forget(task.name, row.trace_id)
        except (GilError, OSError) as exc:  # memory is a cache: the verdict is stored, and a rebuild replays it
            _log.warning(
                "task %r: memory did not learn the verdict on trace %s (%s: %s); rebuild-memory replays it",
                task.name,
                row.trace_id,
                type(exc).__name__,
                exc,
            )
            reason = f"{type(exc).__name__}: {exc}"[:_REASON_CHARS]
            self._store.append("unlearned_verdicts", [_unlearned_row(task.name, row.trace_id, reason)])
            self._unlearned_of(task.name).add(row.trace_id)
            return False
        unlearned = self._unlearned_of(task.name)
        if row.trace_id in unlearned:
            self._store.append("unlearned_verdicts", [_unlearned_row(task.name, row.trace_id, None)])
            unlearned.discard(row.trace_id)
        return True

    def _unlearned_of(self, task: str) -> set[str]:
        """The traces of ``task`` whose verdict memory has not learned, as the store says (read once, then kept)."""
        unlearned = self._unlearned.get(task)
        if unlearned is None:
            rows = self._store.rescanning(
                lambda: (
                    self._store.scan("unlearned_verdicts")
                    .filter((pl.col("task") == task) & ~pl.col("learned"))
                    .select("trace_id")
                    .collect()
                )
            )
            unlearned = self._unlearned[task] = set(rows["trace_id"].to_list())
        return unlearned

    def _trace(self, task: str, trace_id: str) -> TraceRow:
        with self._recent_lock:
            row = self._recent.get(trace_id)
        if row is None:
            rows = self._store.rescanning(
                lambda: self._store.scan("traces").filter(pl.col("trace_id") == trace_id).collect()
            )
            if rows.is_empty():
                raise UnknownTraceError(f"no trace {trace_id!r} in {self._store.root}", trace_id=trace_id, task=task)
            row = TraceRow.from_row(rows.row(0, named=True))
        if row.task != task:
            # Tenants never see each other's traces: say only that this task has no such trace.
            raise UnknownTraceError(f"task {task!r} has no trace {trace_id!r}", trace_id=trace_id, task=task)
        return row

    def _keep(self, row: TraceRow) -> None:
        with self._recent_lock:
            self._recent[row.trace_id] = row

    def _judged(self, task: str, *columns: str) -> pl.DataFrame:
        """The task's traces that carry a verdict (``columns`` of them, or all), in the store's write order."""

        def read() -> pl.DataFrame:
            traces = self._store.scan("traces").filter(
                (pl.col("task") == task) & pl.col("feedback_verdict").is_not_null()
            )
            return (traces.select(columns) if columns else traces).collect()

        return self._store.rescanning(read)
