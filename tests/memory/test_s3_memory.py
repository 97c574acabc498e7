"""LanceDB memory on object storage: an ``s3://bucket/prefix`` path on moto's S3 server (started here, on
loopback) remembers, recalls, forgets and rebuilds as a local folder does, across instances and concurrent
writers; a refused key is a ``MemoryUnavailableError`` that never shows the key."""

from __future__ import annotations

import asyncio
import traceback

import pytest

from gil_core.errors import MemoryUnavailableError
from gil_core.memory import LanceDBMemory, MemoryEntry
from gil_core.storage import S3Settings
from gil_core.testing import HashEmbeddingModel
from tests.telemetry._s3 import (
    ACCESS_KEY_ID,
    SECRET_ACCESS_KEY,
    keys_checked,
    new_bucket,
    objects,
    serve_s3,
    settings_for,
)

pytestmark = pytest.mark.s3

TASK = "support"

s3_endpoint = pytest.fixture(scope="module")(serve_s3)
s3 = pytest.fixture(settings_for)


@pytest.fixture
def root(s3_endpoint: str) -> str:
    return f"s3://{new_bucket(s3_endpoint)}/gil/memory"


def memory_at(root: str, s3: S3Settings) -> LanceDBMemory:
    return LanceDBMemory(root, HashEmbeddingModel(32), s3=s3)


async def test_the_memory_remembers_recalls_and_forgets_over_s3(root: str, s3: S3Settings) -> None:
    memory = memory_at(root, s3)
    assert await memory.lookup(TASK, "where is my refund", threshold=0.9) is None  # no table yet
    await memory.remember(TASK, "t-1", "where is my refund", "Refunds take 5 days.")
    await memory.remember(TASK, "t-2", "cancel my order", "Use the orders page.")

    recall = await memory.lookup(TASK, "where is my refund", threshold=0.9)
    assert recall is not None and recall.hit and recall.source == "t-1"
    assert recall.answer == "Refunds take 5 days." and recall.similarity == pytest.approx(1.0)

    again = memory_at(root, s3)  # another process would open it this way: nothing cached
    assert [entry.key for entry in await again.entries(TASK)] == ["t-1", "t-2"]
    await again.forget(TASK, "t-1")
    assert [entry.key for entry in await memory.entries(TASK)] == ["t-2"]  # the first instance sees the delete
    miss = await memory.lookup(TASK, "where is my refund", threshold=0.9)
    assert miss is not None and not miss.hit and miss.source == "t-2"
    assert await memory.entries("other task") == []

    bucket, prefix = root.removeprefix("s3://").split("/", 1)
    assert any(name.startswith("memory.lance/") for name in objects(s3, bucket, prefix))


async def test_rebuild_over_s3_replaces_a_tasks_entries_in_one_step(root: str, s3: S3Settings) -> None:
    memory = memory_at(root, s3)
    await memory.remember(TASK, "old", "printer jammed", "Open the tray.")
    await memory.remember("billing", "keep", "invoice missing", "Check spam.")
    await memory.rebuild(TASK, [MemoryEntry(key="new", text="reset my password", answer="Use the link.")])
    fresh = memory_at(root, s3)
    assert [entry.key for entry in await fresh.entries(TASK)] == ["new"]
    assert [entry.key for entry in await fresh.entries("billing")] == ["keep"]


async def test_two_writers_on_the_same_s3_table_lose_nothing(root: str, s3: S3Settings) -> None:
    """Each commit is a put-if-absent of the next manifest: a writer that loses the race retries on top."""
    first, second = memory_at(root, s3), memory_at(root, s3)
    await first.remember(TASK, "seed", "hello", "hi")  # create the table before the race

    async def write(memory: LanceDBMemory, prefix: str) -> None:
        for index in range(4):
            await memory.remember(TASK, f"{prefix}-{index}", f"{prefix} question {index}", f"{prefix} answer")

    await asyncio.gather(write(first, "a"), write(second, "b"))
    keys = {entry.key for entry in await memory_at(root, s3).entries(TASK)}
    assert keys == {"seed"} | {f"{prefix}-{index}" for prefix in "ab" for index in range(4)}


async def test_a_refused_key_is_a_memory_error_that_never_shows_the_key(root: str, s3: S3Settings) -> None:
    memory = memory_at(root, s3)
    assert ACCESS_KEY_ID not in repr(memory) and SECRET_ACCESS_KEY not in repr(memory)
    with keys_checked(), pytest.raises(MemoryUnavailableError) as raised:
        await memory.remember(TASK, "t-1", "where is my refund", "Soon.")
    error = raised.value
    assert error.task == TASK and root in str(error) and "open the table" in str(error)
    assert error.__cause__ is None and error.__suppress_context__  # the library's text is not shown as a cause
    for text in (str(error), repr(error), "".join(traceback.format_exception(error))):
        assert ACCESS_KEY_ID not in text and SECRET_ACCESS_KEY not in text
