"""Replays deactivation.json: the habits proposed for retirement under each of its policies, and the usage
(last request each habit answered) read from its request log."""

from __future__ import annotations

from typing import Any

from gil_core.habits.deactivation import (
    DeactivationPolicy,
    DeactivationProposal,
    ReliabilityCounts,
    ReliabilityWeights,
    count_usage,
    propose_deactivations,
    served_habit,
)
from tests.conformance._fixtures import load_json, report
from tests.conformance.test_promotion_replay import quiet_tree, same


def proposal_json(proposal: DeactivationProposal) -> dict[str, Any]:
    return {
        "id": proposal.id,
        "anchor": proposal.anchor,
        "reason": proposal.reason.value,
        "recency": proposal.recency,
        "score": proposal.score,
    }


def test_every_policy_proposes_the_same_retirements() -> None:
    fixture = load_json("deactivation.json")
    tree = quiet_tree(fixture["tree"], "deactivation.json")
    weights = ReliabilityWeights(**fixture["weights"])
    counts = {item: ReliabilityCounts(**row) for item, row in fixture["counts"].items()}
    usage = count_usage(served_habit(row["mode"], [row["last"]]) for row in fixture["requests"])
    assert (dict(usage.last_index), usage.total) == (fixture["usage"]["last_index"], fixture["usage"]["total"])
    failures = []
    for case in fixture["cases"]:
        policy = DeactivationPolicy(**case["policy"])
        got = [proposal_json(p) for p in propose_deactivations(tree, counts, usage, weights, policy)]
        if not same(got, case["expected"]):
            failures.append((case["name"], got, case["expected"]))
    total = len(fixture["cases"])
    report("deactivation.json", total - len(failures), total, "policies (id, anchor, reason, recency, score, order)")
    assert total == 2 and not failures, failures
