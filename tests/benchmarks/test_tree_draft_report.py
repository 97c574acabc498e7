"""The tree-draft benchmark's reading (benchmarks/tree_draft.py): each request's key answer mapped to the drafted
option that gives it (a template through its slots), and the rows the report prints against the hand tree."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from benchmarks.feedback_queue import STREAMS
from benchmarks.tree_draft import MISSING, Arm, _mapped, section
from gil_core.ontology.model import OptionKind
from gil_core.testing import HashEmbeddingModel
from gil_core.tree_draft import AnsweredRequest, draft_tree


def test_each_request_maps_to_the_drafted_option_that_gives_its_answer_or_to_none_or_to_missing() -> None:
    (spec,) = [spec for spec in STREAMS if spec.name == "support"]
    requests = spec.load().requests[: spec.size]
    rows = [AnsweredRequest(request.text, request.expected) for request in requests[:150]]
    tree = asyncio.run(draft_tree(rows, HashEmbeddingModel())).tree
    data: Any = SimpleNamespace(spec=spec)
    mapped = _mapped(tree, data)
    assert len(mapped) == len(requests)
    kinds = {option.id: option for option, _ in tree.options()}
    for request, option_id in zip(requests, mapped, strict=True):
        if option_id is None:
            assert request.option_id is None  # none of these, in both trees
        elif option_id != MISSING:
            option = kinds[option_id]
            assert option.text == request.expected or option.kind is OptionKind.TEMPLATE
    templated = [i for i in mapped if i is not None and i != MISSING and kinds[i].kind is OptionKind.TEMPLATE]
    assert len(templated) >= 30  # the tracking, return-label and invoice replies, each filled from its request


def test_the_report_sets_each_draft_against_the_hand_tree_of_the_same_run() -> None:
    hand = Arm("the tree written by hand", 12, 3, 5, 300, 300, None, 84, 99)
    draft = Arm("drafted from the whole stream", 12, 3, 2, 300, 300, 0.41, 87, 99, 0.6)
    rendered = section({"support": [hand, draft]}, "cmd").render()
    assert "| support: the tree written by hand | (reported) | 12 options (3 templates) in 5 categories" in rendered
    assert "ARI 0.41; the learned judge right on never-seen requests after 150: 87.9% (87/99) (+3.0 points)" in (
        rendered
    )
