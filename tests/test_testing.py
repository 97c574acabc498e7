"""The public fakes in gil_core.testing behave like the real adapters they stand in for."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from gil_core.errors import BadResponseError, ModelError, ModelUnavailableError, RateLimitedError
from gil_core.llm import ChatModel, Completion, EmbeddingModel, Message, ServerTimings, TokenLogprob, Usage
from gil_core.testing import (
    FailureKind,
    HashEmbeddingModel,
    ScriptedChatModel,
    ScriptedOpenAIServer,
    ScriptedReply,
)

MESSAGES: list[Message] = [{"role": "user", "content": "where is my parcel"}]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


# --- ScriptedChatModel


async def test_scripted_chat_returns_the_queued_reply_and_records_the_call() -> None:
    model = ScriptedChatModel(name="fake")
    model.enqueue(
        "B",
        top_logprobs=[("B", -0.2), ("A", None)],
        usage=Usage(prompt_tokens=10, completion_tokens=1, cached_tokens=4),
        timings=ServerTimings(prompt_ms=5.0, predicted_ms=2.0),
    )
    completion = await model.complete(MESSAGES, max_tokens=1, top_logprobs=5, extra_body={"x": 1})
    assert completion.content == "B"
    assert completion.top_logprobs == (TokenLogprob("B", -0.2), TokenLogprob("A", None))
    assert completion.usage == Usage(prompt_tokens=10, completion_tokens=1, cached_tokens=4)
    assert completion.timings == ServerTimings(prompt_ms=5.0, predicted_ms=2.0)
    assert completion.model == "fake" and completion.finish_reason == "stop"
    assert len(model.history) == 1
    assert model.history[0].messages == tuple(MESSAGES)
    assert model.history[0].kwargs == {
        "max_tokens": 1,
        "temperature": 0.0,
        "top_logprobs": 5,
        "extra_body": {"x": 1},
    }
    assert model.pending == 0


async def test_scripted_chat_gives_logprobs_only_when_asked_and_at_most_as_many_as_asked() -> None:
    model = ScriptedChatModel()
    for _ in range(2):
        model.enqueue("A", top_logprobs=[("A", -0.1), ("B", -2.0), ("C", -3.0)])
    assert (await model.complete(MESSAGES, max_tokens=1)).top_logprobs == ()
    assert [t.token for t in (await model.complete(MESSAGES, max_tokens=1, top_logprobs=2)).top_logprobs] == [
        "A",
        "B",
    ]


async def test_scripted_chat_without_scripted_logprobs_is_certain_of_its_content() -> None:
    model = ScriptedChatModel()
    model.enqueue("A")
    completion = await model.complete(MESSAGES, max_tokens=1, top_logprobs=3)
    assert completion.top_logprobs == (TokenLogprob("A", 0.0),)


async def test_scripted_chat_estimates_usage_and_timings_when_not_given() -> None:
    model = ScriptedChatModel()
    model.enqueue("two words")
    completion = await model.complete(MESSAGES, max_tokens=8)
    assert completion.usage == Usage(prompt_tokens=4, completion_tokens=2)
    assert completion.timings is not None and completion.timings.predicted_ms > 0


async def test_scripted_chat_returns_an_enqueued_completion() -> None:
    model = ScriptedChatModel()
    scripted = Completion("A", usage=Usage(prompt_tokens=3), model="m", finish_reason="stop")
    model.enqueue(scripted)
    assert await model.complete(MESSAGES, max_tokens=1) == scripted


async def test_scripted_chat_asks_the_responder_once_the_queue_is_empty() -> None:
    def respond(messages: Sequence[Message], **kwargs: Any) -> Completion:
        return Completion(f"echo {messages[-1]['content']} {kwargs['max_tokens']}")

    model = ScriptedChatModel(responder=respond)
    model.enqueue("queued first")
    assert (await model.complete(MESSAGES, max_tokens=3)).content == "queued first"
    assert (await model.complete(MESSAGES, max_tokens=3)).content == "echo where is my parcel 3"


async def test_scripted_chat_raises_model_unavailable_when_the_script_ran_out() -> None:
    model = ScriptedChatModel()
    with pytest.raises(ModelUnavailableError, match="script ran out"):
        await model.complete(MESSAGES, max_tokens=1)
    assert len(model.history) == 1


@pytest.mark.parametrize(
    ("kind", "error", "status"),
    [
        ("refuse", ModelUnavailableError, None),
        ("hang", ModelUnavailableError, None),
        ("503", ModelUnavailableError, 503),
        ("400", BadResponseError, 400),
        ("garbage", BadResponseError, None),
        ("429", RateLimitedError, 429),
    ],
)
async def test_scripted_chat_failures_raise_the_adapters_typed_errors(
    kind: Any, error: type[ModelError], status: int | None
) -> None:
    model = ScriptedChatModel()
    model.enqueue_failure(kind, retry_after=3)
    with pytest.raises(error) as caught:
        await model.complete(MESSAGES, max_tokens=1)
    assert type(caught.value) is error and caught.value.status == status
    if kind == "429":
        assert isinstance(caught.value, RateLimitedError) and caught.value.retry_after == 3.0


async def test_scripted_chat_reply_modes_empty_truncated_and_no_logprobs() -> None:
    model = ScriptedChatModel()
    kinds: list[FailureKind] = ["empty", "truncated", "no_logprobs", "no_logprobs"]
    for kind in kinds:
        model.enqueue_failure(kind)
    assert (await model.complete(MESSAGES, max_tokens=1, top_logprobs=2)).content == ""
    assert (await model.complete(MESSAGES, max_tokens=3)).finish_reason == "length"
    assert (await model.complete(MESSAGES, max_tokens=1)).content == "yes"
    with pytest.raises(BadResponseError, match="no logprobs"):
        await model.complete(MESSAGES, max_tokens=1, top_logprobs=2)


def test_unknown_failure_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown failure"):
        ScriptedChatModel().enqueue_failure("teapot")  # type: ignore[arg-type]


def test_fakes_satisfy_the_ports() -> None:
    assert isinstance(ScriptedChatModel(), ChatModel)
    assert isinstance(HashEmbeddingModel(), EmbeddingModel)


# --- HashEmbeddingModel


async def test_hash_embeddings_are_unit_vectors_with_word_count_usage() -> None:
    model = HashEmbeddingModel(dimensions=32)
    embeddings = await model.embed(["reset my password", "hi"])
    assert model.name == "hash-embedding" and embeddings.model == "hash-embedding"
    assert [len(vector) for vector in embeddings.vectors] == [32, 32]
    assert all(math.isclose(cosine(v, v), 1.0) for v in embeddings.vectors)
    assert embeddings.usage.prompt_tokens == 4


def test_hash_embeddings_of_texts_sharing_ngrams_are_close() -> None:
    model = HashEmbeddingModel(dimensions=256)
    anchor = model.embed_text("I want to reset my password")
    assert cosine(anchor, model.embed_text("i want to reset my password!")) > 0.9
    assert cosine(anchor, model.embed_text("please reset my password")) > 0.5
    assert cosine(anchor, model.embed_text("Quarterly revenue grew by 4%")) < 0.3


def test_hash_embedding_of_empty_text_is_the_zero_vector() -> None:
    assert HashEmbeddingModel(dimensions=8).embed_text("") == (0.0,) * 8


def test_hash_embeddings_are_identical_across_processes() -> None:
    """blake2b, not Python's salted hash(): another interpreter with another hash seed gets the same."""
    code = "from gil_core.testing import HashEmbeddingModel; print(repr(HashEmbeddingModel().embed_text('abc')))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == repr(HashEmbeddingModel().embed_text("abc"))


