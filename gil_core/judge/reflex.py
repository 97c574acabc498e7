"""The reflex judge: a ``Judge`` by embedding similarity, and a tiered judge that asks it before the LLM.

``ReflexJudge`` compares the request with each candidate's text, ``"label — description"`` (just the label
when there is no description), and with the candidate's confirmed examples when it has any; a candidate's
similarity is the highest cosine among its texts. The distribution is a softmax at ``temperature`` over the
candidates' similarities and "none of these", which takes part as if it were a candidate of similarity
``none_similarity``: when no candidate is more similar than that, none wins; the closer the best candidate is
to it, the more mass none takes. The result is read through ``read_distribution`` like an LLM judgment (labels,
tie rule, trust), with all its mass on labels.

``TieredJudge`` serves the reflex's judgment when its confidence reaches ``threshold`` (and, by default, when
it picked a candidate rather than none: a reflex cannot tell "nothing fits" from "nothing looked alike"), and
otherwise asks the deliberate judge, once. Its ``TieredJudgment`` says which judge decided.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gil_core.errors import ConfigurationError, ModelError
from gil_core.judge.distribution import DEFAULT_TRUST_THRESHOLD, read_distribution
from gil_core.judge.escalation import reflex_serves
from gil_core.judge.primitives import _cosines, _softmax, _TextVectors
from gil_core.judge.prompt import Candidate, label_candidates
from gil_core.judge.single_token import Judge, Judgment
from gil_core.llm.ports import EmbeddingModel, TokenLogprob
from gil_core.llm.recorder import call_scope
from gil_core.ontology.labels import LabelScheme

__all__ = ["DecidedBy", "ReflexJudge", "TieredJudge", "TieredJudgment", "candidate_text"]

DecidedBy = Literal["reflex", "deliberate"]


def candidate_text(candidate: Candidate) -> str:
    """What a candidate is compared by: ``"label — description"``, or the label alone."""
    return f"{candidate.label} — {candidate.description}" if candidate.description else candidate.label


class ReflexJudge:
    """``Judge`` by embeddings (see the module doc). ``examples`` maps a candidate id to confirmed requests
    of that candidate. The embedding call is made in a ``call_scope("embed")`` with the node, layer and
    candidates, annotated with the distribution, so an ``EmbeddingRecorder`` records it like a judge call.
    Candidate texts' vectors are kept, so a node seen before costs one embedding of the request."""

    def __init__(
        self,
        embedder: EmbeddingModel,
        *,
        temperature: float = 0.05,
        none_similarity: float = 0.3,
        examples: Mapping[str, Sequence[str]] | None = None,
        trust_threshold: float = DEFAULT_TRUST_THRESHOLD,
    ) -> None:
        if not (math.isfinite(temperature) and temperature > 0) or not -1.0 <= none_similarity <= 1.0:
            raise ConfigurationError(
                f"temperature must be > 0 and none_similarity in [-1, 1] ({temperature!r}, {none_similarity!r})"
            )
        self._vectors = _TextVectors(embedder)
        self._temperature = temperature
        self._none_similarity = none_similarity
        self._examples = {key: tuple(texts) for key, texts in (examples or {}).items()}
        self._trust_threshold = trust_threshold

    async def judge(
        self,
        request: str,
        node_id: str,
        candidates: Sequence[Candidate],
        *,
        scheme: LabelScheme,
        layer: int | None = None,
    ) -> Judgment:
        shown = label_candidates(candidates, scheme, node_id=node_id)
        texts = [(candidate_text(c), *self._examples.get(c.id, ())) for c in candidates]
        with call_scope("embed", node_id=node_id, layer=layer, candidates=shown) as scope:
            similarities = [self._none_similarity]
            if candidates:
                query, vectors = await self._vectors.embed(request, [text for group in texts for text in group])
                cosines = iter(_cosines(query, vectors))
                similarities += [max(next(cosines) for _ in group) for group in texts]
            probabilities = _softmax(np.asarray(similarities, dtype=np.float64) / self._temperature)
            # Read like a model's first token, so labels, ties and trust follow the LLM judge's rules exactly.
            alternatives = [
                TokenLogprob(item.shown_as, math.log(p) if p > 0 else None)
                for item, p in zip(shown, probabilities, strict=True)
            ]
            distribution = read_distribution(alternatives, shown, trust_threshold=self._trust_threshold)
            scope.annotate(
                distribution=distribution.probs,
                label_mass=distribution.label_mass,
                confidence=distribution.confidence,
                outcome=distribution.outcome,
            )
        return Judgment(node_id=node_id, shown=shown, distribution=distribution, energy=scope.energy)


@dataclass(frozen=True, slots=True)
class TieredJudgment(Judgment):
    """A ``Judgment`` that also says which judge decided and, when the deliberate judge did, what the reflex
    said (or None when the reflex failed). ``energy`` is what both cost."""

    decided_by: DecidedBy = "deliberate"
    reflex: Judgment | None = None


class TieredJudge:
    """``Judge`` asking ``reflex`` first and ``deliberate`` only when the reflex is not sure enough."""

    def __init__(self, reflex: Judge, deliberate: Judge, threshold: float, *, defer_none: bool = True) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ConfigurationError(f"threshold must be in [0, 1], got {threshold!r}")
        self._reflex = reflex
        self._deliberate = deliberate
        self._threshold = threshold
        self._defer_none = defer_none

    async def judge(
        self,
        request: str,
        node_id: str,
        candidates: Sequence[Candidate],
        *,
        scheme: LabelScheme,
        layer: int | None = None,
    ) -> TieredJudgment:
        reflex: Judgment | None
        try:
            reflex = await self._reflex.judge(request, node_id, candidates, scheme=scheme, layer=layer)
        except ModelError:  # the reflex is an optimisation: when it cannot answer, the LLM judge does
            reflex = None
        if reflex is not None and self._serves(reflex):
            return TieredJudgment(reflex.node_id, reflex.shown, reflex.distribution, reflex.energy, "reflex")
        deliberate = await self._deliberate.judge(request, node_id, candidates, scheme=scheme, layer=layer)
        energy = deliberate.energy + (reflex.energy if reflex is not None else 0.0)
        return TieredJudgment(
            deliberate.node_id, deliberate.shown, deliberate.distribution, energy, "deliberate", reflex
        )

    def _serves(self, reflex: Judgment) -> bool:
        return reflex_serves(
            reflex.confidence,
            self._threshold,
            trusted=reflex.distribution.trusted,
            deferred=self._defer_none and reflex.distribution.none_selected,
        )
