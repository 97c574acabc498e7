"""The client layers in the resolver's path: request cache per tenant and schema, operation log, limiter with a
fallback model, and do-not-record requests that leave no trace of their text anywhere."""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl
import pytest

from gil_core.client import InProcessRequestCache, JsonLinesOperationLog, TokenBucketLimiter
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.memory import LanceDBMemory
from gil_core.resolver import ClientSetup, Resolver
from gil_core.runtime import client_parts, open_runtime
from gil_core.settings import ClientParts
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel, ScriptedOpenAIServer, ScriptedReply
from tests.flows._support import write_task_file
from tests.resolver._support import Script, support_server, support_task

REFUND = "where is my refund?"
SCRIPTS = {REFUND: Script(route=["billing", "refund status"])}


def chat_requests(server: ScriptedOpenAIServer) -> int:
    return sum(request.path.endswith("/chat/completions") for request in server.requests)


def calls_of(store: TelemetryStore, trace_id: str) -> pl.DataFrame:
    calls = store.read("calls")
    return calls.filter(pl.col("trace_id") == trace_id)


async def test_a_repeated_request_is_answered_from_the_cache_without_a_model_call(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    cache = InProcessRequestCache()
    with support_server(SCRIPTS) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(chat, store, client=ClientSetup(ClientParts(cache=cache)))
            task = support_task(memory_threshold=None)
            first = await resolver.resolve(task, REFUND)
            asked = chat_requests(server)
            second = await resolver.resolve(task, REFUND)
    assert asked >= 2 and chat_requests(server) == asked  # every judgment came from the cache
    assert (first.mode, first.output) == (second.mode, second.output) and first.mode == "habit/answer"
    assert [step.chosen for step in first.path] == [step.chosen for step in second.path]
    # A cached answer is not a model call: it is neither recorded nor priced.
    assert len(calls_of(store, first.trace_id)) == asked and calls_of(store, second.trace_id).is_empty()
    assert second.energy == 0.0 and first.energy > 0.0


async def test_tenants_and_changed_trees_never_share_a_cache_entry(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    with support_server(SCRIPTS) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(chat, store, client=ClientSetup(ClientParts(cache=InProcessRequestCache())))
            alpha, beta = support_task("alpha", memory_threshold=None), support_task("beta", memory_threshold=None)
            await resolver.resolve(alpha, REFUND)
            after_alpha = chat_requests(server)
            await resolver.resolve(beta, REFUND)  # the same request and tree, another tenant
            after_beta = chat_requests(server)
            stricter = support_task("alpha", memory_threshold=None, fallback_max_tokens=99)  # another schema
            await resolver.resolve(stricter, REFUND)
            after_change = chat_requests(server)
            await resolver.resolve(alpha, REFUND)
    assert after_beta - after_alpha == after_alpha > 0
    assert after_change - after_beta == after_alpha
    assert chat_requests(server) == after_change  # alpha's own entries still serve alpha
    assert alpha.schema != stricter.schema and alpha.schema == beta.schema


async def test_a_judge_reply_without_logprobs_is_never_cached(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    cache = InProcessRequestCache()
    server = ScriptedOpenAIServer(responder=lambda body: ScriptedReply("A", omit_logprobs=True))
    with server:
        async with OpenAICompatibleChatModel(server.base_url, "m", max_attempts=1) as chat:
            resolver = Resolver(chat, store, client=ClientSetup(ClientParts(cache=cache)))
            result = await resolver.resolve(support_task(memory_threshold=None), REFUND)
    # The judgment had no logprobs and the generation's "A" broke the tree contract: neither may be stored.
    assert result.output is None and result.failure is not None
    assert chat_requests(server) >= 2 and cache.stats().entries == 0


async def test_the_operation_log_holds_one_entry_per_model_call_and_none_for_cache_hits(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    log = JsonLinesOperationLog(tmp_path / "store")
    with support_server(SCRIPTS) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(chat, store, client=ClientSetup(ClientParts(cache=InProcessRequestCache(), log=log)))
            task = support_task(memory_threshold=None)
            await resolver.resolve(task, REFUND)
            await resolver.resolve(task, REFUND)
    entries = log.entries()
    assert len(entries) == chat_requests(server) and all(entry.success for entry in entries)
    assert {entry.model for entry in entries} == {"m"}


async def test_a_refused_call_goes_to_the_fallback_model_which_is_recorded_by_name(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    now = [0.0]
    limiter = TokenBucketLimiter(0.001, 1, max_wait=0.0, clock=lambda: now[0])  # one call, then refusals
    with support_server(SCRIPTS) as main, support_server(SCRIPTS) as spare:
        async with (
            OpenAICompatibleChatModel(main.base_url, "main-model") as chat,
            OpenAICompatibleChatModel(spare.base_url, "spare-model") as fallback,
        ):
            resolver = Resolver(
                chat, store, client=ClientSetup(ClientParts(limiter=limiter), provider="main", fallback=fallback)
            )
            result = await resolver.resolve(support_task(memory_threshold=None), REFUND)
    assert result.mode == "habit/answer"
    models = calls_of(store, result.trace_id)["model"].to_list()
    assert models[0] == "main-model" and set(models[1:]) == {"spare-model"}
    assert chat_requests(main) == 1 and chat_requests(spare) == len(models) - 1
    snapshot = limiter.snapshot("main")
    assert (snapshot.allowed, snapshot.refused) == (1, len(models) - 1)


def test_the_task_file_and_settings_switch_the_layers_and_the_local_server_gets_no_limiter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GIL_REQUESTS_PER_SECOND", raising=False)
    remote = load_task_file(write_task_file(tmp_path, "http://127.0.0.1:9/v1", client={"burst": 3}))
    parts = client_parts(remote)
    assert parts.cache is not None and parts.log is None  # the log is off until log_path names where
    assert parts.limiter is not None and parts.limiter.snapshot("x").capacity == 3
    (tmp_path / "local").mkdir()
    local = load_task_file(write_task_file(tmp_path / "local", "unused", chat_model="local"))
    assert client_parts(local).limiter is None
    monkeypatch.setenv("GIL_CACHE_ENABLED", "false")
    assert client_parts(remote).cache is None


async def test_do_not_record_leaves_no_trace_of_the_request_in_any_file_or_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "my card 4111-1111-1111-1111 was charged twice, where is my refund?"
    store = TelemetryStore(tmp_path / "store")
    memory = LanceDBMemory(tmp_path / "memory", HashEmbeddingModel())
    cache = InProcessRequestCache()
    parts = ClientParts(cache=cache, log=JsonLinesOperationLog(tmp_path / "store"))
    caplog.set_level(logging.DEBUG)
    with support_server({secret: Script(route=["billing", "refund status"])}) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(chat, store, memory=memory, client=ClientSetup(parts))
            task = support_task()
            private = await resolver.resolve(task, secret, do_not_record=True)
            await resolver.feedback(task, private.trace_id, correct=True)
            again = await resolver.resolve(task, secret, do_not_record=True)
    assert private.mode == "habit/answer" and private.output  # the caller still gets its answer
    assert again.mode == "habit/answer"  # not from memory (nothing was remembered), not from the cache
    assert cache.stats().entries == 0 and await memory.entries(task.name) == []
    assert calls_of(store, private.trace_id)["content"].is_null().all()
    needles = [secret.encode(), b"4111-1111", "4111-1111".encode("utf-16-le")]
    written = [path for root in (tmp_path / "store", tmp_path / "memory") for path in root.rglob("*") if path.is_file()]
    assert written, "the store wrote nothing at all"
    for path in written:
        data = path.read_bytes()
        assert not any(needle in data for needle in needles), f"{path} holds the private request"
    assert "4111" not in caplog.text
    trace = store.read("traces").filter(pl.col("trace_id") == private.trace_id)
    assert trace["state"].to_list() == ["", ""] or set(trace["state"].to_list()) == {""}


async def test_a_task_marked_do_not_record_in_its_task_file_is_private_through_the_runtime(tmp_path: Path) -> None:
    secret = "please cancel order 77123 for my neighbour"
    with support_server({}, default=Script(answers=["None of these"])) as server:
        path = write_task_file(tmp_path, server.base_url, do_not_record=True)
        loaded = load_task_file(path)
        assert loaded.task.policy.do_not_record
        async with open_runtime(loaded) as runtime:
            result = await runtime.resolver.resolve(runtime.task, secret)
    assert result.trace_id
    for file in tmp_path.rglob("*"):
        if file.is_file() and file.suffix != ".yaml":
            assert b"77123" not in file.read_bytes(), file
