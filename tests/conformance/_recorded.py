"""Adapters that answer with what the reference recorded, so a replay drives our real code with its inputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gil_core.judge import Candidate, Judgment, LabelDistribution
from gil_core.ontology import LabelScheme


class RecordedJudge:
    """A judge that answers with the judgments recorded for the current request, node by node."""

    def __init__(self, judgments: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.judgments: Mapping[str, Mapping[str, Any]] = judgments or {}
        self.asked: list[str] = []

    async def judge(
        self,
        request: str,
        node_id: str,
        candidates: Sequence[Candidate],
        *,
        scheme: LabelScheme,
        layer: int | None = None,
    ) -> Judgment:
        self.asked.append(node_id)
        recorded = self.judgments[node_id]
        probs = recorded["probs"]
        assert set(probs) == {c.id for c in candidates}, (node_id, sorted(probs), [c.id for c in candidates])
        trusted = recorded["trusted"]
        distribution = LabelDistribution(
            probs=probs,
            none_prob=1.0 - sum(probs.values()),
            label_mass=recorded.get("label_mass", 1.0),
            confidence=recorded["confidence"],
            trusted=trusted,
            choice=recorded["choice"],
            winner=recorded["choice"] if trusted else max(probs, key=probs.__getitem__),
        )
        return Judgment(node_id=node_id, shown=(), distribution=distribution)