# --- ScriptedOpenAIServer


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as running:
        yield running


def post(server: ScriptedOpenAIServer, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=5.0, **kwargs)


def test_server_listens_on_loopback_and_records_bodies_and_headers(server: ScriptedOpenAIServer) -> None:
    assert urlsplit(server.base_url).hostname == "127.0.0.1" and server.base_url.endswith("/v1")
    server.enqueue("hello")
    reply = post(server, "/chat/completions", {"model": "m", "messages": MESSAGES}, headers={"X-Trace": "t1"})
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"] == "hello"
    assert server.requests[0].body == {"model": "m", "messages": MESSAGES}
    assert server.requests[0].headers["x-trace"] == "t1"


def test_server_reply_has_openai_usage_llama_cpp_timings_and_null_logprobs(
    server: ScriptedOpenAIServer,
) -> None:
    server.enqueue("A", top_logprobs=[("A", -0.5), ("B", None)], usage=Usage(9, 1, 6))
    body = {"model": "m", "messages": MESSAGES, "logprobs": True, "top_logprobs": 2}
    reply = post(server, "/chat/completions", body).json()
    assert reply["usage"] == {
        "prompt_tokens": 9,
        "completion_tokens": 1,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 6},
    }
    assert set(reply["timings"]) == {"prompt_ms", "predicted_ms"}
    first = reply["choices"][0]["logprobs"]["content"][0]
    assert first["top_logprobs"] == [{"token": "A", "logprob": -0.5}, {"token": "B", "logprob": None}]


