"""The learned judge on the request path: a ``Judge`` that serves a node's learned judgment where the node's rule
lets it, and asks the next judge (the description reflex, or the LLM) everywhere else.

Its prediction is recorded at every node it could judge, served or not (``Step.learned``: choice, confidence,
novelty similarity and what became of it), so the log holds predictions made before their verdicts: the
evidence the next fit reads. A share (``audit_rate``) of served judgments is also put to the LLM, recorded in
``Step.audit`` and not served, so the comparison with the LLM stays current.

With ``guess`` on, a node below the root that neither the learned judge (not served) nor the next judge
settles is settled by the learned judge's choice where ``NodeModel.may_guess`` allows it (the log shows the LLM
there significantly worse; the request is not novel): ``decided_by`` "guess", the next judge's judgment kept in
``Step.audit``. Never at the root: a request of a category the tree does not hold sits below the root's cut, and
guessing there would answer it as another category.

Where the node's state says the next judge does not help there (``NodeModel.asks_next_judge``: it settled almost
none of the requests it was asked there with the confirmed child), it is not asked, except on the audit share:
the step exits (``decided_by`` "unasked", the learned judgment kept, not trusted) unless a guess settles it, and
a guess made so keeps no audit (no LLM judgment was made).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gil_core.errors import ModelError
from gil_core.habits.attribution import AnswerIndex
from gil_core.judge.distribution import LabelDistribution, read_distribution
from gil_core.judge.prompt import Candidate, label_candidates
from gil_core.judge.single_token import Judge, Judgment
from gil_core.learned.state import LearnedState, Prediction
from gil_core.llm.ports import TokenLogprob
from gil_core.llm.recorder import call_scope, current_trace_id
from gil_core.memory.guard import has_negation
from gil_core.ontology.labels import LabelScheme
from gil_core.ontology.model import Tree
from gil_core.telemetry.records import CandidateShown
from gil_core.traverse import Traversal, exit_reason

__all__ = ["LearnedJudge", "LearnedJudgment", "audited", "served_answer"]

VectorOf = Callable[[str], Awaitable[NDArray[np.float32]]]
TextsOf = Callable[[Sequence[str]], Awaitable[NDArray[np.float32]]]


@dataclass(frozen=True, slots=True)
class LearnedJudgment(Judgment):
    """A ``Judgment`` saying who decided (``learned``, ``guess``, ``reflex``, ``llm``, or ``unasked``: nobody, the
    next judge not asked where it does not help), what the learned judge predicted (None where it has no model),
    and, for an audited served judgment or a guess the LLM was asked before, what the LLM said."""

    decided_by: str = "llm"
    learned: Mapping[str, Any] | None = None
    audit: Mapping[str, Any] | None = None


class LearnedJudge:
    """``Judge`` by ``state`` where a node may serve (module doc), else by ``fallback``; ``llm`` judges audits.

    ``vector_of`` gives the request's unit vector (one embedding per request: memory's, when it embedded the
    request first). ``threshold(node_id, layer)`` is the task's confidence threshold there, which an audited
    LLM judgment must reach to count as what the LLM would have chosen. ``answers`` tells which shown shadows
    are tree answers after all (filled templates); another shadow at a node leaves that node to the LLM.
    ``guess``: settle with the learned choice below the root where the next judge does not (module doc).
    """

    def __init__(
        self,
        state: LearnedState,
        *,
        vector_of: VectorOf,
        fallback: Judge,
        llm: Judge,
        audit_rate: float,
        threshold: Callable[[str, int], float],
        answers: AnswerIndex,
        texts_of: TextsOf,
        guess: bool = False,
    ) -> None:
        self._state = state
        self._guess = guess
        self._vector_of = vector_of
        self._fallback = fallback
        self._llm = llm
        self._audit_rate = audit_rate
        self._threshold = threshold
        self._answers = answers
        self._texts_of = texts_of

    async def judge(
        self,
        request: str,
        node_id: str,
        candidates: Sequence[Candidate],
        *,
        scheme: LabelScheme,
        layer: int | None = None,
    ) -> LearnedJudgment:
        model = self._state.nodes.get(node_id)
        if model is None:
            return await self._ask_fallback(request, node_id, candidates, scheme, layer, None, 0.0)
        shown = label_candidates(candidates, scheme, node_id=node_id)
        with call_scope("embed", node_id=node_id, layer=layer, candidates=shown) as scope:
            try:
                vector = await self._vector_of(request)
            except ModelError:  # without a vector the learned judge has nothing to say: the next judge decides
                vector = None
            prediction = model.predict(vector) if vector is not None else None
            decision = None
            distribution = None
            negates = has_negation(request)
            if prediction is not None and vector is not None:
                decision = model.decide(prediction, negates=negates)
                if decision == "served" and await self._like_a_shadow(vector, prediction, candidates):
                    decision = "shadow"
                distribution = _distribution(prediction, shown)
                scope.annotate(
                    distribution=distribution.probs,
                    label_mass=distribution.label_mass,
                    confidence=distribution.confidence,
                    outcome=distribution.outcome,
                )
        energy = scope.energy
        if prediction is None or distribution is None:
            return await self._ask_fallback(request, node_id, candidates, scheme, layer, None, energy)
        note = {
            "choice": prediction.choice,
            "p": prediction.confidence,
            "near": prediction.near,
            "why": decision,
            "n": model.report.get("rows", 0),  # confirmed rows the model had: which generation of it judged
        }
        trace_id = current_trace_id()
        if decision != "served":
            ask_next = model.asks_next_judge or trace_id is None or audited(trace_id, node_id, self._audit_rate)
            if ask_next:
                judgment = await self._ask_fallback(request, node_id, candidates, scheme, layer, note, energy)
            else:  # the log shows the next judge does not help here (fit.py, "The next judge"): not asked
                unasked = replace(distribution, trusted=False, choice=None)
                judgment = LearnedJudgment(node_id, shown, unasked, energy, "unasked", note)
            guess = self._guess and decision is not None and model.may_guess(prediction, decision, negates=negates)
            # A shadow is no learned class: a request as like a shown shadow is left to the LLM's word.
            if guess and vector is not None and not await self._like_a_shadow(vector, prediction, candidates):
                threshold = self._threshold(node_id, layer or 1)
                if exit_reason(judgment.distribution, threshold) and exit_reason(distribution, threshold) is None:
                    # Neither settled the node, and the learned choice reaches its threshold: it settles it.
                    guessed = _audit_note(judgment, threshold) if ask_next else None
                    return LearnedJudgment(node_id, shown, distribution, judgment.energy, "guess", note, guessed)
            return judgment
        audit = None
        if trace_id is not None and audited(trace_id, node_id, self._audit_rate):
            try:
                asked = await self._llm.judge(request, node_id, candidates, scheme=scheme, layer=layer)
            except ModelError:
                asked = None  # an audit is not served: its failure changes nothing but the evidence
            if asked is not None:
                energy += asked.energy
                audit = _audit_note(asked, self._threshold(node_id, layer or 1))
        return LearnedJudgment(node_id, shown, distribution, energy, "learned", note, audit)

    async def _like_a_shadow(
        self, vector: NDArray[np.float32], prediction: Prediction, candidates: Sequence[Candidate]
    ) -> bool:
        """Whether the request is at least as like a shown shadow's first request as like the confirmed requests
        of the class it is predicted as. A shadow is a confirmed answer the tree does not hold, so it is no
        learned class: such a request is left to the LLM, which is shown the shadow. A filled template is its
        template's class, not a shadow of its own."""
        texts = [
            c.description
            for c in candidates
            if c.is_shadow and c.description and self._answers.option_for(c.answer) is None
        ]
        if not texts:
            return False
        try:
            similarity = float((await self._texts_of(texts) @ vector).max())
        except ModelError:
            return True  # cannot tell: the LLM, which sees the shadows, judges
        return prediction.near is None or similarity >= prediction.near

    async def look_ahead(self, request: str, walk: Traversal, tree: Tree) -> Traversal:
        """Where the walk stopped above the learned judge's own choice (another judge exited there), follow that
        choice down, predicting and never serving, and keep those predictions in the last step's note
        (``ahead``): the evidence of nodes the walk did not reach, so they need not wait for walks to reach them
        before their rule can be read."""
        last = walk.steps[-1] if walk.steps else None
        note = last.learned if last is not None else None
        visited = {step.node for step in walk.steps}
        node_id = note.get("choice") if note else None
        if last is None or note is None or node_id is None or not tree.has_node(node_id) or node_id in visited:
            return walk
        try:
            vector = await self._vector_of(request)
        except ModelError:
            return walk
        ahead = []
        while node_id is not None and node_id in self._state.nodes and tree.has_node(node_id):
            prediction = self._state.nodes[node_id].predict(vector)
            ahead.append(
                {"node": node_id, "choice": prediction.choice, "p": prediction.confidence, "near": prediction.near}
            )
            node_id = prediction.choice
        if not ahead:
            return walk
        steps = (*walk.steps[:-1], replace(last, learned={**note, "ahead": ahead}))
        return replace(walk, steps=steps)

    async def _ask_fallback(
        self,
        request: str,
        node_id: str,
        candidates: Sequence[Candidate],
        scheme: LabelScheme,
        layer: int | None,
        note: Mapping[str, Any] | None,
        energy: float,
    ) -> LearnedJudgment:
        judgment = await self._fallback.judge(request, node_id, candidates, scheme=scheme, layer=layer)
        decided_by = "reflex" if getattr(judgment, "decided_by", None) == "reflex" else "llm"
        return LearnedJudgment(
            judgment.node_id, judgment.shown, judgment.distribution, judgment.energy + energy, decided_by, note
        )


