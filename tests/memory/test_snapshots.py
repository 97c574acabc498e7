"""A LanceDB memory that has not connected answers a task from its snapshot, stamped with the memory generation
it was read at, without importing LanceDB: in a fresh process, with the exact path's answers and similarities bit
for bit; another process's writes and deletions end that within the refresh bound; a damaged, stale or foreign
snapshot or marker is never served (the table answers, and the load writes the snapshot again); tasks stay apart.
Real LanceDB, real files, real processes; the clock is injected."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from gil_core.errors import MemoryUnavailableError
from gil_core.memory import CallableEmbeddingModel, LanceDBMemory, MemoryEntry
from gil_core.memory._index import snapshot_folder
from gil_core.testing import HashEmbeddingModel, ManualClock
from tests.memory._support import ROOT, Peer
from tests.memory.test_exact_search import near_ties

TASK = "support"
BOUND = 0.5
ENTRIES = [
    ("t-1", "where is my refund", "Soon."),
    ("t-2", "printer jammed again", "Open tray 2."),
    ("t-3", "cancel my order please", "Cancelled."),
    ("t-4", "my parcel never arrived", "We will trace it."),
]
PROBE = """
import asyncio, json, sys
from pathlib import Path
from gil_core.memory import LanceDBMemory
from gil_core.testing import HashEmbeddingModel

async def main():
    memory = LanceDBMemory(Path(sys.argv[1]), HashEmbeddingModel())
    found = [[entry.key, entry.similarity] for entry in await memory.nearest(sys.argv[2], sys.argv[3], 10)]
    recall = await memory.lookup(sys.argv[2], sys.argv[3], threshold=0.99)
    return {
        "found": found,
        "hit": None if recall is None else [recall.source, recall.hit],
        "lancedb": "lancedb" in sys.modules,
        "connects": memory.stats.connects,
        "snapshot_lookups": memory.stats.snapshot_lookups,
    }

print(json.dumps(asyncio.run(main())))
"""


def probe(root: Path, task: str, text: str) -> dict[str, Any]:
    """A lookup in a fresh process: what it found, and whether it imported lancedb."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(root), task, text], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def source_of(recall: Any) -> str | None:
    return None if recall is None else str(recall.source)


async def seeded(root: Path, entries: list[tuple[str, str, str]] = ENTRIES, task: str = TASK) -> None:
    """``entries`` written, then looked up once by another memory: the load writes the task's snapshot."""
    writer = LanceDBMemory(root, HashEmbeddingModel())
    for key, text, answer in entries:
        await writer.remember(task, key, text, answer)
    loader = LanceDBMemory(root, HashEmbeddingModel())
    assert await loader.lookup(task, entries[0][1], threshold=0.5) is not None
    assert loader.wait_snapshots(60) and loader.stats.snapshot_writes == 1 and loader.stats.loads == 1


def folder_of(root: Path, task: str = TASK) -> Path:
    return snapshot_folder(root / "memory.gil-index", task)


@pytest.mark.slow  # processes that import gil_core
async def test_a_fresh_process_answers_from_the_snapshot_without_importing_lancedb(tmp_path: Path) -> None:
    await seeded(tmp_path)
    exact = LanceDBMemory(tmp_path, HashEmbeddingModel())
    await exact.remember(TASK, "t-5", "the app crashes on start", "Update it.")  # connected: the table's answers
    loader = LanceDBMemory(tmp_path, HashEmbeddingModel())
    await loader.lookup(TASK, "anything", threshold=0.5)  # the marker moved: loaded, the snapshot written again
    assert loader.stats.connects == 1 and loader.wait_snapshots(60) and loader.stats.snapshot_writes == 1
    for text in ("cancel my order please", "my parcel is late", "the app crashes on start"):
        answered = probe(tmp_path, TASK, text)
        expected = [[entry.key, entry.similarity] for entry in await exact.nearest(TASK, text, 10)]
        assert answered["found"] == expected  # floats through JSON round-trip exactly
        assert not answered["lancedb"] and answered["connects"] == 0 and answered["snapshot_lookups"] == 2
    assert probe(tmp_path, TASK, "cancel my order please")["hit"] == ["t-3", True]

    await exact.forget(TASK, "t-3")  # the marker moves: the next fresh process reads the table
    answered = probe(tmp_path, TASK, "cancel my order please")
    assert answered["lancedb"] and answered["connects"] == 1 and answered["hit"][0] != "t-3"
    assert "t-3" not in [key for key, _ in answered["found"]]


