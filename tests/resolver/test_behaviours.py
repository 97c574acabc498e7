"""Resolver behaviours beyond one request per mode: diagnostics, shadows, exploration, memory-failure policy."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gil_core.diagnostics import Diagnostics
from gil_core.errors import MemoryUnavailableError
from gil_core.fallback import TextContract
from gil_core.feedback import Feedback
from gil_core.habits.costs import evidence_from_row
from gil_core.habits.shadows import build_shadow_index
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.memory import CallableEmbeddingModel, LanceDBMemory
from gil_core.resolver import Metering, Resolver
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel
from tests.resolver._support import Script, support_server, support_task
from tests.telemetry.test_store import make_trace

REFUND = "Refunds reach the original payment method within 5 business days of approval."


def metric_points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


async def test_each_request_is_a_gil_resolve_span_with_its_calls_nested_and_counted(tmp_path: Path) -> None:
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    diagnostics = Diagnostics(tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader]))
    task = support_task(memory_threshold=0.95)
    with support_server({"where is my refund?": Script(route=["billing", "refund status"])}) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(
                chat,
                TelemetryStore(tmp_path / "store"),
                memory=LanceDBMemory(tmp_path / "memory", HashEmbeddingModel()),
                metering=Metering(diagnostics=diagnostics),
            )
            resolution = await resolver.resolve(task, "where is my refund?")
    spans = exporter.get_finished_spans()
    (resolve,) = [span for span in spans if span.name == "gil.resolve"]
    calls = [span for span in spans if span.name == "gil.call"]
    attributes = dict(resolve.attributes or {})
    assert attributes["gil.task"] == "support" and attributes["gil.mode"] == "habit/answer"
    assert attributes["gil.memory"] == "miss"  # an empty memory answers nothing
    assert attributes["gil.energy"] == pytest.approx(resolution.energy)
    assert attributes["gil.confidence"] == pytest.approx(0.96) and "gil.failure" not in attributes
    assert [dict(span.attributes or {})["gil.role"] for span in calls] == ["judge", "judge"]
    assert [dict(span.attributes or {}).get("gil.node") for span in calls] == ["root", "billing"]
    assert all(span.parent is not None and span.parent.span_id == resolve.context.span_id for span in calls)
    (count,) = metric_points(reader, "gil.resolutions")
    assert count.value == 1 and dict(count.attributes) == {"gil.task": "support", "gil.mode": "habit/answer"}
    (energy,) = metric_points(reader, "gil.resolution.energy")
    assert energy.sum == pytest.approx(resolution.energy)
    assert metric_points(reader, "gil.resolution.duration")[0].count == 1
    assert sum(point.count for point in metric_points(reader, "gil.call.energy")) == 2


async def test_a_confirmed_generated_answer_becomes_a_shadow_and_choosing_it_defers(tmp_path: Path) -> None:
    """After a correct answer at shipping that no habit holds, the judge sees it beside shipping's habits."""
    delivery = "Express parcels arrive on the next business day, tracked."
    task = replace(support_task(memory_threshold=None), contract=TextContract())  # free text can be new
    scripts = {
        "how long does delivery take?": Script(route=["shipping"], answers=[delivery]),
        "how many days until it arrives?": Script(route=["shipping", delivery[:40]], answers=[delivery]),
    }
    store = TelemetryStore(tmp_path / "store")
    with support_server(scripts) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(chat, store)
            first = await resolver.resolve(task, "how long does delivery take?")
            assert first.mode == "partial" and first.output == delivery
            await resolver.feedback(task, first.trace_id, correct=True)
            second = await resolver.resolve(task, "how many days until it arrives?")
            shown = [r.body for r in server.requests if r.body.get("logprobs")][-1]["messages"][1]["content"]
    assert f"{delivery[:40]} — how long does delivery take?" in shown
    assert second.path[-1].outcome == "defer" and second.path[-1].chosen is not None
    assert second.path[-1].chosen.startswith("shadow-") and second.mode == "partial" and second.output == delivery


def test_the_shadows_read_from_the_log_are_those_every_judged_trace_gives(tmp_path: Path) -> None:
    """The read keeps only the traces that can make a shadow (a generated answer judged, or any answer marked
    wrong): the index is the one every judged trace of the task gives."""
    task = support_task(memory_threshold=None)
    store = TelemetryStore(tmp_path / "store")
    with store.group_commit(max_rows=1_000, max_delay_s=None):
        store.record_trace(make_trace("generated", mode="fallback", output="A new answer.", feedback_verdict="correct"))
        for index in range(40):  # confirmed habit answers: nearly all of a mature log, none a shadow
            store.record_trace(make_trace(f"right-{index}", output=REFUND, feedback_verdict="correct"))
        store.record_trace(
            make_trace("corrected", output=REFUND, feedback_verdict="wrong", feedback_correction="Another answer.")
        )
        store.record_trace(make_trace("again", mode="partial", output="A new answer.", feedback_verdict="correct"))
        store.record_trace(make_trace("unjudged", mode="fallback", output="Never confirmed."))
        store.record_trace(make_trace("elsewhere", task="other", mode="fallback", feedback_verdict="correct"))
    judged = store.read("traces").filter((pl.col("task") == task.name) & pl.col("feedback_verdict").is_not_null())
    every = [evidence for evidence in map(evidence_from_row, judged.iter_rows(named=True)) if evidence is not None]
    shadows = Feedback(store, memory=None, learner=None).shadows(task)
    assert shadows == build_shadow_index(task.tree, every, exclude=(task.language.none_of_these,))
    assert [candidate.answer for candidate in shadows["billing"]] == ["A new answer.", "Another answer."]


