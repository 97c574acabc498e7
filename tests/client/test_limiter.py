"""The rate limiter: token buckets that wait for a near turn, refuse a far one, and a decorator with a fallback."""

from __future__ import annotations

import asyncio

import pytest

from gil_core.client import LimitedChatModel, LimiterRefusedError, TokenBucketLimiter
from gil_core.errors import BadResponseError, ConfigurationError, ModelUnavailableError, RateLimitedError
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.testing import ManualClock, ScriptedChatModel, ScriptedOpenAIServer
from tests.client._support import user


def limiter(clock: ManualClock, **kwargs: object) -> TokenBucketLimiter:
    return TokenBucketLimiter(clock=clock, sleep=clock.sleep, **kwargs)  # type: ignore[arg-type]


async def test_a_burst_goes_at_once_then_calls_wait_their_turn() -> None:
    clock = ManualClock()
    bucket = limiter(clock)  # defaults: 5 per second, burst 10
    for _ in range(10):
        await bucket.acquire("openai")
    assert clock.sleeps == []
    await bucket.acquire("openai")
    await bucket.acquire("openai")
    assert clock.sleeps == pytest.approx([0.2, 0.4])  # each reserved the next token after the last
    snapshot = bucket.snapshot("openai")
    assert (snapshot.tokens_available, snapshot.capacity, snapshot.allowed, snapshot.refused) == (0.0, 10, 12, 0)


async def test_the_limiter_waits_when_short_and_refuses_at_once_beyond_30_seconds() -> None:
    clock = ManualClock()
    bucket = limiter(clock)
    for _ in range(160):  # 10 at once, then turns 0.2 s … 30.0 s away
        await bucket.acquire("openai")
    assert max(clock.sleeps) == pytest.approx(30.0) and len(clock.sleeps) == 150

    with pytest.raises(LimiterRefusedError) as refused:
        await bucket.acquire("openai")

    assert len(clock.sleeps) == 150  # refused at once: no wait at all
    assert refused.value.retry_after == pytest.approx(30.2) and refused.value.provider == "openai"
    assert isinstance(refused.value, RateLimitedError)  # a typed transient error
    assert (bucket.snapshot("openai").allowed, bucket.snapshot("openai").refused) == (160, 1)


async def test_time_refills_the_bucket_up_to_its_burst() -> None:
    clock = ManualClock()
    bucket = limiter(clock, requests_per_second=2, burst=3)
    for _ in range(3):
        await bucket.acquire("local")
    assert bucket.snapshot("local").tokens_available == 0
    clock.now += 1.0
    assert bucket.snapshot("local").tokens_available == pytest.approx(2.0)
    clock.now += 60.0
    assert bucket.snapshot("local").tokens_available == 3


async def test_providers_have_separate_buckets() -> None:
    clock = ManualClock()
    bucket = limiter(clock, requests_per_second=1, burst=1, max_wait=0)
    await bucket.acquire("openai")
    await bucket.acquire("anthropic")
    with pytest.raises(LimiterRefusedError):
        await bucket.acquire("openai")


async def test_a_tenant_limit_applies_on_top_of_the_providers() -> None:
    clock = ManualClock()
    bucket = limiter(clock, requests_per_second=100, burst=100, tenant_requests_per_second=1, tenant_burst=2)
    await bucket.acquire("openai", tenant="acme")
    await bucket.acquire("openai", tenant="acme")
    await bucket.acquire("openai", tenant="globex")
    assert clock.sleeps == []
    await bucket.acquire("openai", tenant="acme")
    assert clock.sleeps == pytest.approx([1.0])  # acme waits for its own bucket; globex did not
    assert bucket.snapshot("openai", tenant="acme").allowed == 3
    assert bucket.snapshot("openai").allowed == 4


async def test_a_refused_call_reserves_nothing() -> None:
    clock = ManualClock()
    bucket = limiter(clock, requests_per_second=1, burst=1, max_wait=0.5)
    await bucket.acquire("p")
    with pytest.raises(LimiterRefusedError):
        await bucket.acquire("p")
    clock.now += 1.0
    await bucket.acquire("p")  # the refused call took no turn, so this one is on time
    assert clock.sleeps == []


async def test_concurrent_callers_queue_in_arrival_order() -> None:
    clock = ManualClock()
    bucket = limiter(clock, requests_per_second=10, burst=1)
    await asyncio.gather(*(bucket.acquire("p") for _ in range(4)))
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.3])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"requests_per_second": 0},
        {"burst": 0},
        {"max_wait": -1},
        {"tenant_requests_per_second": float("nan")},
    ],
)
def test_invalid_limits_are_configuration_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        TokenBucketLimiter(**kwargs)  # type: ignore[arg-type]


def test_a_tenant_snapshot_needs_a_tenant_limit() -> None:
    with pytest.raises(ConfigurationError):
        TokenBucketLimiter().snapshot("p", tenant="acme")


async def test_each_model_call_takes_one_token() -> None:
    clock = ManualClock()
    bucket = limiter(clock)
    inner = ScriptedChatModel(name="primary")
    inner.enqueue("one")
    inner.enqueue("two")
    model = LimitedChatModel(inner, bucket, "local")
    await model.complete(user("a"), max_tokens=4)
    await model.complete(user("b"), max_tokens=4)
    assert bucket.snapshot("local").allowed == 2 and bucket.snapshot("local").tokens_available == 8


async def test_a_limiter_refusal_goes_to_the_fallback_which_is_named_on_the_answer() -> None:
    clock = ManualClock()
    bucket = limiter(clock, requests_per_second=1, burst=1, max_wait=0)
    primary = ScriptedChatModel(name="primary")
    primary.enqueue("from primary")
    backup = ScriptedChatModel(name="backup")
    backup.enqueue("from backup")
    model = LimitedChatModel(primary, bucket, "local", fallback=backup)

    first = await model.complete(user("a"), max_tokens=4)
    second = await model.complete(user("b"), max_tokens=4)

    assert (first.content, first.model) == ("from primary", "primary")
    assert (second.content, second.model) == ("from backup", "backup")
    assert len(primary.history) == 1 and bucket.snapshot("local").refused == 1


async def test_an_unavailable_provider_goes_to_the_fallback_over_http() -> None:
    with ScriptedOpenAIServer() as down, ScriptedOpenAIServer() as up:
        down.enqueue_failure("503")
        up.enqueue("answered")
        async with (
            OpenAICompatibleChatModel(down.base_url, "primary", max_attempts=1) as primary,
            OpenAICompatibleChatModel(up.base_url, "backup") as backup,
        ):
            model = LimitedChatModel(primary, TokenBucketLimiter(), "local", fallback=backup)
            completion = await model.complete(user("q"), max_tokens=4)
    assert (completion.content, completion.model) == ("answered", "backup")


@pytest.mark.parametrize("failure", ["429", "502"])
async def test_without_a_fallback_a_transient_error_propagates(failure: str) -> None:
    inner = ScriptedChatModel()
    inner.enqueue_failure(failure)  # type: ignore[arg-type]
    with pytest.raises((RateLimitedError, ModelUnavailableError)):
        await LimitedChatModel(inner, TokenBucketLimiter(), "local").complete(user("q"), max_tokens=4)


async def test_a_bad_response_is_not_transient_and_skips_the_fallback() -> None:
    inner = ScriptedChatModel()
    inner.enqueue_failure("400")
    backup = ScriptedChatModel(name="backup")
    with pytest.raises(BadResponseError):
        await LimitedChatModel(inner, None, "local", fallback=backup).complete(user("q"), max_tokens=4)
    assert backup.history == []
