"""LexicalMemory beyond the port's shared rules: its TF-IDF scale and its files."""

from __future__ import annotations

from pathlib import Path

import pytest

from gil_core.errors import MemoryUnavailableError
from gil_core.memory import LexicalMemory, MemoryEntry

TASK = "support"


async def test_words_the_task_never_saw_lower_the_similarity() -> None:
    memory = LexicalMemory()
    await memory.remember(TASK, "t-1", "cancel order", "Cancelled.")
    await memory.remember(TASK, "t-2", "where is my refund", "Soon.")
    recall = await memory.lookup(TASK, "cancel order 123", threshold=0.9)
    assert recall is not None and recall.source == "t-1"
    assert recall.similarity is not None and 0.5 < recall.similarity < 0.9 and not recall.hit


async def test_texts_without_any_character_ngram_are_similar_to_nothing() -> None:
    memory = LexicalMemory()
    await memory.remember(TASK, "t-1", "", "empty")
    await memory.remember(TASK, "t-2", "   ", "blank")
    recall = await memory.lookup(TASK, "anything", threshold=0.0)
    assert recall is not None and (recall.source, recall.similarity, recall.hit) == ("t-1", 0.0, True)


async def test_entries_are_written_atomically_one_file_per_task(tmp_path: Path) -> None:
    memory = LexicalMemory(tmp_path)
    await memory.remember(TASK, "t-1", "where is my refund", "Soon.")
    await memory.remember("x' OR '1'='1", "t-2", "환불 언제 돼요?", "곧 됩니다.")
    files = sorted(path for path in tmp_path.iterdir() if path.suffix == ".jsonl")
    assert len(files) == 2
    assert not [path for path in tmp_path.iterdir() if path.suffix == ".tmp"]
    assert any("환불 언제 돼요?" in path.read_text(encoding="utf-8") for path in files)  # not \\u-escaped
    assert await LexicalMemory(tmp_path).entries("x' OR '1'='1") == [
        MemoryEntry("t-2", "환불 언제 돼요?", "곧 됩니다.")
    ]


async def test_an_unreadable_task_file_is_a_typed_error(tmp_path: Path) -> None:
    await LexicalMemory(tmp_path).remember(TASK, "t-1", "where is my refund", "Soon.")
    (file,) = tmp_path.glob("*.jsonl")
    file.write_text("{not json\n", encoding="utf-8")
    with pytest.raises(MemoryUnavailableError) as caught:
        await LexicalMemory(tmp_path).lookup(TASK, "where is my refund", threshold=0.5)
    assert caught.value.task == TASK and str(file) in str(caught.value)


async def test_a_rewrite_of_the_same_size_is_seen_by_another_instance(tmp_path: Path) -> None:
    writer, reader = LexicalMemory(tmp_path), LexicalMemory(tmp_path)
    for answer in ["answer A", "answer B", "answer C"]:  # same size, written within one clock tick
        await writer.remember(TASK, "t-1", "where is my refund", answer)
        assert [entry.answer for entry in await reader.entries(TASK)] == [answer]
