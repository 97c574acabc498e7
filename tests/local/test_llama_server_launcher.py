"""The launcher's additions to llama-cpp-python's server: timings and cached tokens in chat replies."""

from __future__ import annotations

import json
from typing import Any

import httpx

from gil_core.local._llama_server import _COUNTERS, TimingsMiddleware, add_timings

COUNTERS = {"prompt_n": 12.0, "prompt_ms": 30.5, "predicted_n": 1.0, "predicted_ms": 4.25}


def reply(**extra: Any) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": "A"}}], **extra}


def test_add_timings_writes_llama_cpp_fields_and_cached_prompt_tokens() -> None:
    timed = add_timings(reply(usage={"prompt_tokens": 40, "completion_tokens": 1}), COUNTERS)
    assert timed["timings"] == {"prompt_n": 12, "prompt_ms": 30.5, "predicted_n": 1, "predicted_ms": 4.25}
    assert timed["usage"] == {
        "prompt_tokens": 40,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 28},
    }


def test_add_timings_keeps_cached_tokens_the_server_reported_and_never_goes_negative() -> None:
    given = reply(usage={"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 5}})
    assert add_timings(given, COUNTERS)["usage"]["prompt_tokens_details"] == {"cached_tokens": 5}
    fewer = add_timings(reply(usage={"prompt_tokens": 3}), COUNTERS)
    assert fewer["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_add_timings_without_usage_adds_only_timings() -> None:
    assert add_timings(reply(), COUNTERS) == {**reply(), "timings": add_timings(reply(), COUNTERS)["timings"]}


async def chat_app(scope: Any, receive: Any, send: Any) -> None:
    """Stands in for the server: fills the request's counters (as the wrapped completion does) and answers."""
    counters = _COUNTERS.get()
    if counters is not None:
        counters.update(COUNTERS)
    streamed = scope["path"] == "/v1/chat/completions" and scope["query_string"] == b"stream"
    kind = b"text/event-stream" if streamed else b"application/json"
    body = b"data: {}\n\n" if streamed else json.dumps(reply(usage={"prompt_tokens": 20})).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
    # Two body messages, as a server may send them.
    await send({"type": "http.response.body", "body": body[:5], "more_body": True})
    await send({"type": "http.response.body", "body": body[5:]})


async def post(path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=TimingsMiddleware(chat_app))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.post(path, json={})


async def test_middleware_adds_timings_to_json_chat_replies_with_a_correct_length() -> None:
    response = await post("/v1/chat/completions")
    assert response.json()["timings"]["prompt_ms"] == 30.5
    assert response.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    assert int(response.headers["content-length"]) == len(response.content)


async def test_middleware_passes_streams_and_other_paths_through() -> None:
    assert (await post("/v1/chat/completions?stream")).text == "data: {}\n\n"
    assert "timings" not in (await post("/v1/completions")).json()
    assert _COUNTERS.get() is None
