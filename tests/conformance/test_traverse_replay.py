"""Replays traverse.json: 200 recorded requests under each of 4 threshold sets (steps, habit, exit reason)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from gil_core.judge import Candidate, Judgment, LabelDistribution
from gil_core.ontology import LabelScheme, Tree, TreeLintWarning, parse_tree
from gil_core.traverse import GreedyTraverser, Thresholds
from tests.conformance._fixtures import is_overridden, load_json, report


class RecordedJudge:
    """A judge that answers with the judgments the reference recorded for each node of one request."""

    def __init__(self, judgments: Mapping[str, Mapping[str, Any]]) -> None:
        self.judgments = judgments
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
        assert set(recorded["probs"]) == {c.id for c in candidates}, node_id
        trusted = recorded["trusted"]
        distribution = LabelDistribution(
            probs=recorded["probs"],
            none_prob=1.0 - sum(recorded["probs"].values()),
            label_mass=recorded["label_mass"],
            confidence=recorded["confidence"],
            trusted=trusted,
            choice=recorded["choice"],
            winner=recorded["choice"] if trusted else max(recorded["probs"], key=recorded["probs"].get),
        )
        return Judgment(node_id=node_id, shown=(), distribution=distribution)


def replay_tree(text: str) -> Tree:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        return parse_tree(text, source="traverse.json")


async def test_every_recorded_traversal_takes_the_same_steps() -> None:
    fixture = load_json("traverse.json", "GIL_COMPAT_TRAVERSE")
    tree = replay_tree(fixture["tree"])
    total, mismatches = 0, []
    for case in fixture["cases"]:
        for expected in case["expected"]:
            total += 1
            thresholds = Thresholds(per_layer=tuple(expected["per_layer"]), leaf=expected["leaf"])
            judge = RecordedJudge(case["judgments"])
            walk = await GreedyTraverser(judge, thresholds).traverse(case["trace_id"], tree)
            actual = {
                "steps": [{"node": s.node, "chosen": s.chosen, "outcome": s.outcome} for s in walk.steps],
                "habit": walk.habit.id if walk.habit else None,
                "exit_reason": walk.exit_reason,
            }
            wanted = {key: expected[key] for key in actual}
            if actual != wanted:
                mismatches.append((case["trace_id"], expected["per_layer"], actual, wanted))
            # A skipped node costs no call: the judge is asked exactly at the non-skipped steps.
            assert judge.asked == [s["node"] for s in expected["steps"] if s["outcome"] != "skip"]
    report("traverse.json", total - len(mismatches), total, "traversals (cases x threshold sets)")
    assert is_overridden("GIL_COMPAT_TRAVERSE") or (len(fixture["cases"]), total) == (200, 800)
    assert not mismatches, mismatches[:3]