def fixed_embedder(rows: NDArray[np.float32], queries: NDArray[np.float32]) -> CallableEmbeddingModel:
    table = {f"row {index}": row for index, row in enumerate(rows)}
    table.update({f"query {index}": query for index, query in enumerate(queries)})
    return CallableEmbeddingModel(lambda texts: np.stack([table[text] for text in texts]), name="fixed")


@pytest.mark.parametrize("kind", ["random", "near ties"])
async def test_the_snapshot_answers_what_the_table_answers_bit_for_bit(tmp_path: Path, kind: str) -> None:
    rng = np.random.default_rng(7)
    count, dimensions = 400, 48
    if kind == "random":
        rows = rng.standard_normal((count, dimensions)).astype(np.float32)
        queries = np.concatenate([rng.standard_normal((8, dimensions)), rows[:4]]).astype(np.float32)
    else:
        rows, queries = near_ties(rng, count, dimensions)
    embedder = fixed_embedder(rows, queries)
    writer = LanceDBMemory(tmp_path, embedder)
    await writer.rebuild(TASK, [MemoryEntry(f"k{index}", f"row {index}", f"a{index}") for index in range(count)])
    await writer.forget(TASK, "k1")  # a dead slot in the writer's state; the snapshot holds the live rows
    exact = LanceDBMemory(tmp_path, embedder)  # the LanceDB path: it loads the task, and keeps its snapshot
    assert await exact.nearest(TASK, "query 0", 1)
    assert exact.wait_snapshots(60) and exact.stats.snapshot_writes == 1
    served = LanceDBMemory(tmp_path, embedder)
    asked = 0
    for index in range(len(queries)):
        for k in (1, 7, count):
            expected = await exact.nearest(TASK, f"query {index}", k)
            assert await served.nearest(TASK, f"query {index}", k) == expected  # keys, texts, answers, similarities
            assert expected == await writer.nearest(TASK, f"query {index}", k)
            asked += 1
    assert served.stats.connects == 0 and served.stats.loads == 0 and served.stats.snapshot_lookups == asked
    assert await served.entries(TASK) == await exact.entries(TASK)


@pytest.mark.slow  # a process that imports lancedb
async def test_another_processes_remember_and_forget_end_the_snapshot_within_the_bound(
    tmp_path: Path, peer: Peer
) -> None:
    await seeded(tmp_path)
    clock = ManualClock()
    reader = LanceDBMemory(tmp_path, HashEmbeddingModel(), clock=clock, refresh_interval=BOUND)
    before = source_of(await reader.lookup(TASK, "my screen went black", threshold=0.0))
    assert before is not None and reader.stats.connects == 0

    assert peer("remember", tmp_path, TASK, "t-9", "my screen went black", "Hold the power button.") == "ok"
    reads = reader.stats.generation_reads
    clock.now += BOUND * 0.99  # within the bound: the marker is not read again, the snapshot still answers
    assert source_of(await reader.lookup(TASK, "my screen went black", threshold=0.0)) == before
    assert reader.stats.generation_reads == reads and reader.stats.connects == 0
    clock.now += BOUND * 0.02
    recall = await reader.lookup(TASK, "my screen went black", threshold=0.99)
    assert recall is not None and (recall.source, recall.hit) == ("t-9", True)
    assert reader.stats.connects == 1 and reader.stats.loads == 1  # the marker moved: the table answered
    assert reader.wait_snapshots(60) and reader.stats.snapshot_writes == 1  # and its load kept a new snapshot

    second = LanceDBMemory(tmp_path, HashEmbeddingModel(), clock=clock, refresh_interval=BOUND)
    assert source_of(await second.lookup(TASK, "my screen went black", threshold=0.99)) == "t-9"
    assert second.stats.connects == 0  # the new snapshot holds the peer's entry
    assert peer("forget", tmp_path, TASK, "t-9") == "ok"
    clock.now += BOUND
    assert source_of(await second.lookup(TASK, "my screen went black", threshold=0.0)) not in (None, "t-9")
    assert "t-9" not in [entry.key for entry in await second.entries(TASK)]
    assert second.stats.connects == 1


