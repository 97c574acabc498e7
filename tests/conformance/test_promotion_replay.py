"""Replays promotion.json: per round, the judge cost model fitted from the log, the mean judge energy per node,
the proposals and rejections, the tree written by the review, and the round as the store's log reads it back.

The fixture gives cost samples only with its last round; an earlier round saw the samples of the judge calls
made by its first ``at_index`` requests, which resolver.json run 0 (the candidates' own run) counts.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gil_core.habits.costs import CostSample, EvidenceTrace, JudgeCostModel, mean_judge_energy
from gil_core.habits.promotion import (
    PromotionLog,
    PromotionPolicy,
    Proposal,
    Review,
    propose_promotions,
    review_promotions,
)
from gil_core.habits.shadows import EVIDENCE_MODES, Evidence
from gil_core.ontology import Tree, TreeLintWarning, parse_tree
from gil_core.telemetry import TelemetryStore
from tests.conformance._fixtures import FIXTURES, load_json, report

TOLERANCE = 1e-12  # relative; every float replays bit-exact here, this only forgives another libm's pow()


def quiet_tree(text: str, source: str) -> Tree:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        return parse_tree(text, source=source)


def fixture_evidence(candidates: Sequence[Mapping[str, Any]], modes: Mapping[str, str]) -> list[EvidenceTrace]:
    """The fixture's candidates as evidence; each trace's mode is the one resolver.json run 0 recorded."""
    return [
        EvidenceTrace(
            trace_id=row["trace_id"],
            evidence=Evidence(
                state=row["state"],
                anchor=row["anchor"],
                mode=modes[row["trace_id"]],
                output=row["output"],
                verdict=row["verdict"],
                correction=row["correction"],
            ),
            fallback_energy=row["fallback_energy"],
        )
        for row in candidates
    ]


def run_zero_modes() -> dict[str, str]:
    return {case["trace_id"]: case["mode"] for case in load_json("resolver.json")["runs"][0]["cases"]}


def same(got: Any, want: Any) -> bool:
    """Equal, floats within ``TOLERANCE`` (relative), containers element by element and in order."""
    if isinstance(want, float) or isinstance(got, float):
        return isinstance(got, int | float) and math.isclose(got, want, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
    if isinstance(want, Mapping):
        return isinstance(got, Mapping) and list(got) == list(want) and all(same(got[k], want[k]) for k in want)
    if isinstance(want, list | tuple):
        return isinstance(got, list | tuple) and len(got) == len(want) and all(map(same, got, want))
    return bool(got == want)


def proposal_json(proposal: Proposal) -> dict[str, Any]:
    return {
        "anchor": proposal.anchor,
        "id": proposal.id,
        "label": proposal.label,
        "description": proposal.description,
        "text": proposal.text,
        "sources": list(proposal.sources),
        "support": proposal.support,
        "anchor_volume": proposal.anchor_volume,
        "expected_saving": proposal.expected_saving,
        "added_cost": proposal.added_cost,
        "warned": proposal.warned,
    }


def cost_samples_by_round(fixture: Mapping[str, Any]) -> list[list[CostSample]]:
    """Each round's cost samples: a prefix of the last round's, one per judgment of its first requests."""
    cases = load_json("resolver.json")["runs"][0]["cases"]
    nodes = [node for case in cases for node in case["judgments"]]
    given = fixture["rounds"][-1]["cost_samples"]
    assert len(given) == len(nodes)
    samples = [CostSample(**row, node=node) for row, node in zip(given, nodes, strict=True)]
    rounds = []
    for round_ in fixture["rounds"]:
        count = sum(len(case["judgments"]) for case in cases[: round_["at_index"]])
        if round_["cost_samples"] is not None:
            assert round_["cost_samples"] == given[:count]
        rounds.append(samples[:count])
    return rounds


def check_round(
    round_: Mapping[str, Any], samples: list[CostSample], policy: PromotionPolicy, modes: Mapping[str, str]
) -> tuple[list[str], Review]:
    """Every way the round differs from the fixture, and its review (every proposal accepted)."""
    problems = []
    tree = quiet_tree(round_["tree"], f"promotion.json round at {round_['at_index']}")
    model = JudgeCostModel.fit(samples)
    fitted = {name: getattr(model, name) for name in round_["cost_model"]}
    if not same(fitted, {name: float(value) for name, value in round_["cost_model"].items()}):
        problems.append(f"cost model {fitted} != {round_['cost_model']}")
    if not same(mean_judge_energy(samples), round_["judge_energy"]):
        problems.append(f"judge energy {mean_judge_energy(samples)} != {round_['judge_energy']}")
    evidence = fixture_evidence(round_["candidates"], modes)
    found = propose_promotions(tree, evidence, model, policy)
    got = [proposal_json(proposal) for proposal in found.proposals]
    if not same(got, round_["expected"]):
        problems.append(f"proposals {got} != {round_['expected']}")
    if found.rejected_counts() != round_["rejected"]:
        problems.append(f"rejected {found.rejected_counts()} != {round_['rejected']}")
    review = review_promotions(tree, found.proposals)
    if review.before_yaml != round_["tree"] or review.refused or len(review.applied) != len(found.proposals):
        problems.append(f"review refused {review.refused} or rewrote the tree it started from")
    return problems, review


def test_every_promotion_round_matches(tmp_path: Path) -> None:
    fixture = load_json("promotion.json")
    modes = run_zero_modes()
    policy = PromotionPolicy(
        min_support=fixture["n_min"], from_corrections=False, never_promote=frozenset(fixture["never_promote"])
    )
    log = PromotionLog(TelemetryStore(tmp_path))
    rounds = fixture["rounds"]
    following = [round_["tree"] for round_ in rounds[1:]] + [(FIXTURES / "trees" / "grown.yaml").read_text("utf-8")]
    failures = []
    for round_, samples, next_tree in zip(rounds, cost_samples_by_round(fixture), following, strict=True):
        problems, review = check_round(round_, samples, policy, modes)
        if review.after_yaml != next_tree:
            problems.append("the reviewed tree is not the next round's tree (the last: trees/grown.yaml)")
        log.record(fixture["task"], round_["at_index"], review.applied)
        read_back = [proposal_json(p) for p in log.promotions(fixture["task"], round_["at_index"])]
        if not same(read_back, round_["expected"]):
            problems.append(f"the round log read back {read_back}")
        if problems:
            failures.append((round_["at_index"], problems))
    assert log.rounds(fixture["task"]) == [round_["at_index"] for round_ in rounds]
    seeded = (FIXTURES / "trees" / "seeded.yaml").read_text("utf-8")
    if rounds[0]["tree"] != seeded:
        failures.append((0, ["the first round's tree is not trees/seeded.yaml"]))
    report(
        "promotion.json",
        len(rounds) - len(failures),
        len(rounds),
        "rounds (cost model, judge energy per node, proposals, rejections, reviewed tree, round log)",
    )
    assert len(rounds) == 3 and not failures, failures


def test_the_candidates_are_the_generated_requests_of_run_zero() -> None:
    """Each round's candidates: the fallback and partial traces among run 0's first ``at_index`` requests."""
    cases = load_json("resolver.json")["runs"][0]["cases"]
    for round_ in load_json("promotion.json")["rounds"]:
        generated = [case["trace_id"] for case in cases[: round_["at_index"]] if case["mode"] in EVIDENCE_MODES]
        assert [row["trace_id"] for row in round_["candidates"]] == generated
