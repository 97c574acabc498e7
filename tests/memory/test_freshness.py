"""Another process's writes reach a LanceDB memory within its refresh bound, and only then does it read the
table version: new entries and forgotten ones alike, with real processes. A forgotten entry is never served by
the process (nor by another instance in the process) that forgot it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gil_core.memory import LanceDBMemory
from gil_core.testing import HashEmbeddingModel, ManualClock
from tests.memory._support import Peer

TASK = "support"
BOUND = 0.5


def source_of(recall: Any) -> str | None:
    return None if recall is None else str(recall.source)


@pytest.mark.slow  # processes that import lancedb
async def test_another_processes_new_and_forgotten_entries_are_seen_once_the_bound_has_passed(
    tmp_path: Path, peer: Peer
) -> None:
    clock = ManualClock()
    memory = LanceDBMemory(tmp_path, HashEmbeddingModel(), clock=clock, refresh_interval=BOUND)
    await memory.remember(TASK, "t-1", "where is my refund", "Soon.")
    assert source_of(await memory.lookup(TASK, "cancel my order", threshold=0.0)) == "t-1"

    assert peer("remember", tmp_path, TASK, "t-2", "cancel my order", "Cancelled.") == "ok"
    checks = memory.stats.version_checks
    clock.now += BOUND * 0.99  # within the bound: no table-version round trip, the entry not seen yet
    assert source_of(await memory.lookup(TASK, "cancel my order", threshold=0.0)) == "t-1"
    assert memory.stats.version_checks == checks
    clock.now += BOUND * 0.02
    recall = await memory.lookup(TASK, "cancel my order", threshold=0.99)
    assert recall is not None and (recall.source, recall.hit) == ("t-2", True)
    assert memory.stats.version_checks == checks + 1 and memory.stats.loads == 1  # caught up, not reloaded

    assert peer("forget", tmp_path, TASK, "t-2") == "ok"
    clock.now += BOUND
    assert source_of(await memory.lookup(TASK, "cancel my order", threshold=0.0)) == "t-1"
    assert [entry.key for entry in await memory.entries(TASK)] == ["t-1"]
    assert memory.stats.loads == 1


async def test_a_forgotten_entry_is_never_served_by_the_process_that_forgot_it(tmp_path: Path) -> None:
    clock = ManualClock()  # never moves: nothing here may wait for the refresh bound
    memory = LanceDBMemory(tmp_path, HashEmbeddingModel(), clock=clock)
    other = LanceDBMemory(tmp_path, HashEmbeddingModel(), clock=clock)
    await memory.remember(TASK, "t-1", "where is my refund", "Soon.")
    await memory.remember(TASK, "t-2", "cancel my order", "Cancelled.")
    assert source_of(await other.lookup(TASK, "cancel my order", threshold=0.0)) == "t-2"
    await memory.forget(TASK, "t-2")
    assert source_of(await memory.lookup(TASK, "cancel my order", threshold=0.0)) == "t-1"
    assert source_of(await other.lookup(TASK, "cancel my order", threshold=0.0)) == "t-1"
    await other.remember(TASK, "t-3", "cancel my order", "Done.")
    assert source_of(await memory.lookup(TASK, "cancel my order", threshold=0.0)) == "t-3"


@pytest.mark.slow  # processes that import lancedb
async def test_a_long_lived_reader_process_stops_serving_a_forgotten_entry(tmp_path: Path, peer: Peer) -> None:
    memory = LanceDBMemory(tmp_path, HashEmbeddingModel())
    await memory.remember(TASK, "t-1", "where is my refund", "Soon.")
    await memory.remember(TASK, "t-2", "cancel my order", "Cancelled.")
    assert peer("lookup", tmp_path, TASK, "cancel my order") == ["t-2", 1.0]
    await memory.forget(TASK, "t-2")
    await memory.remember(TASK, "t-3", "printer jammed", "Open tray 2.")
    deadline = time.monotonic() + 30  # generous: the bound is 0.5 s, the machine may be busy
    while peer("lookup", tmp_path, TASK, "cancel my order")[0] == "t-2":
        assert time.monotonic() < deadline, "the reader still serves the forgotten entry"
    assert peer("lookup", tmp_path, TASK, "cancel my order")[0] == "t-1"
    while peer("lookup", tmp_path, TASK, "printer jammed")[0] != "t-3":
        assert time.monotonic() < deadline, "the reader never saw the new entry"


def test_the_bound_is_at_most_one_second(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="refresh_interval"):
        LanceDBMemory(tmp_path, HashEmbeddingModel(), refresh_interval=1.5)
