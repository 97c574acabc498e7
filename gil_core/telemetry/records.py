"""What the sink records: one ``CallRecord`` per model call and one ``TraceRecord`` per request.

Callers build these value objects; only the store turns them into table rows (JSON columns, timestamps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
    "CallRecord",
    "CallRole",
    "CallSink",
    "CandidateShown",
    "TraceRecord",
    "TraceSink",
    "utc_now",
]

CallRole = Literal["embed", "judge", "fallback", "slot_fill", "baseline", "probe", "verify"]


def utc_now() -> datetime:
    """The current time, timezone-aware UTC (the store writes microseconds)."""
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class CandidateShown:
    """One line of a judge prompt: the candidate id (None for "none of these") and the label it was shown as."""

    id: str | None
    shown_as: str
    label: str = ""
    description: str = ""
    answer: str | None = None


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One model call, priced. ``top_logprobs`` keeps the server's order; ``None`` logprob means −∞."""

    call_id: str
    trace_id: str | None
    created_at: datetime
    role: CallRole
    model: str
    node_id: str | None = None
    layer: int | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    gpu_prompt_ms: float | None = None
    gpu_predicted_ms: float | None = None
    content: str | None = None
    first_token: str | None = None
    top_logprobs: Sequence[tuple[str, float | None]] = ()
    distribution: Mapping[str, float] | None = None
    label_mass: float | None = None
    confidence: float | None = None
    outcome: str | None = None
    energy: float = 0.0
    raw_response: str | None = None
    candidates: Sequence[CandidateShown] = ()


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One resolved request. ``path`` and ``recall`` are JSON-ready mappings (snake_case keys)."""

    trace_id: str
    created_at: datetime
    task: str
    state: str
    mode: str
    path: Sequence[Mapping[str, Any]] = ()
    output: str | None = None
    confidence: float | None = None
    energy: float = 0.0
    feedback_verdict: str | None = None
    feedback_correction: str | None = None
    implicit_signal: str | None = None
    label: str | None = None
    explored_output: str | None = None
    recall: Mapping[str, Any] | None = None
    failure: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class CallSink(Protocol):
    """Where the call recorder sends each finished call."""

    def record_calls(self, calls: Sequence[CallRecord]) -> None:
        """Persist ``calls``. Returning means durable, except inside a group commit (``TelemetryStore.group_commit``),
        where it means queued: durable at the group's next flush."""
        ...


@runtime_checkable
class TraceSink(CallSink, Protocol):
    """A sink that also records traces."""

    def record_trace(self, trace: TraceRecord, calls: Sequence[CallRecord] = ()) -> Any:
        """Persist a trace together with its calls: durable on return, or queued for the next flush inside a group
        commit."""
        ...
