"""Replays prompts.json "fallbacks": the Korean fallback prompts byte for byte, for every contract kind."""

from __future__ import annotations

import warnings
from typing import Any

from gil_core.fallback import (
    ChoiceContract,
    Contract,
    ScoreContract,
    TextContract,
    TreeAnswerContract,
    build_fallback_messages,
)
from gil_core.language import KOREAN
from gil_core.ontology import Tree, TreeLintWarning, parse_tree
from tests.conformance._fixtures import is_overridden, load_json, report


def contract_for(recorded: dict[str, Any], tree: Tree) -> Contract:
    kind = recorded["contract"]
    if kind == "tree-scoped":
        return TreeAnswerContract(tree).narrowed(recorded["scoped_node"])
    contracts: dict[str, Contract] = {
        "text": TextContract(),
        "text-max": TextContract(max_length=80),
        "choice": ChoiceContract(("yes", "no")),
        "score": ScoreContract(1, 5),
        "tree": TreeAnswerContract(tree),
    }
    return contracts[kind]


def load_fixture() -> tuple[dict[str, Any], Tree]:
    fixture = load_json("prompts.json", "GIL_COMPAT_PROMPTS")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        return fixture, parse_tree(fixture["tree"], source="prompts.json")


def test_korean_fallback_prompts_are_byte_exact() -> None:
    fixture, tree = load_fixture()
    mismatches = []
    for recorded in fixture["fallbacks"]:
        system, user = build_fallback_messages(
            KOREAN,
            recorded["state"],
            contract_for(recorded, tree),
            path=recorded["path"],
            examples=recorded["examples"],
            complaint=recorded["complaint"],
        )
        if (system["content"], user["content"]) != (recorded["system"], recorded["user"]):
            mismatches.append((recorded["contract"], user["content"], recorded["user"]))
    total = len(fixture["fallbacks"])
    report("prompts.json fallbacks", total - len(mismatches), total, "fallback prompts byte-exact (system + user)")
    assert is_overridden("GIL_COMPAT_PROMPTS") or total == 6
    assert not mismatches, mismatches


def test_the_narrowed_tree_contract_escapes_with_the_reference_string() -> None:
    fixture, tree = load_fixture()
    assert fixture["escape"] == KOREAN.out_of_category
    assert TreeAnswerContract(tree).narrowed("billing").escape(KOREAN) == fixture["escape"]
