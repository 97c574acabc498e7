"""Memory and embedder faults during batches: requests go on as traced misses, answered by the tree; a circuit
breaker spares a failing embedding endpoint; memory that could not learn is rebuilt from the feedback history.

(The breaker's own rules are tests/memory/test_breaker.py; one resolver with a breaker over a dead endpoint is
tests/resolver/test_memory_in_the_resolver.py. Here: what a task file gets, and faults of other kinds.)
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from flows.cli import app
from gil_core.batch import Ticket, Verdict, resolve_batch
from gil_core.batch_feedback import apply_verdicts
from gil_core.llm import OpenAICompatibleChatModel, OpenAICompatibleEmbeddingModel
from gil_core.memory import LanceDBMemory
from gil_core.resolver import Resolver
from gil_core.runtime import open_runtime
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel, ScriptedChatModel, ScriptedOpenAIServer
from tests.flows._support import write_task_file
from tests.reliability._support import REFUND, check_one_trace_per_ticket, memory_matches_history
from tests.resolver._support import Script, support_server, support_task

pytestmark = pytest.mark.reliability

REFUND_QUESTION = "where is my refund?"
SCRIPTS = {REFUND_QUESTION: Script(route=["billing", "refund status"])}


def embedding_requests(server: ScriptedOpenAIServer) -> int:
    return sum(request.path.endswith("/embeddings") for request in server.requests)


def recalls(store: TelemetryStore) -> list[dict[str, object]]:
    return [json.loads(recall) for recall in store.read("traces")["recall"].drop_nulls()]


FIRST = Ticket("first", REFUND_QUESTION)


async def remember_one_answer(task_file: Path) -> None:
    """Resolve the refund question once (ticket FIRST) and confirm it, so memory holds an entry to look up."""
    loaded = load_task_file(task_file)
    async with open_runtime(loaded) as runtime:
        report = await resolve_batch(runtime.resolver, loaded.task, [FIRST])
        await apply_verdicts(runtime.resolver, loaded.task, [Verdict(report.trace_ids[FIRST.id], True)])


@pytest.mark.slow
async def test_a_task_files_memory_spares_a_failing_embedding_endpoint(tmp_path: Path) -> None:
    """Through ``open_runtime`` (what ``gil`` and the flows use): with the endpoint answering 503, two requests
    in a row are misses answered by the tree, and only the first lookup reaches the endpoint (with its retries)."""
    with support_server(SCRIPTS) as chat, ScriptedOpenAIServer() as embedder:
        task_file = write_task_file(tmp_path, chat.base_url, embedding_model={"url": embedder.base_url, "name": "e"})
        await remember_one_answer(task_file)
        before = embedding_requests(embedder)
        for _ in range(20):
            embedder.enqueue_failure("503")
        loaded = load_task_file(task_file)
        tickets = [Ticket(f"t{index}", REFUND_QUESTION) for index in range(2)]
        async with open_runtime(loaded) as runtime:  # a new process: nothing embedded yet
            report = await resolve_batch(runtime.resolver, loaded.task, tickets, concurrency=1)
        during = embedding_requests(embedder) - before

    assert (report.resolved, report.failed) == (2, [])
    store = TelemetryStore(tmp_path / "store")
    traces = check_one_trace_per_ticket(store, "support", [FIRST, *tickets]).filter(
        pl.col("feedback_verdict").is_null()
    )
    assert set(traces["mode"]) == {"habit/answer"} and set(traces["output"]) == {REFUND}
    failed = [recall for recall in recalls(store) if recall.get("error")]
    assert len(failed) == 2 and all(recall["hit"] is False for recall in failed)
    assert during <= 4, f"{during} embedding requests for 2 lookups: no breaker spared the endpoint"


@pytest.mark.slow
def test_an_unusable_memory_store_makes_misses_and_a_rebuild_restores_it(tmp_path: Path) -> None:
    """The memory directory is a file (a broken mount, say): every lookup and every memory write fails, the
    requests are answered by the tree, the verdicts are still stored, and ``gil rebuild-memory`` catches up."""
    with support_server(SCRIPTS) as chat:
        task_file = write_task_file(tmp_path, chat.base_url)
        (tmp_path / "memory").write_text("not a directory", encoding="utf-8")
        loaded = load_task_file(task_file)
        tickets = [Ticket(f"t{index}", REFUND_QUESTION) for index in range(3)]

        async def batch_then_feedback() -> tuple[int, int]:
            async with open_runtime(loaded) as runtime:
                report = await resolve_batch(runtime.resolver, loaded.task, tickets, concurrency=1)
                verdicts = [Verdict(trace_id, True) for trace_id in report.trace_ids.values()]
                feedback = await apply_verdicts(runtime.resolver, loaded.task, verdicts)
            return report.resolved, feedback.applied

        assert asyncio.run(batch_then_feedback()) == (3, 3)
    store = TelemetryStore(tmp_path / "store")
    traces = check_one_trace_per_ticket(store, "support", tickets)
    assert set(traces["output"]) == {REFUND} and set(traces["feedback_verdict"]) == {"correct"}
    assert all("LanceDB store" in str(recall.get("error")) for recall in recalls(store))

    (tmp_path / "memory").unlink()  # the mount is back, empty
    result = CliRunner().invoke(app, ["rebuild-memory", "-t", str(task_file), "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"entries": 3}
    resolver = Resolver(ScriptedChatModel(), store)
    memory = LanceDBMemory(tmp_path / "memory", HashEmbeddingModel())
    assert asyncio.run(memory_matches_history(resolver, memory, "support")) == 3


async def test_bad_embedding_replies_are_misses_with_the_reason_and_the_next_lookup_hits(tmp_path: Path) -> None:
    """A reply with vectors of the wrong size, then one that is not JSON, then a healthy one."""
    store, task = TelemetryStore(tmp_path / "store"), support_task()
    with support_server(SCRIPTS) as chat, ScriptedOpenAIServer() as embedder:
        async with (
            OpenAICompatibleChatModel(chat.base_url, "m") as chat_model,
            OpenAICompatibleEmbeddingModel(embedder.base_url, "e", max_attempts=1) as embedding_model,
        ):
            resolver = Resolver(chat_model, store, memory=LanceDBMemory(tmp_path / "memory", embedding_model))
            first = await resolver.resolve(task, REFUND_QUESTION)
            await resolver.feedback(task, first.trace_id, correct=True)
            embedder.enqueue_json({"object": "list", "data": [{"index": 0, "embedding": [0.5, 0.5]}]})
            embedder.enqueue_failure("garbage")
            fresh = Resolver(chat_model, store, memory=LanceDBMemory(tmp_path / "memory", embedding_model))
            tickets = [Ticket(f"t{index}", REFUND_QUESTION) for index in range(3)]
            await resolve_batch(fresh, task, tickets, concurrency=1)

    by_ticket = store.read("traces").filter(pl.col("trace_id") != first.trace_id).sort("created_at")
    modes = by_ticket["mode"].to_list()
    errors = [json.loads(recall).get("error") for recall in by_ticket["recall"]]
    assert modes == ["habit/answer", "habit/answer", "memory"]
    assert "2-dimensional vectors" in errors[0] and "not JSON" in errors[1] and errors[2] is None
    assert set(by_ticket["output"]) == {REFUND}
