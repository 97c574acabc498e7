"""LanceDBMemory beyond the port's shared rules: exact cosine, embedding calls, typed failures, LANCE_LOG."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from gil_core.errors import MemoryUnavailableError, ModelError
from gil_core.llm import EmbeddingRecorder, OpenAICompatibleEmbeddingModel
from gil_core.memory import CallableEmbeddingModel, LanceDBMemory
from gil_core.telemetry import EnergyModel
from gil_core.testing import HashEmbeddingModel, ScriptedOpenAIServer
from tests.memory._support import ListSink

TASK = "support"
TEXTS = ["where is my refund", "refund where is it", "cancel my order", "my order never came", "printer jammed"]


def float64_cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The reference: numpy float64 cosine of two vectors rounded to float32, as the table stores them."""
    x, y = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b))
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


async def test_similarity_is_the_exact_float64_cosine_of_the_stored_vectors(tmp_path: Path) -> None:
    embedder = HashEmbeddingModel(64)
    memory = LanceDBMemory(tmp_path, embedder)
    for index, text in enumerate(TEXTS):
        await memory.remember(TASK, f"t-{index}", text, f"answer {index}")
    query = "where is my refund please"
    found = await memory.nearest(TASK, query, len(TEXTS))
    expected = {
        f"t-{index}": float64_cosine(embedder.embed_text(query), embedder.embed_text(text))
        for index, text in enumerate(TEXTS)
    }
    assert [entry.key for entry in found] == sorted(expected, key=lambda key: -expected[key])
    for entry in found:
        assert entry.similarity == pytest.approx(expected[entry.key], abs=1e-12)
        # Against the unrounded float64 vectors only float32 storage separates them.
        raw = float(np.dot(embedder.embed_text(query), embedder.embed_text(entry.text)))
        assert entry.similarity == pytest.approx(raw, abs=1e-6)


async def test_embedding_calls_through_an_http_endpoint_are_recorded_and_not_repeated(tmp_path: Path) -> None:
    sink = ListSink()
    with ScriptedOpenAIServer(embedding_dimensions=32) as server:
        async with OpenAICompatibleEmbeddingModel(server.base_url, "embedder") as model:
            memory = LanceDBMemory(tmp_path, EmbeddingRecorder(model, sink=sink, energy=EnergyModel.tokens()))

            assert await memory.lookup(TASK, "where is my refund", threshold=0.8) is None
            assert len(sink.calls) == 0  # an empty task costs no embedding

            await memory.remember(TASK, "t-1", "where is my refund", "Soon.")
            recall = await memory.lookup(TASK, "cancel my order", threshold=0.8)
            assert len(sink.calls) == 2 and recall is not None and not recall.hit

            await memory.remember(TASK, "t-2", "cancel my order", "Cancelled.")  # the vector of the lookup
            again = await memory.lookup(TASK, "cancel my order", threshold=0.8)
            assert again is not None and (again.source, again.hit, again.similarity) == ("t-2", True, 1.0)
            assert len(sink.calls) == 2

        embedding_requests = [request for request in server.requests if request.path == "/v1/embeddings"]
    assert len(embedding_requests) == 2
    assert {(call.role, call.model) for call in sink.calls} == {("embed", "embedder")}
    assert [call.prompt_tokens for call in sink.calls] == [4, 3]


async def test_an_embedder_failure_is_a_typed_error_naming_the_task(tmp_path: Path) -> None:
    def broken(texts: list[str]) -> list[list[float]]:
        raise ConnectionError("model server is gone")

    healthy = LanceDBMemory(tmp_path, HashEmbeddingModel(8))
    await healthy.remember(TASK, "t-1", "where is my refund", "Soon.")
    memory = LanceDBMemory(tmp_path, CallableEmbeddingModel(broken, name="local"))
    with pytest.raises(MemoryUnavailableError) as caught:
        await memory.lookup(TASK, "where is my refund", threshold=0.8)
    assert caught.value.task == TASK and "'local'" in str(caught.value) and "model server is gone" in str(caught.value)
    assert isinstance(caught.value.__cause__, ModelError)
    assert caught.value.__cause__.endpoint == "callable:local"


