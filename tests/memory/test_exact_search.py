"""The float32 shortlist with exact float64 rescoring gives today's answers and similarities, bit for bit: on
random data, near ties, exact ties, rows of odd norms, removed and replaced entries, and through LanceDBMemory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from gil_core.memory import CallableEmbeddingModel, LanceDBMemory, MemoryEntry
from gil_core.memory._vectors import TaskVectors, approximation_margin
from tests.memory._shipped_search import shipped_nearest

TASK = "support"


def state_of(rows: NDArray[np.floating]) -> TaskVectors:
    entries = [MemoryEntry(f"k{index}", f"text {index}", f"answer {index}") for index in range(len(rows))]
    return TaskVectors.from_rows(entries, rows, dimensions=rows.shape[1], created=np.arange(len(rows)) + 1)


def found(state: TaskVectors, query: NDArray[np.floating], k: int) -> list[tuple[int, float]]:
    return [(int(entry.key[1:]), entry.similarity or 0.0) for entry in state.nearest(query, k)]


def near_ties(rng: np.random.Generator, count: int, dimensions: int) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """Rows that are copies of a few vectors moved by a unit in the last place, by a tiny amount, or scaled (the
    same direction, another norm): float32 scores cannot tell them apart, the exact cosine can (or ties)."""
    base = rng.standard_normal((4, dimensions)).astype(np.float32)
    rows = base[rng.integers(0, 4, count)].copy()
    kind = rng.integers(0, 4, count)
    nudged = np.nextafter(rows, np.float32(np.inf))
    rows[kind == 1] = nudged[kind == 1]
    rows[kind == 2] += (1e-6 * rng.standard_normal((int((kind == 2).sum()), dimensions))).astype(np.float32)
    rows[kind == 3] *= np.float32(3.0)
    queries = np.concatenate([base, base + 1e-4 * rng.standard_normal((4, dimensions)).astype(np.float32)])
    return rows, queries.astype(np.float32)


@pytest.mark.parametrize("dimensions", [3, 64, 384])
@pytest.mark.parametrize("kind", ["random", "clustered", "near ties"])
def test_answers_and_similarities_are_the_shipped_ones_bit_for_bit(dimensions: int, kind: str) -> None:
    rng = np.random.default_rng(dimensions)
    count = 1000
    if kind == "random":
        rows = rng.standard_normal((count, dimensions)).astype(np.float32)
        queries = rng.standard_normal((12, dimensions)).astype(np.float32)
    elif kind == "clustered":
        centres = rng.standard_normal((20, dimensions))
        rows = (centres[rng.integers(0, 20, count)] + 0.05 * rng.standard_normal((count, dimensions))).astype(
            np.float32
        )
        queries = np.concatenate([rows[:10], rows[10:20] + np.float32(0.01)]).astype(np.float32)
    else:
        rows, queries = near_ties(rng, count, dimensions)
    state = state_of(rows)
    for query in queries:
        for k in (1, 5, count):
            assert found(state, query, k) == shipped_nearest(rows, query, k)


def test_exact_ties_go_to_the_earliest_entry_and_a_vector_is_its_own_best_match() -> None:
    rng = np.random.default_rng(7)
    vector = rng.standard_normal(384).astype(np.float32)
    rows = np.concatenate([rng.standard_normal((500, 384)).astype(np.float32), np.stack([vector] * 5)])
    rows[100] = vector
    state = state_of(rows)
    best = found(state, vector, 7)
    assert best[:6] == [(100, 1.0), (500, 1.0), (501, 1.0), (502, 1.0), (503, 1.0), (504, 1.0)]
    assert best == shipped_nearest(rows, vector, 7)


def test_rows_and_queries_of_odd_norms_are_scored_exactly() -> None:
    """Zero rows, and norms where float32 products would underflow or overflow, are always scored exactly."""
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((300, 16)).astype(np.float32)
    rows[5] = 0.0
    rows[6] = rows[7] * np.float32(1e-30)  # squares underflow in float32
    rows[8] = rows[9] * np.float32(1e25)  # squares overflow in float32
    state = state_of(rows)
    queries = [rows[6] / np.float32(1e-30), rows[8], np.zeros(16, np.float32), rows[3] * np.float32(1e-25)]
    for query in [*queries, *rng.standard_normal((10, 16)).astype(np.float32)]:
        for k in (1, 4):
            assert found(state, query, k) == shipped_nearest(rows, query, k)


def test_removed_and_replaced_entries_rank_as_a_fresh_state_would() -> None:
    rng = np.random.default_rng(11)
    rows = rng.standard_normal((400, 32)).astype(np.float32)
    state = state_of(rows)
    kept = list(range(400))
    for index in range(0, 400, 3):  # enough removals to compact
        state.remove(f"k{index}")
        kept.remove(index)
    replacement = rng.standard_normal(32).astype(np.float32)
    state.upsert(MemoryEntry("k1", "text 1", "again"), replacement, created_us=10_000)
    kept.remove(1)
    order = [*kept, 1]
    reference = np.concatenate([rows[kept], replacement[None, :]])
    for query in [replacement, *rng.standard_normal((10, 32)).astype(np.float32)]:
        for k in (1, 3, len(order)):
            expected = [(order[row], similarity) for row, similarity in shipped_nearest(reference, query, k)]
            assert found(state, query, k) == expected
    assert [entry.key for entry in state.entries()] == [f"k{index}" for index in order]


def test_rows_learned_out_of_order_still_tie_by_when_they_were_remembered() -> None:
    vector = np.ones(8, np.float32)
    state = TaskVectors(8)
    state.learn(MemoryEntry("late", "t", "a"), vector, created_us=200, address=5)
    state.learn(MemoryEntry("early", "t", "a"), vector, created_us=100, address=3)
    state.learn(MemoryEntry("early", "t", "a"), vector, created_us=100, address=9)  # the same row, moved
    assert [entry.key for entry in state.nearest(vector, 2)] == ["early", "late"]
    assert [entry.key for entry in state.entries()] == ["early", "late"]
    assert state.addresses() == {5: "late", 9: "early"} and state.watermark == 9


def test_the_shortlist_margin_covers_float32_rounding_and_stays_small() -> None:
    assert 4.5e-5 < approximation_margin(384) < 5e-5
    assert approximation_margin(2**24) == float("inf")


async def test_lancedb_memory_answers_as_the_shipped_search_on_its_stored_vectors(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    rows, queries = near_ties(rng, 300, 48)
    texts = {f"row {index}": rows[index] for index in range(len(rows))}
    texts.update({f"query {index}": query for index, query in enumerate(queries)})
    embedder = CallableEmbeddingModel(lambda batch: np.stack([texts[text] for text in batch]), name="fixed")
    memory = LanceDBMemory(tmp_path, embedder)
    await memory.rebuild(TASK, [MemoryEntry(f"k{index}", f"row {index}", "a") for index in range(len(rows))])
    reopened = LanceDBMemory(tmp_path, embedder)  # reads the table: the vectors as stored
    for index, query in enumerate(queries):
        expected = shipped_nearest(rows, query, 5)
        for memory_ in (memory, reopened):
            got = await memory_.nearest(TASK, f"query {index}", 5)
            assert [(int(entry.key[1:]), entry.similarity) for entry in got] == expected
