"""The Memory port's rules, checked on every adapter: threshold, ranking and ties, upsert, forget, rebuild,
tenant isolation (whatever the task name holds), persistence across processes."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gil_core.memory import Memory, MemoryChanges, MemoryEntry, Recall
from tests.memory._support import ADAPTERS, describe, open_memory

TASK = "support"
NASTY_TASKS = ["x' OR '1'='1", "a\\", "a\\' OR 1=1 --", "'; DROP TABLE memory; --", "", "환불 \n%_"]


@pytest.fixture(params=ADAPTERS)
def adapter(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def memory(adapter: str, tmp_path: Path) -> Memory:
    return open_memory(adapter, tmp_path)


async def test_a_task_without_entries_recalls_nothing(memory: Memory) -> None:
    assert await memory.lookup(TASK, "where is my refund", threshold=0.5) is None
    assert await memory.nearest(TASK, "where is my refund", 3) == []
    assert await memory.entries(TASK) == []


async def test_a_hit_means_similarity_reaches_the_threshold(memory: Memory) -> None:
    await memory.remember(TASK, "t-1", "where is my refund", "3 to 5 working days")
    probe = await memory.lookup(TASK, "where is my refund for the shoes", threshold=0.0)
    assert probe is not None and probe.similarity is not None and 0.0 < probe.similarity < 1.0
    at = await memory.lookup(TASK, "where is my refund for the shoes", threshold=probe.similarity)
    above = await memory.lookup(TASK, "where is my refund for the shoes", threshold=math.nextafter(probe.similarity, 2))
    assert at == Recall(probe.similarity, True, "t-1", probe.similarity, "3 to 5 working days", "where is my refund")
    assert above is not None and (above.hit, above.source, above.answer) == (False, "t-1", "3 to 5 working days")


async def test_the_same_request_has_similarity_exactly_one(memory: Memory) -> None:
    await memory.remember(TASK, "t-1", "cancel my order", "Cancelled.")
    await memory.remember(TASK, "t-2", "where is my refund", "Soon.")
    recall = await memory.lookup(TASK, "cancel my order", threshold=1.0)
    assert recall is not None and (recall.similarity, recall.hit, recall.source) == (1.0, True, "t-1")


async def test_nearest_ranks_best_first_and_carries_similarities(memory: Memory) -> None:
    await memory.remember(TASK, "far", "the printer is jammed", "Open tray 2.")
    await memory.remember(TASK, "near", "cancel my order please", "Cancelled.")
    await memory.remember(TASK, "exact", "cancel my order", "Cancelled!")
    found = await memory.nearest(TASK, "cancel my order", 2)
    assert [entry.key for entry in found] == ["exact", "near"]
    assert found[0].similarity is not None and found[1].similarity is not None
    assert found[0].similarity > found[1].similarity
    assert [entry.key for entry in await memory.nearest(TASK, "cancel my order", 10)] == ["exact", "near", "far"]
    assert await memory.nearest(TASK, "cancel my order", 0) == []
    with pytest.raises(ValueError):
        await memory.nearest(TASK, "cancel my order", -1)
    with pytest.raises(ValueError):
        await memory.lookup(TASK, "cancel my order", threshold=math.nan)


async def test_equal_similarities_go_to_the_entry_remembered_earliest(memory: Memory) -> None:
    for key in ["k3", "k1", "k5", "k2", "k4"]:  # not alphabetical: order must come from insertion
        await memory.remember(TASK, key, "is my parcel lost", f"answer {key}")
    recall = await memory.lookup(TASK, "is my parcel lost", threshold=0.9)
    assert recall is not None and (recall.source, recall.answer) == ("k3", "answer k3")
    assert [entry.key for entry in await memory.nearest(TASK, "parcel", 5)] == ["k3", "k1", "k5", "k2", "k4"]
    await memory.forget(TASK, "k3")
    await memory.remember(TASK, "k3", "is my parcel lost", "answer k3, again")  # remembered again: now newest
    recall = await memory.lookup(TASK, "is my parcel lost", threshold=0.9)
    assert recall is not None and recall.source == "k1"
    assert [entry.key for entry in await memory.entries(TASK)] == ["k1", "k5", "k2", "k4", "k3"]


async def test_remembering_a_key_again_replaces_its_entry(memory: Memory) -> None:
    await memory.remember(TASK, "t-1", "where is my refund", "Soon.")
    await memory.remember(TASK, "t-2", "cancel my order", "Cancelled.")
    await memory.remember(TASK, "t-1", "where is my refund", "3 to 5 working days")
    assert await memory.entries(TASK) == [
        MemoryEntry("t-2", "cancel my order", "Cancelled."),
        MemoryEntry("t-1", "where is my refund", "3 to 5 working days"),
    ]
    recall = await memory.lookup(TASK, "where is my refund", threshold=0.9)
    assert recall is not None and recall.answer == "3 to 5 working days"


async def test_forget_drops_one_entry_and_ignores_unknown_keys(memory: Memory) -> None:
    await memory.forget(TASK, "nothing-here")  # no table, no file, no error
    await memory.remember(TASK, "t-1", "where is my refund", "Soon.")
    await memory.remember(TASK, "t-2", "cancel my order", "Cancelled.")
    await memory.forget(TASK, "t-1")
    await memory.forget(TASK, "t-1")
    await memory.forget(TASK, "unknown")
    assert [entry.key for entry in await memory.entries(TASK)] == ["t-2"]
    recall = await memory.lookup(TASK, "where is my refund", threshold=0.0)
    assert recall is not None and recall.source == "t-2"
    await memory.forget(TASK, "t-2")
    assert await memory.lookup(TASK, "where is my refund", threshold=0.0) is None


async def test_a_change_is_its_remembers_and_forgets_made_in_order(memory: Memory) -> None:
    await memory.remember(TASK, "held", "printer jammed", "Open tray 2.")
    await memory.remember(TASK, "kept", "cancel my order", "Cancelled.")
    changes = (
        MemoryChanges()
        .remember("a", "where is my refund", "Soon.")
        .remember("b", "is my parcel lost", "No.")
        .forget("held")
        .remember("a", "where is my refund", "3 to 5 working days")  # again: replaced, and now the newest
        .remember("gone", "reset my password", "Use the link.")
        .forget("gone")  # the last word on a key counts
        .forget("never-held")
    )
    assert [entry.key for entry in changes.entries] == ["b", "a"]
    assert changes.forgotten == ["held", "gone", "never-held"]
    await memory.change(TASK, changes)
    assert await memory.entries(TASK) == [
        MemoryEntry("kept", "cancel my order", "Cancelled."),
        MemoryEntry("b", "is my parcel lost", "No."),
        MemoryEntry("a", "where is my refund", "3 to 5 working days"),
    ]
    recall = await memory.lookup(TASK, "where is my refund", threshold=0.9)
    assert recall is not None and (recall.source, recall.answer) == ("a", "3 to 5 working days")
    await memory.change(TASK, MemoryChanges().forget("kept").forget("b"))  # forgets only
    await memory.change(TASK, MemoryChanges())  # nothing
    await memory.change("elsewhere", MemoryChanges().forget("a"))  # another task: nothing of ours goes
    assert [entry.key for entry in await memory.entries(TASK)] == ["a"]


async def test_a_change_forgetting_an_injection_shaped_key_forgets_only_that_key(memory: Memory) -> None:
    nasty = "k' OR '1'='1"
    await memory.change(TASK, MemoryChanges().remember("k1", "where is my refund", "Soon.").remember(nasty, "x", "y"))
    await memory.remember("billing", "k2", "where is my refund", "Ask billing.")
    await memory.change(TASK, MemoryChanges().forget(nasty).forget("k2' OR task = 'billing"))
    assert [entry.key for entry in await memory.entries(TASK)] == ["k1"]
    assert [entry.key for entry in await memory.entries("billing")] == ["k2"]


async def test_rebuild_replaces_everything_the_task_holds(memory: Memory) -> None:
    await memory.remember(TASK, "old", "printer jammed", "Open tray 2.")
    planned = [MemoryEntry(f"r-{index}", f"question number {index}", f"answer {index}") for index in range(12)]
    planned.append(MemoryEntry("r-3", "question number three", "answer three"))  # a repeated key: last wins, last
    await memory.rebuild(TASK, planned)
    expected = [*planned[:3], *planned[4:12], MemoryEntry("r-3", "question number three", "answer three")]
    assert await memory.entries(TASK) == expected
    recall = await memory.lookup(TASK, "question number 7", threshold=0.99)
    assert recall is not None and (recall.source, recall.hit) == ("r-7", True)
    await memory.rebuild(TASK, [])
    assert await memory.lookup(TASK, "question number 7", threshold=0.0) is None


@pytest.mark.parametrize("other", NASTY_TASKS)
async def test_tasks_holding_the_same_request_never_see_each_others_answers(memory: Memory, other: str) -> None:
    await memory.remember(TASK, "ours", "where is my refund", "answer of support")
    await memory.remember(other, "theirs", "where is my refund", f"answer of {other!r}")
    for task, key, answer in [(TASK, "ours", "answer of support"), (other, "theirs", f"answer of {other!r}")]:
        recall = await memory.lookup(task, "where is my refund", threshold=0.9)
        assert recall is not None and (recall.source, recall.answer, recall.similarity) == (key, answer, 1.0)
        assert [entry.key for entry in await memory.nearest(task, "where is my refund", 10)] == [key]
    await memory.forget(other, "ours")  # another task's key: nothing to forget in `other`
    await memory.rebuild(other, [])
    assert [entry.key for entry in await memory.entries(TASK)] == ["ours"]
    assert await memory.lookup(other, "where is my refund", threshold=0.0) is None


async def test_an_injection_shaped_task_name_sees_no_other_rows(memory: Memory) -> None:
    await memory.remember(TASK, "t-1", "where is my refund", "Soon.")
    await memory.remember("billing", "t-2", "where is my refund", "Ask billing.")
    assert await memory.lookup(NASTY_TASKS[0], "where is my refund", threshold=0.0) is None
    assert await memory.entries(NASTY_TASKS[0]) == []
    await memory.rebuild(NASTY_TASKS[0], [MemoryEntry("t-3", "cancel my order", "Cancelled.")])
    assert [entry.key for entry in await memory.nearest(NASTY_TASKS[0], "where is my refund", 10)] == ["t-3"]
    assert [entry.key for entry in await memory.entries(TASK)] == ["t-1"]
    assert [entry.key for entry in await memory.entries("billing")] == ["t-2"]


async def test_a_second_instance_on_the_same_store_sees_the_first_ones_writes(adapter: str, tmp_path: Path) -> None:
    first, second = open_memory(adapter, tmp_path), open_memory(adapter, tmp_path)
    await first.remember(TASK, "t-1", "where is my refund", "Soon.")
    assert [entry.key for entry in await second.entries(TASK)] == ["t-1"]  # second has now read the task
    await first.remember(TASK, "t-2", "cancel my order", "Cancelled.")
    await first.forget(TASK, "t-1")
    recall = await second.lookup(TASK, "cancel my order", threshold=0.9)
    assert recall is not None and recall.source == "t-2"
    assert [entry.key for entry in await second.entries(TASK)] == ["t-2"]


async def test_concurrent_writes_and_lookups_leave_what_a_new_instance_reads(adapter: str, tmp_path: Path) -> None:
    memory = open_memory(adapter, tmp_path)
    writes = [memory.remember(TASK, f"t-{index}", f"question number {index}", f"answer {index}") for index in range(16)]
    reads = [memory.lookup(TASK, f"question number {index}", threshold=0.9) for index in range(16)]
    await asyncio.gather(*writes, *reads, memory.forget(TASK, "t-3"))
    held = await memory.entries(TASK)
    assert len(held) in (15, 16) and len({entry.key for entry in held}) == len(held)
    assert await open_memory(adapter, tmp_path).entries(TASK) == held


async def reopen_and_describe(adapter: str, root: Path, queries: list[str]) -> dict[str, Any]:
    """What a new instance on ``root`` answers: LanceDB from a fresh process (its state is process-wide: a
    connection, a runtime), the lexical memory from a new instance (it holds nothing but its files)."""
    if adapter == "lexical":
        return await describe(open_memory(adapter, root), TASK, queries)
    command = [sys.executable, "-m", "tests.memory._support", adapter, str(root), TASK, *queries]
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2])
    reply: dict[str, Any] = json.loads(done.stdout)
    return reply


@pytest.mark.slow  # LanceDB: a new interpreter imports lancedb
async def test_memory_survives_a_restart_without_a_rebuild(adapter: str, tmp_path: Path) -> None:
    memory = open_memory(adapter, tmp_path)
    for index in range(12):
        await memory.remember(TASK, f"t-{index}", f"question number {index}", f"answer {index}")
    await memory.forget(TASK, "t-4")
    await memory.remember(NASTY_TASKS[0], "t-x", "question number 5", "not for support")
    queries = ["question number 5", "question number 4", "something else entirely"]
    here = json.loads(json.dumps(await describe(memory, TASK, queries)))

    there = await reopen_and_describe(adapter, tmp_path, queries)
    assert there == here  # the same entries in the same order, the same similarities to the last bit
    assert len(there["entries"]) == 11 and there["recalls"][0][:2] == ["t-5", 1.0]
