"""CircuitBreakingMemory: after a failure no call reaches the memory for the cooldown, then one trial does."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from gil_core.errors import ConfigurationError, MemoryUnavailableError
from gil_core.llm import OpenAICompatibleEmbeddingModel
from gil_core.memory import CallableEmbeddingModel, CircuitBreakingMemory, LanceDBMemory
from gil_core.testing import HashEmbeddingModel, ManualClock, ScriptedOpenAIServer

TASK = "support"


class FlakyEmbedder:
    """An embedding function that counts its calls, fails while ``failing``, and can hold a call (``gate``)."""

    def __init__(self) -> None:
        self.calls = 0
        self.failing = False
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self._hash = HashEmbeddingModel(16)

    def __call__(self, texts: list[str]) -> list[tuple[float, ...]]:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(timeout=10)
        if self.failing:
            raise ConnectionError("embedding server down")
        return [self._hash.embed_text(text) for text in texts]


@pytest.fixture
def flaky() -> FlakyEmbedder:
    return FlakyEmbedder()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def breaker(tmp_path: Path, flaky: FlakyEmbedder, clock: ManualClock) -> CircuitBreakingMemory:
    memory = LanceDBMemory(tmp_path, CallableEmbeddingModel(flaky, name="flaky"))
    breaker = CircuitBreakingMemory(memory, cooldown=30.0, clock=clock)
    await breaker.remember(TASK, "t-1", "where is my refund", "Soon.")
    flaky.calls = 0
    return breaker


async def trip(breaker: CircuitBreakingMemory, flaky: FlakyEmbedder) -> None:
    flaky.failing = True
    with pytest.raises(MemoryUnavailableError, match="embedding server down"):
        await breaker.lookup(TASK, "the request that fails", threshold=0.8)
    assert breaker.state == "open" and flaky.calls == 1


async def test_an_open_circuit_makes_no_call_until_the_cooldown_ends(
    breaker: CircuitBreakingMemory, flaky: FlakyEmbedder, clock: ManualClock
) -> None:
    await trip(breaker, flaky)
    for index in range(5):  # distinct texts: none could be answered from the query-vector cache
        clock.now += 5.0
        with pytest.raises(MemoryUnavailableError, match="circuit open") as caught:
            await breaker.lookup(TASK, f"request {index}", threshold=0.8)
        assert caught.value.open_until == 1030.0 and caught.value.task == TASK
    for refused in (breaker.nearest(TASK, "x", 3), breaker.remember(TASK, "t-2", "y", "z"), breaker.rebuild(TASK, [])):
        with pytest.raises(MemoryUnavailableError, match=r"until 1030\.000"):
            await refused
    assert flaky.calls == 1  # the failure itself; nothing since reached the endpoint

    clock.now = 1030.0
    assert breaker.state == "half_open"
    flaky.failing = False
    recall = await breaker.lookup(TASK, "where is my refund, please", threshold=0.5)
    assert recall is not None and recall.source == "t-1"
    assert flaky.calls == 2 and breaker.state == "closed"


async def test_a_failed_trial_opens_the_circuit_again(
    breaker: CircuitBreakingMemory, flaky: FlakyEmbedder, clock: ManualClock
) -> None:
    await trip(breaker, flaky)
    clock.now += 30.0
    with pytest.raises(MemoryUnavailableError, match="embedding server down"):
        await breaker.lookup(TASK, "the trial", threshold=0.8)
    assert breaker.state == "open" and flaky.calls == 2
    clock.now += 29.0
    with pytest.raises(MemoryUnavailableError, match="circuit open"):
        await breaker.lookup(TASK, "too early", threshold=0.8)
    assert flaky.calls == 2


async def test_callers_during_the_trial_are_refused(
    breaker: CircuitBreakingMemory, flaky: FlakyEmbedder, clock: ManualClock
) -> None:
    await trip(breaker, flaky)
    clock.now += 30.0
    flaky.failing, flaky.gate = False, threading.Event()
    flaky.entered.clear()
    trial = asyncio.create_task(breaker.lookup(TASK, "the trial", threshold=0.8))
    await asyncio.to_thread(flaky.entered.wait, 10)
    with pytest.raises(MemoryUnavailableError, match="trial call is in flight"):
        await breaker.lookup(TASK, "meanwhile", threshold=0.8)
    assert breaker.state == "half_open"
    flaky.gate.set()
    await trial
    assert breaker.state == "closed" and flaky.calls == 2


async def test_forget_always_passes_and_leaves_the_circuit_alone(
    breaker: CircuitBreakingMemory, flaky: FlakyEmbedder
) -> None:
    await trip(breaker, flaky)
    await breaker.forget(TASK, "t-1")
    assert await breaker.entries(TASK) == [] and breaker.state == "open"


async def test_a_500_from_the_endpoint_opens_it_and_refused_calls_send_no_request(
    tmp_path: Path, clock: ManualClock
) -> None:
    with ScriptedOpenAIServer(embedding_dimensions=16) as server:
        async with OpenAICompatibleEmbeddingModel(server.base_url, "embedder", max_attempts=1) as model:
            breaker = CircuitBreakingMemory(LanceDBMemory(tmp_path, model), cooldown=10.0, clock=clock)
            await breaker.remember(TASK, "t-1", "where is my refund", "Soon.")
            server.enqueue_failure("500")
            with pytest.raises(MemoryUnavailableError, match="HTTP 500"):
                await breaker.lookup(TASK, "cancel my order", threshold=0.8)
            sent = len(server.requests)
            for index in range(3):
                with pytest.raises(MemoryUnavailableError, match="circuit open"):
                    await breaker.lookup(TASK, f"request {index}", threshold=0.8)
            assert len(server.requests) == sent
            clock.now += 10.0
            assert await breaker.lookup(TASK, "cancel my order", threshold=0.8) is not None
            assert len(server.requests) == sent + 1 and breaker.state == "closed"


@pytest.mark.parametrize("cooldown", [-1.0, float("nan"), float("inf")])
def test_the_cooldown_must_be_a_finite_non_negative_number(cooldown: float) -> None:
    with pytest.raises(ConfigurationError):
        CircuitBreakingMemory(LanceDBMemory("unused", HashEmbeddingModel()), cooldown=cooldown)