def test_server_answers_from_the_responder_per_prompt() -> None:
    def respond(body: Any) -> ScriptedReply:
        question = body["messages"][-1]["content"]
        return ScriptedReply("B" if "parcel" in question else "A")

    with ScriptedOpenAIServer(responder=respond) as server:
        asked = [
            post(server, "/chat/completions", {"messages": [{"role": "user", "content": text}]})
            for text in ("parcel", "bill")
        ]
    assert [reply.json()["choices"][0]["message"]["content"] for reply in asked] == ["B", "A"]


def test_server_answers_500_when_nothing_is_queued_and_no_responder(server: ScriptedOpenAIServer) -> None:
    reply = post(server, "/chat/completions", {"messages": MESSAGES})
    assert reply.status_code == 500
    assert "nothing queued" in reply.json()["error"]["message"]


def test_server_embeddings_are_hash_vectors_in_order_and_leave_chat_replies_queued(
    server: ScriptedOpenAIServer,
) -> None:
    server.enqueue("for the chat")
    reply = post(server, "/embeddings", {"model": "e", "input": ["one two", "three"]}).json()
    reference = HashEmbeddingModel()
    assert [item["index"] for item in reply["data"]] == [0, 1]
    assert reply["data"][1]["embedding"] == list(reference.embed_text("three"))
    assert reply["usage"]["prompt_tokens"] == 3
    assert server.pending == 1


def test_server_rejects_a_wrong_api_key_unknown_paths_and_non_json(server: ScriptedOpenAIServer) -> None:
    assert post(server, "/models", {}).status_code == 404
    assert httpx.post(f"{server.base_url}/embeddings", content=b"{", timeout=5.0).status_code == 400
    with ScriptedOpenAIServer(api_key="k") as guarded:
        assert post(guarded, "/embeddings", {"input": "x"}).status_code == 401
        assert post(guarded, "/embeddings", {"input": "x"}, headers={"Authorization": "Bearer k"}).status_code == 200


def test_server_failure_429_sends_retry_after(server: ScriptedOpenAIServer) -> None:
    server.enqueue_failure("429", retry_after=7)
    reply = post(server, "/chat/completions", {"messages": MESSAGES})
    assert reply.status_code == 429 and reply.headers["Retry-After"] == "7"


def test_server_garbage_is_a_200_that_is_not_json(server: ScriptedOpenAIServer) -> None:
    server.enqueue_failure("garbage")
    reply = post(server, "/chat/completions", {"messages": MESSAGES})
    assert reply.status_code == 200
    with pytest.raises(ValueError):
        reply.json()


