"""The two model ports Gil calls, and the value objects they return."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypedDict, runtime_checkable

__all__ = [
    "ChatModel",
    "Completion",
    "EmbeddingModel",
    "Embeddings",
    "Message",
    "ServerTimings",
    "TokenLogprob",
    "Usage",
]


class Message(TypedDict):
    """One chat message in the OpenAI layout."""

    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One alternative for the first generated token. ``logprob`` is None where the server sent null (−∞)."""

    token: str
    logprob: float | None


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts as the server reported them; ``cached_tokens`` are prompt tokens served from its cache."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ServerTimings:
    """llama.cpp's ``timings``: milliseconds the server spent on the prompt and on the predicted tokens."""

    prompt_ms: float
    predicted_ms: float


@dataclass(frozen=True, slots=True)
class Completion:
    """A chat model's answer: content, the first token's top logprobs, usage and, when sent, server timings."""

    content: str
    top_logprobs: tuple[TokenLogprob, ...] = ()
    usage: Usage = field(default_factory=Usage)
    timings: ServerTimings | None = None
    model: str = ""
    finish_reason: str | None = None
    latency_ms: float = 0.0
    raw: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Embeddings:
    """Vectors in the order of the texts given, and the usage of the call."""

    vectors: tuple[tuple[float, ...], ...]
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    latency_ms: float = 0.0


@runtime_checkable
class ChatModel(Protocol):
    """Anything that completes a chat. Adapters translate their provider's errors into ``ModelError``."""

    @property
    def name(self) -> str:
        """The model name recorded with each call."""
        ...

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_logprobs: int = 0,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Completion:
        """Complete ``messages``; ``top_logprobs`` > 0 asks for the first token's alternatives."""
        ...


@runtime_checkable
class EmbeddingModel(Protocol):
    """Anything that turns texts into vectors."""

    @property
    def name(self) -> str:
        """The model name recorded with each call."""
        ...

    async def embed(self, texts: Sequence[str]) -> Embeddings:
        """Embed ``texts`` in order."""
        ...
