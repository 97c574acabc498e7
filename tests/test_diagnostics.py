"""gil's spans and metrics, read back through the OpenTelemetry SDK's in-memory exporters."""

from __future__ import annotations

import ast
import asyncio
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import gil_core
import gil_core.diagnostics
from gil_core.diagnostics import Diagnostics, default_diagnostics


@dataclass
class Telemetry:
    diagnostics: Diagnostics
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader

    def finished(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans.get_finished_spans() if span.name == name]

    def points(self, metric_name: str) -> list[Any]:
        data = self.metrics.get_metrics_data()
        if data is None:  # nothing recorded yet
            return []
        return [
            point
            for resource_metrics in data.resource_metrics
            for scope_metrics in resource_metrics.scope_metrics
            for metric in scope_metrics.metrics
            if metric.name == metric_name
            for point in metric.data.data_points
        ]

    def sums(self, metric_name: str) -> dict[tuple[tuple[str, Any], ...], float]:
        points = self.points(metric_name)
        assert all(isinstance(point, NumberDataPoint) for point in points)
        return {key(point.attributes): point.value for point in points}

    def histograms(self, metric_name: str) -> dict[tuple[tuple[str, Any], ...], HistogramDataPoint]:
        points = self.points(metric_name)
        assert all(isinstance(point, HistogramDataPoint) for point in points)
        return {key(point.attributes): point for point in points}


