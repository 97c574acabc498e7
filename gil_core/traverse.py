"""Greedy traversal: one single-token judgment per layer, from the root down, until a habit or an exit."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gil_core.errors import ConfigurationError
from gil_core.judge.distribution import LabelDistribution
from gil_core.judge.prompt import Candidate
from gil_core.judge.single_token import Judge
from gil_core.ontology.model import Node, Option, Tree

__all__ = ["ExitReason", "GreedyTraverser", "Step", "StepOutcome", "Thresholds", "Traversal", "exit_reason"]

StepOutcome = Literal["accept", "exit", "skip", "defer"]
ExitReason = Literal["untrusted", "none_selected", "low_confidence", "shadow", "skip"]


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Minimum confidence to accept a choice: ``per_layer[min(layer-1, len-1)]`` at a category, ``leaf`` where
    the candidates are answers. There are no defaults: a threshold is a decision about precision."""

    per_layer: tuple[float, ...]
    leaf: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_layer", tuple(self.per_layer))
        if not self.per_layer:
            raise ConfigurationError("Thresholds.per_layer needs at least one value")
        for value in (*self.per_layer, self.leaf):
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ConfigurationError(f"a threshold must lie in [0, 1], got {value!r}")

    def for_node(self, node: Node, layer: int) -> float:
        """The threshold at ``node`` on ``layer`` (root = 1)."""
        if node.is_leaf:
            return self.leaf
        return self.per_layer[min(layer - 1, len(self.per_layer) - 1)]


@dataclass(frozen=True, slots=True)
class Step:
    """One node visited. ``p`` is the winning label's probability; ``chosen`` is None unless accepted/deferred."""

    node: str
    layer: int
    outcome: StepOutcome
    chosen: str | None = None
    p: float | None = None
    probs: Mapping[str, float] = field(default_factory=dict)
    energy: float = 0.0
    none_prob: float | None = None
    # "learned" | "guess" | "reflex" | "llm" | "deliberate" | "unasked" (nobody asked); None: the LLM judge alone
    decided_by: str | None = None
    learned: Mapping[str, Any] | None = None  # the learned judge's prediction here, served or not
    audit: Mapping[str, Any] | None = None  # the LLM's judgment of a learned step (served or guessed), not served

    def to_json(self) -> dict[str, Any]:
        """The path step as the traces table stores it (``decided_by``, ``learned`` and ``audit`` only when set:
        steps of a walk without a tiered or learned judge keep the reference's keys)."""
        extra: dict[str, Any] = {"decided_by": self.decided_by} if self.decided_by is not None else {}
        if self.learned is not None:
            extra["learned"] = dict(self.learned)
        if self.audit is not None:
            extra["audit"] = dict(self.audit)
        return extra | {
            "node": self.node,
            "layer": self.layer,
            "chosen": self.chosen,
            "p": self.p,
            "outcome": self.outcome,
            "probs": dict(self.probs),
            "energy": self.energy,
            "none_prob": self.none_prob,
        }


@dataclass(frozen=True, slots=True)
class Traversal:
    """Where the walk ended: a habit reached, a shadow deferred to, or an exit with its reason."""

    steps: tuple[Step, ...]
    habit: Option | None = None
    exit_reason: ExitReason | None = None
    shadow: Candidate | None = None

    @property
    def confirmed(self) -> tuple[str, ...]:
        """The categories (and habit) accepted on the way down, in order."""
        return tuple(step.chosen for step in self.steps if step.outcome == "accept" and step.chosen is not None)

    @property
    def last_node(self) -> str:
        """The deepest node the walk stood on."""
        return self.steps[-1].node

    @property
    def energy(self) -> float:
        return sum(step.energy for step in self.steps)


class GreedyTraverser:
    """Walks a tree with a judge. Shadows (per leaf id) are shown beside that leaf's habits; picking one
    defers to generation."""

    def __init__(self, judge: Judge, thresholds: Thresholds) -> None:
        self._judge = judge
        self._thresholds = thresholds

    async def traverse(
        self,
        request: str,
        tree: Tree,
        *,
        shadows: Mapping[str, Sequence[Candidate]] | None = None,
    ) -> Traversal:
        steps: list[Step] = []
        node, layer = tree.root, 1
        while True:
            candidates: Sequence[Candidate] = _candidates(node)
            if node.is_leaf and shadows:
                # The most supported shadows first, as many as the node's labels can still show: a leaf whose
                # confirmed answers outgrow its scheme keeps being judged (the rest wait for a review round).
                room = max(0, node.label_scheme.capacity - len(candidates))
                shown = [replace_shadow(shadow) for shadow in list(shadows.get(node.id, ()))[:room]]
                candidates = [*candidates, *shown]
            if not candidates:
                steps.append(Step(node=node.id, layer=layer, outcome="skip"))
                return Traversal(tuple(steps), exit_reason="skip")
            judgment = await self._judge.judge(request, node.id, candidates, scheme=node.label_scheme, layer=layer)
            dist = judgment.distribution
            reason = exit_reason(dist, self._thresholds.for_node(node, layer))
            judged: dict[str, Any] = {
                "node": node.id,
                "layer": layer,
                "p": dist.confidence,
                "probs": dist.probs,
                "energy": judgment.energy,
                "none_prob": dist.none_prob,
                "decided_by": getattr(judgment, "decided_by", None),
                "learned": getattr(judgment, "learned", None),
                "audit": getattr(judgment, "audit", None),
            }
            if reason is not None:
                steps.append(Step(outcome="exit", **judged))
                return Traversal(tuple(steps), exit_reason=reason)
            chosen = next(c for c in candidates if c.id == dist.choice)
            if chosen.is_shadow:
                steps.append(Step(outcome="defer", chosen=chosen.id, **judged))
                return Traversal(tuple(steps), exit_reason="shadow", shadow=chosen)
            steps.append(Step(outcome="accept", chosen=chosen.id, **judged))
            if node.is_leaf:
                return Traversal(tuple(steps), habit=tree.option(chosen.id))
            node, layer = tree.node(chosen.id), layer + 1


def exit_reason(distribution: LabelDistribution, threshold: float) -> ExitReason | None:
    """Why a judgment does not settle its node (None: it does): not trusted, "none of these" chosen, or a
    winner below the node's ``threshold``."""
    if not distribution.trusted:
        return "untrusted"
    if distribution.none_selected:
        return "none_selected"
    if distribution.confidence < threshold:
        return "low_confidence"
    return None


_KEPT_NODES = 1024
# id(node) → the node (held, so that its id names no other node meanwhile) and its candidates
_CANDIDATES: dict[int, tuple[Node, tuple[Candidate, ...]]] = {}


def _candidates(node: Node) -> tuple[Candidate, ...]:
    """A node's candidates (its children, or its habits), made once per node: nodes are frozen, and every request
    of a walk through the node shows the same ones (the shadows beside a leaf's habits come on top)."""
    kept = _CANDIDATES.get(id(node))
    if kept is not None and kept[0] is node:
        return kept[1]
    items: Sequence[Node | Option] = node.children or node.options
    made = tuple(Candidate.of(item) for item in items)
    if len(_CANDIDATES) >= _KEPT_NODES:  # trees read again (a new version of a task's file): forget the old ones
        _CANDIDATES.clear()
    _CANDIDATES[id(node)] = (node, made)
    return made


def replace_shadow(shadow: Candidate) -> Candidate:
    """A shadow candidate, marked as one whatever its caller said."""
    if shadow.is_shadow:
        return shadow
    return Candidate(shadow.id, shadow.label, shadow.description, shadow.answer, is_shadow=True)
