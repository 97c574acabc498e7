"""``HashEmbeddingModel``: a deterministic ``EmbeddingModel`` that embeds without a model (hashed character
3-grams), identical in every process."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from gil_core.errors import ConfigurationError
from gil_core.llm.ports import Embeddings, Usage
from gil_core.testing._script import _count_words

__all__ = ["HashEmbeddingModel"]


class HashEmbeddingModel:
    """Deterministic ``EmbeddingModel``: character 3-grams hashed (blake2b) to signed buckets, L2-normalised.

    Texts sharing many 3-grams get a high cosine, unrelated texts a cosine near 0; identical in every process.
    """

    def __init__(self, dimensions: int = 64, *, name: str = "hash-embedding") -> None:
        if dimensions < 1:
            raise ConfigurationError(f"dimensions must be at least 1, got {dimensions}")
        self.dimensions = dimensions
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def embed_text(self, text: str) -> tuple[float, ...]:
        """One text's unit vector (all zeros for a text without characters)."""
        vector = [0.0] * self.dimensions
        padded = f" {' '.join(text.lower().split())} "
        for start in range(len(padded) - 2):
            digest = hashlib.blake2b(padded[start : start + 3].encode(), digest_size=8).digest()
            number = int.from_bytes(digest, "big")
            vector[number % self.dimensions] += 1.0 if number >> 63 else -1.0
        norm = math.sqrt(sum(x * x for x in vector))
        return tuple(x / norm for x in vector) if norm else tuple(vector)

    async def embed(self, texts: Sequence[str]) -> Embeddings:
        """Vectors in order; ``usage.prompt_tokens`` counts words."""
        return Embeddings(
            vectors=tuple(self.embed_text(text) for text in texts),
            usage=Usage(prompt_tokens=_count_words(texts)),
            model=self._name,
        )
