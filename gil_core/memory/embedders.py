"""Any embedding function as an ``EmbeddingModel``, e.g. a sentence-transformers model's ``encode``.

The function runs in a worker thread so it does not block the event loop. Wrapped in ``EmbeddingRecorder``, its
calls are recorded like those of any other embedding model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gil_core.errors import BadResponseError, GilError, ModelUnavailableError
from gil_core.llm.ports import Embeddings, Usage

__all__ = ["CallableEmbeddingModel", "EmbeddingFunction"]

EmbeddingFunction = Callable[[list[str]], Sequence[Sequence[float]] | NDArray[Any]]
"""Texts in, one vector per text out: nested sequences, or an n × d array (sentence-transformers' ``encode``)."""


class CallableEmbeddingModel:
    """``EmbeddingModel`` calling ``fn(texts)``, which returns one vector per text (lists or an n × d array).

    ``usage.prompt_tokens`` counts words, as a stand-in for the tokens a local model does not report. A failure
    of ``fn`` becomes ``ModelUnavailableError`` with endpoint ``callable:{name}``; a reply of the wrong shape
    becomes ``BadResponseError``.
    """

    def __init__(self, fn: EmbeddingFunction, *, name: str) -> None:
        self._fn = fn
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def endpoint(self) -> str:
        """How errors name this model: ``callable:{name}``."""
        return f"callable:{self._name}"

    def __repr__(self) -> str:
        return f"CallableEmbeddingModel({self._fn!r}, name={self._name!r})"

    async def embed(self, texts: Sequence[str]) -> Embeddings:
        """Vectors in the order of ``texts``; no call for no texts."""
        if not texts:
            return Embeddings(vectors=(), model=self._name)
        batch = list(texts)
        started = time.perf_counter()
        try:
            reply = await asyncio.to_thread(self._fn, batch)
        except GilError:
            raise
        except Exception as exc:
            raise ModelUnavailableError(
                f"the embedding function raised {type(exc).__name__}: {exc}", endpoint=self.endpoint
            ) from exc
        latency_ms = (time.perf_counter() - started) * 1000.0
        try:
            vectors = np.asarray(reply, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise BadResponseError(
                f"the embedding function returned no numeric matrix ({exc})", endpoint=self.endpoint
            ) from exc
        if vectors.ndim != 2 or len(vectors) != len(batch):
            shape = "x".join(str(size) for size in vectors.shape)
            raise BadResponseError(
                f"the embedding function returned a {shape} array for {len(batch)} texts", endpoint=self.endpoint
            )
        return Embeddings(
            vectors=tuple(tuple(row) for row in vectors.tolist()),
            usage=Usage(prompt_tokens=sum(len(text.split()) for text in batch)),
            model=self._name,
            latency_ms=latency_ms,
        )