def key(attributes: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """A metric point's attributes as a hashable, order-free key."""
    return tuple(sorted((attributes or {}).items()))


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Telemetry(Diagnostics(tracer_provider=tracer_provider, meter_provider=meter_provider), spans, reader)
    tracer_provider.shutdown()
    meter_provider.shutdown()


class Boom(RuntimeError):
    pass


def test_call_spans_nest_under_the_resolve_span_in_the_same_trace(telemetry: Telemetry) -> None:
    with telemetry.diagnostics.resolve_span("support") as resolution:
        with telemetry.diagnostics.call_span(role="embed", model="minilm"):
            pass
        with telemetry.diagnostics.call_span(role="judge", model="qwen", node_id="billing", layer=1):
            pass
        resolution.finish(mode="tree", memory="miss", energy=12.5, confidence=0.9, failure=None)

    (resolve,) = telemetry.finished("gil.resolve")
    calls = telemetry.finished("gil.call")
    assert len(calls) == 2
    assert resolve.parent is None
    for call in calls:
        assert call.parent is not None
        assert call.parent.span_id == resolve.context.span_id
        assert call.context.trace_id == resolve.context.trace_id


def test_spans_and_metrics_are_named_gil_with_the_package_version(telemetry: Telemetry) -> None:
    with telemetry.diagnostics.resolve_span("support") as resolution:
        resolution.finish(mode="memory", memory="hit", energy=1.0, confidence=None, failure=None)

    (resolve,) = telemetry.finished("gil.resolve")
    assert resolve.instrumentation_scope is not None
    assert (resolve.instrumentation_scope.name, resolve.instrumentation_scope.version) == ("gil", gil_core.__version__)
    data = telemetry.metrics.get_metrics_data()
    assert data is not None
    scopes = {(s.scope.name, s.scope.version) for rm in data.resource_metrics for s in rm.scope_metrics}
    assert scopes == {("gil", gil_core.__version__)}


def test_finish_sets_mode_memory_energy_and_confidence_on_the_resolve_span(telemetry: Telemetry) -> None:
    with telemetry.diagnostics.resolve_span("support") as resolution:
        resolution.finish(mode="tree", memory="miss", energy=12.5, confidence=0.875, failure=None)

    (resolve,) = telemetry.finished("gil.resolve")
    assert dict(resolve.attributes or {}) == {
        "gil.task": "support",
        "gil.mode": "tree",
        "gil.memory": "miss",
        "gil.energy": 12.5,
        "gil.confidence": 0.875,
    }
    assert resolve.status.status_code is StatusCode.UNSET
    assert resolve.events == ()


def test_finish_with_a_failure_sets_the_failure_attribute_and_error_status(telemetry: Telemetry) -> None:
    with telemetry.diagnostics.resolve_span("support") as resolution:
        resolution.finish(mode="abstain", memory="failed", energy=3.0, confidence=None, failure="model unavailable")

    (resolve,) = telemetry.finished("gil.resolve")
    attributes = dict(resolve.attributes or {})
    assert attributes["gil.failure"] == "model unavailable"
    assert attributes["gil.mode"] == "abstain"
    assert "gil.confidence" not in attributes
    assert resolve.status.status_code is StatusCode.ERROR
    assert resolve.status.description == "model unavailable"
    assert telemetry.sums("gil.resolutions") == {key({"gil.task": "support", "gil.mode": "abstain"}): 1}


def test_resolve_span_without_finish_reports_mode_unknown(telemetry: Telemetry) -> None:
    with telemetry.diagnostics.resolve_span("support"):
        pass

    (resolve,) = telemetry.finished("gil.resolve")
    assert dict(resolve.attributes or {}) == {"gil.task": "support", "gil.mode": "unknown"}
    assert resolve.status.status_code is StatusCode.UNSET
    assert telemetry.sums("gil.resolutions") == {key({"gil.task": "support", "gil.mode": "unknown"}): 1}


def test_exception_in_resolve_span_is_recorded_marked_error_counted_as_mode_error_and_reraised(
    telemetry: Telemetry,
) -> None:
    with pytest.raises(Boom, match="store down"), telemetry.diagnostics.resolve_span("support"):
        raise Boom("store down")

    (resolve,) = telemetry.finished("gil.resolve")
    assert resolve.status.status_code is StatusCode.ERROR
    assert resolve.status.description == "Boom: store down"
    assert (resolve.attributes or {})["gil.mode"] == "error"
    (event,) = resolve.events  # once: the SDK's own recording is switched off
    assert event.name == "exception"
    assert str((event.attributes or {})["exception.type"]).endswith("Boom")
    assert (event.attributes or {})["exception.message"] == "store down"
    error = key({"gil.task": "support", "gil.mode": "error"})
    assert telemetry.sums("gil.resolutions") == {error: 1}
    assert telemetry.histograms("gil.resolution.energy")[error].count == 1
    assert telemetry.histograms("gil.resolution.duration")[error].count == 1


def test_exception_after_finish_keeps_the_reported_outcome_but_mode_error(telemetry: Telemetry) -> None:
    with pytest.raises(Boom), telemetry.diagnostics.resolve_span("support") as resolution:
        resolution.finish(mode="tree", memory="miss", energy=7.0, confidence=0.5, failure=None)
        raise Boom("sink rejected the trace")

    (resolve,) = telemetry.finished("gil.resolve")
    attributes = dict(resolve.attributes or {})
    assert (attributes["gil.mode"], attributes["gil.memory"], attributes["gil.energy"]) == ("error", "miss", 7.0)
    assert telemetry.histograms("gil.resolution.energy")[key({"gil.task": "support", "gil.mode": "error"})].sum == 7.0


def test_resolutions_counter_sums_per_task_and_mode(telemetry: Telemetry) -> None:
    for task, mode in [("support", "memory"), ("support", "memory"), ("support", "tree"), ("billing", "memory")]:
        with telemetry.diagnostics.resolve_span(task) as resolution:
            resolution.finish(mode=mode, memory="hit", energy=1.0, confidence=None, failure=None)

    assert telemetry.sums("gil.resolutions") == {
        key({"gil.task": "support", "gil.mode": "memory"}): 2,
        key({"gil.task": "support", "gil.mode": "tree"}): 1,
        key({"gil.task": "billing", "gil.mode": "memory"}): 1,
    }


def test_energy_histogram_counts_and_sums_each_resolution_per_task_and_mode(telemetry: Telemetry) -> None:
    for mode, energy in [("tree", 10.0), ("tree", 2.5), ("fallback", 40.0)]:
        with telemetry.diagnostics.resolve_span("support") as resolution:
            resolution.finish(mode=mode, memory="miss", energy=energy, confidence=None, failure=None)

    histograms = telemetry.histograms("gil.resolution.energy")
    assert {key: (point.count, point.sum) for key, point in histograms.items()} == {
        key({"gil.task": "support", "gil.mode": "tree"}): (2, 12.5),
        key({"gil.task": "support", "gil.mode": "fallback"}): (1, 40.0),
    }


def test_duration_histogram_measures_the_block_in_seconds(telemetry: Telemetry) -> None:
    outside_started = time.perf_counter()
    with telemetry.diagnostics.resolve_span("support") as resolution:
        time.sleep(0.01)
        resolution.finish(mode="tree", memory="off", energy=0.0, confidence=None, failure=None)
    outside = time.perf_counter() - outside_started

    (point,) = telemetry.histograms("gil.resolution.duration").values()
    assert point.attributes == {"gil.task": "support", "gil.mode": "tree"}
    assert point.count == 1
    assert 0.01 <= point.sum <= outside


def test_call_span_finish_sets_token_and_energy_attributes_and_records_call_energy(telemetry: Telemetry) -> None:
    with telemetry.diagnostics.call_span(role="judge", model="qwen", node_id="billing", layer=2) as call:
        call.finish(prompt_tokens=120, completion_tokens=1, cached_tokens=100, energy=21.0)
    with telemetry.diagnostics.call_span(role="judge", model="qwen") as call:
        call.finish(prompt_tokens=80, completion_tokens=1, cached_tokens=0, energy=81.0)
    with telemetry.diagnostics.call_span(role="embed", model="minilm") as call:
        call.finish(prompt_tokens=9, completion_tokens=0, cached_tokens=0, energy=9.0)

    first = telemetry.finished("gil.call")[0]
    assert dict(first.attributes or {}) == {
        "gil.role": "judge",
        "gil.model": "qwen",
        "gil.node": "billing",
        "gil.layer": 2,
        "gil.prompt_tokens": 120,
        "gil.completion_tokens": 1,
        "gil.cached_tokens": 100,
        "gil.energy": 21.0,
    }
    histograms = telemetry.histograms("gil.call.energy")
    assert {key: (point.count, point.sum) for key, point in histograms.items()} == {
        key({"gil.role": "judge", "gil.model": "qwen"}): (2, 102.0),
        key({"gil.role": "embed", "gil.model": "minilm"}): (1, 9.0),
    }


def test_call_span_omits_node_and_layer_when_not_given(telemetry: Telemetry) -> None:
    with telemetry.diagnostics.call_span(role="fallback", model="qwen"):
        pass

    (call,) = telemetry.finished("gil.call")
    assert dict(call.attributes or {}) == {"gil.role": "fallback", "gil.model": "qwen"}
    assert telemetry.points("gil.call.energy") == []


def test_call_span_finished_twice_counts_the_call_once_with_the_last_usage(telemetry: Telemetry) -> None:
    with telemetry.diagnostics.call_span(role="judge", model="qwen") as call:
        call.finish(prompt_tokens=1, completion_tokens=1, cached_tokens=0, energy=2.0)
        call.finish(prompt_tokens=5, completion_tokens=1, cached_tokens=0, energy=6.0)

    (point,) = telemetry.histograms("gil.call.energy").values()
    assert (point.count, point.sum) == (1, 6.0)


def test_exception_in_call_span_is_recorded_marked_error_and_reraised(telemetry: Telemetry) -> None:
    with (
        telemetry.diagnostics.resolve_span("support"),
        pytest.raises(Boom),
        telemetry.diagnostics.call_span(role="judge", model="qwen"),
    ):
        raise Boom("connection reset")

    (call,) = telemetry.finished("gil.call")
    assert call.status.status_code is StatusCode.ERROR
    assert call.status.description == "Boom: connection reset"
    assert [event.name for event in call.events] == ["exception"]
    (resolve,) = telemetry.finished("gil.resolve")
    assert resolve.status.status_code is StatusCode.UNSET  # caught inside the block, so not the resolution's error


def test_a_private_call_span_records_its_error_by_type_only(telemetry: Telemetry) -> None:
    echoed = "reply echoed: my card ends " + "42" * 2  # the frames keep source lines: not the text itself
    with pytest.raises(Boom), telemetry.diagnostics.call_span(role="judge", model="qwen", private=True):
        raise Boom(echoed)

    (call,) = telemetry.finished("gil.call")
    assert call.status.status_code is StatusCode.ERROR and call.status.description == "Boom"
    (event,) = call.events
    assert "4242" not in str(dict(event.attributes or {})) and str(event.attributes["exception.type"]).endswith("Boom")


async def test_concurrent_async_resolutions_nest_calls_under_their_own_resolve_span(telemetry: Telemetry) -> None:
    both_open = asyncio.Barrier(2)

    async def resolve(task: str) -> None:
        with telemetry.diagnostics.resolve_span(task) as resolution:
            await both_open.wait()  # both resolve spans are open before any call starts
            for layer in range(3):
                with telemetry.diagnostics.call_span(role="judge", model=task, layer=layer):
                    await asyncio.sleep(0)  # hand over to the other task mid-call
            resolution.finish(mode="tree", memory="miss", energy=3.0, confidence=None, failure=None)

    await asyncio.gather(resolve("support"), resolve("billing"))

    resolves = {(span.attributes or {})["gil.task"]: span for span in telemetry.finished("gil.resolve")}
    assert set(resolves) == {"support", "billing"}
    calls = telemetry.finished("gil.call")
    assert len(calls) == 6
    for call in calls:
        owner = resolves[(call.attributes or {})["gil.model"]]
        assert call.parent is not None
        assert call.parent.span_id == owner.context.span_id
        assert call.context.trace_id == owner.context.trace_id
    assert resolves["support"].context.trace_id != resolves["billing"].context.trace_id


def test_default_diagnostics_is_created_once_and_works_without_an_sdk() -> None:
    """No provider is set globally here, so the API's no-op spans and instruments take the calls."""
    diagnostics = default_diagnostics()
    assert default_diagnostics() is diagnostics
    with diagnostics.resolve_span("support") as resolution, diagnostics.call_span(role="judge", model="qwen") as call:
        call.finish(prompt_tokens=1, completion_tokens=1, cached_tokens=0, energy=2.0)
        resolution.finish(mode="tree", memory="off", energy=2.0, confidence=None, failure=None)


def test_diagnostics_imports_the_opentelemetry_api_only_never_the_sdk() -> None:
    source = Path(gil_core.diagnostics.__file__).read_text(encoding="utf-8")
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert not any(name.startswith("opentelemetry.sdk") for name in imported)
    assert "opentelemetry" in imported or any(name.startswith("opentelemetry.") for name in imported)


def test_without_a_tracer_provider_no_span_is_opened_and_the_metrics_still_count() -> None:
    """No tracer provider (given or global): the resolution's handle holds the API's non-recording span, the
    current span is left as it was, and the metrics count each resolution and call as with spans."""
    from opentelemetry import trace

    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(Diagnostics(meter_provider=meter_provider), InMemorySpanExporter(), reader)
    before = trace.get_current_span()
    with telemetry.diagnostics.resolve_span("support") as resolution:
        assert not resolution.span.is_recording() and trace.get_current_span() is before
        with telemetry.diagnostics.call_span(role="judge", model="qwen") as call:
            call.finish(prompt_tokens=1, completion_tokens=1, cached_tokens=0, energy=2.0)
        resolution.finish(mode="tree", memory="off", energy=2.0, confidence=None, failure=None)
    with pytest.raises(Boom), telemetry.diagnostics.resolve_span("support"):
        raise Boom("no")
    assert telemetry.sums("gil.resolutions") == {
        (("gil.mode", "error"), ("gil.task", "support")): 1,
        (("gil.mode", "tree"), ("gil.task", "support")): 1,
    }
    assert telemetry.histograms("gil.call.energy")[(("gil.model", "qwen"), ("gil.role", "judge"))].sum == 2.0
    meter_provider.shutdown()


def test_a_global_tracer_provider_set_after_first_use_gets_the_spans() -> None:
    """Spans are opened once a global provider is installed, even after gil's diagnostics were created (run in a
    fresh interpreter: the global provider can be set once per process)."""
    import subprocess
    import sys

    script = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from gil_core.diagnostics import default_diagnostics

diagnostics = default_diagnostics()
with diagnostics.resolve_span("before"):
    pass
spans = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)
with diagnostics.resolve_span("after"), diagnostics.call_span(role="judge", model="qwen"):
    pass
print(sorted((span.name, dict(span.attributes).get("gil.task", "")) for span in spans.get_finished_spans()))
"""
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert finished.stdout.strip() == "[('gil.call', ''), ('gil.resolve', 'after')]"
