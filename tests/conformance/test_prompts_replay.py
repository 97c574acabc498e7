"""Replays prompts.json: the Korean judge prompts byte for byte, and the escape string."""

from __future__ import annotations

import warnings

from gil_core.judge import Candidate, build_judge_messages, label_candidates
from gil_core.language import KOREAN
from gil_core.ontology import LabelScheme, TreeLintWarning, parse_tree
from tests.conformance._fixtures import is_overridden, load_json, report


def test_korean_judge_prompts_are_byte_exact() -> None:
    fixture = load_json("prompts.json", "GIL_COMPAT_PROMPTS")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        tree = parse_tree(fixture["tree"], source="prompts.json")
    mismatches = []
    for recorded in fixture["judges"]:
        node = tree.node(recorded["node"])
        candidates = [Candidate.of(item) for item in (node.children or node.options)]
        shown = label_candidates(candidates, LabelScheme(recorded["scheme"]), node_id=node.id)
        system, user = build_judge_messages(KOREAN, recorded["state"], shown)
        if (system["content"], user["content"]) != (recorded["system"], recorded["user"]):
            mismatches.append((recorded["node"], user["content"], recorded["user"]))
    total = len(fixture["judges"])
    report("prompts.json", total - len(mismatches), total, "judge prompts byte-exact (system + user)")
    assert is_overridden("GIL_COMPAT_PROMPTS") or total == 3
    assert not mismatches, mismatches


def test_korean_escape_is_the_reference_string() -> None:
    assert KOREAN.out_of_category == load_json("prompts.json", "GIL_COMPAT_PROMPTS")["escape"]
