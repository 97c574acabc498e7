"""The rule each node of the learned judge may serve by, read from the logged predictions, and whether the next
judge is still asked where it does not serve.

* **Rules**, from the logged predictions (made before their verdicts) of models of the node's current generation
  (fitted on at least a quarter of its current confirmed rows), latest ``window`` per node, a node's own
  while it has ``min_support`` of them, else its layer's (leaves and inner nodes pooled apart, since their
  thresholds differ), else the whole tree's (one model judges every node); the same for the predictions the LLM
  also judged. The novelty check is not applied to
  them: it only ever removes requests from what is served. Cuts run over the logged confidences from the
  task's threshold at the node up:
  - *proven*: the lowest cut whose Wilson 95% lower bound of precision reaches the node's target;
  - *better*: the lowest cut whose logged precision reaches the node's target (not yet proven: the estimate),
    where on the requests the LLM also judged at the node the learned judge was right significantly more often
    than the LLM (a one-sided exact sign test over the requests exactly one of the two got right, at 95%):
    waiting for proof would mean asking a judge that is worse.
  The rule with the lower cut applies (proven on a tie). A node that served before and meets neither is
  *withdrawn* until a refit restores it; one that never served is *learning*.
* **The next judge.** Where the learned judge does not serve, the description reflex or the LLM is asked; a
  judge that never settles the node with the confirmed child costs energy for nothing. From the node's own
  logged requests the next judge was asked (not the audits of served ones), latest ``window``: how many it
  settled with the confirmed child ("none of these" confirmed at the root counts as not helped: an exit gives
  the same); where the Wilson 95% upper bound of that share is below ``llm_floor``, the node is marked so
  (``report["next_judge"]``) and the request path asks it only on the audit share. A node's own count needs
  dozens of asks to fall under a floor of a few percent (74 with none right, for 5%); while the next judge has
  settled none of the node's own right, the asks of the nodes of its layer (leaves and inner nodes apart, as
  for the rules; ``pooling: layer``), then those of the whole tree, decide instead when they fall under the
  floor (it is one judge: what it settles elsewhere counts for it everywhere); a judge that helped a node is
  judged there on that node's own record only.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gil_core.learned.log import Logged
from gil_core.learned.state import SERVING_RULES, SIGNIFICANCE, NodeModel, Rule
from gil_core.tasks import LearnedPolicy
from gil_core.wilson import wilson_interval, wilson_lower_bound

__all__ = ["RuleChoice", "choose_rule", "rule_evidence", "with_next_judge", "with_rule"]


@dataclass(frozen=True)
class _Evidence:
    """What a node's rules read: logged predictions (for precision) and those the LLM judged too (for the
    comparison), each the node's own while it has ``min_support`` of them, else its layer's; and every logged
    prediction of the node's own (for coverage)."""

    rows: list[Logged]
    rows_from: str
    pairs: list[Logged]
    pairs_from: str
    own: list[Logged]


def rule_evidence(
    node_id: str,
    logged: Sequence[Logged],
    groups: Mapping[str, tuple[int, bool]],
    models: Mapping[str, NodeModel],
    policy: LearnedPolicy,
) -> _Evidence:
    def latest(items: list[Logged], *, last: bool = False) -> tuple[list[Logged], str] | None:
        """The node's own, else its layer's, else the tree's: the first that has ``min_support`` (the tree's
        however few when ``last``)."""
        pools = _pools(node_id, items, groups, policy.window)
        if policy.pooling == "node":
            return pools[0][1], "node"
        for name, kept in pools:
            if len(kept) >= policy.min_support:
                return kept, name
        return (pools[-1][1], "tree") if last else None

    # A prediction speaks for a node's model when a model of its generation made it: one fitted on at least a
    # quarter as many confirmed rows as the node's now (a leaf first judged from its priors alone says little
    # about the leaf it became). Only where no pool has enough of those does every prediction count.
    current = {node: int(model.report.get("rows", 0)) for node, model in models.items()}
    recent = [item for item in logged if 4 * item.rows >= current.get(item.node_id, 0)]
    rows, rows_from = latest(recent) or latest(list(logged), last=True) or ([], "tree")
    pairs, pairs_from = latest([item for item in logged if item.llm_right is not None], last=True) or ([], "tree")
    return _Evidence(rows, rows_from, pairs, pairs_from, [item for item in logged if item.node_id == node_id])