async def test_exploration_cross_checks_a_habit_answer_and_records_a_dispute(tmp_path: Path) -> None:
    task = support_task(memory_threshold=None, exploration_rate=1.0)
    other = "Shipping is free above 50 and 5 below that."
    store = TelemetryStore(tmp_path / "store")
    with support_server({"where is my refund?": Script(route=["billing", "refund status"], answers=[other])}) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolution = await Resolver(chat, store).resolve(task, "where is my refund?")
    assert resolution.mode == "habit/answer" and resolution.output == REFUND
    assert resolution.explored_output == other
    trace = store.read("traces").row(0, named=True)
    assert trace["explored_output"] == other
    (row,) = store.read("habit_reliability").to_dicts()
    assert (row["item_id"], row["explored"], row["disputed"]) == ("refund-status", 1, 1)
    assert [c["role"] for c in store.read("calls").to_dicts()] == ["judge", "judge", "fallback"]


async def test_with_the_error_policy_a_failed_lookup_fails_the_request_and_is_traced(tmp_path: Path) -> None:
    healthy = HashEmbeddingModel()
    down = False

    def embed(texts: list[str]) -> list[tuple[float, ...]]:
        if down:
            raise ConnectionError("embedding service down")
        return [healthy.embed_text(text) for text in texts]

    task = support_task(memory_threshold=0.9, memory_failure="error")
    memory = LanceDBMemory(tmp_path / "memory", CallableEmbeddingModel(embed, name="flaky"))
    await memory.remember("support", "earlier", "hours?", "We open at nine.")
    store = TelemetryStore(tmp_path / "store")
    down = True
    with support_server({}) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            with pytest.raises(MemoryUnavailableError, match="embedding service down"):
                await Resolver(chat, store, memory=memory).resolve(task, "opening hours?")
        assert not [r for r in server.requests if r.path.endswith("/chat/completions")]
    (trace,) = store.read("traces").to_dicts()
    assert trace["mode"] == "abstain" and "embedding service down" in trace["failure"]
    assert json.loads(trace["recall"] or "null") is None


async def test_the_memory_guard_refuses_a_hit_for_another_order_number(tmp_path: Path) -> None:
    task = support_task(memory_threshold=0.5, memory_guard=True)
    first, second = "track order 48213 please", "track order 48214 please"
    scripts = {
        first: Script(route=["shipping", "track order"], slots={"order": "48213"}),
        second: Script(route=["shipping", "track order"], slots={"order": "48214"}),
    }
    store = TelemetryStore(tmp_path / "store")
    with support_server(scripts) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(chat, store, memory=LanceDBMemory(tmp_path / "memory", HashEmbeddingModel()))
            answered = await resolver.resolve(task, first)
            await resolver.feedback(task, answered.trace_id, correct=True)
            guarded = await resolver.resolve(task, second)
    assert guarded.mode == "habit/template" and guarded.output is not None and "48214" in guarded.output
    assert guarded.recall is not None and not guarded.recall.hit and guarded.recall.error is None
    assert (guarded.recall.refused or "").startswith("guard: ")  # memory worked; the guard took the hit back


async def test_the_reflex_judge_settles_nodes_without_an_llm_call_and_the_trace_says_which(tmp_path: Path) -> None:
    from gil_core.llm import EmbeddingRecorder
    from gil_core.telemetry import EnergyModel

    task = support_task(memory_threshold=None, reflex_threshold=0.9)
    request = "charges, refunds, invoices and ways to pay"  # billing's own description: the reflex is sure
    store = TelemetryStore(tmp_path / "store")
    with support_server({request: Script(route=["billing", "refund status"])}) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            reflex = EmbeddingRecorder(HashEmbeddingModel(), sink=store, energy=EnergyModel.tokens())
            resolution = await Resolver(chat, store, reflex_embedder=reflex).resolve(task, request)
        llm_judgments = [r for r in server.requests if r.body.get("logprobs")]
    deciders = {step.node: step.decided_by for step in resolution.path}
    assert deciders["root"] == "reflex" and resolution.path[0].chosen == "billing"
    assert len(llm_judgments) == sum(1 for who in deciders.values() if who == "deliberate")
    trace = store.read("traces").row(0, named=True)
    assert [step["decided_by"] for step in json.loads(trace["path"])] == [s.decided_by for s in resolution.path]
    calls = store.read("calls")
    assert "root" in calls.filter(calls["role"] == "embed")["node_id"].to_list()
    assert "root" not in calls.filter(calls["role"] == "judge")["node_id"].to_list()
