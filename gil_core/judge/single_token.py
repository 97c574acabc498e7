"""The single-token judge: one call, ``max_tokens=1``, read through the first token's top logprobs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gil_core.judge.distribution import DEFAULT_TRUST_THRESHOLD, LabelDistribution, read_distribution
from gil_core.judge.prompt import Candidate, build_judge_messages, label_candidates, order_candidates
from gil_core.language import PromptLanguage
from gil_core.llm.ports import ChatModel
from gil_core.llm.recorder import call_scope
from gil_core.ontology.labels import LabelScheme
from gil_core.telemetry.records import CandidateShown

__all__ = ["TOP_LOGPROBS", "Judge", "Judgment", "SingleTokenJudge"]

TOP_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class Judgment:
    """One judgment at one node: what was shown, what the model's first token said, and what it cost."""

    node_id: str
    shown: tuple[CandidateShown, ...]
    distribution: LabelDistribution
    energy: float = 0.0

    @property
    def choice(self) -> str | None:
        return self.distribution.choice

    @property
    def confidence(self) -> float:
        return self.distribution.confidence


class Judge(Protocol):
    """Anything that picks one candidate (or none) at a node."""

    async def judge(
        self,
        request: str,
        node_id: str,
        candidates: Sequence[Candidate],
        *,
        scheme: LabelScheme,
        layer: int | None = None,
    ) -> Judgment:
        """Judge ``request`` against ``candidates`` shown under ``scheme``."""
        ...


class SingleTokenJudge:
    """Asks the model for one label token and reads its top logprobs as a distribution over the candidates.

    ``order_seed`` shuffles candidates per request (stable for the same request); ``trust_threshold`` is the
    label mass below which the model is taken not to have answered with a label at all.
    """

    def __init__(
        self,
        model: ChatModel,
        language: PromptLanguage,
        *,
        trust_threshold: float = DEFAULT_TRUST_THRESHOLD,
        order_seed: str | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        self._model = model
        self._language = language
        self._trust_threshold = trust_threshold
        self._order_seed = order_seed
        self._extra_body = extra_body

    async def judge(
        self,
        request: str,
        node_id: str,
        candidates: Sequence[Candidate],
        *,
        scheme: LabelScheme,
        layer: int | None = None,
    ) -> Judgment:
        ordered = order_candidates(candidates, seed=self._order_seed, node_id=node_id, request=request)
        shown = label_candidates(ordered, scheme, node_id=node_id)
        messages = build_judge_messages(self._language, request, shown)
        with call_scope("judge", node_id=node_id, layer=layer, candidates=shown) as scope:
            completion = await self._model.complete(
                messages,
                max_tokens=1,
                temperature=0.0,
                top_logprobs=TOP_LOGPROBS,
                extra_body=self._extra_body,
            )
            distribution = read_distribution(completion.top_logprobs, shown, trust_threshold=self._trust_threshold)
            scope.annotate(
                distribution=distribution.probs,
                label_mass=distribution.label_mass,
                confidence=distribution.confidence,
                outcome=distribution.outcome,
            )
        return Judgment(node_id=node_id, shown=shown, distribution=distribution, energy=scope.energy)
