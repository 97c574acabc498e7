"""The OpenAI-compatible adapters over real HTTP on loopback, against ScriptedOpenAIServer."""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from gil_core.errors import BadResponseError, ConfigurationError, ModelUnavailableError, RateLimitedError
from gil_core.llm import (
    ChatModel,
    EmbeddingModel,
    Message,
    OpenAICompatibleChatModel,
    OpenAICompatibleEmbeddingModel,
    ServerTimings,
    TokenLogprob,
    Usage,
)
from gil_core.llm.openai_compat import _deep_merge
from gil_core.testing import HashEmbeddingModel, ScriptedOpenAIServer

API_KEY = "sk-test-0123456789-secret"
MESSAGES: list[Message] = [
    {"role": "system", "content": "Answer with one label."},
    {"role": "user", "content": "My card was charged twice"},
]


class RecordedSleep:
    """The adapters' sleep hook: records each retry wait instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as running:
        yield running


@pytest.fixture
def sleeps() -> RecordedSleep:
    return RecordedSleep()


@pytest.fixture
async def chat(server: ScriptedOpenAIServer, sleeps: RecordedSleep) -> AsyncIterator[OpenAICompatibleChatModel]:
    async with OpenAICompatibleChatModel(
        server.base_url, "judge-model", api_key=API_KEY, timeout=5.0, sleep=sleeps
    ) as model:
        yield model


@pytest.fixture
async def embedder(
    server: ScriptedOpenAIServer, sleeps: RecordedSleep
) -> AsyncIterator[OpenAICompatibleEmbeddingModel]:
    async with OpenAICompatibleEmbeddingModel(
        server.base_url, "embed-model", api_key=API_KEY, timeout=5.0, sleep=sleeps
    ) as model:
        yield model


# --- parsing


async def test_complete_parses_content_logprobs_usage_and_timings(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel
) -> None:
    server.enqueue(
        "B",
        top_logprobs=[("B", -0.1), ("A", -2.5), ("none", None)],
        usage=Usage(prompt_tokens=120, completion_tokens=1, cached_tokens=96),
        timings=ServerTimings(prompt_ms=12.5, predicted_ms=3.0),
    )
    completion = await chat.complete(MESSAGES, max_tokens=1, top_logprobs=3)
    assert completion.content == "B"
    assert completion.top_logprobs == (
        TokenLogprob("B", -0.1),
        TokenLogprob("A", -2.5),
        TokenLogprob("none", None),
    )
    assert completion.usage == Usage(prompt_tokens=120, completion_tokens=1, cached_tokens=96)
    assert completion.timings == ServerTimings(prompt_ms=12.5, predicted_ms=3.0)
    assert completion.model == "judge-model"
    assert completion.finish_reason == "stop"
    assert completion.latency_ms > 0
    assert completion.raw is not None and completion.raw["choices"][0]["message"]["content"] == "B"


async def test_null_logprob_on_the_wire_becomes_none(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel
) -> None:
    """A JSON null logprob (−∞) is kept as None, not dropped or turned into a number."""
    server.enqueue("A", top_logprobs=[("A", 0.0), ("B", None)])
    completion = await chat.complete(MESSAGES, max_tokens=1, top_logprobs=2)
    assert completion.raw is not None
    assert completion.raw["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["logprob"] is None
    assert completion.top_logprobs[1] == TokenLogprob("B", None)


async def test_request_carries_model_messages_and_logprob_fields(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel
) -> None:
    server.enqueue("A")
    await chat.complete(MESSAGES, max_tokens=1, temperature=0.0, top_logprobs=5)
    received = server.requests[-1]
    assert received.path == "/v1/chat/completions"
    assert received.body == {
        "model": "judge-model",
        "messages": MESSAGES,
        "max_tokens": 1,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": 5,
    }


async def test_request_leaves_logprob_fields_out_when_not_asked(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel
) -> None:
    server.enqueue("hello")
    completion = await chat.complete(MESSAGES, max_tokens=16)
    assert "logprobs" not in server.requests[-1].body
    assert "top_logprobs" not in server.requests[-1].body
    assert completion.top_logprobs == ()


async def test_extra_body_is_deep_merged_over_the_fields_gil_sets(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel
) -> None:
    server.enqueue("A")
    extra = {"chat_template_kwargs": {"enable_thinking": False}, "temperature": 0.7, "logprobs": False}
    await chat.complete(MESSAGES, max_tokens=1, top_logprobs=2, extra_body=extra)
    body = server.requests[-1].body
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["temperature"] == 0.7  # extra_body wins
    assert body["logprobs"] is False
    assert body["top_logprobs"] == 2 and body["max_tokens"] == 1


def test_deep_merge_merges_nested_mappings_and_replaces_other_values() -> None:
    base = {"a": {"x": 1, "y": {"deep": 1}}, "b": [1, 2], "c": 1}
    override = {"a": {"y": {"other": 2}, "z": 3}, "b": [3], "c": {"now": "dict"}}
    assert _deep_merge(base, override) == {
        "a": {"x": 1, "y": {"deep": 1, "other": 2}, "z": 3},
        "b": [3],
        "c": {"now": "dict"},
    }
    assert base == {"a": {"x": 1, "y": {"deep": 1}}, "b": [1, 2], "c": 1}  # inputs untouched


async def test_missing_cached_tokens_and_timings_read_as_zero_and_none(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel
) -> None:
    server.enqueue_json(
        {
            "model": "served-name",
            "choices": [{"message": {"role": "assistant", "content": None}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 0},
        }
    )
    completion = await chat.complete(MESSAGES, max_tokens=4)
    assert completion.content == ""  # null content reads as empty
    assert completion.usage == Usage(prompt_tokens=7, completion_tokens=0, cached_tokens=0)
    assert completion.timings is None
    assert completion.model == "served-name"


async def test_empty_reply_is_a_completion_with_empty_content(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel
) -> None:
    """An empty generation is an answer, not an error, even when logprobs were asked (no first token)."""
    server.enqueue_failure("empty")
    server.enqueue_failure("empty")
    assert (await chat.complete(MESSAGES, max_tokens=4)).content == ""
    completion = await chat.complete(MESSAGES, max_tokens=1, top_logprobs=3)
    assert completion.content == "" and completion.top_logprobs == ()


async def test_truncated_reply_keeps_finish_reason_length(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel
) -> None:
    server.enqueue_failure("truncated")
    completion = await chat.complete(MESSAGES, max_tokens=3)
    assert completion.finish_reason == "length"
    assert completion.content


# --- secrets


async def test_api_key_is_sent_as_bearer_but_absent_from_errors_and_repr(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel
) -> None:
    """Even when the server echoes the key in its error body, the raised error does not carry it."""
    server.enqueue_json({"error": {"message": f"key {API_KEY} is revoked"}}, status=401)
    with pytest.raises(BadResponseError) as caught:
        await chat.complete(MESSAGES, max_tokens=1)
    assert server.requests[-1].headers["authorization"] == f"Bearer {API_KEY}"
    assert caught.value.status == 401
    assert API_KEY not in str(caught.value) and API_KEY not in caught.value.reason
    assert "revoked" in str(caught.value)
    assert API_KEY not in repr(chat)


async def test_no_authorization_header_without_api_key(server: ScriptedOpenAIServer) -> None:
    server.enqueue("A")
    async with OpenAICompatibleChatModel(server.base_url, "m") as model:
        await model.complete(MESSAGES, max_tokens=1)
    assert "authorization" not in server.requests[-1].headers


# --- failures


async def test_refused_connection_is_retried_a_bounded_number_of_times_then_unavailable(
    server: ScriptedOpenAIServer, sleeps: RecordedSleep
) -> None:
    server.enqueue_failure("refuse")
    async with OpenAICompatibleChatModel(server.base_url, "m", max_attempts=3, sleep=sleeps) as model:
        with pytest.raises(ModelUnavailableError) as caught:
            await model.complete(MESSAGES, max_tokens=1)
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    assert len(sleeps.waits) == 2
    assert caught.value.endpoint == f"{server.base_url}/chat/completions"
    assert caught.value.endpoint in str(caught.value)
    assert server.requests == []


async def test_hang_past_the_timeout_is_unavailable_and_not_retried(
    server: ScriptedOpenAIServer, sleeps: RecordedSleep
) -> None:
    """A read timeout may mean the server is working on it: no second attempt doubles the load."""
    server.enqueue_failure("hang")
    async with OpenAICompatibleChatModel(server.base_url, "m", timeout=0.3, sleep=sleeps) as model:
        with pytest.raises(ModelUnavailableError) as caught:
            await model.complete(MESSAGES, max_tokens=1)
    assert isinstance(caught.value.__cause__, httpx.TimeoutException)
    assert "0.3 s" in str(caught.value)
    assert sleeps.waits == []


async def test_429_is_retried_honouring_retry_after_then_rate_limited(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel, sleeps: RecordedSleep
) -> None:
    for _ in range(4):
        server.enqueue_failure("429", retry_after=2)
    with pytest.raises(RateLimitedError) as caught:
        await chat.complete(MESSAGES, max_tokens=1)
    assert caught.value.retry_after == 2.0
    assert caught.value.status == 429
    assert sleeps.waits == [2.0, 2.0, 2.0]
    assert len(server.requests) == 4


async def test_429_then_success_returns_the_completion(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel, sleeps: RecordedSleep
) -> None:
    server.enqueue_failure("429", retry_after=1.5)
    server.enqueue("A")
    assert (await chat.complete(MESSAGES, max_tokens=1)).content == "A"
    assert sleeps.waits == [1.5]


async def test_retry_after_as_http_date_is_honoured(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel, sleeps: RecordedSleep
) -> None:
    server.enqueue_failure("429", retry_after=email.utils.formatdate(time.time() + 10, usegmt=True))
    server.enqueue("A")
    await chat.complete(MESSAGES, max_tokens=1)
    assert len(sleeps.waits) == 1
    assert 8.0 <= sleeps.waits[0] <= 10.0  # the date has one-second resolution


async def test_retry_after_is_capped_by_max_retry_wait(server: ScriptedOpenAIServer, sleeps: RecordedSleep) -> None:
    for _ in range(3):
        server.enqueue_failure("429", retry_after=3600)
    async with OpenAICompatibleChatModel(
        server.base_url, "m", max_attempts=3, max_retry_wait=5.0, sleep=sleeps
    ) as model:
        with pytest.raises(RateLimitedError) as caught:
            await model.complete(MESSAGES, max_tokens=1)
    assert sleeps.waits == [5.0, 5.0]
    assert caught.value.retry_after == 3600.0


@pytest.mark.parametrize("status", ["500", "502", "503", "504"])
async def test_server_errors_are_retried_with_backoff_then_unavailable(
    status: Any, server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel, sleeps: RecordedSleep
) -> None:
    for _ in range(4):
        server.enqueue_failure(status)
    with pytest.raises(ModelUnavailableError) as caught:
        await chat.complete(MESSAGES, max_tokens=1)
    assert caught.value.status == int(status)
    assert isinstance(caught.value.__cause__, httpx.HTTPStatusError)
    assert len(server.requests) == 4
    assert len(sleeps.waits) == 3
    # exponential (0.5, 1, 2 s) plus up to 0.5 s of jitter
    for attempt, wait in enumerate(sleeps.waits):
        assert 0.5 * 2**attempt <= wait <= 0.5 * 2**attempt + 0.5


async def test_backoff_never_exceeds_max_retry_wait(server: ScriptedOpenAIServer, sleeps: RecordedSleep) -> None:
    for _ in range(6):
        server.enqueue_failure("503")
    async with OpenAICompatibleChatModel(
        server.base_url, "m", max_attempts=6, max_retry_wait=1.0, sleep=sleeps
    ) as model:
        with pytest.raises(ModelUnavailableError):
            await model.complete(MESSAGES, max_tokens=1)
    assert len(sleeps.waits) == 5 and max(sleeps.waits) <= 1.0


async def test_two_503_then_success_succeeds_on_the_third_attempt(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel, sleeps: RecordedSleep
) -> None:
    server.enqueue_failure("503")
    server.enqueue_failure("503")
    server.enqueue("A", top_logprobs=[("A", -0.01)])
    completion = await chat.complete(MESSAGES, max_tokens=1, top_logprobs=1)
    assert completion.top_logprobs == (TokenLogprob("A", -0.01),)
    assert len(server.requests) == 3
    assert len(sleeps.waits) == 2


@pytest.mark.parametrize("status", ["400", "404"])
async def test_other_4xx_is_a_bad_response_without_retry(
    status: Any, server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel, sleeps: RecordedSleep
) -> None:
    server.enqueue_failure(status)
    with pytest.raises(BadResponseError) as caught:
        await chat.complete(MESSAGES, max_tokens=1)
    assert caught.value.status == int(status)
    assert len(server.requests) == 1 and sleeps.waits == []


async def test_non_json_body_is_a_bad_response(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel, sleeps: RecordedSleep
) -> None:
    server.enqueue_failure("garbage")
    with pytest.raises(BadResponseError) as caught:
        await chat.complete(MESSAGES, max_tokens=1)
    assert "not JSON" in str(caught.value)
    assert isinstance(caught.value.__cause__, json.JSONDecodeError)
    assert sleeps.waits == []


async def test_reply_without_logprobs_when_asked_is_a_bad_response(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel
) -> None:
    server.enqueue_failure("no_logprobs")
    with pytest.raises(BadResponseError, match="no logprobs in the reply"):
        await chat.complete(MESSAGES, max_tokens=1, top_logprobs=5)


async def test_reply_without_logprobs_is_fine_when_none_were_asked(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel
) -> None:
    server.enqueue_failure("no_logprobs")
    assert (await chat.complete(MESSAGES, max_tokens=1)).content == "yes"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"object": "chat.completion"}, id="no-choices"),
        pytest.param({"choices": []}, id="empty-choices"),
        pytest.param({"choices": "A"}, id="choices-not-a-list"),
        pytest.param({"choices": [{"message": {"content": 5}}]}, id="content-not-a-string"),
        pytest.param({"choices": [{"message": "A"}]}, id="message-not-an-object"),
        pytest.param({"choices": [{"message": {"content": "A"}}], "usage": {"prompt_tokens": "7"}}, id="usage"),
        pytest.param(
            {"choices": [{"message": {"content": "A"}}], "timings": {"prompt_ms": "x", "predicted_ms": 1}},
            id="timings",
        ),
        pytest.param(
            {"choices": [{"message": {"content": "A"}, "logprobs": {"content": [{"top_logprobs": [{"token": 1}]}]}}]},
            id="logprob-token",
        ),
    ],
)
async def test_reply_of_the_wrong_shape_is_a_bad_response(
    body: dict[str, Any], server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel
) -> None:
    server.enqueue_json(body)
    with pytest.raises(BadResponseError, match="reply"):
        await chat.complete(MESSAGES, max_tokens=1)


async def test_json_that_is_not_an_object_is_a_bad_response(
    server: ScriptedOpenAIServer, chat: OpenAICompatibleChatModel
) -> None:
    server.enqueue_json(["not", "an", "object"])
    with pytest.raises(BadResponseError, match="not an object"):
        await chat.complete(MESSAGES, max_tokens=1)


# --- embeddings


async def test_embed_returns_vectors_in_input_order_with_usage(
    server: ScriptedOpenAIServer, embedder: OpenAICompatibleEmbeddingModel
) -> None:
    texts = ["refund my order", "reset my password please", "hi"]
    embeddings = await embedder.embed(texts)
    reference = HashEmbeddingModel(64)
    assert embeddings.vectors == tuple(reference.embed_text(text) for text in texts)
    assert embeddings.usage.prompt_tokens == 8  # words
    assert embeddings.model == "embed-model"
    assert embeddings.latency_ms > 0
    assert server.requests[-1].path == "/v1/embeddings"
    assert server.requests[-1].body == {"model": "embed-model", "input": texts}


async def test_embed_sorts_the_reply_by_index(
    server: ScriptedOpenAIServer, embedder: OpenAICompatibleEmbeddingModel
) -> None:
    server.enqueue_json(
        {
            "data": [{"index": 1, "embedding": [0.0, 1.0]}, {"index": 0, "embedding": [1, 0]}],
            "usage": {"prompt_tokens": 2, "total_tokens": 2},
        }
    )
    embeddings = await embedder.embed(["first", "second"])
    assert embeddings.vectors == ((1.0, 0.0), (0.0, 1.0))
    assert embeddings.usage == Usage(prompt_tokens=2)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"data": [{"index": 0, "embedding": [1.0]}]}, id="one-vector-for-two-texts"),
        pytest.param({"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]}, id="dup"),
        pytest.param({"data": [{"index": 0, "embedding": ["a"]}, {"index": 1, "embedding": [1]}]}, id="type"),
        pytest.param({"object": "list"}, id="no-data"),
    ],
)
async def test_embed_reply_of_the_wrong_shape_is_a_bad_response(
    body: dict[str, Any], server: ScriptedOpenAIServer, embedder: OpenAICompatibleEmbeddingModel
) -> None:
    server.enqueue_json(body)
    with pytest.raises(BadResponseError):
        await embedder.embed(["first", "second"])


async def test_embed_shares_the_retry_and_error_handling(
    server: ScriptedOpenAIServer, embedder: OpenAICompatibleEmbeddingModel, sleeps: RecordedSleep
) -> None:
    server.enqueue_failure("503")
    server.enqueue_failure("429", retry_after=1)
    assert len((await embedder.embed(["a b"])).vectors) == 1
    assert len(sleeps.waits) == 2 and sleeps.waits[1] == 1.0
    server.enqueue_failure("garbage")
    with pytest.raises(BadResponseError) as caught:
        await embedder.embed(["a b"])
    assert caught.value.endpoint == f"{server.base_url}/embeddings"


async def test_embed_of_no_texts_sends_no_request(
    server: ScriptedOpenAIServer, embedder: OpenAICompatibleEmbeddingModel
) -> None:
    assert (await embedder.embed([])).vectors == ()
    assert server.requests == []


# --- construction and lifecycle


def test_adapters_satisfy_the_ports_and_hide_the_key() -> None:
    chat = OpenAICompatibleChatModel("http://127.0.0.1:1/v1/", "judge", api_key=API_KEY)
    embed = OpenAICompatibleEmbeddingModel("http://127.0.0.1:1/v1", "embed", api_key=API_KEY)
    assert isinstance(chat, ChatModel) and isinstance(embed, EmbeddingModel)
    assert chat.name == "judge" and embed.name == "embed"
    assert repr(chat) == "OpenAICompatibleChatModel(base_url='http://127.0.0.1:1/v1', model='judge')"
    assert API_KEY not in repr(embed)


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"timeout": 0.0}, {"max_retry_wait": -1.0}])
def test_invalid_settings_are_a_configuration_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        OpenAICompatibleChatModel("http://127.0.0.1:1/v1", "m", **kwargs)


async def test_a_client_passed_in_stays_open_after_aclose(server: ScriptedOpenAIServer) -> None:
    server.enqueue("A")
    async with httpx.AsyncClient() as client:
        async with OpenAICompatibleChatModel(server.base_url, "m", client=client) as model:
            await model.complete(MESSAGES, max_tokens=1)
        assert not client.is_closed
