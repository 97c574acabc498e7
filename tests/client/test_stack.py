"""The decorators together, in the stack's order: what a cached answer skips, what a private call leaves behind."""

from __future__ import annotations

from pathlib import Path

from gil_core.client import (
    InProcessOperationLog,
    InProcessRequestCache,
    JsonLinesOperationLog,
    TokenBucketLimiter,
    build_chat_stack,
    call_options,
)
from gil_core.llm import CallRecorder, OpenAICompatibleChatModel, Usage
from gil_core.telemetry import EnergyModel, TelemetryStore
from gil_core.testing import ManualClock, ScriptedChatModel, ScriptedOpenAIServer
from tests.client._support import ListSink, user


async def test_a_cached_answer_adds_no_tokens_waits_on_no_limiter_and_is_not_logged() -> None:
    clock = ManualClock()
    limiter = TokenBucketLimiter(clock=clock, sleep=clock.sleep)
    log = InProcessOperationLog()
    sink = ListSink()
    inner = ScriptedChatModel(name="big")
    inner.enqueue("five days", usage=Usage(prompt_tokens=40, completion_tokens=2))
    recorded = CallRecorder(inner, sink=sink, energy=EnergyModel.tokens())
    model = build_chat_stack(
        recorded, provider="local", tenant="acme", schema="v1", cache=InProcessRequestCache(), log=log, limiter=limiter
    )

    for _ in range(3):
        assert (await model.complete(user("refund?"), max_tokens=8)).content == "five days"

    assert len(inner.history) == 1
    assert len(sink.calls) == 1 and sink.calls[0].prompt_tokens == 40  # one priced call
    assert limiter.snapshot("local").allowed == 1  # hits took no turn
    assert len(log.entries()) == 1 and log.stats().tokens == 42


async def test_a_refused_call_is_logged_with_the_model_that_answered() -> None:
    clock = ManualClock()
    limiter = TokenBucketLimiter(1, 1, max_wait=0, clock=clock, sleep=clock.sleep)
    log = InProcessOperationLog()
    primary = ScriptedChatModel(name="primary")
    primary.enqueue("a")
    backup = ScriptedChatModel(name="backup")
    backup.enqueue("b")
    model = build_chat_stack(
        primary, provider="local", tenant="t", schema="s", log=log, limiter=limiter, fallback=backup
    )
    await model.complete(user("one"), max_tokens=4)
    await model.complete(user("two"), max_tokens=4)
    assert [(item.model, item.success) for item in log.entries()] == [("primary", True), ("backup", True)]


def test_a_stack_with_no_parts_is_the_model_itself() -> None:
    inner = ScriptedChatModel()
    assert build_chat_stack(inner, provider="p", tenant="t", schema="s") is inner


async def test_a_do_not_record_call_leaves_no_trace_of_its_input_under_the_store_root(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = TelemetryStore(root)
    secret = "SECRET-customer-4417-card"
    visible = "VISIBLE-marker-request"
    with ScriptedOpenAIServer() as server:
        server.enqueue("noted")
        server.enqueue("noted too")
        async with OpenAICompatibleChatModel(server.base_url, "m") as http:
            model = build_chat_stack(
                CallRecorder(http, sink=store, energy=EnergyModel.tokens()),
                provider="local",
                tenant="acme",
                schema="v1",
                cache=InProcessRequestCache(),
                log=JsonLinesOperationLog(root),
                limiter=TokenBucketLimiter(),
            )
            await model.complete(user(visible), max_tokens=8)
            with call_options(do_not_record=True):
                await model.complete(user(f"my card is {secret}"), max_tokens=8)

    written = [path for path in root.rglob("*") if path.is_file()]
    assert any((root / "operation_log") in path.parents for path in written)
    contents = b"".join(path.read_bytes() for path in written)
    assert visible.encode() in contents  # the grep does find a recorded call's input
    assert secret.encode() not in contents
    calls = store.read("calls")  # Parquet may compress text, so read the table too
    assert calls.height >= 1
    assert not any(secret in str(value) for column in calls.columns for value in calls[column].to_list())
