"""Texts as the float32 vectors a LanceDB memory stores and searches with: embedded through its ``EmbeddingModel``,
checked (one finite vector per text, as wide as the table's), query vectors kept in a small LRU."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np
from cachetools import LRUCache
from numpy.typing import NDArray

from gil_core.errors import MemoryUnavailableError
from gil_core.llm.ports import EmbeddingModel

__all__ = ["MemoryEmbedder"]

_EMBED_BATCH = 128  # texts per embedding request when rebuilding; endpoints cap the batch size
_Vectors = NDArray[np.float32]


class _QueryVectors:
    """A small LRU of query vectors by (task, text), so ``remember`` right after ``lookup`` embeds nothing."""

    def __init__(self, size: int) -> None:
        self._items: LRUCache[tuple[str, str], _Vectors] = LRUCache(max(0, size))
        self._lock = threading.Lock()  # one memory may serve several event loops' threads; cachetools is not safe

    def get(self, task: str, text: str) -> _Vectors | None:
        with self._lock:
            return self._items.get((task, text))

    def put(self, task: str, text: str, vector: _Vectors) -> None:
        if self._items.maxsize == 0:
            return  # a size of 0 keeps nothing (LRUCache would raise)
        with self._lock:
            self._items[(task, text)] = vector


class MemoryEmbedder:
    """``embedder`` for a memory on the table ``table``, keeping ``query_cache_size`` query vectors. ``dimensions``
    is the width the table holds (None until it is known): every vector embedded must have it."""

    def __init__(
        self, embedder: EmbeddingModel, query_cache_size: int, *, table: str, dimensions: Callable[[], int | None]
    ) -> None:
        self._embedder = embedder
        self._query_vectors = _QueryVectors(query_cache_size)
        self._table_name = table
        self._dimensions = dimensions

    def cached(self, task: str, text: str) -> _Vectors | None:
        """The query vector of ``text`` for ``task`` when it is kept, without embedding it."""
        return self._query_vectors.get(task, text)

    async def query_vector(self, task: str, text: str) -> _Vectors:
        vector = self._query_vectors.get(task, text)
        if vector is None:
            vector = (await self._embed(task, [text]))[0]
            self._query_vectors.put(task, text, vector)
        return vector

    async def vectors(self, task: str, texts: Sequence[str]) -> _Vectors:
        """Vectors of ``texts`` in order: the kept query vectors (a text remembered right after its lookup embeds
        nothing), the others embedded as ``embed_all`` does."""
        kept = {text: vector for text in texts if (vector := self._query_vectors.get(task, text)) is not None}
        missing = [text for text in texts if text not in kept]
        if missing:
            kept.update(zip(missing, await self.embed_all(task, missing), strict=True))
        if not texts:
            return np.zeros((0, self._dimensions() or 0), dtype=np.float32)
        return np.stack([kept[text] for text in texts])

    async def embed_all(self, task: str, texts: Sequence[str]) -> _Vectors:
        """Vectors of ``texts`` in order; each distinct text is embedded once, in batches."""
        distinct = list(dict.fromkeys(texts))
        found: dict[str, _Vectors] = {}
        for start in range(0, len(distinct), _EMBED_BATCH):
            batch = distinct[start : start + _EMBED_BATCH]
            found.update(zip(batch, await self._embed(task, batch), strict=True))
        if not texts:
            return np.zeros((0, self._dimensions() or 0), dtype=np.float32)
        return np.stack([found[text] for text in texts])

    async def _embed(self, task: str, texts: Sequence[str]) -> _Vectors:
        name = self._embedder.name
        try:
            embeddings = await self._embedder.embed(texts)
        except Exception as exc:
            raise MemoryUnavailableError(f"embedder {name!r} failed ({type(exc).__name__}: {exc})", task=task) from exc
        vectors = np.asarray(embeddings.vectors, dtype=np.float64)
        if vectors.ndim != 2 or len(vectors) != len(texts) or vectors.shape[1] == 0:
            shape = "x".join(str(size) for size in vectors.shape)
            raise MemoryUnavailableError(
                f"embedder {name!r} returned {shape} numbers for {len(texts)} texts", task=task
            )
        stored = vectors.astype(np.float32)
        if not np.isfinite(stored).all():
            raise MemoryUnavailableError(
                f"embedder {name!r} returned a vector that is not finite in float32", task=task
            )
        self.check_dimensions(task, stored[0])
        return stored

    def check_dimensions(self, task: str, vector: _Vectors) -> None:
        """Raise ``MemoryUnavailableError`` when ``vector`` is not as wide as the table's vectors."""
        dimensions = self._dimensions()
        if dimensions is not None and len(vector) != dimensions:
            raise MemoryUnavailableError(
                f"embedder {self._embedder.name!r} returns {len(vector)}-dimensional vectors but the table "
                f"{self._table_name!r} holds {dimensions}-dimensional ones",
                task=task,
            )
