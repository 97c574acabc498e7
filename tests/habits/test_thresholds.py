"""Threshold selection: the isotonic choice over (confidence, right) pairs, the replay that makes those pairs
from judged traces (layers, leaf, memory against earlier confirmed requests only), and one run over a store."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from gil_core.errors import ConfigurationError
from gil_core.fallback import TreeAnswerContract
from gil_core.habits.thresholds import (
    ThresholdChoice,
    choose_threshold,
    judgment_pairs,
    nearest_earlier,
    select_thresholds,
)
from gil_core.ontology import Node, Option, OptionKind, Slot, Tree
from gil_core.tasks import TaskDefinition, TaskPolicy
from gil_core.telemetry import CallRecord, TelemetryStore, TraceRecord
from gil_core.testing import HashEmbeddingModel
from gil_core.traverse import Thresholds

REFUND, RESET = "Refunds take 5 days", "Use the reset link"
TREE = Tree(
    Node(
        "root",
        children=(
            Node(
                "billing",
                options=(
                    Option("refund", text=REFUND),
                    Option("quote", kind=OptionKind.TEMPLATE, template="{x}", slots=(Slot("x", "amount"),)),
                ),
            ),
            Node("account", options=(Option("reset", text=RESET),)),
        ),
    )
)
START = datetime(2026, 1, 1, tzinfo=UTC)


# -- choosing over pairs ---------------------------------------------------------------------------------------


def test_on_rising_precision_the_threshold_meets_the_target_on_held_out_answers() -> None:
    rng = np.random.default_rng(7)
    confidence = rng.uniform(0.0, 1.0, 6000)
    right = rng.uniform(0.0, 1.0, 6000) < confidence  # P(right | confidence) = confidence
    fit, held_out = slice(0, 3000), slice(3000, None)
    choice = choose_threshold(confidence[fit], right[fit], target_precision=0.9, minimum_answered=100)
    assert choice.threshold is not None and choice.answered >= 100 and choice.precision >= 0.9  # type: ignore[operator]
    accepted = confidence[held_out] >= choice.threshold
    assert right[held_out][accepted].mean() >= 0.9 and accepted.sum() >= 100


def test_when_no_threshold_meets_the_target_the_report_says_so_with_the_best_precision() -> None:
    rng = np.random.default_rng(8)
    confidence = rng.uniform(0.0, 1.0, 2000)
    right = rng.uniform(0.0, 1.0, 2000) < 0.6  # precision does not rise with confidence
    choice = choose_threshold(confidence, right, target_precision=0.9, minimum_answered=200)
    assert choice.threshold is None and choice.counted == 2000
    assert choice.precision is not None and 0.55 < choice.precision < 0.9 and choice.answered >= 200


def test_the_lowest_confidence_whose_bands_all_meet_the_target_is_chosen() -> None:
    choice = choose_threshold([0.2, 0.4, 0.6, 0.8], [0, 1, 1, 1], target_precision=0.9, minimum_answered=2)
    assert choice == ThresholdChoice(threshold=0.4, precision=1.0, answered=3, counted=4)


def test_a_good_low_band_cannot_set_the_threshold_when_a_higher_band_falls_short() -> None:
    confidences = [0.5] * 10 + [0.9] * 10
    rights = [1] * 10 + [1, 0] * 5  # isotonic pooling: 0.75 everywhere
    choice = choose_threshold(confidences, rights, target_precision=0.9, minimum_answered=5)
    assert choice.threshold is None and choice.precision == 0.75 and choice.answered == 20


def test_too_few_answers_above_the_band_that_meets_the_target_give_no_threshold() -> None:
    choice = choose_threshold([0.1, 0.2, 0.9, 0.95], [0, 0, 1, 1], target_precision=0.9, minimum_answered=3)
    assert choice.threshold is None and choice.answered == 3 and choice.precision == pytest.approx(2 / 3)


def test_no_answers_give_no_threshold_and_no_precision() -> None:
    assert choose_threshold([], [], target_precision=0.9, minimum_answered=1) == ThresholdChoice(None, None, 0, 0)


@pytest.mark.parametrize(("target", "minimum"), [(0.0, 1), (1.1, 1), (0.9, 0)])
def test_target_and_minimum_are_validated(target: float, minimum: int) -> None:
    with pytest.raises(ConfigurationError):
        choose_threshold([0.5], [1], target_precision=target, minimum_answered=minimum)


# -- memory replay: only earlier confirmed requests -------------------------------------------------------------


def test_each_request_is_looked_up_only_among_earlier_held_requests_ties_to_the_earliest() -> None:
    vectors = [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    held = [True, True, False, True, True, True]
    nearest, similarity = nearest_earlier(vectors, held)
    assert nearest.tolist() == [-1, 0, 0, 0, 0, 0]
    assert np.isnan(similarity[0])
    assert similarity[1:4].tolist() == [1.0, 0.0, 1.0]
    assert similarity[4] == 0.0  # a zero vector is similar to nothing
    assert similarity[5] == pytest.approx(np.sqrt(0.5))  # row 2 is not held, so its 1.0·0.7 never counts


# -- judgments as pairs -------------------------------------------------------------------------------------------


def step(node: str, layer: int, p: float, chosen: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"node": node, "layer": layer, "chosen": chosen, "p": p, "outcome": "accept" if chosen else "exit", **extra}


def row(number: int, path: list[dict[str, Any]], verdict: str, output: str, **extra: Any) -> dict[str, Any]:
    return {
        "trace_id": f"t{number}",
        "mode": extra.pop("mode", "partial"),
        "path": json.dumps(path),
        "output": output,
        "feedback_verdict": verdict,
        "feedback_correction": extra.pop("correction", None),
        **extra,
    }


def pairs_of(*rows: dict[str, Any], untrusted: frozenset[tuple[str, str]] = frozenset()) -> Any:
    return judgment_pairs(TREE, pl.DataFrame(list(rows)), untrusted)


def test_a_layer_judgment_is_right_when_the_confirmed_answer_lies_in_the_chosen_subtree() -> None:
    layers, _ = pairs_of(
        row(1, [step("root", 1, 0.9, "billing")], "correct", REFUND),
        row(2, [step("root", 1, 0.8, "billing")], "wrong", "x", correction=RESET),
        row(3, [step("root", 1, 0.7, "account")], "correct", "not a habit"),  # unknown: skipped
    )
    assert layers == {1: ([0.9, 0.8], [True, False])}


def test_a_low_confidence_exit_counts_with_the_winner_read_from_its_probabilities() -> None:
    exit_step = step("root", 1, 0.55, probs={"billing": 0.55, "account": 0.3}, none_prob=0.15)
    none_won = step("root", 1, 0.5, probs={"billing": 0.3, "account": 0.2}, none_prob=0.5)
    layers, _ = pairs_of(
        row(1, [exit_step], "wrong", "x", correction=REFUND, mode="fallback"),
        row(2, [none_won], "wrong", "x", correction=REFUND, mode="fallback"),
    )
    assert layers == {1: ([0.55], [True])}


def test_untrusted_judgments_are_no_answers_at_any_threshold() -> None:
    exit_step = step("root", 1, 0.55, probs={"billing": 0.55, "account": 0.3}, none_prob=0.15)
    layers, _ = pairs_of(row(1, [exit_step], "wrong", "x", correction=REFUND), untrusted=frozenset({("t1", "root")}))
    assert layers == {}


def test_a_leaf_judgment_is_right_when_it_chose_the_confirmed_habit_or_its_output_was_correct() -> None:
    to_billing = step("root", 1, 0.9, "billing")
    _, leaf = pairs_of(
        row(1, [to_billing, step("billing", 2, 0.95, "refund")], "correct", REFUND, mode="habit/answer"),
        row(2, [to_billing, step("billing", 2, 0.85, "refund")], "wrong", REFUND, mode="habit/answer"),
        row(3, [to_billing, step("billing", 2, 0.75, "quote")], "correct", "$5", mode="habit/template"),
        row(4, [to_billing, step("billing", 2, 0.65, "shadow-1", outcome="defer")], "correct", REFUND),
    )
    assert leaf == ([0.95, 0.85, 0.75], [True, False, True])


# -- over a store ------------------------------------------------------------------------------------------------


def record(store: TelemetryStore, number: int, text: str, path: list[dict[str, Any]], **fields: Any) -> None:
    calls = fields.pop("calls", ())
    store.record_trace(
        TraceRecord(
            trace_id=f"t{number}", created_at=START + timedelta(seconds=number), task="support", state=text,
            path=path, **fields,
        ),
        calls,
    )  # fmt: skip


async def test_a_store_is_replayed_in_request_order_for_layers_leaf_and_memory(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path)
    for number in range(40):
        p = 0.5 + 0.01 * number
        path = [step("root", 1, p, "billing"), step("billing", 2, p, "refund")]
        if p >= 0.7 - 1e-9:  # routed well from 0.7 up
            record(store, number, f"how long do refunds take {number}", path, mode="habit/answer",
                   output=REFUND, feedback_verdict="correct")  # fmt: skip
        else:
            record(store, number, f"reset my password please {number}", path, mode="habit/answer",
                   output=REFUND, feedback_verdict="wrong", feedback_correction=RESET)  # fmt: skip
    untrusted_exit = step("root", 1, 0.6, probs={"billing": 0.6, "account": 0.3}, none_prob=0.1)
    judge = CallRecord(call_id="c40", trace_id="t40", created_at=START, role="judge", model="m", node_id="root",
                       label_mass=0.5)  # fmt: skip
    record(store, 40, "refund?", [untrusted_exit], mode="fallback", output="x", feedback_verdict="wrong",
           feedback_correction=RESET, calls=[judge])  # fmt: skip
    # logged recalls: one against an earlier request (kept), one against a later one (dropped)
    record(store, 41, "refunds", [], mode="memory", output=REFUND, feedback_verdict="correct",
           recall={"source": "t39", "similarity": 0.97, "threshold": 0.9, "hit": True})  # fmt: skip
    record(store, 42, "resets", [], mode="fallback", output=RESET, feedback_verdict="correct",
           recall={"source": "t43", "similarity": 0.8, "threshold": 0.9, "hit": False})  # fmt: skip
    record(store, 43, "later", [], mode="fallback", output=RESET, feedback_verdict="correct")
    record(store, 44, "never judged", [], mode="fallback", output=RESET)
    store.record_trace(TraceRecord(trace_id="o1", created_at=START, task="other", state="x", mode="memory",
                                   feedback_verdict="correct", output="y"))  # fmt: skip
    task = TaskDefinition(
        name="support",
        contract=TreeAnswerContract(TREE),
        tree=TREE,
        policy=TaskPolicy(thresholds=Thresholds(per_layer=(0.5,), leaf=0.5)),
    )

    report = await select_thresholds(
        store, task, target_precision=0.9, minimum_answered=5, embedder=HashEmbeddingModel()
    )
    assert list(report.layers) == [1]
    assert report.layers[1].threshold == pytest.approx(0.7)
    assert (report.layers[1].precision, report.layers[1].answered, report.layers[1].counted) == (1.0, 20, 40)
    assert report.leaf.threshold == pytest.approx(0.7) and report.leaf.counted == 40
    assert report.memory.counted == 43  # every judged request but the first has an earlier confirmed one
    assert report.memory.precision == 1.0 and report.memory.threshold is not None

    logged = await select_thresholds(store, task, target_precision=0.9, minimum_answered=1)
    assert logged.memory == ThresholdChoice(threshold=0.97, precision=1.0, answered=1, counted=1)
    assert logged.layers == report.layers and logged.leaf == report.leaf
