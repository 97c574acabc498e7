"""The request cache: what is stored, what is read back, and what is discarded."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from gil_core.client import (
    CachingChatModel,
    InProcessRequestCache,
    call_options,
    current_call_options,
    is_storable,
)
from gil_core.errors import ConfigurationError, ModelError
from gil_core.fallback import ChoiceContract
from gil_core.llm import Completion, OpenAICompatibleChatModel, Usage
from gil_core.testing import ManualClock, ScriptedChatModel, ScriptedOpenAIServer
from tests.client._support import user


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as running:
        yield running


def caching(model: ScriptedChatModel, cache: InProcessRequestCache, **kwargs: object) -> CachingChatModel:
    scope = {"tenant": "acme", "schema": "tree-v1", **kwargs}
    return CachingChatModel(model, cache, **scope)  # type: ignore[arg-type]


async def test_a_repeated_request_is_answered_from_the_cache_over_http(server: ScriptedOpenAIServer) -> None:
    server.enqueue("refunds take 5 days", usage=Usage(prompt_tokens=12, completion_tokens=4))
    cache = InProcessRequestCache()
    async with OpenAICompatibleChatModel(server.base_url, "big-model") as http:
        model = CachingChatModel(http, cache, tenant="acme", schema="tree-v1")
        first = await model.complete(user("when is my refund?"), max_tokens=32)
        second = await model.complete(user("when is my refund?"), max_tokens=32)

    assert len(server.requests) == 1
    assert first.content == second.content == "refunds take 5 days"
    assert first.usage.prompt_tokens == 12
    # A hit cost nothing: no tokens, no timings, no latency, no raw reply.
    assert (second.usage, second.timings, second.latency_ms, second.raw) == (Usage(), None, 0.0, None)
    assert second.model == first.model == "big-model"
    assert (model.outcomes().hits, model.outcomes().stores, cache.stats().entries) == (1, 1, 1)


async def test_two_tenants_with_identical_requests_never_share_an_entry() -> None:
    inner = ScriptedChatModel()
    inner.enqueue("for acme")
    inner.enqueue("for globex")
    cache = InProcessRequestCache()
    acme = caching(inner, cache, tenant="acme")
    globex = caching(inner, cache, tenant="globex")

    assert (await acme.complete(user("same words"), max_tokens=8)).content == "for acme"
    assert (await globex.complete(user("same words"), max_tokens=8)).content == "for globex"
    assert (await acme.complete(user("same words"), max_tokens=8)).content == "for acme"
    assert (await globex.complete(user("same words"), max_tokens=8)).content == "for globex"
    assert len(inner.history) == 2 and cache.stats().entries == 2


@pytest.mark.parametrize(
    "change",
    [
        {"schema": "tree-v2"},  # the tree changed
        {"messages": user("other words")},  # the prompt changed
        {"max_tokens": 9},
        {"temperature": 0.5},
        {"extra_body": {"seed": 1}},
    ],
)
async def test_any_change_to_what_decides_the_reply_misses(change: dict[str, object]) -> None:
    inner = ScriptedChatModel(responder=lambda messages, **_: Completion("fresh"))
    cache = InProcessRequestCache()
    base = caching(inner, cache)
    await base.complete(user("same words"), max_tokens=8)

    model = caching(inner, cache, schema=change.get("schema", "tree-v1"))
    messages = change.get("messages", user("same words"))
    kwargs = {name: value for name, value in change.items() if name in ("max_tokens", "temperature", "extra_body")}
    await model.complete(messages, **{"max_tokens": 8, **kwargs})  # type: ignore[arg-type]
    assert len(inner.history) == 2


async def test_a_cached_answer_failing_the_current_contract_is_re_asked_and_replaced() -> None:
    inner = ScriptedChatModel()
    inner.enqueue("maybe")
    inner.enqueue("yes")
    cache = InProcessRequestCache()
    await caching(inner, cache).complete(user("refund?"), max_tokens=4)  # stored without a contract

    strict = caching(inner, cache, contract=ChoiceContract(("yes", "no")))
    replaced = await strict.complete(user("refund?"), max_tokens=4)
    again = await strict.complete(user("refund?"), max_tokens=4)

    assert (replaced.content, again.content) == ("yes", "yes")
    assert len(inner.history) == 2  # asked once more, then served the replacement
    assert strict.outcomes().discarded_invalid == 1 and strict.outcomes().hits == 1


async def test_the_contract_can_be_given_per_call() -> None:
    inner = ScriptedChatModel()
    inner.enqueue("maybe")
    inner.enqueue("no")
    cache = InProcessRequestCache()
    model = caching(inner, cache)
    await model.complete(user("refund?"), max_tokens=4)
    with call_options(contract=ChoiceContract(("yes", "no"))):
        assert (await model.complete(user("refund?"), max_tokens=4)).content == "no"
    assert len(inner.history) == 2


async def test_a_reply_breaking_the_contract_is_not_stored() -> None:
    inner = ScriptedChatModel()
    inner.enqueue("perhaps")
    inner.enqueue("perhaps")
    model = caching(inner, InProcessRequestCache(), contract=ChoiceContract(("yes", "no")))
    await model.complete(user("refund?"), max_tokens=4)
    await model.complete(user("refund?"), max_tokens=4)
    assert len(inner.history) == 2 and model.outcomes().not_stored == 2


async def test_a_refusal_is_not_stored_over_http(server: ScriptedOpenAIServer) -> None:
    server.enqueue("I can't help with that.", finish_reason="content_filter")
    refusal = {"role": "assistant", "content": "No.", "refusal": "I can't help with that."}
    server.enqueue_json({"model": "m", "choices": [{"index": 0, "message": refusal, "finish_reason": "stop"}]})
    server.enqueue("here is the answer")
    cache = InProcessRequestCache()
    async with OpenAICompatibleChatModel(server.base_url, "m") as http:
        model = CachingChatModel(http, cache, tenant="acme", schema="s")
        for _ in range(3):
            await model.complete(user("please"), max_tokens=8)
        assert (await model.complete(user("please"), max_tokens=8)).content == "here is the answer"

    assert len(server.requests) == 3
    assert model.outcomes().not_stored == 2 and cache.stats().entries == 1


@pytest.mark.parametrize(
    ("completion", "storable"),
    [
        (Completion("The answer is", finish_reason="length"), False),
        (Completion("", finish_reason="stop"), False),
        (Completion("No.", finish_reason="content_filter"), False),
        (Completion("ok", raw={"choices": [{"message": {"content": "ok", "refusal": "no"}}]}), False),
        (Completion("ok", finish_reason="stop", raw={"choices": [{"message": {"refusal": None}}]}), True),
        (Completion("B", finish_reason=None), True),
    ],
)
def test_truncated_empty_and_refused_replies_are_never_storable(completion: Completion, storable: bool) -> None:
    assert is_storable(completion) is storable


async def test_a_truncated_reply_is_not_stored() -> None:
    inner = ScriptedChatModel()
    inner.enqueue_failure("truncated")
    inner.enqueue("The answer is five days.")
    model = caching(inner, InProcessRequestCache())
    assert (await model.complete(user("q"), max_tokens=3)).finish_reason == "length"
    assert (await model.complete(user("q"), max_tokens=3)).content == "The answer is five days."


async def test_bypass_cache_neither_reads_nor_writes() -> None:
    inner = ScriptedChatModel(responder=lambda messages, **_: Completion("fresh"))
    cache = InProcessRequestCache()
    model = caching(inner, cache)
    await model.complete(user("q"), max_tokens=4)  # stored
    with call_options(bypass_cache=True):
        await model.complete(user("q"), max_tokens=4)  # not read
        await model.complete(user("other"), max_tokens=4)  # not written
    assert len(inner.history) == 3
    assert cache.stats().entries == 1 and model.outcomes().bypassed == 2


async def test_only_the_first_attempt_reads_but_a_retry_writes() -> None:
    inner = ScriptedChatModel()
    inner.enqueue("first")
    inner.enqueue("retried")
    model = caching(inner, InProcessRequestCache())
    await model.complete(user("q"), max_tokens=4)
    with call_options(attempt=2):
        assert (await model.complete(user("q"), max_tokens=4)).content == "retried"
    assert (await model.complete(user("q"), max_tokens=4)).content == "retried"
    assert len(inner.history) == 2


async def test_a_do_not_record_call_reads_but_is_not_stored() -> None:
    inner = ScriptedChatModel(responder=lambda messages, **_: Completion("fresh"))
    cache = InProcessRequestCache()
    model = caching(inner, cache)
    with call_options(do_not_record=True):
        await model.complete(user("private"), max_tokens=4)
    assert cache.stats().entries == 0


async def test_a_corrupt_entry_is_detected_on_read_and_discarded(caplog: pytest.LogCaptureFixture) -> None:
    inner = ScriptedChatModel()
    inner.enqueue("refunds take 5 days")
    inner.enqueue("refunds take 5 days")
    cache = InProcessRequestCache()
    model = caching(inner, cache)
    await model.complete(user("q"), max_tokens=8)
    key = model.key_for(user("q"), max_tokens=8)
    stored = await cache.get(key)
    assert stored is not None
    envelope = json.loads(stored)
    envelope["body"] = envelope["body"].replace("5 days", "50 days")  # a flipped digit, checksum kept
    await cache.set(key, json.dumps(envelope).encode())

    with caplog.at_level(logging.WARNING, logger="gil_core.client.cache.caching_model"):
        answer = await model.complete(user("q"), max_tokens=8)

    assert answer.content == "refunds take 5 days"
    assert len(inner.history) == 2
    assert model.outcomes().discarded_corrupt == 1 and "corrupt" in caplog.text
    assert (await model.complete(user("q"), max_tokens=8)).content == "refunds take 5 days"  # replaced, intact


@pytest.mark.parametrize("payload", [b"\xff\xfe not utf-8", b"{}", b"[1, 2]", b'{"format": 1, "checksum": "x"}'])
async def test_unreadable_payloads_are_corrupt(payload: bytes) -> None:
    inner = ScriptedChatModel(responder=lambda messages, **_: Completion("fresh"))
    cache = InProcessRequestCache()
    model = caching(inner, cache)
    await cache.set(model.key_for(user("q"), max_tokens=4), payload)
    assert (await model.complete(user("q"), max_tokens=4)).content == "fresh"
    assert model.outcomes().discarded_corrupt == 1


async def test_an_entry_filed_under_another_requests_key_is_corrupt() -> None:
    inner = ScriptedChatModel(responder=lambda messages, **_: Completion(messages[0]["content"].upper()))
    cache = InProcessRequestCache()
    model = caching(inner, cache)
    await model.complete(user("one"), max_tokens=4)
    moved = await cache.get(model.key_for(user("one"), max_tokens=4))
    assert moved is not None
    await cache.set(model.key_for(user("two"), max_tokens=4), moved)
    assert (await model.complete(user("two"), max_tokens=4)).content == "TWO"


async def test_entries_expire_after_their_ttl_and_the_least_recently_used_goes_first() -> None:
    clock = ManualClock()
    cache = InProcessRequestCache(capacity=2, default_ttl=60.0, timer=clock)
    await cache.set("a", b"1")
    await cache.set("b", b"2", ttl=600.0)
    clock.now += 61
    assert await cache.get("a") is None and await cache.get("b") == b"2"
    await cache.set("c", b"3")
    await cache.set("d", b"4")  # over capacity: "b" was used least recently
    assert await cache.get("b") is None and await cache.get("c") == b"3"
    stats = cache.stats()
    assert (stats.entries, stats.capacity, stats.writes) == (2, 2, 4)
    await cache.clear()
    assert cache.stats().entries == 0


async def test_the_defaults_are_a_thousand_entries_for_an_hour() -> None:
    clock = ManualClock()
    cache = InProcessRequestCache(timer=clock)
    await cache.set("k", b"v")
    clock.now += 3_599
    assert cache.stats().capacity == 1_000 and await cache.get("k") == b"v"
    clock.now += 2
    assert await cache.get("k") is None


class BrokenCache(InProcessRequestCache):
    async def get(self, key: str) -> bytes | None:
        raise OSError("cache server gone")

    async def set(self, key: str, payload: bytes, ttl: float | None = None) -> None:
        raise OSError("cache server gone")


async def test_a_failing_cache_never_fails_the_call() -> None:
    inner = ScriptedChatModel(responder=lambda messages, **_: Completion("fresh"))
    model = caching(inner, BrokenCache())
    assert (await model.complete(user("q"), max_tokens=4)).content == "fresh"
    assert model.outcomes().cache_errors == 2


async def test_a_model_error_is_not_cached_and_propagates() -> None:
    inner = ScriptedChatModel()
    inner.enqueue_failure("503")
    inner.enqueue("recovered")
    model = caching(inner, InProcessRequestCache())
    with pytest.raises(ModelError):
        await model.complete(user("q"), max_tokens=4)
    assert (await model.complete(user("q"), max_tokens=4)).content == "recovered"


@pytest.mark.parametrize("scope", [{"tenant": " "}, {"schema": ""}])
def test_a_blank_tenant_or_schema_is_a_configuration_error(scope: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError):
        caching(ScriptedChatModel(), InProcessRequestCache(), **scope)


@pytest.mark.parametrize("kwargs", [{"capacity": 0}, {"default_ttl": 0}, {"default_ttl": float("inf")}])
def test_invalid_cache_settings_are_configuration_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        InProcessRequestCache(**kwargs)  # type: ignore[arg-type]


def test_call_options_nest_and_restore() -> None:
    with call_options(intent="triage", tags=("a",)):
        with call_options(attempt=2):
            assert (current_call_options().intent, current_call_options().attempt) == ("triage", 2)
        assert current_call_options().attempt == 1
    assert current_call_options().intent is None
    with pytest.raises(ConfigurationError), call_options(attempt=0):
        pass
