"""Review rounds as a person sees them: a list of items to accept or reject, and what a decision does.

A round (promotion, deactivation, differentiation) reads the log and writes its list as YAML; ``decide`` records
a decision in the review log and, for an accepted promotion or retirement, rewrites the tree file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from gil_core.errors import ConfigurationError
from gil_core.habits.deactivation import (
    DeactivationPolicy,
    ReliabilityWeights,
    prepare_deactivation_round,
)
from gil_core.habits.differentiation import DifferentiationPolicy, prepare_differentiation_round
from gil_core.habits.promotion import (
    PromotionLog,
    PromotionPolicy,
    prepare_promotion_round,
    review_promotions,
)
from gil_core.habits.review_log import Decision, ReviewKind, ReviewLog
from gil_core.llm import EmbeddingModel
from gil_core.ontology import Tree, write_tree
from gil_core.tasks import TaskDefinition
from gil_core.telemetry import TelemetryStore

__all__ = [
    "DEFAULT_DEACTIVATION",
    "DEFAULT_DIFFERENTIATION",
    "DEFAULT_PROMOTION",
    "DEFAULT_WEIGHTS",
    "ReviewList",
    "deactivation_review",
    "decide",
    "differentiation_review",
    "promotion_review",
]

DEFAULT_PROMOTION = PromotionPolicy(min_support=3, from_corrections=False)
DEFAULT_WEIGHTS = ReliabilityWeights(reinforce=1.0, penalty=2.0, prior_strength=2.0)
DEFAULT_DEACTIVATION = DeactivationPolicy(
    half_life=500.0, stale_below=0.05, reliability_below=0.4, min_verdicts=5, dispute_rate=0.3, min_explored=3
)
DEFAULT_DIFFERENTIATION = DifferentiationPolicy(headroom=2, min_support=3, similarity=0.8, unserved_min_support=3)


@dataclass(frozen=True)
class ReviewList:
    """What a round proposes: one mapping per item, each with an ``id`` a decision names."""

    kind: ReviewKind
    task: str
    items: list[dict[str, Any]]

    def to_yaml(self) -> str:
        return yaml.safe_dump(
            {"kind": self.kind.value, "task": self.task, "items": self.items}, sort_keys=False, allow_unicode=True
        )

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml(), encoding="utf-8")
        return path


def promotion_review(
    store: TelemetryStore, task: TaskDefinition, policy: PromotionPolicy = DEFAULT_PROMOTION
) -> ReviewList:
    """Recurring confirmed answers worth making habits (net saving > 0), best first."""
    round_ = prepare_promotion_round(store, task.name, task.tree, policy, none_text=task.language.none_of_these)
    items = [
        {**asdict(proposal), "sources": list(proposal.sources), "net_saving": proposal.net_saving}
        for proposal in round_.proposals.proposals
    ]
    return ReviewList(ReviewKind.PROMOTION, task.name, items)


def deactivation_review(
    store: TelemetryStore,
    task: TaskDefinition,
    weights: ReliabilityWeights = DEFAULT_WEIGHTS,
    policy: DeactivationPolicy = DEFAULT_DEACTIVATION,
) -> ReviewList:
    """Habits to retire: unreliable, disputed or stale, each under its heaviest reason."""
    proposals = prepare_deactivation_round(store, task.name, task.tree, weights, policy)
    return ReviewList(ReviewKind.DEACTIVATION, task.name, [asdict(proposal) for proposal in proposals])


async def differentiation_review(
    store: TelemetryStore,
    task: TaskDefinition,
    embedder: EmbeddingModel,
    policy: DifferentiationPolicy = DEFAULT_DIFFERENTIATION,
) -> ReviewList:
    """Categories to split (near capacity), answers anchored too high, and unserved requests to add a category for."""
    report = await prepare_differentiation_round(
        store, task.name, task.tree, policy, none_text=task.language.none_of_these, embedder=embedder
    )
    items: list[dict[str, Any]] = []
    items += [{"id": signal.id, "signal": "capacity", **asdict(signal)} for signal in report.capacity]
    items += [{"id": signal.id, "signal": "anchored", **_plain(asdict(signal))} for signal in report.anchored]
    items += [
        {"id": f"unserved-{index}", "signal": "unserved", "support": group.support, **_plain(asdict(group))}
        for index, group in enumerate(report.unserved, start=1)
    ]
    return ReviewList(ReviewKind.DIFFERENTIATION, task.name, items)


def _plain(data: dict[str, Any]) -> dict[str, Any]:
    return {
        key: list(value) if isinstance(value, tuple) else str(value) if hasattr(value, "value") else value
        for key, value in data.items()
    }


def decide(
    store: TelemetryStore,
    task: TaskDefinition,
    kind: ReviewKind | str,
    item_id: str,
    decision: Decision | str,
    note: str | None = None,
) -> Tree | None:
    """Record a decision. An accepted promotion adds the habit to the tree file, an accepted retirement removes
    the habit from it; both return the new tree (written to ``task.tree.source``). Others return None."""
    kind, decision = ReviewKind(kind), Decision(decision)
    new_tree: Tree | None = None
    if decision is Decision.ACCEPTED and kind is ReviewKind.PROMOTION:
        round_ = prepare_promotion_round(
            store, task.name, task.tree, DEFAULT_PROMOTION, none_text=task.language.none_of_these
        )
        chosen = [p for p in round_.proposals.proposals if p.id == item_id]
        if not chosen:
            raise ConfigurationError(f"task {task.name!r}: no promotion proposal {item_id!r} in the current round")
        review = review_promotions(task.tree, chosen)
        if review.refused:
            raise ConfigurationError(f"{item_id}: refused ({review.refused[0].reason.value})")
        PromotionLog(store).record(
            task.name, store.read("traces").filter(store.read("traces")["task"] == task.name).height, chosen
        )
        new_tree = review.tree
    elif decision is Decision.ACCEPTED and kind is ReviewKind.DEACTIVATION:
        if not task.tree.has_option(item_id):
            raise ConfigurationError(f"task {task.name!r}: the tree has no habit {item_id!r} to retire")
        new_tree = _without_option(task.tree, item_id)
    ReviewLog(store).record(task.name, kind, item_id, decision, note)
    if new_tree is not None and task.tree.source:
        write_tree(new_tree, task.tree.source)
    return new_tree


def _without_option(tree: Tree, option_id: str) -> Tree:
    owner = tree.owner(option_id)

    def rebuild(node: Any) -> Any:
        if node.id == owner.id:
            return replace(node, options=tuple(o for o in node.options if o.id != option_id))
        return replace(node, children=tuple(rebuild(child) for child in node.children))

    return Tree(rebuild(tree.root), source=tree.source)
