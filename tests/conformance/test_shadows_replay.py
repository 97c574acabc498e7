"""Replays shadows.json: the shadow index built from the evidence log at each of its checkpoints."""

from __future__ import annotations

import json
import warnings

from gil_core.habits import Evidence, build_shadow_index
from gil_core.ontology import TreeLintWarning, parse_tree
from tests.conformance._fixtures import load_json, report


def test_the_shadow_index_matches_at_every_checkpoint() -> None:
    fixture = load_json("shadows.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        tree = parse_tree(fixture["tree"], source="shadows.json")
    evidence = [
        Evidence(
            state=row["state"],
            anchor=json.loads(row["path"])[-1]["node"],
            mode=row["mode"],
            output=row["output"],
            verdict=row["feedback_verdict"],
            correction=row["feedback_correction"],
            explored_output=row["explored_output"],
        )
        for row in fixture["evidence"]
    ]
    mismatches = []
    for checkpoint in fixture["checkpoints"]:
        index = build_shadow_index(tree, evidence[: checkpoint["rows"]], exclude=fixture["exclude"])
        got = {
            anchor: [{"id": s.id, "label": s.label, "description": s.description, "answer": s.answer} for s in shadows]
            for anchor, shadows in index.items()
        }
        if got != checkpoint["index"] or list(got) != list(checkpoint["index"]):
            mismatches.append((checkpoint["rows"], got, checkpoint["index"]))
    total = len(fixture["checkpoints"])
    report("shadows.json", total - len(mismatches), total, "checkpoints (shadow index per node, in order)")
    assert total == 3 and not mismatches, mismatches[:1]
