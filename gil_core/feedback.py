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
import pickle
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple, cast

import polars as pl
from cachetools import FIFOCache

from gil_core._ticket_files import Verdict
from gil_core.answer_versions import StaleEntries, TreeChange, changed_answers, confirmed_version
from gil_core.errors import GilError, SchemaViolationError, UnknownTraceError
from gil_core.habits.attribution import AnswerIndex, attribute_verdict
from gil_core.habits.costs import EVIDENCE_COLUMNS, evidence_from_row
from gil_core.habits.counters import reliability_rows
from gil_core.habits.shadows import build_shadow_index, may_shadow_rows
from gil_core.judge import Candidate
from gil_core.learned import LearnedState, Learner
from gil_core.memory import FeedbackEvent, Memory, MemoryChanges, plan_memory, rebuild_memory
from gil_core.memory import Verdict as VerdictWord
from gil_core.memory.evidence import MemoryEvidence
from gil_core.ontology import Tree
from gil_core.tasks import TaskDefinition
from gil_core.telemetry import TelemetryStore
from gil_core.traverse import Step
from gil_core.verdicts import confirmed_answer
from gil_core.wiring import require_learner

__all__ = ["Feedback", "GivenVerdicts", "TraceRow"]

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
    answer_version: str | None = None

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
            verdict=cast(VerdictWord, self.feedback_verdict),
            correction=self.feedback_correction,
            recall_source=self.recall_source,
            answer_version=self.answer_version,
        )


_COLUMNS: tuple[str, ...] = tuple(item.name for item in fields(TraceRow))


class _RecentRows:
    """The rows of the traces a resolver stored last, the oldest stored going first (a read keeps a row no longer).

    Each row is held as one compressed string of bytes: a row as a dataclass of Python strings took ~1.5 KB and
    ~20 objects, scattered through the allocator's pools as the batch's short-lived objects came and went; as
    one block it takes ~0.7 KB (RELIABILITY.md, "Findings"). Only rows this object wrote are ever read
    back. Not thread-safe: the caller holds a lock."""

    def __init__(self, capacity: int) -> None:
        self._rows: FIFOCache[str, bytes] = FIFOCache(capacity)

    def put(self, row: TraceRow) -> None:
        values = tuple(getattr(row, name) for name in _COLUMNS)
        self._rows[row.trace_id] = zlib.compress(pickle.dumps(values, pickle.HIGHEST_PROTOCOL), 1)

    def get(self, trace_id: str) -> TraceRow | None:
        held = self._rows.get(trace_id)
        return None if held is None else TraceRow(*pickle.loads(zlib.decompress(held)))  # written by ``put``

    def __len__(self) -> int:
        return len(self._rows)


_REASON_CHARS = 500  # of a failure's text kept in ``unlearned_verdicts``: the log has it whole
_NAMED_TRACES = 5  # trace ids a warning names when memory failed to learn a chunk of verdicts


def _unlearned_row(task: str, trace_id: str, reason: str | None) -> dict[str, Any]:
    """A row of ``unlearned_verdicts``: memory failed to learn the verdict on ``trace_id`` (``reason``), or, with no
    reason, it caught up."""
    return {"trace_id": trace_id, "task": task, "at": datetime.now(UTC), "learned": reason is None, "reason": reason}


class _Lesson(NamedTuple):
    """A verdict as memory learns it: the trace's row as answered, whether it was right, the correction, and
    whether the memory evidence counts it (not when it was counted before, on a verdict the trace carried)."""

    row: TraceRow
    correct: bool
    correction: str | None
    counted: bool


@dataclass
class GivenVerdicts:
    """What ``Feedback.give_many`` did: how many verdicts it stored, how many the traces carried already (not
    stored again), the ones on traces the task does not have (each its error; the others went on), and whether
    memory learned the stored and carried ones."""

    stored: int = 0
    carried: int = 0
    unknown: list[UnknownTraceError] = field(default_factory=list)
    learned: bool = True


