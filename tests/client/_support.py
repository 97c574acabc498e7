"""Helpers shared by the client and judgment tests: a clock that moves only when told, a sink that keeps calls,
and an embedder that remembers what it embedded."""

from __future__ import annotations

from collections.abc import Sequence

from gil_core.errors import ModelUnavailableError
from gil_core.llm import Embeddings, Message
from gil_core.telemetry.records import CallRecord
from gil_core.testing import HashEmbeddingModel


class ListSink:
    """Keeps recorded calls in memory."""

    def __init__(self) -> None:
        self.calls: list[CallRecord] = []

    def record_calls(self, calls: Sequence[CallRecord]) -> None:
        self.calls.extend(calls)


def user(text: str) -> list[Message]:
    """One user message."""
    return [{"role": "user", "content": text}]


class CountingEmbedder(HashEmbeddingModel):
    """``HashEmbeddingModel`` remembering the texts of every call; with ``fails``, every call fails."""

    def __init__(self, *, fails: bool = False) -> None:
        super().__init__()
        self.calls: list[list[str]] = []
        self.fails = fails

    async def embed(self, texts: Sequence[str]) -> Embeddings:
        self.calls.append(list(texts))
        if self.fails:
            raise ModelUnavailableError("embedder down", endpoint="test://embedder")
        return await super().embed(texts)
