"""Per-entry evidence: how the hits a remembered entry served were judged, and the similarity it may serve at.

An entry whose served hits keep being confirmed has earned trust: it may answer at a lower similarity than the
task's ``memory_accept`` without a verification. How much lower is bounded by the Wilson lower bound ``L`` on its
precision (confirmed / judged hits, 95%): its threshold is ``accept − (accept − verify) · L``, so an entry
with no evidence stays at ``accept`` and none ever goes below ``verify``. An entry whose hit is judged wrong is
forgotten by the resolver, so its evidence no longer matters.

The evidence is read off the log (memory-mode traces with a verdict, by their recall source) and kept current
as verdicts arrive; a later verdict on the same trace replaces the earlier one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import polars as pl

from gil_core.errors import ConfigurationError
from gil_core.wilson import wilson_lower_bound

__all__ = ["EntryEvidence", "MemoryEvidence", "wilson_lower_bound"]


@dataclass
class EntryEvidence:
    """The verdicts on the hits one entry served."""

    confirmed: int = 0
    refuted: int = 0

    @property
    def judged(self) -> int:
        return self.confirmed + self.refuted

    @property
    def precision_lower_bound(self) -> float:
        return wilson_lower_bound(self.confirmed, self.judged)


@dataclass
class MemoryEvidence:
    """Evidence per entry (by source key) of one task, fed with verdicts on memory hits."""

    entries: dict[str, EntryEvidence] = field(default_factory=dict)
    _verdicts: dict[str, tuple[str, bool]] = field(default_factory=dict)

    @classmethod
    def from_log(cls, traces: pl.LazyFrame, task: str) -> MemoryEvidence:
        """The evidence of ``task`` in a traces table: its memory hits with a verdict, in request order."""
        evidence = cls()
        judged = (
            traces.filter(
                (pl.col("task") == task) & (pl.col("mode") == "memory") & pl.col("feedback_verdict").is_not_null()
            )
            .select("trace_id", "recall", "feedback_verdict", "created_at")
            .sort("created_at")
            .collect()
        )
        for row in judged.iter_rows(named=True):
            source = (json.loads(row["recall"]) or {}).get("source") if row["recall"] else None
            if source is not None:
                evidence.record(row["trace_id"], source, row["feedback_verdict"] == "correct")
        return evidence

    def record(self, trace_id: str, source: str, correct: bool) -> None:
        """A verdict on the hit ``trace_id`` served from ``source``; a later verdict on a trace replaces it."""
        earlier = self._verdicts.get(trace_id)
        if earlier is not None:
            old = self.entries[earlier[0]]
            if earlier[1]:
                old.confirmed -= 1
            else:
                old.refuted -= 1
        self._verdicts[trace_id] = (source, correct)
        entry = self.entries.setdefault(source, EntryEvidence())
        if correct:
            entry.confirmed += 1
        else:
            entry.refuted += 1

    def threshold(self, source: str | None, *, accept: float, verify: float) -> float:
        """The similarity at or above which ``source`` is served without a verification."""
        if not (math.isfinite(accept) and math.isfinite(verify)) or verify > accept:
            raise ConfigurationError(f"need finite memory_verify ({verify}) ≤ memory_accept ({accept})")
        evidence = self.entries.get(source) if source is not None else None
        trust = evidence.precision_lower_bound if evidence is not None else 0.0
        return max(verify, accept - (accept - verify) * trust)
