"""Records and prices every model call without the caller assembling rows.

``CallRecorder`` wraps any ``ChatModel`` (or ``EmbeddingModel``) and keeps the port's signature, so nothing
above it knows it is there. What a call is *for* (role, node, layer, candidates) travels in a ``call_scope``
context; a judge annotates the scope with what it read from the reply (distribution, label mass, outcome),
and when the scope closes its calls go to the sink, complete.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from gil_core.diagnostics import CallSpan, Diagnostics, default_diagnostics
from gil_core.llm.options import current_call_options
from gil_core.llm.ports import ChatModel, Completion, EmbeddingModel, Embeddings, Message, Usage
from gil_core.telemetry.energy import EnergyModel
from gil_core.telemetry.records import CallRecord, CallRole, CallSink, CandidateShown, utc_now

__all__ = ["CallRecorder", "CallScope", "EmbeddingRecorder", "call_scope", "current_trace_id", "trace_scope"]

_SCOPE: ContextVar[CallScope | None] = ContextVar("gil_call_scope", default=None)
_TRACE: ContextVar[_TraceContext | None] = ContextVar("gil_trace", default=None)
# One encoder for every raw response (json.dumps with options builds one per call); the same text as
# ``json.dumps(raw, ensure_ascii=False)``.
_RAW_ENCODER = json.JSONEncoder(ensure_ascii=False)

# Call ids: 128 random bits from a generator of the recorder's own, seeded from the OS and again in a forked child.
# Unique as uuid4's are, without the system call (and the GIL handed away) that ``uuid.uuid4`` makes per call;
# nobody can seed it (``random.seed`` does not reach it). Ids are names, not secrets.
_IDS = random.Random()
os.register_at_fork(after_in_child=_IDS.seed)


def _new_call_id() -> str:
    return f"{_IDS.getrandbits(128):032x}"


@dataclass(frozen=True, slots=True)
class _TraceContext:
    trace_id: str
    collected: list[CallRecord] | None


def _deliver(records: list[CallRecord], sink: CallSink) -> None:
    """Send finished records to the sink, or to the enclosing trace's collection when it collects them."""
    context = _TRACE.get()
    if context is not None and context.collected is not None:
        context.collected.extend(records)
    else:
        sink.record_calls(records)


@dataclass
class CallScope:
    """What the calls made inside one ``call_scope`` are for, and what they cost so far."""

    role: CallRole
    node_id: str | None = None
    layer: int | None = None
    candidates: Sequence[CandidateShown] = ()
    annotations: dict[str, Any] = field(default_factory=dict)
    # Each call's fields, not yet a record: the annotations come after the call, and a record is built once.
    _pending: list[tuple[dict[str, Any], CallSink]] = field(default_factory=list)

    @property
    def records(self) -> list[CallRecord]:
        """The calls recorded so far, with the annotations given so far."""
        return [self._annotated(columns) for columns, _ in self._pending]

    def _annotated(self, columns: dict[str, Any]) -> CallRecord:
        return CallRecord(**(columns | self.annotations if self.annotations else columns))

    @property
    def energy(self) -> float:
        """The priced energy of every call made in this scope."""
        return sum(float(columns["energy"]) for columns, _ in self._pending)

    def annotate(
        self,
        *,
        distribution: Mapping[str, float] | None = None,
        label_mass: float | None = None,
        confidence: float | None = None,
        outcome: str | None = None,
    ) -> None:
        """Attach what the caller read from the reply to every call of this scope."""
        given = {"distribution": distribution, "label_mass": label_mass, "confidence": confidence}
        self.annotations.update({key: value for key, value in given.items() if value is not None})
        if outcome is not None:
            self.annotations["outcome"] = outcome

    def _flush(self) -> None:
        if not self._pending:
            return
        by_sink: dict[int, tuple[CallSink, list[CallRecord]]] = {}
        for columns, sink in self._pending:
            by_sink.setdefault(id(sink), (sink, []))[1].append(self._annotated(columns))
        for sink, records in by_sink.values():
            _deliver(records, sink)


def call_scope(
    role: CallRole,
    *,
    node_id: str | None = None,
    layer: int | None = None,
    candidates: Sequence[CandidateShown] = (),
) -> AbstractContextManager[CallScope]:
    """Calls made through a recorder inside this block are recorded with this role, node and layer; they
    reach the sink when the block ends (even when it raises, so a paid call is never lost)."""
    return _InCallScope(CallScope(role=role, node_id=node_id, layer=layer, candidates=tuple(candidates)))


def trace_scope(trace_id: str, *, collect: list[CallRecord] | None = None) -> AbstractContextManager[str]:
    """Calls recorded inside this block carry ``trace_id``. With ``collect``, finished calls are appended to
    that list instead of going to their sinks, so the caller can store them together with the trace."""
    return _InTraceScope(_TraceContext(trace_id, collect))


# Both blocks are entered several times per request: plain context managers, not generators (a third the cost).
class _InCallScope:
    __slots__ = ("_scope", "_token")

    def __init__(self, scope: CallScope) -> None:
        self._scope = scope

    def __enter__(self) -> CallScope:
        self._token = _SCOPE.set(self._scope)
        return self._scope

    def __exit__(self, *_: object) -> None:
        _SCOPE.reset(self._token)
        self._scope._flush()