@pytest.mark.parametrize(
    ("vectors", "says"),
    [
        ([[0.0] * 16], "16-dimensional"),
        ([[math.nan] * 8], "not finite"),
        ([], "for 1 texts"),
    ],
)
async def test_a_vector_the_table_cannot_hold_is_refused(tmp_path: Path, vectors: list[list[float]], says: str) -> None:
    await LanceDBMemory(tmp_path, HashEmbeddingModel(8)).remember(TASK, "t-1", "where is my refund", "Soon.")
    memory = LanceDBMemory(tmp_path, CallableEmbeddingModel(lambda texts: vectors, name="odd"))
    with pytest.raises(MemoryUnavailableError, match=says):
        await memory.remember(TASK, "t-2", "cancel my order", "Cancelled.")
    assert [entry.key for entry in await memory.entries(TASK)] == ["t-1"]


def test_lance_log_defaults_to_error_without_overriding_a_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LANCE_LOG", raising=False)
    LanceDBMemory(tmp_path, HashEmbeddingModel())
    assert os.environ["LANCE_LOG"] == "error"
    monkeypatch.setenv("LANCE_LOG", "debug")
    LanceDBMemory(tmp_path, HashEmbeddingModel())
    assert os.environ["LANCE_LOG"] == "debug"


_POOL_PROBE = """
import asyncio, sys
if sys.argv[2] == "pyarrow first":
    import pyarrow
from gil_core.memory import LanceDBMemory
from gil_core.testing import HashEmbeddingModel

async def main():
    memory = LanceDBMemory(sys.argv[1], HashEmbeddingModel(8))
    await memory.remember("support", "t-1", "where is my parcel", "On its way.")
    assert (await memory.lookup("support", "where is my parcel", threshold=0.99)) is not None
    import pyarrow as pa
    before = pa.default_memory_pool().bytes_allocated()
    kept = pa.array(list(range(100_000)))  # allocated by the default pool
    print(pa.default_memory_pool().backend_name, pa.default_memory_pool().bytes_allocated() - before)

asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("chosen", "order", "pool"),
    [(None, "memory first", "system"), (None, "pyarrow first", "system"), ("mimalloc", "memory first", "mimalloc")],
)
def test_memory_puts_pyarrow_s_buffers_on_the_system_allocator_unless_the_operator_chose_one(
    tmp_path: Path, chosen: str | None, order: str, pool: str
) -> None:
    """pyarrow's default allocator kept growing in the soak's long-lived processes (RELIABILITY.md, "Findings"):
    a process that opens memory allocates Arrow buffers with the system allocator, whether pyarrow was imported
    before or not, unless ``ARROW_DEFAULT_MEMORY_POOL`` says otherwise. Each case is a fresh interpreter."""
    import subprocess
    import sys

    environment = {key: value for key, value in os.environ.items() if key != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen is not None:
        environment["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    done = subprocess.run(
        [sys.executable, "-c", _POOL_PROBE, str(tmp_path), order],
        env=environment, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    backend, allocated = done.stdout.split()
    assert backend == pool
    assert int(allocated) >= 800_000  # the array's buffer was allocated by that pool


async def test_lancedb_s_metadata_cache_is_bounded_per_process_across_many_writes(tmp_path: Path) -> None:
    """Every write makes a table version whose metadata LanceDB caches (its default bound is 1 GiB, which a
    long-lived writer fills: issue 19's soak). The memory's connections share one session per bound: after 80
    writes and lookups through two instances its caches hold something, and never more than the bound."""
    from gil_core.memory.lance_tables import lance_session

    bound = 2 << 20
    first = LanceDBMemory(tmp_path, HashEmbeddingModel(8), metadata_cache_bytes=bound)
    second = LanceDBMemory(tmp_path, HashEmbeddingModel(8), metadata_cache_bytes=bound, refresh_interval=0.0)
    for index in range(80):
        memory = first if index % 2 else second
        await memory.remember(TASK, f"t-{index}", f"where is parcel {index}", f"Parcel {index} is on its way.")
        assert (await memory.lookup(TASK, f"where is parcel {index}", threshold=0.99)) is not None
    session = lance_session(bound)
    assert 0 < session.size_bytes <= bound
    assert lance_session(bound) is session and lance_session() is not session


@pytest.mark.filterwarnings("ignore:optimize.cleanup_older_than=0.:UserWarning")  # the test's own table
async def test_compact_memory_merges_each_write_s_file_and_old_versions_while_instances_keep_answering(
    tmp_path: Path,
) -> None:
    from datetime import timedelta

    from gil_core.errors import InvalidArgumentError
    from gil_core.memory import compact_memory

    assert await compact_memory(tmp_path) is None  # no table yet
    writer = LanceDBMemory(tmp_path, HashEmbeddingModel(8))
    for index in range(12):
        await writer.remember("support", f"k{index}", f"where is parcel {index}", f"Parcel {index} is on its way.")
    await writer.forget("support", "k3")
    table = tmp_path / "memory.lance"
    files_before = len(list((table / "data").iterdir()))
    versions_before = len(list((table / "_versions").glob("*.manifest")))
    assert files_before >= 12 and versions_before >= 13  # a data file and a version per write

    done = await compact_memory(tmp_path, keep_versions_for=timedelta(0))

    assert done is not None
    assert done.fragments_removed >= 11 and done.fragments_added == 1
    assert done.versions_removed >= versions_before - 1 and done.bytes_removed > 0
    assert len(list((table / "data").iterdir())) == 1
    assert len(list((table / "_versions").glob("*.manifest"))) <= 2
    # The instance that wrote before the compaction answers as before (its rows moved), and keeps learning.
    hit = await writer.lookup("support", "where is parcel 5", threshold=0.99)
    assert hit is not None and hit.hit and hit.answer == "Parcel 5 is on its way."
    missed = await writer.lookup("support", "where is parcel 3", threshold=0.99)
    assert missed is None or not missed.hit
    await writer.remember("support", "k20", "where is parcel 20", "Parcel 20 is on its way.")
    fresh = LanceDBMemory(tmp_path, HashEmbeddingModel(8))
    expected = {f"k{index}" for index in (*range(12), 20)} - {"k3"}
    assert {entry.key for entry in await fresh.entries("support")} == expected
    assert {entry.key for entry in await writer.entries("support")} == expected
    with pytest.raises(InvalidArgumentError, match="keep_versions_for"):
        await compact_memory(tmp_path, keep_versions_for=timedelta(seconds=-1))


async def test_a_change_of_many_entries_is_one_table_version_and_one_embedding_call(tmp_path: Path) -> None:
    from gil_core.memory import MemoryChanges

    hashed = HashEmbeddingModel(8)
    batches: list[int] = []

    def embed(texts: Sequence[str]) -> list[list[float]]:
        batches.append(len(texts))
        return [hashed.embed_text(text) for text in texts]

    memory = LanceDBMemory(tmp_path, CallableEmbeddingModel(embed, name="counted"))
    await memory.remember(TASK, "old", "printer jammed", "Open tray 2.")
    versions = tmp_path / "memory.lance" / "_versions"
    before, batches[:] = len(list(versions.glob("*.manifest"))), []
    changes = MemoryChanges().forget("old")
    for index in range(40):
        changes.remember(f"t-{index}", f"where is parcel {index}", f"Parcel {index} is on its way.")
    await memory.change(TASK, changes)
    assert len(list(versions.glob("*.manifest"))) == before + 1
    assert batches == [40]
    fresh = LanceDBMemory(tmp_path, CallableEmbeddingModel(embed, name="counted"))
    assert [entry.key for entry in await fresh.entries(TASK)] == [f"t-{index}" for index in range(40)]
    await memory.change(TASK, MemoryChanges().forget("old").forget("never-held"))  # nothing held: no version
    assert len(list(versions.glob("*.manifest"))) == before + 1


async def test_a_table_another_process_is_still_creating_is_no_table_yet_and_a_write_creates_it(tmp_path: Path) -> None:
    """A create makes the table's folder before it commits a first version; a second process that lists the
    folder then and opens it hears that the table was not found (two processes writing a fresh memory at once
    met it: RELIABILITY.md). That is no table yet: a lookup misses, a compaction has nothing to do, a write
    creates the table, and other instances read what it wrote."""
    from gil_core.memory import compact_memory

    (tmp_path / "memory.lance").mkdir()  # the folder, as a create in another process leaves it before its commit
    memory = LanceDBMemory(tmp_path, HashEmbeddingModel(8))
    assert await memory.lookup(TASK, TEXTS[0], threshold=0.5) is None
    assert await compact_memory(tmp_path) is None
    await memory.remember(TASK, "trace-1", TEXTS[0], "It is on its way.")
    recall = await LanceDBMemory(tmp_path, HashEmbeddingModel(8)).lookup(TASK, TEXTS[0], threshold=0.9)
    assert recall is not None and recall.hit and recall.answer == "It is on its way."
