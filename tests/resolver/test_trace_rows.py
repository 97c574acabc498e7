"""A trace as feedback reads it back (gil_core.feedback.TraceRow): the traces table's columns in order, the row
a read gives back unchanged, an unknown column refused; and a memory that fails to learn a verdict is logged,
the verdict stored all the same, and said: ``feedback`` returns False and ``apply_verdicts`` counts it as
``not_learned``."""

from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path

import pytest

from gil_core.batch import Verdict
from gil_core.batch_feedback import apply_verdicts
from gil_core.errors import GilError, SchemaViolationError
from gil_core.feedback import TraceRow, _RecentRows
from gil_core.memory import LexicalMemory, MemoryChanges
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition
from gil_core.telemetry import TelemetryStore
from gil_core.telemetry.schemas import COLUMNS
from gil_core.testing import ScriptedChatModel, ScriptedReply
from tests.resolver._support import support_task


class _Unlearning(LexicalMemory):
    """A memory that cannot be written to (a full disk, say)."""

    async def change(self, task: str, changes: MemoryChanges) -> None:
        raise GilError("memory is read-only")


def test_a_trace_row_holds_the_traces_columns_in_order() -> None:
    assert tuple(item.name for item in fields(TraceRow)) == COLUMNS["traces"]


async def test_a_stored_trace_reads_back_as_the_row_it_is(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    resolver = Resolver(ScriptedChatModel(responder=lambda *_, **__: ScriptedReply("B")), store)
    task = support_task(memory_threshold=None)
    await resolver.resolve(task, "where is my refund?", trace_id="t")
    await resolver.feedback(task, "t", correct=False, correction="Refunds take five days.")
    (row,) = store.read("traces").iter_rows(named=True)
    assert TraceRow.from_row(row).to_row() == row
    assert row["feedback_verdict"] == "wrong" and row["feedback_correction"] == "Refunds take five days."
    with pytest.raises(SchemaViolationError, match="unknown columns"):
        TraceRow.from_row({**row, "surprise": 1})


async def test_the_rows_kept_for_feedback_read_back_as_stored_and_the_oldest_kept_goes_first(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    resolver = Resolver(ScriptedChatModel(responder=lambda *_, **__: ScriptedReply("B")), store)
    task = support_task(memory_threshold=None)
    for trace_id, text in (("a", "where is my refund?"), ("b", "환불은 언제 되나요?"), ("c", "and my parcel?")):
        await resolver.resolve(task, text, trace_id=trace_id)
    await resolver.feedback(task, "a", correct=False, correction="Refunds take five days.")
    stored = {row["trace_id"]: TraceRow.from_row(row) for row in store.read("traces").iter_rows(named=True)}
    kept = _RecentRows(2)
    for trace_id in ("a", "b", "c"):
        kept.put(stored[trace_id])
    assert (kept.get("a"), kept.get("b"), kept.get("c"), len(kept)) == (None, stored["b"], stored["c"], 2)
    kept.put(stored["a"])  # a verdict's row comes in again as the newest
    assert (kept.get("a"), kept.get("b")) == (stored["a"], None)
    assert stored["a"].feedback_correction == "Refunds take five days."
    assert stored["b"].state == "환불은 언제 되나요?" and stored["b"].created_at.tzinfo is not None


def _unlearning(tmp_path: Path) -> tuple[TelemetryStore, _Unlearning, Resolver, TaskDefinition]:
    store = TelemetryStore(tmp_path / "store")
    memory = _Unlearning(tmp_path / "memory")
    resolver = Resolver(ScriptedChatModel(responder=lambda *_, **__: ScriptedReply("B")), store, memory=memory)
    return store, memory, resolver, support_task(memory_threshold=0.95)


async def test_a_memory_that_fails_to_learn_is_logged_the_verdict_stands_and_feedback_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, memory, resolver, task = _unlearning(tmp_path)
    await resolver.resolve(task, "where is my refund?", trace_id="t")
    with caplog.at_level(logging.WARNING, logger="gil_core.feedback"):
        learned = await resolver.feedback(task, "t", correct=False, correction="Refunds take five days.")
    assert learned is False
    assert "memory did not learn the verdict on trace t (GilError: memory is read-only)" in caplog.text
    assert store.read("traces")["feedback_verdict"].to_list() == ["wrong"]
    assert await memory.entries(task.name) == []


async def test_verdicts_memory_failed_to_learn_are_applied_and_counted_not_learned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, memory, resolver, task = _unlearning(tmp_path)
    for trace_id in ("a", "b"):
        await resolver.resolve(task, f"where is refund {trace_id}?", trace_id=trace_id)
    verdicts = [Verdict("a", True, None), Verdict("b", False, "Refunds take five days.")]
    with caplog.at_level(logging.WARNING, logger="gil_core.feedback"):
        report = await apply_verdicts(resolver, task, verdicts)
    assert (report.applied, report.unchanged, report.not_learned, report.failed) == (2, 0, 2, [])
    assert "memory did not learn the verdicts on 2 traces (a, b)" in caplog.text  # one write for the chunk
    rerun = await apply_verdicts(resolver, task, verdicts)  # stored already: relearned, and still not learned
    assert (rerun.applied, rerun.unchanged, rerun.not_learned) == (0, 2, 2)
    assert await memory.entries(task.name) == []
    assert sorted(store.read("traces")["feedback_verdict"].to_list()) == ["correct", "wrong"]
