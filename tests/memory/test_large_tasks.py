"""Tasks past the index threshold (lowered here) are answered from LanceDB's vector index: recall against the
exact search, candidates rescored exactly, rows added after the build found, deletions honoured, other tasks
untouched, and a reopened memory builds nothing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from gil_core.memory import CallableEmbeddingModel, LanceDBMemory, MemoryEntry
from gil_core.memory._index import current_generation, snapshot_folder
from gil_core.memory.lancedb_memory import DEFAULT_REFRESH_INTERVAL, IndexSettings
from gil_core.testing import HashEmbeddingModel, ManualClock
from tests.memory._shipped_search import shipped_nearest
from tests.memory._support import Peer

pytestmark = pytest.mark.slow  # index builds

BIG, SMALL = "big task", "small task"
SETTINGS = IndexSettings(threshold=400, min_unindexed=50)
DIMENSIONS = 64  # HashEmbeddingModel's, so another process's texts fit the table


class Vectors:
    """Texts named ``row N`` / ``query N`` embed to fixed vectors; anything else to a hash of its text."""

    def __init__(self, rows: NDArray[np.float32], queries: NDArray[np.float32]) -> None:
        self.table = {f"row {index}": row for index, row in enumerate(rows)}
        self.table.update({f"query {index}": query for index, query in enumerate(queries)})

    def __call__(self, texts: list[str]) -> NDArray[np.float32]:
        hashed = HashEmbeddingModel(DIMENSIONS)
        return np.stack([self.table.get(text, np.asarray(hashed.embed_text(text), np.float32)) for text in texts])


def clustered(count: int, queries: int, seed: int) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((count // 20, DIMENSIONS))
    rows = centres[rng.integers(0, len(centres), count)] + 0.2 * rng.standard_normal((count, DIMENSIONS))
    sources = rng.integers(0, count, queries)
    near = rows[sources] + 0.05 * rng.standard_normal((queries, DIMENSIONS))
    return rows.astype(np.float32), near.astype(np.float32)


async def indexed_memory(root: Path, rows: NDArray[np.float32], queries: NDArray[np.float32]) -> LanceDBMemory:
    embedder = CallableEmbeddingModel(Vectors(rows, queries), name="fixed")
    memory = LanceDBMemory(root, embedder, index=SETTINGS)
    await memory.rebuild(BIG, [MemoryEntry(f"k{index}", f"row {index}", f"a{index}") for index in range(len(rows))])
    await memory.rebuild(SMALL, [MemoryEntry(f"s{index}", f"row {index}", "small") for index in range(50)])
    await memory.build_index()
    return LanceDBMemory(root, embedder, index=SETTINGS)  # a reopened memory: nothing held yet


async def test_lookups_of_a_large_task_rescore_the_index_candidates_exactly(tmp_path: Path) -> None:
    rows, queries = clustered(1000, 60, seed=1)
    memory = await indexed_memory(tmp_path, rows, queries)
    hits = 0
    for index, query in enumerate(queries):
        found = await memory.nearest(BIG, f"query {index}", 3)
        exact = dict(shipped_nearest(rows, query, len(rows)))
        for entry in found:  # every similarity is the exact one of its row, bit for bit
            assert entry.similarity == exact[int(entry.key[1:])]
        assert [entry.similarity for entry in found] == sorted((e.similarity for e in found), reverse=True)
        hits += int(found[0].key[1:]) == shipped_nearest(rows, query, 1)[0][0]
    assert hits / len(queries) >= 0.95
    assert memory.stats.index_lookups == len(queries) and memory.stats.loads == 0  # nothing read whole
    assert memory.stats.connects == 0  # the snapshot is stamped with the task's generation: LanceDB not needed


async def test_rows_added_after_the_build_are_found_and_forgotten_ones_are_not(tmp_path: Path) -> None:
    rows, queries = clustered(600, 10, seed=2)
    memory = await indexed_memory(tmp_path, rows, queries)
    writer = LanceDBMemory(tmp_path, CallableEmbeddingModel(Vectors(rows, queries), name="fixed"), index=SETTINGS)
    for index in range(5):
        await writer.remember(BIG, f"new {index}", f"query {index}", f"new answer {index}")
    for index in range(5):
        recall = await memory.lookup(BIG, f"query {index}", threshold=0.999)
        assert recall is not None and (recall.source, recall.similarity) == (f"new {index}", 1.0)
    await writer.forget(BIG, "new 0")
    recall = await memory.lookup(BIG, "query 0", threshold=0.0)
    assert recall is not None and recall.source != "new 0"
    assert [entry.key for entry in await memory.entries(BIG)][-4:] == [f"new {index}" for index in range(1, 5)]


async def test_a_small_task_sharing_the_table_stays_in_the_process_and_apart(tmp_path: Path) -> None:
    rows, queries = clustered(600, 10, seed=3)
    memory = await indexed_memory(tmp_path, rows, queries)
    for index in range(10):
        text = f"row {index}"
        big, small = await memory.nearest(BIG, text, 100), await memory.nearest(SMALL, text, 100)
        assert big[0].key == f"k{index}" and all(entry.key.startswith("k") for entry in big)
        assert small[0].key == f"s{index}" and all(entry.key.startswith("s") for entry in small)
        assert len(small) == 50 and big[0].similarity == small[0].similarity == 1.0
    assert memory.stats.index_lookups == 10 and memory.stats.loads == 1  # the small task, read once
    assert await memory.nearest("no such task", "row 1", 5) == []


async def test_a_reopened_indexed_task_builds_nothing(tmp_path: Path) -> None:
    rows, queries = clustered(600, 10, seed=4)
    memory = await indexed_memory(tmp_path, rows, queries)
    builder = memory.index_builder()
    builds = builder.builds
    assert builds == 1
    for index in range(10):
        await memory.lookup(BIG, f"query {index}", threshold=0.5)
    assert builder.builds == builds and not builder.failures
    assert memory.stats.index_lookups == 10 and memory.stats.loads == 0


async def test_a_task_that_grows_past_the_threshold_gets_its_index_in_the_background(tmp_path: Path) -> None:
    rows, queries = clustered(500, 10, seed=5)
    embedder = CallableEmbeddingModel(Vectors(rows, queries), name="fixed")
    memory = LanceDBMemory(tmp_path, embedder, index=SETTINGS)
    await memory.rebuild(BIG, [MemoryEntry(f"k{index}", f"row {index}", "a") for index in range(399)])
    assert not memory.index_builder().builds
    await memory.remember(BIG, "k399", "row 399", "a")  # 400 entries: the build starts
    deadline = time.monotonic() + 120
    while memory.stats.index_lookups == 0:  # exact lookups in the process until the index exists
        recall = await memory.lookup(BIG, "row 7", threshold=0.999)
        assert recall is not None and recall.source == "k7"
        assert time.monotonic() < deadline, "the index never took over"
        await asyncio.sleep(0.05)
    assert current_generation(snapshot_folder(tmp_path / "memory.gil-index", BIG)) is not None


async def test_another_processes_writes_reach_an_indexed_task_within_the_bound(tmp_path: Path, peer: Peer) -> None:
    """Rows another process adds or forgets reach an indexed task (its tail, its dropped rows) once the refresh
    bound has passed, as for a task held in the process."""
    rows, queries = clustered(600, 10, seed=6)
    await indexed_memory(tmp_path, rows, queries)
    clock = ManualClock()
    embedder = CallableEmbeddingModel(Vectors(rows, queries), name="fixed")
    memory = LanceDBMemory(tmp_path, embedder, index=SETTINGS, clock=clock)
    assert (await memory.lookup(BIG, "row 3", threshold=0.999)).source == "k3"  # type: ignore[union-attr]
    assert peer("remember", tmp_path, BIG, "theirs", "a request only the peer has seen", "Theirs.") == "ok"
    clock.now += DEFAULT_REFRESH_INTERVAL
    recall = await memory.lookup(BIG, "a request only the peer has seen", threshold=0.999)
    assert recall is not None and (recall.source, recall.answer) == ("theirs", "Theirs.")
    assert peer("forget", tmp_path, BIG, "k3") == "ok"
    clock.now += DEFAULT_REFRESH_INTERVAL
    recall = await memory.lookup(BIG, "row 3", threshold=0.0)
    assert recall is not None and recall.source != "k3"
    assert peer("remember", tmp_path, BIG, "k5", "a new text for an old key", "Replaced.") == "ok"
    clock.now += DEFAULT_REFRESH_INTERVAL
    recall = await memory.lookup(BIG, "row 5", threshold=0.0)
    assert recall is not None and recall.source != "k5"  # the snapshot's row of the key is not served
    recall = await memory.lookup(BIG, "a new text for an old key", threshold=0.999)
    assert recall is not None and (recall.source, recall.answer) == ("k5", "Replaced.")
    assert memory.stats.index_lookups == 5 and memory.stats.loads == 0 and memory.stats.snapshot_opens == 1
    assert memory.stats.connects == 1  # the peer's write moved the marker: the table was asked (and the tail read)


async def test_two_large_tasks_share_the_index_and_never_see_each_others_rows(tmp_path: Path) -> None:
    """The larger task is filtered after the search (it holds most of the table), the smaller before it; both
    answer only from their own rows, the same vectors notwithstanding."""
    rows, queries = clustered(1000, 10, seed=7)
    embedder = CallableEmbeddingModel(Vectors(rows, queries), name="fixed")
    memory = LanceDBMemory(tmp_path, embedder, index=SETTINGS)
    await memory.rebuild(BIG, [MemoryEntry(f"k{index}", f"row {index}", "big") for index in range(1000)])
    await memory.rebuild("other", [MemoryEntry(f"o{index}", f"row {index}", "other") for index in range(500)])
    await memory.build_index()
    reopened = LanceDBMemory(tmp_path, embedder, index=SETTINGS)
    for index in range(0, 500, 50):
        big = await reopened.nearest(BIG, f"row {index}", 30)
        other = await reopened.nearest("other", f"row {index}", 30)
        assert (big[0].key, big[0].similarity) == (f"k{index}", 1.0) and all(e.answer == "big" for e in big)
        assert (other[0].key, other[0].similarity) == (f"o{index}", 1.0) and all(e.answer == "other" for e in other)
    assert reopened.stats.index_lookups == 20 and reopened.stats.loads == 0


async def test_a_damaged_snapshot_is_never_served_and_is_built_again_from_the_table(tmp_path: Path) -> None:
    rows, queries = clustered(600, 10, seed=8)
    await indexed_memory(tmp_path, rows, queries)
    folder = snapshot_folder(tmp_path / "memory.gil-index", BIG)
    generation = current_generation(folder)
    assert generation is not None
    damaged = folder / generation / "index.faiss"
    damaged.write_bytes(damaged.read_bytes()[:100])  # cut short
    embedder = CallableEmbeddingModel(Vectors(rows, queries), name="fixed")
    memory = LanceDBMemory(tmp_path, embedder, index=SETTINGS)
    for index in range(5):  # answered exactly from the table meanwhile
        recall = await memory.lookup(BIG, f"row {index}", threshold=0.999)
        assert recall is not None and recall.source == f"k{index}"
    assert memory.stats.loads == 1 and memory.stats.snapshot_opens == 0
    assert memory.index_builder().wait(120)
    assert current_generation(folder) not in (None, generation)
    reopened = LanceDBMemory(tmp_path, embedder, index=SETTINGS)
    recall = await reopened.lookup(BIG, "row 7", threshold=0.999)
    assert recall is not None and recall.source == "k7"
    assert (reopened.stats.snapshot_opens, reopened.stats.loads, reopened.stats.index_lookups) == (1, 0, 1)


async def test_an_index_missing_too_many_rows_is_built_again_and_keeps_every_answer(tmp_path: Path) -> None:
    """Past ``min_unindexed`` rows written or forgotten since the snapshot, it is built again in the background;
    lookups answer the same before and after, from the tail and then from the new snapshot."""
    rows, queries = clustered(600, 10, seed=9)
    memory = await indexed_memory(tmp_path, rows, queries)
    folder = snapshot_folder(tmp_path / "memory.gil-index", BIG)
    first = current_generation(folder)
    builds = memory.index_builder().builds
    for index in range(SETTINGS.min_unindexed - 1):
        await memory.remember(BIG, f"new {index}", f"query {index % 10} again {index}", f"new answer {index}")
    await memory.forget(BIG, "k0")
    assert memory.index_builder().wait(120) and memory.index_builder().builds == builds + 1
    assert current_generation(folder) != first
    before = [await memory.nearest(BIG, f"query {index % 10} again {index}", 2) for index in range(0, 49, 7)]
    reopened = LanceDBMemory(tmp_path, CallableEmbeddingModel(Vectors(rows, queries), name="fixed"), index=SETTINGS)
    after = [await reopened.nearest(BIG, f"query {index % 10} again {index}", 2) for index in range(0, 49, 7)]
    assert before == after and all(found[0].key.startswith("new ") for found in after)
    assert all(entry.key != "k0" for entry in await reopened.nearest(BIG, "row 0", 50))
    assert len(await reopened.entries(BIG)) == 600 - 1 + SETTINGS.min_unindexed - 1