def served_share(
    classes: Sequence[str | None], own: Sequence[Logged], cut: float, novelty_cuts: NDArray[np.float64]
) -> float:
    """The share of a node's logged predictions its rule would serve now: at or above the confidence ``cut`` and
    as like the confirmed requests of their class as its novelty cut (the node's reported coverage)."""
    index = {choice_id: position for position, choice_id in enumerate(classes)}
    return sum(_kept_by(item, index, cut, novelty_cuts) is None for item in own) / len(own)


def withheld(
    classes: Sequence[str | None], own: Sequence[Logged], cut: float, novelty_cuts: NDArray[np.float64]
) -> dict[str, list[int]]:
    """Of a node's logged predictions its rule would not serve now, per reason (``novel``: unlike the confirmed
    requests of their class; ``below_cut``: under the confidence cut), how many, and how many of those the
    learned choice had right: what each cut costs (``gil fit-reflex``)."""
    index = {choice_id: position for position, choice_id in enumerate(classes)}
    counts = {"novel": [0, 0], "below_cut": [0, 0]}
    for item in own:
        reason = _kept_by(item, index, cut, novelty_cuts)
        if reason is not None:
            counts[reason][0] += 1
            counts[reason][1] += int(item.right)
    return counts


def reported_at_cuts(model: NodeModel, logged: Sequence[Logged]) -> NodeModel:
    """A serving node's report as it serves now, once every step that moves its cuts has run (the guard for
    categories the tree does not hold raises the root's after its rule is chosen): its novelty cuts, its coverage
    and what its cuts withhold (``withheld``), all at those cuts."""
    if model.cut is None:
        return model
    own = [item for item in logged if item.node_id == model.node_id]
    kept = withheld(model.classes, own, model.cut, model.novelty_cuts)
    report = {
        **model.report,
        "novelty_cuts": [None if math.isnan(value) else float(value) for value in model.novelty_cuts],
        "withheld": kept,
    }
    if own:  # the share served, as ``served_share`` counts it
        report["coverage"] = (len(own) - kept["novel"][0] - kept["below_cut"][0]) / len(own)
    return replace(model, report=report)


def _kept_by(
    item: Logged, index: Mapping[str | None, int], cut: float, novelty_cuts: NDArray[np.float64]
) -> str | None:
    """Why the rule would not serve ``item`` now (None: it would), the novelty check first, as serving does."""
    if item.near is None or item.near < float(novelty_cuts[index.get(item.choice, 0)]):
        return "novel"
    return "below_cut" if item.confidence < cut else None


def with_rule(
    model: NodeModel,
    *,
    novelty_cuts: NDArray[np.float64],
    logged: _Evidence,
    threshold: float,
    target: float,
    policy: LearnedPolicy,
    previous: NodeModel | None,
) -> NodeModel:
    own = logged.own
    choice = choose_rule(logged.rows, logged.pairs, threshold=threshold, target=target)
    coverage = None
    if choice.rule is not None and choice.cut is not None and own:
        coverage = served_share(model.classes, own, choice.cut, novelty_cuts)
    rule: Rule
    if choice.rule is not None:
        rule = choice.rule
    elif previous is not None and (previous.rule in SERVING_RULES or previous.rule == "withdrawn"):
        rule = "withdrawn"
    else:
        rule = "learning"
    report = {
        **model.report,
        "logged": len(own),
        "target": target,
        "evidence_rows": len(logged.rows),
        "pairs_from": logged.pairs_from,
        "coverage": coverage,
        "novelty_cuts": [None if math.isnan(value) else value for value in novelty_cuts],
        **choice.report(),
    }
    return replace(
        model,
        novelty_cuts=novelty_cuts,
        rule=rule,
        cut=choice.cut if choice.rule is not None else None,
        evidence=logged.rows_from,
        report=report,
    )


@dataclass(frozen=True)
class RuleChoice:
    """What the rules found on one node's evidence: the applicable rule (None: neither) with its cut, and the
    figures at that cut (or, when neither applies, at the task's threshold)."""

    rule: Rule | None
    cut: float | None
    support: int
    precision: float | None
    lower_bound: float | None
    p_value: float | None
    pairs: int
    llm_precision: float | None

    def report(self) -> dict[str, float | int | str | None]:
        return {
            "cut": self.cut,
            "support": self.support,
            "precision": self.precision,
            "lower_bound": self.lower_bound,
            "p_value": self.p_value,
            "pairs": self.pairs,
            "llm_precision": self.llm_precision,
        }


_NOTHING = RuleChoice(None, None, 0, None, None, None, 0, None)


