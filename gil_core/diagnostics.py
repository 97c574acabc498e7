"""OpenTelemetry spans and metrics for each resolution and model call, all under the instrumentation name "gil".

Emitted: a ``gil.resolve`` span per request with a ``gil.call`` child span per model call; the counter
``gil.resolutions`` and the histograms ``gil.resolution.energy``, ``gil.resolution.duration`` (by task and mode)
and ``gil.call.energy`` (by role and model). gil_core depends on ``opentelemetry-api`` only, whose providers do
nothing until an application installs an SDK, so all of this costs next to nothing by default. To turn it on,
install ``opentelemetry-sdk`` (and an exporter), then either set the global providers
(``trace.set_tracer_provider``, ``metrics.set_meter_provider``) before or after gil is first used, or pass
providers to ``Diagnostics(tracer_provider=..., meter_provider=...)``.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from opentelemetry import metrics, trace
from opentelemetry.metrics import Counter, Histogram, MeterProvider
from opentelemetry.trace import Span, Status, StatusCode, TracerProvider

from gil_core import __version__

__all__ = [
    "INSTRUMENTATION_NAME",
    "CallSpan",
    "Diagnostics",
    "MemoryOutcome",
    "ResolveSpan",
    "default_diagnostics",
]

INSTRUMENTATION_NAME = "gil"
"""The one tracer and meter name every gil span and instrument is created under."""

MemoryOutcome = Literal["off", "hit", "miss", "failed"]
"""What memory did for one resolution: not consulted, answered, had nothing close enough, or failed."""

# Seconds; the API's default buckets are sized for milliseconds, which would put every resolution in the first few.
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True, slots=True)
class _ResolutionOutcome:
    mode: str
    memory: MemoryOutcome
    energy: float
    confidence: float | None
    failure: str | None


@dataclass(frozen=True, slots=True)
class _CallUsage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    energy: float


class ResolveSpan:
    """The open ``gil.resolve`` span of one request; the resolver reports how it ended through ``finish``."""

    __slots__ = ("_outcome", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        """The underlying OpenTelemetry span, for attributes or events beyond the ones gil sets."""
        self._outcome: _ResolutionOutcome | None = None

    def finish(
        self,
        *,
        mode: str,
        memory: MemoryOutcome,
        energy: float,
        confidence: float | None,
        failure: str | None,
    ) -> None:
        """Report how the resolution ended; written to the span and metrics when the block exits (last call wins).

        A ``failure`` marks the span's status ERROR with the failure as its description.
        """
        self._outcome = _ResolutionOutcome(mode, memory, energy, confidence, failure)


class CallSpan:
    """The open ``gil.call`` span of one model call; the caller reports its usage through ``finish``."""

    __slots__ = ("_usage", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        """The underlying OpenTelemetry span, for attributes or events beyond the ones gil sets."""
        self._usage: _CallUsage | None = None

    def finish(self, *, prompt_tokens: int, completion_tokens: int, cached_tokens: int, energy: float) -> None:
        """Report the call's token counts and priced energy (``CallRecord``'s fields of the same names).

        Written to the span and to ``gil.call.energy`` when the block exits (last call wins), so a call is
        counted once however often this is called.
        """
        self._usage = _CallUsage(prompt_tokens, completion_tokens, cached_tokens, energy)


class Diagnostics:
    """Opens gil's spans and records its metrics through one tracer and one meter named "gil".

    Without providers it uses the global ones, which may be set later: the API's proxies forward to whatever
    provider is installed when a span starts or a value is recorded.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self._tracer = trace.get_tracer(INSTRUMENTATION_NAME, __version__, tracer_provider=tracer_provider)
        self._own_tracer = tracer_provider is not None
        self._idle_tracer = trace.NoOpTracer()
        meter = metrics.get_meter(INSTRUMENTATION_NAME, __version__, meter_provider=meter_provider)
        self._resolutions: Counter = meter.create_counter(
            "gil.resolutions", unit="{resolution}", description="Requests resolved, by task and mode."
        )
        self._resolution_energy: Histogram = meter.create_histogram(
            "gil.resolution.energy", description="Priced energy of all model calls of one resolution."
        )
        self._resolution_duration: Histogram = meter.create_histogram(
            "gil.resolution.duration",
            unit="s",
            description="Wall time of one resolution.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self._call_energy: Histogram = meter.create_histogram(
            "gil.call.energy", description="Priced energy of one model call, by role and model."
        )

    @contextmanager
    def resolve_span(self, task: str, *, private: bool = False) -> Iterator[ResolveSpan]:
        """Open ``gil.resolve`` as the current span, so call spans opened inside the block nest under it.

        On exit the outcome given to ``ResolveSpan.finish`` becomes the span's ``gil.mode``, ``gil.memory``,
        ``gil.energy``, ``gil.confidence`` and ``gil.failure`` attributes (mode "unknown" if ``finish`` was
        never called) and the resolution metrics are recorded. An exception escaping the block is recorded on
        the span, sets status ERROR and mode "error" (metrics included), and propagates. For a ``private``
        (do-not-record) request the exception is recorded by its type only: its message may quote the request.
        """
        if not self._tracing():
            # No tracer provider: the API's span would record nothing. The one it would give is taken as it is
            # (no context to switch), and the metrics are recorded as ever.
            idle = self._idle_tracer.start_span("gil.resolve")
            started = time.perf_counter()
            handle = ResolveSpan(idle)
            try:
                yield handle
            except BaseException:
                self._record_resolution(task, "error", handle._outcome, started)
                raise
            outcome = handle._outcome
            self._record_resolution(task, "unknown" if outcome is None else outcome.mode, outcome, started)
            return
        with self._tracer.start_as_current_span(
            "gil.resolve",
            attributes={"gil.task": task},
            # Recorded below, together with the mode, so the exception appears once.
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            started = time.perf_counter()
            handle = ResolveSpan(span)
            try:
                yield handle
            except BaseException as exc:
                _record_error(span, exc, private=private)
                self._end_resolution(span, task, "error", handle._outcome, started)
                raise
            outcome = handle._outcome
            if outcome is not None and outcome.failure is not None:
                span.set_status(Status(StatusCode.ERROR, outcome.failure))
            self._end_resolution(span, task, "unknown" if outcome is None else outcome.mode, outcome, started)

    @contextmanager
    def call_span(
        self, *, role: str, model: str, node_id: str | None = None, layer: int | None = None, private: bool = False
    ) -> Iterator[CallSpan]:
        """Open ``gil.call`` as a child of the current span (normally a ``gil.resolve``) for one model call.

        On exit the usage given to ``CallSpan.finish`` becomes the span's token and energy attributes and is
        recorded in ``gil.call.energy``. An exception escaping the block is recorded on the span (by its type
        only for a ``private`` call: a do-not-record one, whose message may hold the request), sets status ERROR,
        and propagates.
        """
        if not self._tracing():
            handle = CallSpan(self._idle_tracer.start_span("gil.call"))
            try:
                yield handle
            finally:
                if handle._usage is not None:
                    self._call_energy.record(handle._usage.energy, {"gil.role": role, "gil.model": model})
            return
        attributes: dict[str, str | int] = {"gil.role": role, "gil.model": model}
        if node_id is not None:
            attributes["gil.node"] = node_id
        if layer is not None:
            attributes["gil.layer"] = layer
        with self._tracer.start_as_current_span(
            "gil.call", attributes=attributes, record_exception=False, set_status_on_exception=False
        ) as span:
            handle = CallSpan(span)
            try:
                yield handle
            except BaseException as exc:
                _record_error(span, exc, private=private)
                raise
            finally:
                usage = handle._usage
                if usage is not None:
                    span.set_attributes(
                        {
                            "gil.prompt_tokens": usage.prompt_tokens,
                            "gil.completion_tokens": usage.completion_tokens,
                            "gil.cached_tokens": usage.cached_tokens,
                            "gil.energy": usage.energy,
                        }
                    )
                    self._call_energy.record(usage.energy, {"gil.role": role, "gil.model": model})

    def _tracing(self) -> bool:
        """Whether a span could record anything: a provider was given, or one is installed globally (now: it may
        be set after gil is first used)."""
        return self._own_tracer or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)

    def _end_resolution(
        self, span: Span, task: str, mode: str, outcome: _ResolutionOutcome | None, started: float
    ) -> None:
        span.set_attribute("gil.mode", mode)
        if outcome is not None:
            span.set_attributes({"gil.memory": outcome.memory, "gil.energy": outcome.energy})
            if outcome.confidence is not None:
                span.set_attribute("gil.confidence", outcome.confidence)
            if outcome.failure is not None:
                span.set_attribute("gil.failure", outcome.failure)
        self._record_resolution(task, mode, outcome, started)

    def _record_resolution(self, task: str, mode: str, outcome: _ResolutionOutcome | None, started: float) -> None:
        energy = outcome.energy if outcome is not None else 0.0
        labels = {"gil.task": task, "gil.mode": mode}
        self._resolutions.add(1, labels)
        self._resolution_energy.record(energy, labels)
        self._resolution_duration.record(time.perf_counter() - started, labels)


def _record_error(span: Span, error: BaseException, *, private: bool) -> None:
    """The exception as a span event and the status ERROR. For a do-not-record request or call only its type: the
    message, and the traceback's last lines (which repeat it and its causes'), may quote the request."""
    kind = type(error).__name__
    if not private:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{kind}: {error}"))
        return
    withheld = "(not recorded: the request is not to be recorded)"
    frames = "".join(traceback.format_tb(error.__traceback__))
    span.record_exception(error, {"exception.message": withheld, "exception.stacktrace": frames})
    span.set_status(Status(StatusCode.ERROR, kind))


_default: Diagnostics | None = None
_default_lock = threading.Lock()


def default_diagnostics() -> Diagnostics:
    """The process-wide ``Diagnostics`` on the global providers, created on first use (nothing at import time)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Diagnostics()
    return _default
