"""The learned-reflex benchmark's protocol (``benchmarks.learned``): its streams, its arms, the policy they run
with and the fixed numbers every part reads, and the tree helpers (an answer's top category, a tree's prior texts)
that its parts and the other learned-reflex benchmarks share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from benchmarks._quality_streams import Stream, _bundled_stream, home_stream, support_stream
from gil_core.ontology import Tree
from gil_core.tasks import LearnedPolicy

__all__ = [
    "ARMS",
    "COMMAND",
    "DESIGN_ARMS",
    "GROUPED_AFTER",
    "LEARNED",
    "LOCO_SENT",
    "LOCO_TRAIN",
    "POLICY",
    "REFLEX_THRESHOLD",
    "SAMPLE",
    "STREAMS",
    "WARMUP",
    "Arm",
    "StreamSpec",
    "assistant_stream",
    "categories_of",
    "top_category",
]

COMMAND = "uv run --extra local python -m benchmarks.learned"
POLICY = LearnedPolicy(precision=0.97)  # the demo task file's learned_reflex, chosen before any run
REFLEX_THRESHOLD = 0.9  # the quality benchmark's reflex arm
WARMUP = 150  # "after 150 confirmed": requests from position 150 on
SAMPLE = 300  # the LLM baselines' sample on longer streams
LOCO_TRAIN = 150
LOCO_SENT = 50
GROUPED_AFTER = 20


def assistant_stream() -> Stream:
    files = ("assistant_requests.jsonl", "assistant_answers.jsonl")
    source = (
        "data/assistant_requests.jsonl + answers (scripts/make_assistant_data.py, ovos-switchboard-pipeline-plugin)"
    )
    return _bundled_stream("assistant", "Voice assistant (OVOS switchboard examples)", files, source)


@dataclass(frozen=True)
class StreamSpec:
    name: str
    load: Callable[[], Stream]
    size: int


STREAMS = (
    StreamSpec("support", support_stream, 300),
    StreamSpec("home", home_stream, 600),
    StreamSpec("assistant", assistant_stream, 842),
)


@dataclass(frozen=True)
class Arm:
    key: str
    title: str
    policy: dict[str, Any]
    local: bool  # the real local LLM, or the stand-in
    sample: bool = False  # a random sample of SAMPLE requests where the stream is longer
    grouped: bool = False


LEARNED = {"learned": POLICY}
ARMS = (
    Arm("learned", "learned reflex (the demo's settings)", LEARNED, local=True),
    Arm("reflex", "tree + description reflex 0.9", {"reflex_threshold": REFLEX_THRESHOLD}, local=True, sample=True),
    Arm("generation", "full generation", {"use_tree": False, "memory_threshold": None}, local=True, sample=True),
)
DESIGN_ARMS = (
    Arm("standin", "learned, evidence pooled by layer", LEARNED, local=False),
    Arm(
        "standin-node",
        "learned, evidence per node only",
        {"learned": replace(POLICY, pooling="node")},
        local=False,
    ),
    Arm("standin-grouped", "learned, feedback grouped by category", LEARNED, local=False, grouped=True),
)


def top_category(tree: Tree, option: str | None) -> str | None:
    """The root's child an answer lies under (the root for an answer of its own; None: none of these)."""
    if option is None:
        return None
    path = tree.path_to(tree.owner(option).id)
    return path[1].id if len(path) > 1 else tree.root.id


def categories_of(stream: Stream, tree: Tree) -> dict[str, str | None]:
    """Each request's top category (``top_category``)."""
    return {request.id: top_category(tree, request.option_id) for request in stream.requests}


def _prior_texts(tree: Tree) -> list[str]:
    from gil_core.learned import prior_texts

    return list(
        dict.fromkeys(text for node, _ in tree.iter_nodes() for item in (node.children or node.options)
                      for text in prior_texts(tree, item))
    )  # fmt: skip