def choose_rule(rows: Sequence[Logged], pairs: Sequence[Logged], *, threshold: float, target: float) -> RuleChoice:
    """The lowest cut (from ``threshold`` up, over the logged confidences of ``rows``) under each rule (module
    doc): precision is read on ``rows``, the comparison with the LLM on ``pairs``."""
    from scipy.stats import binom  # type: ignore[import-untyped]  # fit path only

    if not rows:
        return _NOTHING
    confidence = np.asarray([item.confidence for item in rows], dtype=np.float64)
    right = np.asarray([item.right for item in rows], dtype=bool)
    paired_right = np.asarray([item.right for item in pairs], dtype=bool)
    llm = np.asarray([bool(item.llm_right) for item in pairs], dtype=bool)
    # Over every request both judged here: is the LLM, asked at this node, measurably worse?
    wins, losses = int((paired_right & ~llm).sum()), int((~paired_right & llm).sum())
    p_value = float(binom.sf(wins - 1, wins + losses, 0.5)) if wins + losses else 1.0
    llm_precision = float(llm.mean()) if len(pairs) else None
    levels = np.unique(confidence[confidence >= threshold])
    figures: list[RuleChoice] = []
    proven_at: int | None = None
    better_at: int | None = None
    for position, cut in enumerate(levels):
        above = confidence >= cut
        n, k = int(above.sum()), int((above & right).sum())
        lower = wilson_lower_bound(k, n)
        figures.append(RuleChoice(None, float(cut), n, k / n, lower, p_value, len(pairs), llm_precision))
        if proven_at is None and lower >= target:
            proven_at = position
        if better_at is None and k / n >= target and p_value < SIGNIFICANCE:
            better_at = position
    if proven_at is None and better_at is None:
        return replace(figures[0], cut=None) if figures else _NOTHING
    if better_at is None or (proven_at is not None and proven_at <= better_at):
        assert proven_at is not None
        return replace(figures[proven_at], rule="proven")
    return replace(figures[better_at], rule="better")


def with_next_judge(
    model: NodeModel,
    logged: Sequence[Logged],
    groups: Mapping[str, tuple[int, bool]],
    policy: LearnedPolicy,
) -> NodeModel:
    """Whether the next judge is still asked at this node where the learned judge does not serve (module doc,
    "The next judge"): over its latest ``window`` logged requests it was asked (not an audit of a served one),
    how many it settled with the confirmed child, and the Wilson 95% upper bound of that share; while it settled
    none of the node's own, the same over the node's layer and then over the tree (each node's latest
    ``window``), the first of them under the floor deciding."""
    asked_there = [item for item in logged if not item.served and item.llm_right is not None]
    pools = _pools(model.node_id, asked_there, groups, policy.window)
    if _settled(pools[0][1]) > 0 or policy.pooling == "node":
        pools = pools[:1]
    figures: dict[str, Any] = {"evidence": "node", "ask": True}
    for evidence, asked in pools:
        settled = _settled(asked)
        upper = wilson_interval(settled, len(asked))[1] if asked else 1.0
        if evidence == "node":
            figures |= {"asked": len(asked), "settled_right": settled, "upper_bound": upper}
        if policy.llm_floor > 0.0 and upper < policy.llm_floor:
            figures |= {"evidence": evidence, "ask": False}
            if evidence != "node":
                figures |= {"pooled_asked": len(asked), "pooled_settled_right": settled, "pooled_upper_bound": upper}
            break
    return replace(model, report={**model.report, "next_judge": figures})


def _pools(
    node_id: str, logged: Sequence[Logged], groups: Mapping[str, tuple[int, bool]], window: int
) -> list[tuple[str, list[Logged]]]:
    """The evidence a node may read, narrowest first: its own latest ``window`` logged items, its group's (each
    node's latest ``window``: its layer, leaves and inner nodes apart) and the tree's."""
    per_node: dict[str, list[Logged]] = defaultdict(list)
    for item in logged:
        per_node[item.node_id].append(item)
    latest = {node: items[-window:] for node, items in per_node.items()}
    layer = [item for node, items in latest.items() if groups.get(node) == groups[node_id] for item in items]
    return [
        ("node", latest.get(node_id, [])),
        ("layer", layer),
        ("tree", [i for items in latest.values() for i in items]),
    ]


def _settled(asked: Sequence[Logged]) -> int:
    """How many of these requests the next judge settled with the confirmed child."""
    return sum(bool(item.llm_right) and item.truth is not None for item in asked)
