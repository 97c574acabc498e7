"""Memory as the resolver uses it: failures as misses, the breaker, restarts, rebuilds, and tenants."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gil_core.errors import UnknownTraceError
from gil_core.llm import OpenAICompatibleChatModel, OpenAICompatibleEmbeddingModel
from gil_core.memory import CircuitBreakingMemory, LanceDBMemory
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel, ManualClock, ScriptedChatModel
from tests.resolver._support import ROOT, Script, support_server, support_task

GIFT = "do you sell gift cards?"


async def test_a_dead_embedding_endpoint_makes_misses_and_the_breaker_spares_it(tmp_path: Path) -> None:
    store, clock = TelemetryStore(tmp_path / "store"), ManualClock()
    with support_server({}, default=Script(answers=["None of these"])) as server:
        embedder = OpenAICompatibleEmbeddingModel(server.base_url, "emb", max_attempts=1)
        memory = CircuitBreakingMemory(LanceDBMemory(tmp_path / "memory", embedder), cooldown=60.0, clock=clock)
        task = support_task()
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(chat, store, memory=memory)
            first = await resolver.resolve(task, GIFT)
            await resolver.feedback(task, first.trace_id, correct=True)  # remember: the endpoint is alive
            embed_requests = lambda: sum(r.path.endswith("/embeddings") for r in server.requests)  # noqa: E731
            alive = embed_requests()
            server.enqueue_failure("500")
            failed = await resolver.resolve(task, "gift cards, do you sell them?")
            assert failed.mode == "fallback" and failed.output == "None of these"
            assert failed.recall is not None and failed.recall.error and not failed.recall.hit
            assert embed_requests() == alive + 1
            for _ in range(3):  # within the cooldown: no call reaches the endpoint
                clock.now += 10
                during = await resolver.resolve(task, f"any gift cards, {clock.now}?")
                assert during.recall is not None and "open" in (during.recall.error or "")
            assert embed_requests() == alive + 1
            trace = store.read("traces").filter(store.read("traces")["trace_id"] == during.trace_id).row(0, named=True)
            assert json.loads(trace["recall"])["error"] and trace["mode"] == "fallback"
            clock.now += 60  # cooldown over: one trial, which succeeds and closes the circuit
            after = await resolver.resolve(task, GIFT)
            assert after.mode == "memory" and memory.state == "closed"


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from gil_core.memory import LanceDBMemory
    from gil_core.resolver import Resolver
    from gil_core.telemetry import TelemetryStore
    from gil_core.testing import HashEmbeddingModel, ManualClock, ScriptedChatModel, ScriptedChatModel
    from tests.resolver._support import support_task

    async def main():
        resolver = Resolver(
            ScriptedChatModel(), TelemetryStore({store!r}), memory=LanceDBMemory({memory!r}, HashEmbeddingModel())
        )
        resolution = await resolver.resolve(support_task(), {text!r})
        print(resolution.mode, resolution.output)

    asyncio.run(main())
    """
)


async def test_memory_survives_a_restart_and_a_lost_table_is_rebuilt_from_feedback(tmp_path: Path) -> None:
    store_path, memory_path = tmp_path / "store", tmp_path / "memory"
    task = support_task()
    with support_server({GIFT: Script(answers=["None of these"])}) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(
                chat, TelemetryStore(store_path), memory=LanceDBMemory(memory_path, HashEmbeddingModel())
            )
            first = await resolver.resolve(task, GIFT)
            await resolver.feedback(task, first.trace_id, correct=True)

    def in_a_new_process() -> str:
        code = CHILD.format(root=str(ROOT), store=str(store_path), memory=str(memory_path), text=GIFT)
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()

    assert in_a_new_process() == "memory None of these"
    shutil.rmtree(memory_path)
    rebuilt = Resolver(
        ScriptedChatModel(), TelemetryStore(store_path), memory=LanceDBMemory(memory_path, HashEmbeddingModel())
    )
    assert await rebuilt.rebuild_memory(task) == 1
    assert in_a_new_process() == "memory None of these"


async def test_two_tasks_with_the_same_request_never_see_each_others_answer(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    memory = LanceDBMemory(tmp_path / "memory", HashEmbeddingModel())
    alpha, beta = support_task("alpha"), support_task("beta")
    with support_server({GIFT: Script(answers=["None of these", "None of these"])}) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(chat, store, memory=memory)
            traces = {}
            for task, answer in ((alpha, "Alpha sells them."), (beta, "Beta never does.")):
                resolution = await resolver.resolve(task, GIFT)
                traces[task.name] = resolution.trace_id
                await resolver.feedback(task, resolution.trace_id, correct=False, correction=answer)
            for task, answer in ((alpha, "Alpha sells them."), (beta, "Beta never does.")):
                for _ in range(3):
                    again = await resolver.resolve(task, GIFT)
                    assert (again.mode, again.output) == ("memory", answer)
                    assert again.recall is not None and again.recall.source is not None
            # Feedback on another task's trace is refused as unknown, and teaches nothing.
            with pytest.raises(UnknownTraceError, match="task 'beta' has no trace"):
                await resolver.feedback(beta, traces["alpha"], correct=True)
    assert [e.answer for e in await memory.entries("beta")] == ["Beta never does."]