async def test_a_write_in_this_process_is_seen_at_once(tmp_path: Path) -> None:
    await seeded(tmp_path)
    clock = ManualClock()  # never moves
    reader = LanceDBMemory(tmp_path, HashEmbeddingModel(), clock=clock)
    other = LanceDBMemory(tmp_path, HashEmbeddingModel(), clock=clock)
    assert source_of(await reader.lookup(TASK, "cancel my order please", threshold=0.99)) == "t-3"
    await other.forget(TASK, "t-3")
    assert source_of(await reader.lookup(TASK, "cancel my order please", threshold=0.0)) != "t-3"
    await reader.remember(TASK, "t-6", "cancel my order please", "Done.")  # the served memory writes: it connects
    assert source_of(await reader.lookup(TASK, "cancel my order please", threshold=0.99)) == "t-6"
    assert source_of(await other.lookup(TASK, "cancel my order please", threshold=0.99)) == "t-6"


def damage_snapshot(folder: Path) -> None:
    snapshot = folder / "exact.arrow"
    snapshot.write_bytes(snapshot.read_bytes()[:200])


def damage_marker(folder: Path) -> None:
    (folder / "generation").write_text("not a generation\n", encoding="ascii")


def remove_marker(folder: Path) -> None:
    (folder / "generation").unlink()


def move_marker(folder: Path) -> None:
    (folder / "generation").write_text("0" * 32, encoding="ascii")  # a token no snapshot was read at


@pytest.mark.parametrize("damage", [damage_snapshot, damage_marker, remove_marker, move_marker])
async def test_a_damaged_or_stale_snapshot_or_marker_is_never_served(tmp_path: Path, damage: Any) -> None:
    await seeded(tmp_path)
    damage(folder_of(tmp_path))
    memory = LanceDBMemory(tmp_path, HashEmbeddingModel())
    recall = await memory.lookup(TASK, "cancel my order please", threshold=0.99)
    assert recall is not None and recall.source == "t-3"
    assert memory.stats.connects == 1 and memory.stats.snapshot_lookups == 0 and memory.stats.loads == 1
    assert memory.wait_snapshots(60) and memory.stats.snapshot_writes == 1  # kept again, with a sound marker
    reopened = LanceDBMemory(tmp_path, HashEmbeddingModel())
    assert source_of(await reopened.lookup(TASK, "cancel my order please", threshold=0.99)) == "t-3"
    assert reopened.stats.connects == 0


async def test_tasks_are_answered_from_their_own_snapshots_only(tmp_path: Path) -> None:
    alpha = [(key, text, f"alpha: {answer}") for key, text, answer in ENTRIES]
    beta = [(f"b{key}", text, f"beta: {answer}") for key, text, answer in ENTRIES[:2]]
    await seeded(tmp_path, alpha, "alpha")
    await seeded(tmp_path, beta, "beta")
    memory = LanceDBMemory(tmp_path, HashEmbeddingModel())
    for _, text, _ in ENTRIES:
        assert all(entry.answer.startswith("alpha: ") for entry in await memory.nearest("alpha", text, 10))
        assert [entry.key for entry in await memory.nearest("beta", text, 10)] in (["bt-1", "bt-2"], ["bt-2", "bt-1"])
    assert await memory.nearest("gamma", "where is my refund", 5) == []
    assert memory.stats.snapshot_lookups == 2 * len(ENTRIES) and memory.stats.connects == 1  # gamma: the table's

    # beta's folder given alpha's snapshot and marker: the task named inside does not match, so it is not served
    for name in ("exact.arrow", "generation"):
        (folder_of(tmp_path, "beta") / name).write_bytes((folder_of(tmp_path, "alpha") / name).read_bytes())
    fresh = LanceDBMemory(tmp_path, HashEmbeddingModel())
    found = await fresh.nearest("beta", "where is my refund", 10)
    assert found[0].key == "bt-1" and all(entry.answer.startswith("beta: ") for entry in found)
    assert fresh.stats.connects == 1 and fresh.stats.snapshot_lookups == 0


async def test_an_embedder_of_another_width_is_refused_as_the_table_refuses_it(tmp_path: Path) -> None:
    await seeded(tmp_path)
    memory = LanceDBMemory(tmp_path, HashEmbeddingModel(32))  # the snapshot, like the table, holds 64 dimensions
    with pytest.raises(MemoryUnavailableError, match="32-dimensional vectors but the table"):
        await memory.lookup(TASK, "cancel my order please", threshold=0.5)
    assert memory.stats.connects == 1 and memory.stats.snapshot_lookups == 0
