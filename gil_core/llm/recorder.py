"""Records and prices every model call without the caller assembling rows.

``CallRecorder`` wraps any ``ChatModel`` (or ``EmbeddingModel``) and keeps the port's signature, so nothing
above it knows it is there. What a call is *for* (role, node, layer, candidates) travels in a ``call_scope``
context; a judge annotates the scope with what it read from the reply (distribution, label mass, outcome),
and when the scope closes its calls go to the sink, complete.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from gil_core.llm.ports import ChatModel, Completion, EmbeddingModel, Embeddings, Message, Usage
from gil_core.telemetry.energy import EnergyModel
from gil_core.telemetry.records import CallRecord, CallRole, CallSink, CandidateShown, utc_now

__all__ = ["CallRecorder", "CallScope", "EmbeddingRecorder", "call_scope", "current_trace_id", "trace_scope"]

_SCOPE: ContextVar[CallScope | None] = ContextVar("gil_call_scope", default=None)
_TRACE: ContextVar[str | None] = ContextVar("gil_trace_id", default=None)


@dataclass
class CallScope:
    """What the calls made inside one ``call_scope`` are for, and what they cost so far."""

    role: CallRole
    node_id: str | None = None
    layer: int | None = None
    candidates: Sequence[CandidateShown] = ()
    annotations: dict[str, Any] = field(default_factory=dict)
    _pending: list[tuple[CallRecord, CallSink]] = field(default_factory=list)

    @property
    def records(self) -> list[CallRecord]:
        """The calls recorded so far, with the annotations given so far."""
        return [replace(record, **self.annotations) for record, _ in self._pending]

    @property
    def energy(self) -> float:
        """The priced energy of every call made in this scope."""
        return sum(record.energy for record, _ in self._pending)

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
        by_sink: dict[int, tuple[CallSink, list[CallRecord]]] = {}
        for record, sink in self._pending:
            by_sink.setdefault(id(sink), (sink, []))[1].append(replace(record, **self.annotations))
        for sink, records in by_sink.values():
            sink.record_calls(records)


@contextmanager
def call_scope(
    role: CallRole,
    *,
    node_id: str | None = None,
    layer: int | None = None,
    candidates: Sequence[CandidateShown] = (),
) -> Iterator[CallScope]:
    """Calls made through a recorder inside this block are recorded with this role, node and layer; they
    reach the sink when the block ends (even when it raises, so a paid call is never lost)."""
    scope = CallScope(role=role, node_id=node_id, layer=layer, candidates=tuple(candidates))
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)
        scope._flush()


@contextmanager
def trace_scope(trace_id: str) -> Iterator[str]:
    """Calls recorded inside this block carry ``trace_id``."""
    token = _TRACE.set(trace_id)
    try:
        yield trace_id
    finally:
        _TRACE.reset(token)


def current_trace_id() -> str | None:
    """The trace id set by the innermost ``trace_scope``, if any."""
    return _TRACE.get()


class _Recording:
    """What both recorders share: the sink, the price list, and how a call becomes a record."""

    def __init__(self, sink: CallSink, energy: EnergyModel, default_role: CallRole) -> None:
        self._sink = sink
        self._energy = energy
        self._default_role = default_role

    def _price(self, usage: Usage) -> float:
        return self._energy.price(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)

    def _keep(self, record: CallRecord, scope: CallScope | None) -> None:
        if scope is None:
            self._sink.record_calls([record])
        else:
            scope._pending.append((record, self._sink))

    def _base(self, scope: CallScope | None, model: str, usage: Usage, latency_ms: float) -> CallRecord:
        return CallRecord(
            call_id=uuid.uuid4().hex,
            trace_id=_TRACE.get(),
            created_at=utc_now(),
            role=scope.role if scope is not None else self._default_role,
            model=model,
            node_id=scope.node_id if scope is not None else None,
            layer=scope.layer if scope is not None else None,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            latency_ms=latency_ms,
            energy=self._price(usage),
            candidates=tuple(scope.candidates) if scope is not None else (),
        )


class CallRecorder(_Recording):
    """A ``ChatModel`` that records and prices every call of the model it wraps."""

    def __init__(
        self,
        model: ChatModel,
        *,
        sink: CallSink,
        energy: EnergyModel,
        default_role: CallRole = "probe",
    ) -> None:
        super().__init__(sink, energy, default_role)
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
        completion = await self._model.complete(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            top_logprobs=top_logprobs,
            extra_body=extra_body,
        )
        scope = _SCOPE.get()
        record = self._base(scope, completion.model or self._model.name, completion.usage, completion.latency_ms)
        first_token = completion.top_logprobs[0].token if completion.top_logprobs else None
        record = replace(
            record,
            gpu_prompt_ms=completion.timings.prompt_ms if completion.timings else None,
            gpu_predicted_ms=completion.timings.predicted_ms if completion.timings else None,
            content=completion.content,
            first_token=first_token,
            top_logprobs=tuple((item.token, item.logprob) for item in completion.top_logprobs),
            raw_response=json.dumps(completion.raw, ensure_ascii=False) if completion.raw is not None else None,
        )
        self._keep(record, scope)
        return completion


class EmbeddingRecorder(_Recording):
    """An ``EmbeddingModel`` that records and prices every call (role ``embed``) of the model it wraps."""

    def __init__(self, model: EmbeddingModel, *, sink: CallSink, energy: EnergyModel) -> None:
        super().__init__(sink, energy, "embed")
        self._model = model

    @property
    def name(self) -> str:
        return self._model.name

    async def embed(self, texts: Sequence[str]) -> Embeddings:
        embeddings = await self._model.embed(texts)
        scope = _SCOPE.get()
        record = self._base(scope, embeddings.model or self._model.name, embeddings.usage, embeddings.latency_ms)
        self._keep(replace(record, role="embed"), scope)
        return embeddings
