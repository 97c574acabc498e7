"""The call recorder: every call through it lands in the store's calls table, priced and annotated."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gil_core.judge import Candidate, SingleTokenJudge
from gil_core.language import KOREAN
from gil_core.llm import (
    CallRecorder,
    EmbeddingRecorder,
    OpenAICompatibleChatModel,
    OpenAICompatibleEmbeddingModel,
    Usage,
    call_scope,
    trace_scope,
)
from gil_core.ontology import LabelScheme
from gil_core.telemetry import EnergyModel, TelemetryStore
from gil_core.testing import ScriptedOpenAIServer

PRICES = EnergyModel(fixed=2.0, per_fresh_prompt_token=0.5, per_cached_token=0.05, per_output_token=3.0)


async def test_a_judgment_lands_in_the_calls_table_with_its_reading(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    with ScriptedOpenAIServer() as server:
        server.enqueue(
            "B",
            top_logprobs=[("B", math.log(0.8)), ("A", math.log(0.15)), ("C", None)],
            usage=Usage(prompt_tokens=120, completion_tokens=1, cached_tokens=100),
        )
        async with OpenAICompatibleChatModel(server.base_url, "small-model") as model:
            judge = SingleTokenJudge(CallRecorder(model, sink=store, energy=PRICES), KOREAN)
            candidates = [Candidate("refund", "환불", "환불 상태"), Candidate("invoice", "invoice", "a copy")]
            with trace_scope("trace-1"):
                judgment = await judge.judge(
                    "환불 언제 돼요?", "billing", candidates, scheme=LabelScheme.LETTERS, layer=2
                )

    (row,) = store.read("calls").to_dicts()
    assert (row["trace_id"], row["role"], row["node_id"], row["layer"], row["model"]) == (
        "trace-1",
        "judge",
        "billing",
        2,
        "small-model",
    )
    assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"]) == (120, 100, 1)
    assert row["energy"] == pytest.approx(2.0 + 0.5 * 20 + 0.05 * 100 + 3.0 * 1) == judgment.energy
    assert row["outcome"] == "accept" and row["label_mass"] == pytest.approx(0.95)
    assert json.loads(row["distribution"]) == pytest.approx({"refund": 0.8 / 0.95, "invoice": 0.0})
    assert json.loads(row["top_logprobs"])[2] == {"token": "C", "logprob": None}
    candidates_json = json.loads(row["candidates"])
    assert candidates_json[0] == {"id": None, "shown_as": "A", "label": "", "description": "", "answer": None}
    assert candidates_json[1]["label"] == "환불" and "환불" in row["candidates"]  # non-ASCII unescaped
    assert row["gpu_prompt_ms"] is not None and row["first_token"] == "B" and row["content"] == "B"


async def test_a_call_is_recorded_even_when_its_caller_fails_afterwards(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    with ScriptedOpenAIServer() as server:
        server.enqueue("hello")
        async with OpenAICompatibleChatModel(server.base_url, "m") as model:
            recorder = CallRecorder(model, sink=store, energy=EnergyModel.tokens())
            with pytest.raises(RuntimeError), call_scope("fallback", node_id="shipping"):
                await recorder.complete([{"role": "user", "content": "hi"}], max_tokens=8)
                raise RuntimeError("the contract check failed")
    (row,) = store.read("calls").to_dicts()
    assert (row["role"], row["node_id"], row["content"], row["trace_id"]) == ("fallback", "shipping", "hello", None)


async def test_calls_outside_a_scope_take_the_default_role(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    with ScriptedOpenAIServer() as server:
        server.enqueue("x")
        async with OpenAICompatibleChatModel(server.base_url, "m") as model:
            recorder = CallRecorder(model, sink=store, energy=EnergyModel.tokens(), default_role="baseline")
            await recorder.complete([{"role": "user", "content": "hi"}], max_tokens=4)
    assert store.read("calls")["role"].to_list() == ["baseline"]


async def test_embedding_calls_are_recorded_as_embed_and_priced(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    with ScriptedOpenAIServer() as server:
        async with OpenAICompatibleEmbeddingModel(server.base_url, "minilm") as model:
            recorder = EmbeddingRecorder(model, sink=store, energy=PRICES)
            with trace_scope("t"):
                embeddings = await recorder.embed(["where is my parcel", "refund please"])
    assert len(embeddings.vectors) == 2
    (row,) = store.read("calls").to_dicts()
    assert (row["role"], row["model"], row["trace_id"]) == ("embed", "minilm", "t")
    fresh = row["prompt_tokens"] - row["cached_tokens"]
    assert row["prompt_tokens"] > 0 and row["energy"] == pytest.approx(2.0 + 0.5 * fresh + 0.05 * row["cached_tokens"])


async def test_each_recorded_call_is_a_gil_call_span_with_tokens_and_energy(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from gil_core.diagnostics import Diagnostics

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    diagnostics = Diagnostics(tracer_provider=provider)
    store = TelemetryStore(tmp_path / "store")
    with ScriptedOpenAIServer() as server:
        server.enqueue("ok", usage=Usage(prompt_tokens=10, completion_tokens=2, cached_tokens=4))
        async with OpenAICompatibleChatModel(server.base_url, "m") as model:
            recorder = CallRecorder(model, sink=store, energy=PRICES, diagnostics=diagnostics)
            with call_scope("fallback", node_id="billing", layer=2):
                await recorder.complete([{"role": "user", "content": "hi"}], max_tokens=8)
    (span,) = exporter.get_finished_spans()
    assert span.name == "gil.call"
    attributes = dict(span.attributes or {})
    assert attributes["gil.role"] == "fallback" and attributes["gil.node"] == "billing" and attributes["gil.layer"] == 2
    assert (attributes["gil.prompt_tokens"], attributes["gil.cached_tokens"], attributes["gil.completion_tokens"]) == (
        10,
        4,
        2,
    )
    assert attributes["gil.energy"] == pytest.approx(store.read("calls")["energy"][0])
