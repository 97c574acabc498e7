"""Model servers that never finish or never stop, through the real HTTP adapter on loopback: a reply dripped a
byte at a time (each byte sooner than the read timeout, so only a deadline on the whole attempt ends it), a
reply of hundreds of MB (read no further than the cap, in bounded memory), a length announced past the cap, and
JSON nested deep enough to exhaust the parser's stack. Each ends in one typed error naming the endpoint."""

from __future__ import annotations

import tracemalloc

import httpx
import pytest

from gil_core.errors import BadResponseError, ModelUnavailableError
from gil_core.llm import Message, OpenAICompatibleChatModel, OpenAICompatibleEmbeddingModel
from gil_core.llm.openai_compat import MAX_REPLY_BYTES
from gil_core.testing import ScriptedOpenAIServer
from tests.reliability._support import AttemptCounter

pytestmark = pytest.mark.reliability

MESSAGES: list[Message] = [{"role": "user", "content": "where is my refund?"}]


async def test_a_dripping_server_is_cut_off_by_the_attempts_deadline_not_left_to_drip() -> None:
    """One byte every 0.2 s, for up to 30 s (150 bytes): httpx's read timeout (1 s) never fires, yet the call ends
    after one attempt with a reason, the server seeing the client hang up a few bytes into its drip. A drip that
    ran its course ends without a broken connection (``client_hung_up`` stays false), so the server's own record
    shows the client gave up early, with no clock read by the test."""
    counter = AttemptCounter()
    drip_seconds, hang_seconds = 0.2, 30.0
    full_drip_bytes = int(hang_seconds / drip_seconds)  # one byte a step
    with ScriptedOpenAIServer(drip_seconds=drip_seconds, hang_seconds=hang_seconds) as server:
        server.enqueue_failure("drip")
        async with (
            httpx.AsyncClient(event_hooks={"request": [counter]}) as client,
            OpenAICompatibleChatModel(server.base_url, "m", timeout=1.0, max_attempts=3, client=client) as chat,
        ):
            with pytest.raises(ModelUnavailableError) as caught:
                await chat.complete(MESSAGES, max_tokens=8)
        (reply,) = server.streamed
        assert reply.done.wait(10)
    assert "the reply did not finish within 1.5 s" in str(caught.value) and server.base_url in str(caught.value)
    assert counter.count == 1  # a reply that was arriving is not sent again
    assert reply.client_hung_up  # the client closed the connection while the server was still dripping
    # About 1.5 s of a 30 s drip went out; the whole drip, or a deadline that came only after several read
    # timeouts' worth of bytes, would send far more.
    assert 3 <= reply.bytes_sent < full_drip_bytes // 5, reply  # bytes came more often than the read timeout


@pytest.mark.parametrize("model", ["chat", "embeddings"])
async def test_a_reply_of_hundreds_of_megabytes_is_refused_at_the_cap_in_bounded_memory(model: str) -> None:
    """300 MB without a length: the adapter stops reading at 32 MiB, holding little more than that in memory
    (traced allocations), and the server sees the client hang up long before its end."""
    with ScriptedOpenAIServer(huge_bytes=300 * 1024 * 1024) as server:
        server.enqueue_failure("huge")
        kind = OpenAICompatibleChatModel if model == "chat" else OpenAICompatibleEmbeddingModel
        async with kind(server.base_url, "m", timeout=30.0, max_attempts=3) as adapter:
            tracemalloc.start()
            try:
                with pytest.raises(BadResponseError) as caught:
                    if isinstance(adapter, OpenAICompatibleChatModel):
                        await adapter.complete(MESSAGES, max_tokens=8)
                    else:
                        await adapter.embed(["where is my refund?"])
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        (reply,) = server.streamed
        assert reply.done.wait(10)
    assert f"larger than the cap of {MAX_REPLY_BYTES:,} bytes" in str(caught.value)
    assert peak < MAX_REPLY_BYTES + 24 * 1024 * 1024, f"{peak / 2**20:.0f} MiB traced"
    assert reply.client_hung_up and reply.bytes_sent < 2 * MAX_REPLY_BYTES
    assert len(server.requests) == 1  # not retried


async def test_a_reply_announcing_a_length_past_the_cap_is_refused_before_its_body_is_read() -> None:
    with ScriptedOpenAIServer(responder=lambda body: "fine") as server:
        async with OpenAICompatibleChatModel(server.base_url, "m", max_reply_bytes=100) as chat:
            with pytest.raises(BadResponseError, match=r"reply of [\d,]+ bytes is larger than the cap of 100 bytes"):
                await chat.complete(MESSAGES, max_tokens=8)
            assert len(server.requests) == 1
            async with OpenAICompatibleChatModel(server.base_url, "m") as roomy:
                assert (await roomy.complete(MESSAGES, max_tokens=8)).content == "fine"


async def test_json_nested_past_the_parsers_stack_is_a_bad_reply_not_a_recursion_error() -> None:
    with ScriptedOpenAIServer() as server:
        server.enqueue_json(b"[" * 100_000 + b"]" * 100_000)
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            with pytest.raises(BadResponseError, match="reply is not JSON"):
                await chat.complete(MESSAGES, max_tokens=8)
