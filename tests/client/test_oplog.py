"""The operation log: one entry per model call, kept in process or under a store root, with stats and recall."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gil_core.client import (
    InProcessOperationLog,
    JsonLinesOperationLog,
    LoggedChatModel,
    OperationEntry,
    call_options,
)
from gil_core.errors import ConfigurationError, ModelUnavailableError
from gil_core.llm import Embeddings, Usage
from gil_core.testing import HashEmbeddingModel, ScriptedChatModel
from tests.client._support import user

START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def entry(number: int, text: str, *, success: bool = True, output: str = "ok") -> OperationEntry:
    return OperationEntry(
        entry_id=f"e{number}",
        created_at=START + timedelta(minutes=number),
        intent=None,
        input_preview=text,
        output=output,
        target_type="text",
        success=success,
        attempts=1,
        provider="local",
        model="m",
        prompt_tokens=10,
        completion_tokens=2,
    )


async def test_a_successful_call_becomes_one_complete_entry() -> None:
    inner = ScriptedChatModel(name="small")
    inner.enqueue("five days", usage=Usage(prompt_tokens=30, completion_tokens=2))
    log = InProcessOperationLog()
    model = LoggedChatModel(inner, log, provider="local", target_type="text", tags=("support",))
    long_request = "when is my refund? " * 200

    with call_options(intent="refund triage", attempt=2, tags=("urgent",)):
        await model.complete(user(long_request), max_tokens=8)

    (logged,) = log.entries()
    assert (logged.intent, logged.target_type, logged.attempts, logged.tags) == (
        "refund triage",
        "text",
        2,
        ("support", "urgent"),
    )
    assert logged.input_preview == ("user: " + long_request)[:2000] and len(logged.input_preview) == 2000
    assert (logged.output, logged.success, logged.error) == ("five days", True, None)
    assert (logged.provider, logged.model, logged.prompt_tokens, logged.completion_tokens) == ("local", "small", 30, 2)
    assert logged.duration_ms >= 0 and logged.created_at.tzinfo is not None


async def test_a_failed_call_is_logged_and_its_error_raised() -> None:
    inner = ScriptedChatModel(name="small")
    inner.enqueue_failure("503")
    log = InProcessOperationLog()
    with pytest.raises(ModelUnavailableError):
        await LoggedChatModel(inner, log, provider="local").complete(user("q"), max_tokens=8)
    (logged,) = log.entries()
    assert (logged.success, logged.output, logged.model) == (False, "", "small")
    assert logged.error is not None and logged.error.startswith("ModelUnavailableError")


async def test_a_do_not_record_call_leaves_no_entry() -> None:
    inner = ScriptedChatModel()
    inner.enqueue("secret answer")
    log = InProcessOperationLog()
    with call_options(do_not_record=True):
        await LoggedChatModel(inner, log, provider="local").complete(user("secret"), max_tokens=8)
    assert log.entries() == ()


class FailingLog(InProcessOperationLog):
    async def record(self, entry: OperationEntry) -> None:
        raise OSError("disk full")


async def test_an_error_while_recording_is_a_warning_and_never_fails_the_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = ScriptedChatModel()
    inner.enqueue("answer")
    with caplog.at_level(logging.WARNING):
        completion = await LoggedChatModel(inner, FailingLog(), provider="local").complete(user("q"), max_tokens=8)
    assert completion.content == "answer"
    assert "recording a call failed" in caplog.text


async def test_the_in_process_log_keeps_the_last_entries_or_all_with_zero() -> None:
    bounded = InProcessOperationLog(max_entries=3)
    unbounded = InProcessOperationLog(max_entries=0)
    for number in range(5):
        await bounded.record(entry(number, f"request {number}"))
        await unbounded.record(entry(number, f"request {number}"))
    assert [item.entry_id for item in bounded.entries()] == ["e2", "e3", "e4"]
    assert len(unbounded.entries()) == 5
    assert InProcessOperationLog().entries() == ()
    with pytest.raises(ConfigurationError):
        InProcessOperationLog(max_entries=-1)


async def test_stats_count_entries_successes_tokens_and_the_time_span() -> None:
    log = InProcessOperationLog()
    assert log.stats().success_rate is None and log.stats().oldest is None
    for number, success in enumerate([True, True, False, True]):
        await log.record(entry(number, "r", success=success))
    stats = log.stats()
    assert (stats.entries, stats.successes, stats.success_rate) == (4, 3, 0.75)
    assert (stats.prompt_tokens, stats.completion_tokens, stats.tokens) == (40, 8, 48)
    assert (stats.oldest, stats.newest) == (START, START + timedelta(minutes=3))


async def test_recall_by_words_needs_a_shared_word_of_three_or_more_characters() -> None:
    log = InProcessOperationLog()
    await log.record(entry(0, "refund for a broken kettle"))
    await log.record(entry(1, "where is my parcel"))
    await log.record(entry(2, "refund of a parcel", output="refunds take five days"))

    found = await log.recall("parcel refund", k=5)
    assert [item.entry.entry_id for item in found] == ["e2", "e1", "e0"]  # both words, then newer first
    assert found[0].score == 1.0 and found[0].method == "words"
    assert await log.recall("an of is my", k=5) == []  # only short words: nothing to match on
    assert await log.recall("umbrella", k=5) == []  # no overlap, no result
    assert len(await log.recall("refund", k=1)) == 1
    with pytest.raises(ConfigurationError):
        await log.recall("refund", k=0)


class PickyEmbedder(HashEmbeddingModel):
    """Fails to embed any text containing "kettle"."""

    async def embed(self, texts: Sequence[str]) -> Embeddings:
        if any("kettle" in text for text in texts):
            raise ModelUnavailableError("embedder down", endpoint="test://embedder")
        return await super().embed(texts)


async def test_recall_by_embeddings_falls_back_to_words_where_embedding_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = InProcessOperationLog(embedder=PickyEmbedder())
    with caplog.at_level(logging.WARNING):
        await log.record(entry(0, "refund for a broken kettle"))
    await log.record(entry(1, "where is my parcel now"))
    assert log.entries()[0].embedding is None and log.entries()[1].embedding is not None
    assert "embedding failed" in caplog.text

    found = await log.recall("where is my parcel", k=5)
    assert found[0].entry.entry_id == "e1" and found[0].method == "embedding" and found[0].score > 0.5
    by_words = await log.recall("broken kettle refund", k=5)  # the query itself cannot be embedded
    assert [(item.entry.entry_id, item.method) for item in by_words] == [("e0", "words")]


async def test_the_persistent_log_survives_a_new_instance(tmp_path: Path) -> None:
    log = JsonLinesOperationLog(tmp_path)
    for number in range(3):
        await log.record(entry(number, f"환불 request {number}"))
    reopened = JsonLinesOperationLog(tmp_path)
    assert reopened.entries() == log.entries()
    assert [item.input_preview for item in reopened.entries()] == [f"환불 request {n}" for n in range(3)]
    files = sorted(path.name for path in (tmp_path / "operation_log").iterdir())
    assert len(files) == 3 and all(name.endswith(".jsonl") and not name.startswith(".") for name in files)
    assert "환불" in (tmp_path / "operation_log" / files[0]).read_text(encoding="utf-8")  # not escaped


async def test_a_batch_is_written_as_one_file_when_full_or_flushed(tmp_path: Path) -> None:
    log = JsonLinesOperationLog(tmp_path, batch_size=3)
    for number in range(4):
        await log.record(entry(number, "r"))
    assert len(list((tmp_path / "operation_log").glob("*.jsonl"))) == 1
    assert len(JsonLinesOperationLog(tmp_path).entries()) == 3 and len(log.entries()) == 4
    log.flush()
    log.flush()  # nothing pending: no empty file
    assert len(list((tmp_path / "operation_log").glob("*.jsonl"))) == 2
    assert len(JsonLinesOperationLog(tmp_path).entries()) == 4


async def test_an_unreadable_line_is_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = JsonLinesOperationLog(tmp_path, embedder=HashEmbeddingModel())
    await log.record(entry(0, "refund please"))
    (path,) = (tmp_path / "operation_log").glob("*.jsonl")
    path.write_text(path.read_text(encoding="utf-8") + "{not json\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        (kept,) = JsonLinesOperationLog(tmp_path).entries()
    assert kept.embedding is not None and len(kept.embedding) == 64
    assert "unreadable" in caplog.text


async def test_the_persistent_log_gives_stats_and_recall(tmp_path: Path) -> None:
    log = JsonLinesOperationLog(tmp_path)
    await log.record(entry(0, "refund for a kettle"))
    await log.record(entry(1, "parcel lost", success=False))
    assert log.stats().success_rate == 0.5
    assert [item.entry.entry_id for item in await JsonLinesOperationLog(tmp_path).recall("lost parcel")] == ["e1"]


def test_an_empty_store_has_an_empty_log(tmp_path: Path) -> None:
    assert JsonLinesOperationLog(tmp_path / "nowhere").entries() == ()
    with pytest.raises(ConfigurationError):
        JsonLinesOperationLog(tmp_path, batch_size=0)