def _distribution(prediction: Prediction, shown: Sequence[CandidateShown]) -> LabelDistribution:
    """The prediction over the labels shown, read like a model's first token (labels, ties and trust follow the
    LLM judge's rules); shadows, which are no learned class, get nothing."""
    probability = {choice: float(p) for choice, p in zip(prediction.classes, prediction.probabilities, strict=True)}
    alternatives = [
        TokenLogprob(item.shown_as, math.log(p) if (p := probability.get(item.id, 0.0)) > 0 else None) for item in shown
    ]
    return read_distribution(alternatives, shown, trust_threshold=0.0)


def _audit_note(judgment: Judgment, threshold: float) -> dict[str, Any]:
    """What the LLM would have chosen: its accepted child (None when it would exit), and whether none won."""
    distribution = judgment.distribution
    accepted = distribution.choice if distribution.confidence >= threshold else None
    return {
        "choice": accepted,
        "none": bool(distribution.trusted and distribution.none_selected),
        "p": distribution.confidence,
    }


def served_answer(
    state: LearnedState, tree: Tree, vector: NDArray[np.float32], *, negates: bool = False
) -> tuple[bool, str | None]:
    """What the learned judge alone would answer: (True, option id) when it would serve every step from the root
    to an option, (True, None) when it would serve "none of these" at the root, else (False, None)."""
    node_id: str | None = tree.root.id
    while node_id is not None:
        model = state.nodes.get(node_id)
        if model is None:
            return False, None
        prediction = model.predict(vector)
        if model.decide(prediction, negates=negates) != "served":
            return False, None
        if prediction.choice is None:
            return node_id == tree.root.id, None
        if not tree.has_node(prediction.choice):
            return True, prediction.choice
        node_id = prediction.choice
    return False, None


def unlike_at_root(state: LearnedState, tree: Tree, vector: NDArray[np.float32]) -> bool:
    """Whether the request is less like the confirmed requests of the class the root predicts it as than that
    class's novelty cut (raised at the root so that categories the tree does not hold stay out): the check the
    learned judge serves behind. False where the root has no model."""
    model = state.nodes.get(tree.root.id)
    return model is not None and model.unlike(model.predict(vector)) == "novel"


def audited(trace_id: str, node_id: str, rate: float) -> bool:
    """Whether this node of this trace is one of the ``rate`` share audited: stable per trace and node."""
    if rate <= 0.0:
        return False
    draw = int(hashlib.sha256(f"{trace_id}\x1f{node_id}".encode()).hexdigest()[:8], 16) / 0x1_0000_0000
    return draw < rate
