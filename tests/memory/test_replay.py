"""plan_memory / rebuild_memory: a history of verdicts leaves memory exactly as live feedback left it."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gil_core.errors import ConfigurationError
from gil_core.memory import (
    FeedbackEvent,
    LanceDBMemory,
    LexicalMemory,
    Memory,
    MemoryEntry,
    plan_memory,
    rebuild_memory,
)
from gil_core.testing import HashEmbeddingModel
from tests.memory._support import describe

TASK = "support"


def verdict(
    trace_id: str,
    verdict: str,
    *,
    text: str = "where is my refund",
    mode: str = "fallback",
    output: str | None = "Soon.",
    correction: str | None = None,
    recall_source: str | None = None,
) -> FeedbackEvent:
    return FeedbackEvent(trace_id, text, mode, output, verdict, correction, recall_source)  # type: ignore[arg-type]


async def apply_live(memory: Memory, event: FeedbackEvent) -> None:
    """Feedback as the resolver applies it, one verdict at a time (docs/reference.md, "Feedback")."""
    if event.verdict == "wrong" and event.mode == "memory" and event.recall_source is not None:
        await memory.forget(TASK, event.recall_source)
    answer = ((event.output if event.verdict == "correct" else event.correction) or "").strip()
    if answer:
        await memory.remember(TASK, event.trace_id, event.text, answer)
    else:  # this verdict remembers nothing, so whatever an earlier verdict on the trace remembered goes
        await memory.forget(TASK, event.trace_id)


def test_correct_outputs_and_corrections_are_remembered_stripped() -> None:
    events = [
        verdict("t-1", "correct", output="  3 to 5 days \n"),
        verdict("t-2", "correct", output="   "),
        verdict("t-3", "wrong", correction=" Ask billing. "),
        verdict("t-4", "wrong", correction=None),
        verdict("t-5", "wrong", correction=""),
    ]
    assert plan_memory(events) == [
        MemoryEntry("t-1", "where is my refund", "3 to 5 days"),
        MemoryEntry("t-3", "where is my refund", "Ask billing."),
    ]


def test_a_wrong_memory_hit_forgets_the_entry_that_answered() -> None:
    events = [
        verdict("t-1", "correct", output="Soon."),
        verdict("t-2", "correct", output="Cancelled.", text="cancel my order"),
        verdict("t-3", "wrong", mode="memory", output="Soon.", recall_source="t-1", correction="Next week."),
        verdict("t-4", "correct", mode="memory", output="Cancelled.", recall_source="t-2"),
        verdict("t-5", "wrong", mode="fallback", recall_source="t-2"),  # not a memory answer: nothing forgotten
    ]
    assert [(entry.key, entry.answer) for entry in plan_memory(events)] == [
        ("t-2", "Cancelled."),
        ("t-3", "Next week."),
        ("t-4", "Cancelled."),
    ]


def test_a_later_verdict_on_the_same_trace_overturns_the_earlier_one() -> None:
    events = [
        verdict("t-1", "correct", output="Soon."),
        verdict("t-2", "correct", output="Cancelled."),
        verdict("t-1", "wrong", correction="Next week."),  # replaced, and now the newest
        verdict("t-2", "wrong"),  # removed: the later verdict remembers nothing
    ]
    assert plan_memory(events) == [MemoryEntry("t-1", "where is my refund", "Next week.")]


def test_a_verdict_on_a_tree_answer_the_tree_no_longer_gives_confirms_nothing() -> None:
    events = [
        replace(verdict("t1", "correct", output="Five days."), answer_version="refund#aaaaaaaaaaaa"),
        replace(verdict("t2", "correct", output="Three days."), answer_version="refund#bbbbbbbbbbbb"),
        verdict("t3", "wrong", correction="In our words."),  # no tree answer: kept whatever the tree gives
    ]
    now = frozenset({"refund#bbbbbbbbbbbb"})
    assert [entry.key for entry in plan_memory(events, answers_now=now)] == ["t2", "t3"]
    assert [entry.key for entry in plan_memory(events)] == ["t1", "t2", "t3"]  # no tree given: all of them


def test_an_unknown_verdict_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="maybe"):
        verdict("t-1", "maybe")


TRACES = st.sampled_from(["t-0", "t-1", "t-2", "t-3"])
EVENTS = st.builds(
    FeedbackEvent,
    trace_id=TRACES,
    text=st.sampled_from(["where is my refund", "cancel my order", "printer jammed"]),
    mode=st.sampled_from(["memory", "fallback", "habit/answer"]),
    output=st.sampled_from([None, "", "  ", "Soon.", " Cancelled. "]),
    verdict=st.sampled_from(["correct", "wrong"]),
    correction=st.sampled_from([None, "", "Next week."]),
    recall_source=st.none() | TRACES,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(EVENTS, max_size=12))
def test_the_plan_is_what_live_feedback_leaves_behind(events: list[FeedbackEvent]) -> None:
    async def live_then_rebuilt() -> tuple[list[MemoryEntry], list[MemoryEntry]]:
        live, rebuilt = LexicalMemory(), LexicalMemory()
        for event in events:
            await apply_live(live, event)
        await rebuild_memory(rebuilt, TASK, events)
        return await live.entries(TASK), await rebuilt.entries(TASK)

    live_entries, rebuilt_entries = asyncio.run(live_then_rebuilt())
    assert plan_memory(events) == live_entries == rebuilt_entries


async def test_a_deleted_lancedb_store_rebuilt_from_feedback_answers_as_before(tmp_path: Path) -> None:
    events = [
        verdict("t-1", "correct", output="Soon."),
        verdict("t-2", "correct", text="cancel my order", output="Cancelled."),
        verdict("t-3", "correct", text="where is my refund", output="Within a week."),  # a tie with t-1
        verdict("t-4", "wrong", text="printer jammed", output="Restart it.", correction="Open tray 2."),
        verdict("t-5", "wrong", mode="memory", text="cancel my order!", output="Cancelled.", recall_source="t-2"),
        verdict("t-1", "correct", output="Soon, within 5 days."),  # t-1 is now newer than t-3
    ]
    queries = ["where is my refund", "cancel my order", "printer is jammed", "refund?"]
    memory = LanceDBMemory(tmp_path / "store", HashEmbeddingModel())
    for event in events:
        await apply_live(memory, event)
    before = await describe(memory, TASK, queries)

    shutil.rmtree(tmp_path / "store")
    rebuilt = LanceDBMemory(tmp_path / "store", HashEmbeddingModel())
    await rebuild_memory(rebuilt, TASK, events)

    assert await describe(rebuilt, TASK, queries) == before
    assert [key for key, _, _ in before["entries"]] == ["t-3", "t-4", "t-1"]
    assert before["recalls"][0][:3] == ["t-3", 1.0, True]
