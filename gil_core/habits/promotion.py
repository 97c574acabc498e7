"""Promotion: answers the generator keeps giving at a node become habits of that node, when that saves energy.

A habit answers without generation but lengthens every judge prompt at its node. So an answer is proposed only
when what it saves (its share of the node's generated requests × their mean generation energy) beats what it
adds to the judge (``costs.JudgeCostModel``). A person reviews the proposals; ``review_promotions`` writes the
accepted ones into the tree as ``origin: promoted`` options, and ``PromotionLog`` keeps each round in the store.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import polars as pl

from gil_core.habits.costs import (
    EvidenceTrace,
    JudgeCostModel,
    mean_judge_energy,
    read_cost_samples,
    read_evidence,
)
from gil_core.habits.review_log import ReviewKind, ReviewLog
from gil_core.habits.shadows import EVIDENCE_MODES, confirmed_answer, item_id, short_label
from gil_core.ontology import Node, Option, OptionKind, Origin, Tree, dump_tree
from gil_core.telemetry import TelemetryStore

__all__ = [
    "PromotionLog",
    "PromotionPolicy",
    "PromotionProposals",
    "PromotionRound",
    "Proposal",
    "Refusal",
    "RefusalReason",
    "RejectReason",
    "Rejection",
    "Review",
    "prepare_promotion_round",
    "propose_promotions",
    "review_promotions",
]


@dataclass(frozen=True, slots=True)
class PromotionPolicy:
    """``min_support``: confirmations an answer needs at its node; ``from_corrections``: whether a correction
    given to a wrong answer counts as a confirmation; ``never_promote``: texts that are never habits (the
    language's "none of these", say)."""

    min_support: int
    from_corrections: bool
    never_promote: frozenset[str] = frozenset()


class RejectReason(StrEnum):
    """Why an answer with evidence is not proposed. ``MIN_SUPPORT``'s value is the reference's ("n_min")."""

    MIN_SUPPORT = "n_min"
    SAME_AS_EXISTING = "same_as_existing"
    ENERGY = "energy"
    REJECTED_BEFORE = "rejected_before"


@dataclass(frozen=True, slots=True)
class Proposal:
    """An answer proposed as a habit of ``anchor``; ``warned`` when the anchor is full and needs splitting."""

    anchor: str
    id: str
    label: str
    description: str
    text: str
    sources: tuple[str, ...]
    support: int
    anchor_volume: int
    expected_saving: float
    added_cost: float
    warned: bool = False

    @property
    def net_saving(self) -> float:
        return self.expected_saving - self.added_cost

    def option(self) -> Option:
        """The habit this proposal adds."""
        return Option(
            id=self.id, label=self.label, description=self.description, text=self.text, origin=Origin.PROMOTED
        )


@dataclass(frozen=True, slots=True)
class Rejection:
    """An answer with evidence at ``anchor`` that was not proposed, and why."""

    anchor: str
    text: str
    support: int
    reason: RejectReason


@dataclass(frozen=True, slots=True)
class PromotionProposals:
    """What a proposer found: proposals by net saving (highest first), and the rejections in evidence order."""

    proposals: tuple[Proposal, ...]
    rejections: tuple[Rejection, ...]

    def rejected_counts(self) -> dict[str, int]:
        """How many answers each reason rejected (reasons that rejected none are left out)."""
        counts: dict[str, int] = {}
        for rejection in self.rejections:
            counts[rejection.reason.value] = counts.get(rejection.reason.value, 0) + 1
        return counts


def propose_promotions(
    tree: Tree,
    evidence: Iterable[EvidenceTrace],
    cost_model: JudgeCostModel,
    policy: PromotionPolicy,
    *,
    rejected_ids: Collection[str] = (),
) -> PromotionProposals:
    """Group generated answers by anchor (the last node walked; only nodes without children) and exact text.

    Texts the tree already answers with, and ``never_promote`` texts, are skipped. The rest must reach
    ``min_support``, must not restate an existing habit (``same_as_existing``), must not have been rejected by a
    reviewer before (``rejected_ids``, proposal ids) and must save more than they cost (``energy``).
    """
    volume: dict[str, int] = {}
    groups: dict[tuple[str, str], list[EvidenceTrace]] = {}
    for trace in evidence:
        row = trace.evidence
        if row.mode not in EVIDENCE_MODES or not tree.has_node(row.anchor) or tree.node(row.anchor).children:
            continue
        volume[row.anchor] = volume.get(row.anchor, 0) + 1
        answer = confirmed_answer(row)
        if answer is None or (row.verdict != "correct" and not policy.from_corrections):
            continue
        groups.setdefault((row.anchor, answer), []).append(trace)
    known = {option.text for option, _ in tree.options() if option.kind is OptionKind.ANSWER}
    proposals: list[Proposal] = []
    rejections: list[Rejection] = []
    for (anchor, text), supporters in groups.items():
        if text in known or text in policy.never_promote:
            continue
        proposal = _proposal(tree, anchor, text, supporters, volume[anchor], cost_model)
        reason = _rejection(tree, proposal, policy, rejected_ids)
        if reason is None:
            proposals.append(proposal)
        else:
            rejections.append(Rejection(anchor, text, proposal.support, reason))
    proposals.sort(key=lambda proposal: -proposal.net_saving)
    return PromotionProposals(tuple(proposals), tuple(rejections))


def _proposal(
    tree: Tree, anchor: str, text: str, supporters: Sequence[EvidenceTrace], volume: int, cost_model: JudgeCostModel
) -> Proposal:
    node = tree.node(anchor)
    label = short_label(text)
    description = supporters[0].evidence.state
    mean_energy = sum(trace.fallback_energy for trace in supporters) / len(supporters)
    shown = len(label) + len(description)
    return Proposal(
        anchor=anchor,
        id=item_id("promoted", anchor, text),
        label=label,
        description=description,
        text=text,
        sources=tuple(trace.trace_id for trace in supporters),
        support=len(supporters),
        anchor_volume=volume,
        expected_saving=len(supporters) / volume * mean_energy,
        added_cost=cost_model.marginal(shown) if node.options else cost_model.new_call(shown),
        warned=_is_full(node),
    )


def _rejection(
    tree: Tree, proposal: Proposal, policy: PromotionPolicy, rejected_ids: Collection[str]
) -> RejectReason | None:
    if proposal.support < policy.min_support:
        return RejectReason.MIN_SUPPORT
    if _restates_existing(tree, proposal):
        return RejectReason.SAME_AS_EXISTING
    if proposal.id in rejected_ids:
        return RejectReason.REJECTED_BEFORE
    if proposal.net_saving <= 0.0:
        return RejectReason.ENERGY
    return None


def _restates_existing(tree: Tree, proposal: Proposal) -> bool:
    """Exact texts are skipped before this; here: the same words up to case, spacing and a final full stop, a
    label the judge could not tell from a sibling's, or an id the tree already uses."""
    wanted = _normalised(proposal.text)
    if any(_normalised(option.text or "") == wanted for option, _ in tree.options()):
        return True
    siblings = tree.node(proposal.anchor).options
    if any(option.label.casefold() == proposal.label.casefold() for option in siblings):
        return True
    return tree.has_option(proposal.id) or tree.has_node(proposal.id)


def _normalised(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".")


def _is_full(node: Node) -> bool:
    return len(node.options) >= node.label_scheme.capacity


# -- review ---------------------------------------------------------------------------------------------------


class RefusalReason(StrEnum):
    """Why a proposal was not written into the tree."""

    NOT_ACCEPTED = "not_accepted"
    NO_ANCHOR = "no_anchor"  # the anchor is gone, or has children now
    DUPLICATE = "duplicate"  # its id or its text is in the tree already
    NEEDS_SPLITTING = "needs_splitting"  # the anchor holds as many habits as its label scheme can show


@dataclass(frozen=True, slots=True)
class Refusal:
    """A proposal the review did not write into the tree, and why."""

    proposal: Proposal
    reason: RefusalReason


@dataclass(frozen=True, slots=True)
class Review:
    """A tree before and after a review, as compact YAML, with what was applied and what was refused."""

    tree: Tree
    before_yaml: str
    after_yaml: str
    applied: tuple[Proposal, ...]
    refused: tuple[Refusal, ...]


def review_promotions(tree: Tree, proposals: Iterable[Proposal], *, accepted: Collection[str] | None = None) -> Review:
    """Append each accepted proposal (``accepted`` ids; None = all) to its anchor's options, in order.

    A proposal the tree cannot take is refused: its anchor is gone or has children, it is there already, or
    the anchor is full (a full node is not given a habit: it needs splitting).
    """
    applied: list[Proposal] = []
    refused: list[Refusal] = []
    current = tree
    for proposal in proposals:
        reason = _refusal(current, proposal, accepted)
        if reason is not None:
            refused.append(Refusal(proposal, reason))
            continue
        current = Tree(_with_option(current.root, proposal.anchor, proposal.option()), source=tree.source)
        applied.append(proposal)
    return Review(current, dump_tree(tree), dump_tree(current), tuple(applied), tuple(refused))


def _refusal(tree: Tree, proposal: Proposal, accepted: Collection[str] | None) -> RefusalReason | None:
    if accepted is not None and proposal.id not in accepted:
        return RefusalReason.NOT_ACCEPTED
    if not tree.has_node(proposal.anchor) or tree.node(proposal.anchor).children:
        return RefusalReason.NO_ANCHOR
    node = tree.node(proposal.anchor)
    if tree.has_option(proposal.id) or tree.has_node(proposal.id) or any(o.text == proposal.text for o in node.options):
        return RefusalReason.DUPLICATE
    if _is_full(node):
        return RefusalReason.NEEDS_SPLITTING
    return None


def _with_option(node: Node, anchor: str, option: Option) -> Node:
    if node.id == anchor:
        return dataclasses.replace(node, options=(*node.options, option))
    return dataclasses.replace(node, children=tuple(_with_option(child, anchor, option) for child in node.children))


# -- the log and a round over the store -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromotionRound:
    """A round prepared from the store: where it stands, the fitted judge cost model, and the proposals."""

    at_index: int
    cost_model: JudgeCostModel
    judge_energy: dict[str, float]
    proposals: PromotionProposals


def prepare_promotion_round(
    store: TelemetryStore,
    task: str,
    tree: Tree,
    policy: PromotionPolicy,
    *,
    none_text: str,
    at_index: int | None = None,
) -> PromotionRound:
    """Propose promotions from the task's first ``at_index`` requests (all when None, or when fewer).

    ``none_text`` (the language's "none of these") is never promoted, whatever the policy lists. Proposals a
    reviewer rejected before (the review log's latest decision) are not proposed again: their id hashes the
    anchor and the text, so the same answer at the same node is the same question. Raises ``CostModelError``
    when the log holds too few judge calls to price a habit.
    """
    count = store.scan("traces").filter(pl.col("task") == task).select(pl.len()).collect().item()
    upto = min(at_index, count) if at_index is not None else count
    samples = read_cost_samples(store, task, none_text=none_text, upto=upto)
    cost_model = JudgeCostModel.fit(samples)
    policy = dataclasses.replace(policy, never_promote=policy.never_promote | {none_text})
    rejected = ReviewLog(store).rejected(task, ReviewKind.PROMOTION)
    evidence = read_evidence(store, task, upto=upto)
    proposals = propose_promotions(tree, evidence, cost_model, policy, rejected_ids=rejected)
    return PromotionRound(upto, cost_model, mean_judge_energy(samples), proposals)


class PromotionLog:
    """Promotion rounds in the store: ``promotion_rounds`` marks that a round ran at a trace index (the number of
    requests it had seen), ``promotions`` holds what it promoted. Both are keyed tables: recording the same
    promotion at the same index again replaces its row."""

    def __init__(self, store: TelemetryStore) -> None:
        self._store = store

    def record(self, task: str, at_index: int, promoted: Sequence[Proposal]) -> None:
        """Store a round; its promotions are written first, so a visible round always has them."""
        self._store.append("promotions", [_promotion_row(task, at_index, proposal) for proposal in promoted])
        self._store.append("promotion_rounds", [{"task": task, "at_index": at_index}])

    def rounds(self, task: str) -> list[int]:
        """The trace indices at which the task's rounds ran, in increasing order."""
        rows = self._store.scan("promotion_rounds").filter(pl.col("task") == task).collect()
        return sorted(rows["at_index"].to_list())

    def promotions(self, task: str, at_index: int) -> list[Proposal]:
        """What the round at ``at_index`` promoted, in the order it was recorded."""
        rows = (
            self._store.scan("promotions").filter((pl.col("task") == task) & (pl.col("at_index") == at_index)).collect()
        )
        return [_proposal_from_row(row) for row in rows.iter_rows(named=True)]


_MEASURES = ("support", "anchor_volume", "expected_saving", "added_cost")


def _promotion_row(task: str, at_index: int, proposal: Proposal) -> dict[str, Any]:
    option = {"id": proposal.id, "kind": OptionKind.ANSWER.value, "label": proposal.label}
    option |= {"description": proposal.description, "text": proposal.text, "origin": Origin.PROMOTED.value}
    return {
        "task": task,
        "at_index": at_index,
        "anchor": proposal.anchor,
        "option_id": proposal.id,
        "option": json.dumps(option, ensure_ascii=False, separators=(",", ":")),
        "sources": json.dumps(list(proposal.sources), ensure_ascii=False, separators=(",", ":")),
        **{name: getattr(proposal, name) for name in _MEASURES},
    }


def _proposal_from_row(row: dict[str, Any]) -> Proposal:
    option = json.loads(row["option"])
    return Proposal(
        anchor=row["anchor"],
        id=row["option_id"],
        label=option.get("label") or row["option_id"],
        description=option.get("description", ""),
        text=option.get("text", ""),
        sources=tuple(json.loads(row["sources"])),
        **{name: row[name] for name in _MEASURES},
    )
