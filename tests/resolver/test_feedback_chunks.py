"""Verdicts applied a chunk at a time: stored in one append and taught to memory in one write, with the same
result as one verdict at a time (the later word on a trace wins, an unknown trace is reported)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gil_core.batch import Verdict
from gil_core.batch_feedback import apply_verdicts
from gil_core.errors import ConfigurationError
from gil_core.memory import LanceDBMemory, MemoryEntry
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel, ScriptedChatModel, ScriptedReply
from tests.resolver._support import support_task

VERDICTS = [
    *(Verdict(f"t-{index}", True) for index in range(5)),
    Verdict("t-0", False, "Refunds take five days."),  # a later word on t-0: the correction is remembered
    Verdict("t-5", False),  # wrong, no correction: nothing to remember
    Verdict("t-missing", True),
    Verdict("t-1", True),  # again, as given above in this chunk
]


async def _resolved(root: Path) -> tuple[TelemetryStore, LanceDBMemory, Resolver]:
    store = TelemetryStore(root / "store")
    memory = LanceDBMemory(root / "memory", HashEmbeddingModel(16))
    resolver = Resolver(ScriptedChatModel(responder=lambda *_, **__: ScriptedReply("B")), store, memory=memory)
    for index in range(6):
        await resolver.resolve(support_task(), f"where is refund number {index}?", trace_id=f"t-{index}")
    return store, memory, resolver


def _files(folder: Path) -> int:
    return sum(1 for path in folder.rglob("*") if path.is_file())


async def test_a_chunk_of_verdicts_is_one_append_and_one_memory_write_and_teaches_what_one_at_a_time_does(
    tmp_path: Path,
) -> None:
    task = support_task()
    store, memory, resolver = await _resolved(tmp_path / "chunk")
    manifests = tmp_path / "chunk" / "memory" / "memory.lance" / "_versions"
    trace_files = _files(tmp_path / "chunk" / "store" / "traces")
    report = await apply_verdicts(resolver, task, VERDICTS)
    assert (report.applied, report.unchanged, [item.where for item in report.failed]) == (7, 1, ["trace 't-missing'"])
    assert report.not_learned == 0
    assert len(list(manifests.glob("*.manifest"))) == 2  # the table created (empty), then the chunk's one write
    assert _files(tmp_path / "chunk" / "store" / "traces") == trace_files + 1
    entries = await memory.entries(task.name)
    assert [entry.key for entry in entries] == ["t-2", "t-3", "t-4", "t-0", "t-1"]  # t-1 taught again: the newest
    assert entries[-2] == MemoryEntry("t-0", "where is refund number 0?", "Refunds take five days.")

    _, alone, one_by_one = await _resolved(tmp_path / "one")
    single = await apply_verdicts(one_by_one, task, VERDICTS, chunk=1)
    assert (single.applied, single.unchanged, len(single.failed)) == (7, 1, 1)
    assert await alone.entries(task.name) == entries
    versions = tmp_path / "one" / "memory" / "memory.lance" / "_versions"
    assert len(list(versions.glob("*.manifest"))) >= 6  # a write per verdict that changed what memory holds

    # Run again (after a crash, say): what stands is taught to memory again and not counted twice; the file's two
    # words on t-0 are given again, in order, as one at a time would.
    rerun = await apply_verdicts(resolver, task, VERDICTS)
    assert (rerun.applied, rerun.unchanged, len(rerun.failed)) == (2, 6, 1)
    assert await memory.entries(task.name) == entries
    assert sorted(store.read("traces").filter(store.read("traces")["feedback_verdict"].is_not_null())["trace_id"]) == [
        f"t-{index}" for index in range(6)
    ]


async def test_a_chunk_smaller_than_one_is_refused(tmp_path: Path) -> None:
    _, _, resolver = await _resolved(tmp_path)
    with pytest.raises(ConfigurationError, match="chunk must be at least 1"):
        await apply_verdicts(resolver, support_task(), VERDICTS, chunk=0)
