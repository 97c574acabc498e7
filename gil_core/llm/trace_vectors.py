"""One embedding per request: vectors of texts embedded inside a trace are kept for that trace.

Memory's lookup and the learned judge both need the request's vector; wrapped around the recorded embedder,
``TraceVectorCache`` answers the second ask from the first call, so a request costs one embedding call (a kept
vector is no model call: neither recorded nor priced). Entries are keyed by the trace id, so no request, task or
tenant ever reads another's; outside a trace nothing is kept. The resolver reads the request's vector back
(``vector``) to store it with the trace.
"""

from __future__ import annotations

from collections.abc import Sequence

from cachetools import LRUCache

from gil_core.errors import BadResponseError
from gil_core.llm.ports import EmbeddingModel, Embeddings, Usage
from gil_core.llm.recorder import current_trace_id

__all__ = ["TraceVectorCache"]


class TraceVectorCache:
    """An ``EmbeddingModel`` keeping, per trace, the vectors of the texts embedded in it (the latest
    ``traces`` traces)."""

    def __init__(self, model: EmbeddingModel, *, traces: int = 512) -> None:
        self._model = model
        self._kept: LRUCache[str, dict[str, tuple[float, ...]]] = LRUCache(traces)

    @property
    def name(self) -> str:
        return self._model.name

    @property
    def inner(self) -> EmbeddingModel:
        return self._model

    async def embed(self, texts: Sequence[str]) -> Embeddings:
        trace = current_trace_id()
        if trace is None:
            return await self._model.embed(texts)
        kept = self._kept.get(trace)
        if kept is None:
            kept = self._kept[trace] = {}
        missing = [text for text in dict.fromkeys(texts) if text not in kept]
        usage, model, latency = Usage(), self._model.name, 0.0
        if missing:
            fresh = await self._model.embed(missing)
            if len(fresh.vectors) != len(missing):
                raise BadResponseError(f"{len(fresh.vectors)} vectors for {len(missing)} texts", endpoint=self.name)
            kept.update(zip(missing, fresh.vectors, strict=True))
            usage, model, latency = fresh.usage, fresh.model or model, fresh.latency_ms
        return Embeddings(tuple(kept[text] for text in texts), usage=usage, model=model, latency_ms=latency)

    def vector(self, trace_id: str, text: str) -> tuple[float, ...] | None:
        """The vector ``text`` was given inside trace ``trace_id``, if it was embedded there."""
        kept = self._kept.get(trace_id)
        return kept.get(text) if kept is not None else None