def test_server_refuse_closes_the_listener_after_the_replies_queued_before_it(
    server: ScriptedOpenAIServer,
) -> None:
    server.enqueue("served first")
    server.enqueue_failure("refuse")
    assert post(server, "/chat/completions", {"messages": MESSAGES}).status_code == 200
    port = urlsplit(server.base_url).port
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2.0).close()


def test_server_close_is_not_held_up_by_a_hanging_request() -> None:
    outcome: list[BaseException | httpx.Response] = []

    def call(url: str) -> None:
        try:
            outcome.append(httpx.post(f"{url}/chat/completions", json={"messages": MESSAGES}, timeout=10.0))
        except httpx.HTTPError as exc:
            outcome.append(exc)

    with ScriptedOpenAIServer() as server:
        server.enqueue_failure("hang")
        client = threading.Thread(target=call, args=(server.base_url,))
        client.start()
        arrived = threading.Event()
        for _ in range(500):  # until the request has arrived and is being held (at most ~5 s)
            if server.requests:
                arrived.set()
                break
            arrived.wait(0.01)
        assert arrived.is_set()
    client.join(timeout=5.0)
    assert not client.is_alive()
    assert isinstance(outcome[0], httpx.RemoteProtocolError)  # released without a reply


def test_server_latency_delays_every_reply_by_at_least_the_fixed_time() -> None:
    """A lower bound only: a reply can come late on a busy machine, never early."""
    import time

    latency = 0.3
    with ScriptedOpenAIServer(latency_seconds=latency, responder=lambda body: "ok") as server:
        for path, body in (("/chat/completions", {"messages": MESSAGES}), ("/embeddings", {"input": ["a b"]})):
            started = time.monotonic()
            response = post(server, path, body)
            assert response.status_code == 200 and time.monotonic() - started >= latency
    for bad in (-0.1, 31.0):
        with pytest.raises(ValueError, match="latency_seconds"):
            ScriptedOpenAIServer(latency_seconds=bad)


def _outcomes(server: ScriptedOpenAIServer, count: int) -> tuple[list[str], list[float]]:
    """What each of ``count`` chat requests met (its status, or "reset"), and how long each 200 took."""
    import time

    seen, walls = [], []
    for _ in range(count):
        started = time.monotonic()
        try:
            reply = post(server, "/chat/completions", {"messages": MESSAGES})
        except httpx.TransportError:
            seen.append("reset")
            continue
        seen.append(str(reply.status_code))
        if reply.status_code == 200:
            walls.append(time.monotonic() - started)
    return seen, walls


def test_server_fault_mix_injects_resets_errors_and_slow_replies_by_seeded_shares() -> None:
    """Slow replies are checked by a lower bound only: on a busy machine any reply can be late, none early."""
    mix, slow = {"reset": 0.2, "500": 0.2, "slow": 0.1}, 0.3
    with ScriptedOpenAIServer(responder=lambda body: "ok", fault_mix=mix, fault_seed=7, slow_seconds=slow) as server:
        first, walls = _outcomes(server, 60)
        assert len(server.requests) == 60  # a reset request was read, then reset
        counted = dict(server.faults)
    with ScriptedOpenAIServer(responder=lambda body: "ok", fault_mix=mix, fault_seed=7, slow_seconds=slow) as server:
        assert _outcomes(server, 60)[0] == first  # one seed, one sequence
    assert set(counted) == {"reset", "500", "slow"}
    assert (first.count("reset"), first.count("500")) == (counted["reset"], counted["500"])
    assert first.count("200") == 60 - counted["reset"] - counted["500"]
    assert sum(wall >= slow for wall in walls) >= counted["slow"]
    for bad in ({"melt": 0.1}, {"500": 1.5}, {"500": 0.6, "reset": 0.6}):
        with pytest.raises(ValueError, match="fault_mix"):
            ScriptedOpenAIServer(fault_mix=bad)