class _InTraceScope:
    __slots__ = ("_context", "_token")

    def __init__(self, context: _TraceContext) -> None:
        self._context = context

    def __enter__(self) -> str:
        self._token = _TRACE.set(self._context)
        return self._context.trace_id

    def __exit__(self, *_: object) -> None:
        _TRACE.reset(self._token)


def current_trace_id() -> str | None:
    """The trace id set by the innermost ``trace_scope``, if any."""
    context = _TRACE.get()
    return context.trace_id if context is not None else None


class _Recording:
    """What both recorders share: the sink, the price list, and how a call becomes a record."""

    def __init__(
        self, sink: CallSink, energy: EnergyModel, default_role: CallRole, diagnostics: Diagnostics | None
    ) -> None:
        self._sink = sink
        self._energy = energy
        self._default_role = default_role
        self._diagnostics = diagnostics

    def _span(self, scope: CallScope | None, role: CallRole, model: str) -> AbstractContextManager[CallSpan]:
        """A ``gil.call`` span around one call of ``scope`` (the current one); ``_finish`` closes it."""
        diagnostics = self._diagnostics or default_diagnostics()
        private = current_call_options().do_not_record  # an error's message may hold the request
        if scope is None:
            return diagnostics.call_span(role=role, model=model, private=private)
        return diagnostics.call_span(role=role, model=model, node_id=scope.node_id, layer=scope.layer, private=private)

    def _finish(self, span: CallSpan, columns: dict[str, Any], scope: CallScope | None) -> None:
        """Close the call's span with its fields (``_base``) and keep its record."""
        span.finish(
            prompt_tokens=columns["prompt_tokens"],
            completion_tokens=columns["completion_tokens"],
            cached_tokens=columns["cached_tokens"],
            energy=columns["energy"],
        )
        self._keep(columns, scope)

    def _price(self, usage: Usage) -> float:
        return self._energy.price(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)

    def _keep(self, columns: dict[str, Any], scope: CallScope | None) -> None:
        if scope is None:
            _deliver([CallRecord(**columns)], self._sink)
        else:
            scope._pending.append((columns, self._sink))

    def _base(
        self, scope: CallScope | None, model: str, usage: Usage, latency_ms: float, **columns: Any
    ) -> dict[str, Any]:
        """The call's record as the fields of a ``CallRecord``; ``columns`` are the rest of them (content,
        timings, …). The record itself is built once, with its scope's annotations, when it is delivered."""
        return {
            "call_id": _new_call_id(),
            "trace_id": current_trace_id(),
            "created_at": utc_now(),
            "role": scope.role if scope is not None else self._default_role,
            "model": model,
            "node_id": scope.node_id if scope is not None else None,
            "layer": scope.layer if scope is not None else None,
            "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.cached_tokens,
            "completion_tokens": usage.completion_tokens,
            "latency_ms": latency_ms,
            "energy": self._price(usage),
            "candidates": tuple(scope.candidates) if scope is not None else (),
            **columns,
        }


class CallRecorder(_Recording):
    """A ``ChatModel`` that records and prices every call of the model it wraps."""

    def __init__(
        self,
        model: ChatModel,
        *,
        sink: CallSink,
        energy: EnergyModel,
        default_role: CallRole = "probe",
        diagnostics: Diagnostics | None = None,
    ) -> None:
        super().__init__(sink, energy, default_role, diagnostics)
        self._model = model

    @property
    def name(self) -> str:
        return self._model.name

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_logprobs: int = 0,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Completion:
        scope = _SCOPE.get()
        with self._span(scope, scope.role if scope is not None else self._default_role, self._model.name) as span:
            completion = await self._model.complete(
                messages,
                max_tokens=max_tokens,
                temperature=temperature,
                top_logprobs=top_logprobs,
                extra_body=extra_body,
            )
            timings = completion.timings
            columns: dict[str, Any] = {
                "gpu_prompt_ms": timings.prompt_ms if timings else None,
                "gpu_predicted_ms": timings.predicted_ms if timings else None,
            }
            if not current_call_options().do_not_record:  # else: counts, timings and price only
                logprobs = completion.top_logprobs
                columns["content"] = completion.content
                columns["first_token"] = logprobs[0].token if logprobs else None
                columns["top_logprobs"] = tuple((item.token, item.logprob) for item in logprobs)
                raw = completion.raw
                columns["raw_response"] = _RAW_ENCODER.encode(raw) if raw is not None else None
            model = completion.model or self._model.name
            self._finish(span, self._base(scope, model, completion.usage, completion.latency_ms, **columns), scope)
        return completion


class EmbeddingRecorder(_Recording):
    """An ``EmbeddingModel`` that records and prices every call (role ``embed``) of the model it wraps."""

    def __init__(
        self,
        model: EmbeddingModel,
        *,
        sink: CallSink,
        energy: EnergyModel,
        diagnostics: Diagnostics | None = None,
    ) -> None:
        super().__init__(sink, energy, "embed", diagnostics)
        self._model = model

    @property
    def name(self) -> str:
        return self._model.name

    async def embed(self, texts: Sequence[str]) -> Embeddings:
        scope = _SCOPE.get()
        with self._span(scope, "embed", self._model.name) as span:
            embeddings = await self._model.embed(texts)
            columns = self._base(scope, embeddings.model or self._model.name, embeddings.usage, embeddings.latency_ms)
            self._finish(span, columns | {"role": "embed"}, scope)
        return embeddings