class Feedback:
    """Verdicts on one store's traces and what they teach: habit statistics (in the store), the shadows and each
    memory entry's evidence (kept here), the learned judges (``learner``) and ``memory``."""

    def __init__(
        self,
        store: TelemetryStore,
        *,
        memory: Memory | None,
        learner: Learner | None,
        answers: Callable[[TaskDefinition], AnswerIndex] | None = None,
    ) -> None:
        self._store = store
        self._memory = memory
        self._learner = learner
        self._answers = answers or (lambda task: AnswerIndex(task.tree))
        self._stale = StaleEntries(self._stale_of)
        # Rows of traces this resolver stored recently: feedback usually follows soon, and a scan of the
        # traces table costs a read of every file in it.
        self._recent = _RecentRows(_RECENT_TRACES)
        self._recent_lock = threading.Lock()  # cachetools caches are not thread-safe
        self._evidence_by_task: dict[str, MemoryEvidence] = {}
        self._shadows: dict[str, Mapping[str, list[Candidate]]] = {}
        # Per task, the traces whose verdict memory has not learned (``unlearned_verdicts``), read on first need.
        self._unlearned: dict[str, set[str]] = {}

    def keep(self, row: Mapping[str, Any]) -> None:
        """Keep the row of a trace just stored, for the verdict that usually follows."""
        self._keep(TraceRow.from_row(row))

    async def give(self, task: TaskDefinition, trace_id: str, correct: bool, correction: str | None = None) -> bool:
        """Record a verdict on a trace, then teach habit statistics and memory from it (``give_many`` of one):
        whether memory learned it. Raises ``UnknownTraceError`` when the task has no such trace."""
        given = await self.give_many(task, [Verdict(trace_id, correct, correction)])
        if given.unknown:
            raise given.unknown[0]
        return given.learned

    async def give_many(
        self, task: TaskDefinition, verdicts: Sequence[Verdict], *, skip_carried: bool = False
    ) -> GivenVerdicts:
        """Record verdicts on traces, in order, then teach habit statistics and memory from them.

        The verdicts are durable first (one append for all of them), then memory learns them in one write
        (``Memory.change``), as if each had been learned in turn. A verdict on a trace the task does not have is
        returned in ``unknown`` and the others go on. With ``skip_carried``, a verdict the trace carries already
        (the same word and correction, stored before or earlier in ``verdicts``) is not stored or counted again
        but taught to memory again with the others (``carried``: a rerun after a crash between storing verdicts
        and memory learning them). A memory that fails is logged as a warning, each of the verdicts recorded in
        ``unlearned_verdicts`` (``gil stats`` counts them) and ``learned`` is False (never swallowed:
        ``apply_verdicts`` counts them as ``not_learned``), the verdicts standing and a rebuild from the history
        replaying them. A failure to record raises (``TelemetryError``).
        """
        given = GivenVerdicts()
        found = self._traces(task.name, [verdict.trace_id for verdict in verdicts])
        served_from = self._served_from(task, found)
        lessons: list[_Lesson] = []
        traces: list[dict[str, Any]] = []
        reliability: list[dict[str, Any]] = []
        for verdict in verdicts:
            row = found.get(verdict.trace_id)
            if isinstance(row, UnknownTraceError):
                given.unknown.append(row)
                continue
            assert row is not None
            correction = verdict.correction.strip() if verdict.correction and verdict.correction.strip() else None
            word, kept = ("correct", None) if verdict.correct else ("wrong", correction)
            if skip_carried and (row.feedback_verdict, row.feedback_correction) == (word, kept):
                given.carried += 1
                lessons.append(_Lesson(row, verdict.correct, kept, counted=False))
                continue
            deltas = attribute_verdict(
                task.tree,
                mode=row.mode,
                steps=row.steps(),
                output=row.output,
                correct=verdict.correct,
                correction=correction,
            )
            version = self._confirmed_version(task, row, word, kept, served_from)
            judged = replace(row, feedback_verdict=word, feedback_correction=kept, answer_version=version)
            traces.append(judged.to_row())
            reliability.extend(reliability_rows(task.name, deltas))
            found[verdict.trace_id] = judged  # a later verdict on the same trace reads this one
            lessons.append(_Lesson(row, verdict.correct, correction, counted=True))
        if traces:
            self._store.append_many({"traces": traces, "habit_reliability": reliability})
            self._stale.confirmed(task.name, (stored["trace_id"] for stored in traces))
            given.stored = len(traces)
            for stored in traces:
                self._keep(TraceRow.from_row(stored))
            self._shadows.pop(task.name, None)
            if task.policy.learned is not None and self._learner is not None:
                self._learner.note_feedback(task.name)
        given.learned = await self._learn(task, lessons)
        return given

    async def refresh_learned(self, task: TaskDefinition, *, force: bool = False) -> LearnedState | None:
        """Bring the task's learned judge up to the log: refit it when feedback arrived, when it is missing,
        stale or unreadable (or ``force``), else pick up a newer one another process stored. None when the task
        has no ``learned_reflex``."""
        if task.policy.learned is None:
            return None
        return await require_learner(self._learner, task).refresh(task, force=force)

    def stale_version(self, task: TaskDefinition, key: str) -> str | None:
        """The tree answer (``Option.answer_version``) memory's entry ``key`` of ``task`` stands for, when the task's
        tree no longer gives it; None when it does, or the entry stands for none (``gil_core.answer_versions``)."""
        return self._stale.version(task, key)

    def changed_by(self, task: TaskDefinition, tree: Tree) -> TreeChange:
        """What ``tree`` in place of the task's would change of what the task learned. Reads the history; changes
        nothing."""
        events = self.history(task.name)
        recorded = {event.trace_id: event.answer_version for event in events}
        held = [recorded.get(entry.key) for entry in plan_memory(events)]
        return TreeChange(changed_answers(tree, confirmed=recorded.values(), remembered=held), len(held))

    def _stale_of(self, task: TaskDefinition) -> dict[str, str]:
        """The task's confirmed traces whose recorded tree answer its tree no longer gives: one scan."""
        recorded = pl.col("answer_version")
        gone = recorded.is_not_null() & ~recorded.is_in(sorted(task.tree.answer_versions))
        rows = self._judged(task.name, gone, "trace_id", "answer_version")
        return dict(zip(rows["trace_id"].to_list(), rows["answer_version"].to_list(), strict=True))

    def _served_from(self, task: TaskDefinition, found: Mapping[str, TraceRow | UnknownTraceError]) -> dict[str, str]:
        """The recorded tree answers of the memory entries that served ``found`` traces with an answer the tree's
        texts do not name (a procedure's): what such a hit's verdict confirms. One read, for those entries only."""
        answers = self._answers(task)
        sources = {
            row.recall_source
            for row in found.values()
            if isinstance(row, TraceRow) and row.mode == "memory" and row.recall_source and row.output
            if answers.option_for(row.output) is None and row.output.strip() != task.language.none_of_these
        }
        if not sources:
            return {}
        rows = self._traces(task.name, sorted(sources))
        return {
            key: row.answer_version for key, row in rows.items() if isinstance(row, TraceRow) and row.answer_version
        }

    def _confirmed_version(
        self, task: TaskDefinition, row: TraceRow, word: str, kept: str | None, served_from: Mapping[str, str]
    ) -> str | None:
        """The tree answer a verdict (``word``, the correction ``kept``) on ``row`` confirms."""
        correct = word == "correct"
        source = row.recall_source if correct and row.mode == "memory" else None
        return confirmed_version(
            task.tree,
            self._answers(task),
            answer=confirmed_answer(word, row.output, kept),
            settled_by=row.label if correct and row.mode.startswith("habit/") else None,
            none_text=task.language.none_of_these,
            served_from=served_from.get(source) if source is not None else None,
        )

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
        await rebuild_memory(self._memory, task.name, self.history(task.name), answers_now=task.tree.answer_versions)
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
            judged = self._judged(task.name, may_shadow_rows(), *EVIDENCE_COLUMNS)
            evidence = [row for row in map(evidence_from_row, judged.iter_rows(named=True)) if row is not None]
            cached = build_shadow_index(task.tree, evidence, exclude=(task.language.none_of_these,))
            self._shadows[task.name] = cached
        return cached

    async def _learn(self, task: TaskDefinition, lessons: Sequence[_Lesson]) -> bool:
        """Memory learns verdicts (each a trace's row as answered, whether it was right, the correction), in one
        write: a wrong memory hit forgets its source; a confirmed answer is remembered, else the trace's entry
        is forgotten. The sources of wrong hits are forgotten in a write of their own first, so that a memory
        which then fails to remember still stops serving an answer people marked wrong (as the reference's
        memory did, one call at a time). True when it did (or had nothing to learn), False when memory failed
        (logged, and each trace recorded in ``unlearned_verdicts``; a later success on a trace records that it
        caught up)."""
        if task.policy.memory_threshold is None or self._memory is None or not lessons:
            return True
        evidence = self._evidence_by_task.get(task.name)
        withdrawn, changes = MemoryChanges(), MemoryChanges()
        for row, correct, correction, counted in lessons:
            source = row.recall_source
            if counted and evidence is not None and row.mode == "memory" and source:
                evidence.record(row.trace_id, source, correct)
            if row.mode == "memory" and not correct and source:
                withdrawn.forget(source)
                changes.forget(source)
            answer = confirmed_answer("correct" if correct else "wrong", row.output, correction)
            if answer and row.state:  # a private trace has no text to remember
                changes.remember(row.trace_id, row.state, answer)
            else:  # nothing confirmed: a verdict given earlier on this trace no longer stands
                changes.forget(row.trace_id)
        trace_ids = list(dict.fromkeys(lesson.row.trace_id for lesson in lessons))
        try:
            if len(withdrawn):
                await self._memory.change(task.name, withdrawn)
            await self._memory.change(task.name, changes)
        except (GilError, OSError) as exc:  # memory is a cache: the verdicts are stored, and a rebuild replays them
            named = ", ".join(trace_ids[:_NAMED_TRACES]) + (" …" if len(trace_ids) > _NAMED_TRACES else "")
            which = (
                f"verdict on trace {named}" if len(trace_ids) == 1 else f"verdicts on {len(trace_ids)} traces ({named})"
            )
            _log.warning(
                "task %r: memory did not learn the %s (%s: %s); rebuild-memory replays them",
                task.name,
                which,
                type(exc).__name__,
                exc,
            )
            reason = f"{type(exc).__name__}: {exc}"[:_REASON_CHARS]
            self._store.append("unlearned_verdicts", [_unlearned_row(task.name, key, reason) for key in trace_ids])
            self._unlearned_of(task.name).update(trace_ids)
            return False
        unlearned = self._unlearned_of(task.name)
        caught_up = [trace_id for trace_id in trace_ids if trace_id in unlearned]
        if caught_up:
            self._store.append("unlearned_verdicts", [_unlearned_row(task.name, key, None) for key in caught_up])
            unlearned.difference_update(caught_up)
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

    def _traces(self, task: str, trace_ids: Sequence[str]) -> dict[str, TraceRow | UnknownTraceError]:
        """Each trace's current row, or the error saying ``task`` has no such trace: the rows kept here, the
        others in one scan of the traces table."""
        found: dict[str, TraceRow | UnknownTraceError] = {}
        with self._recent_lock:
            for trace_id in trace_ids:
                row = self._recent.get(trace_id)
                if row is not None:
                    found[trace_id] = row
        missing = list(dict.fromkeys(trace_id for trace_id in trace_ids if trace_id not in found))
        if missing:
            rows = self._store.rescanning(lambda: self._store.scan("traces", only={"trace_id": missing}).collect())
            for item in rows.iter_rows(named=True):
                found[item["trace_id"]] = TraceRow.from_row(item)
        for trace_id in trace_ids:
            held = found.get(trace_id)
            if held is None:
                found[trace_id] = UnknownTraceError(
                    f"no trace {trace_id!r} in {self._store.root}", trace_id=trace_id, task=task
                )
            elif isinstance(held, TraceRow) and held.task != task:
                # Tenants never see each other's traces: say only that this task has no such trace.
                found[trace_id] = UnknownTraceError(
                    f"task {task!r} has no trace {trace_id!r}", trace_id=trace_id, task=task
                )
        return found

    def _keep(self, row: TraceRow) -> None:
        with self._recent_lock:
            self._recent.put(row)

    def _judged(self, task: str, where: pl.Expr | None = None, *columns: str) -> pl.DataFrame:
        """The task's traces that carry a verdict (those ``where`` holds, when given; ``columns`` of them, or
        all), in the store's write order."""

        def read() -> pl.DataFrame:
            judged = (pl.col("task") == task) & pl.col("feedback_verdict").is_not_null()
            traces = self._store.scan("traces").filter(judged if where is None else judged & where)
            return (traces.select(columns) if columns else traces).collect()

        return self._store.rescanning(read)
