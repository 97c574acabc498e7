"""What every operation log shares: embedding entries as they come, statistics, and recall.

Recall: without an embedder, by word overlap — the words of three or more characters (case-folded) of the
query found in the entry's intent, input and output, as a share of the query's words; an entry sharing no word
is no result. With an embedder, by cosine between the query's and the entry's vectors (only positive cosines
count); an entry whose embedding failed when it was recorded falls back to its word score, and so do all
entries when the query cannot be embedded. Ties go to the newer entry.

Every read takes a ``task``: then only the entries recorded for exactly that task count (tenants sharing a log
never read each other's calls; an entry written before entries carried their task belongs to none).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import replace

from gil_core.client.oplog.ports import OperationEntry, OperationStats, RecalledOperation
from gil_core.errors import ConfigurationError
from gil_core.llm.ports import EmbeddingModel

_log = logging.getLogger("gil_core.client.oplog")

_WORD = re.compile(r"\w{3,}")


def words(text: str) -> set[str]:
    """The distinct words of three or more characters, case-folded."""
    return set(_WORD.findall(text.casefold()))


def document(entry: OperationEntry) -> str:
    """The text an entry is recalled by."""
    return "\n".join(part for part in (entry.intent or "", entry.input_preview, entry.output) if part)


def of_task(entries: Sequence[OperationEntry], task: str | None) -> Sequence[OperationEntry]:
    """``entries`` recorded for ``task`` (all of them when None)."""
    return entries if task is None else tuple(entry for entry in entries if entry.task == task)


def cosine(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The cosine of two vectors; None when they cannot be compared (other length, or a zero vector)."""
    if len(a) != len(b):
        return None
    norms = math.sqrt(math.fsum(x * x for x in a) * math.fsum(y * y for y in b))
    return math.fsum(x * y for x, y in zip(a, b, strict=True)) / norms if norms else None


class OperationLogBase:
    """Shared behaviour; an adapter implements ``_keep`` (store one entry) and ``entries``."""

    def __init__(self, embedder: EmbeddingModel | None) -> None:
        self._embedder = embedder

    def entries(self, task: str | None = None) -> Sequence[OperationEntry]:  # pragma: no cover - overridden
        raise NotImplementedError

    def _keep(self, entry: OperationEntry) -> None:  # pragma: no cover - every adapter overrides it
        raise NotImplementedError

    async def record(self, entry: OperationEntry) -> None:
        if self._embedder is not None and entry.embedding is None:
            entry = replace(entry, embedding=await self._embed(document(entry)))
        self._keep(entry)

    def stats(self, task: str | None = None) -> OperationStats:
        entries = self.entries(task)
        successes = sum(entry.success for entry in entries)
        times = [entry.created_at for entry in entries]
        return OperationStats(
            entries=len(entries),
            successes=successes,
            success_rate=successes / len(entries) if entries else None,
            prompt_tokens=sum(entry.prompt_tokens for entry in entries),
            completion_tokens=sum(entry.completion_tokens for entry in entries),
            oldest=min(times, default=None),
            newest=max(times, default=None),
        )

    async def recall(self, query: str, k: int = 5, *, task: str | None = None) -> list[RecalledOperation]:
        if k < 1:
            raise ConfigurationError(f"recall needs k >= 1, got {k}")
        query_words = words(query)
        query_vector = await self._embed(query) if self._embedder is not None else None
        found: list[tuple[float, int, RecalledOperation]] = []
        for index, entry in enumerate(self.entries(task)):
            similarity = cosine(query_vector, entry.embedding) if query_vector and entry.embedding else None
            if similarity is not None:
                if similarity > 0:
                    found.append((similarity, index, RecalledOperation(entry, similarity, "embedding")))
                continue
            shared = len(query_words & words(document(entry)))
            if shared:
                score = shared / len(query_words)
                found.append((score, index, RecalledOperation(entry, score, "words")))
        found.sort(key=lambda item: (-item[0], -item[1]))
        return [recalled for _, _, recalled in found[:k]]

    async def _embed(self, text: str) -> tuple[float, ...] | None:
        """``text``'s vector, or None (with a warning) when the embedder fails: recall then uses words."""
        assert self._embedder is not None
        try:
            (vector,) = (await self._embedder.embed([text])).vectors
        except Exception:  # any embedder's failure: recording must never fail, recall falls back to words
            _log.warning("operation log: embedding failed; words stand in for it", exc_info=True)
            return None
        return tuple(vector)
