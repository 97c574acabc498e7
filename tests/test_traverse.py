"""Greedy traversal with the real single-token judge over a scripted model: steps, thresholds and shadows."""

from __future__ import annotations

import math
import warnings

import pytest

from gil_core.errors import ConfigurationError
from gil_core.judge import Candidate, SingleTokenJudge
from gil_core.language import ENGLISH
from gil_core.ontology import Tree, TreeLintWarning, load_tree
from gil_core.testing import ScriptedChatModel
from gil_core.traverse import GreedyTraverser, Thresholds
from tests.conformance._fixtures import FIXTURES


@pytest.fixture(scope="module")
def tree() -> Tree:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        return load_tree(FIXTURES / "trees" / "support.yaml")


def pick(model: ScriptedChatModel, label: str, p: float) -> None:
    """Script one judgment: ``label`` at probability ``p``, the rest on "none" (label A)."""
    model.enqueue(label, top_logprobs=[(label, math.log(p)), ("A", math.log(1 - p))])


THRESHOLDS = Thresholds(per_layer=(0.6, 0.8), leaf=0.7)


async def test_a_confident_walk_reaches_a_habit(tree: Tree) -> None:
    model = ScriptedChatModel()
    pick(model, "C", 0.95)  # root: B billing, C shipping, ...
    pick(model, "D", 0.9)  # shipping: B track-order, C delivery-time, D shipping-cost
    walk = await GreedyTraverser(SingleTokenJudge(model, ENGLISH), THRESHOLDS).traverse("how much?", tree)
    assert [s.outcome for s in walk.steps] == ["accept", "accept"]
    assert walk.habit is not None and walk.habit.id == "shipping-cost" and walk.exit_reason is None
    assert walk.confirmed == ("shipping", "shipping-cost")
    assert walk.steps[0].to_json()["chosen"] == "shipping" and walk.steps[1].layer == 2


async def test_the_second_layer_threshold_applies_to_deeper_categories(tree: Tree) -> None:
    model = ScriptedChatModel()
    pick(model, "D", 0.95)  # root → account
    pick(model, "B", 0.75)  # account (layer 2, threshold 0.8) → security at 0.75 is too low
    walk = await GreedyTraverser(SingleTokenJudge(model, ENGLISH), THRESHOLDS).traverse("password", tree)
    assert walk.exit_reason == "low_confidence" and walk.steps[-1].node == "account"
    assert walk.steps[-1].chosen is None and walk.steps[-1].p == pytest.approx(0.75)


async def test_a_category_without_habits_is_skipped_without_a_call(tree: Tree) -> None:
    model = ScriptedChatModel()
    pick(model, "F", 0.95)  # root → warranty
    walk = await GreedyTraverser(SingleTokenJudge(model, ENGLISH), THRESHOLDS).traverse("broken", tree)
    assert [(s.node, s.outcome) for s in walk.steps] == [("root", "accept"), ("warranty", "skip")]
    assert walk.exit_reason == "skip" and len(model.history) == 1


async def test_a_chosen_shadow_defers_to_generation(tree: Tree) -> None:
    model = ScriptedChatModel()
    pick(model, "F", 0.95)  # root → warranty, where only a shadow is known
    pick(model, "B", 0.9)
    shadow = Candidate("shadow-0123456789", "repair", "asks about repairs", answer="We repair within 10 days.")
    walk = await GreedyTraverser(SingleTokenJudge(model, ENGLISH), THRESHOLDS).traverse(
        "repair?", tree, shadows={"warranty": [shadow]}
    )
    assert walk.exit_reason == "shadow" and walk.steps[-1].outcome == "defer"
    assert walk.shadow is not None and walk.shadow.answer == "We repair within 10 days."
    assert "repair — asks about repairs" in model.history[-1].messages[1]["content"]


async def test_none_of_these_exits_even_above_threshold(tree: Tree) -> None:
    model = ScriptedChatModel()
    model.enqueue("A", top_logprobs=[("A", 0.0)])
    walk = await GreedyTraverser(SingleTokenJudge(model, ENGLISH), THRESHOLDS).traverse("hello", tree)
    assert walk.exit_reason == "none_selected" and walk.steps[0].none_prob == 1.0


async def test_an_untrusted_judgment_exits_first(tree: Tree) -> None:
    model = ScriptedChatModel()
    model.enqueue("Sure", top_logprobs=[("Sure", math.log(0.7)), ("C", math.log(0.3))])
    walk = await GreedyTraverser(SingleTokenJudge(model, ENGLISH), THRESHOLDS).traverse("hello", tree)
    assert walk.exit_reason == "untrusted"


@pytest.mark.parametrize(("per_layer", "leaf"), [((), 0.5), ((0.5,), 1.5), ((float("nan"),), 0.5), ((-0.1,), 0.5)])
def test_thresholds_refuse_nonsense(per_layer: tuple[float, ...], leaf: float) -> None:
    with pytest.raises(ConfigurationError):
        Thresholds(per_layer=per_layer, leaf=leaf)
