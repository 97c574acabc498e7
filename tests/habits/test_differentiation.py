"""Differentiation: capacity, anchored and unserved signals."""

from __future__ import annotations

from pathlib import Path

import pytest

from gil_core.errors import ConfigurationError
from gil_core.habits.differentiation import (
    AnchoredKind,
    DifferentiationPolicy,
    anchored_signals,
    capacity_signals,
    group_unserved,
    prepare_differentiation_round,
    unserved_requests,
    unserved_signals,
)
from gil_core.habits.review_log import ReviewKind, ReviewLog
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel
from tests.habits.test_promotion import NONE, TREE, full_tree, quiet, record_request, trace


def test_capacity_flags_nodes_within_the_headroom_of_their_schemes_capacity() -> None:
    tree = full_tree()  # nine habits under the digits scheme: full
    assert [(s.node, s.candidates, s.capacity) for s in capacity_signals(tree, 0)] == [("root", 9, 9)]
    assert capacity_signals(quiet(TREE), 0) == []
    assert [s.node for s in capacity_signals(quiet(TREE), 21)] == ["root"]  # four children: 25 − 21
    assert capacity_signals(quiet(TREE), 20) == []
    assert capacity_signals(tree, 2, dismissed={"capacity-root"}) == []


def test_repeated_correct_answers_at_a_node_with_children_say_where_the_answer_lives() -> None:
    evidence = [trace(i, "account", "Use the reset link.") for i in range(2)]  # a habit below: missed
    evidence += [trace(i, "account", "Refunds take 5 days.") for i in range(2, 5)]  # a habit elsewhere
    evidence += [trace(i, "root", "We are open on Sundays.") for i in range(5, 7)]  # no habit at all
    signals = anchored_signals(quiet(TREE), evidence, min_support=2)
    assert [(s.kind, s.node, s.target, s.support) for s in signals] == [
        (AnchoredKind.MISSED, "account", "security", 2),
        (AnchoredKind.REANCHOR, "account", "billing", 3),
        (AnchoredKind.ORPHAN, "root", None, 2),
    ]
    assert signals[1].sources == ("t-0002", "t-0003", "t-0004")


def test_anchored_signals_come_by_node_then_support_and_skip_what_does_not_count() -> None:
    evidence = [trace(i, "root", "Use the reset link.") for i in range(2)]
    evidence += [trace(i, "root", "Shipping is free.") for i in range(2, 5)]
    evidence += [trace(i, "account", "Use the reset link.") for i in range(5, 7)]
    evidence += [trace(i, "root", NONE) for i in range(7, 10)]  # "none of these" is never a signal
    evidence += [trace(i, "root", "Refunds take 5 days.", verdict="wrong", correction="x") for i in range(10, 13)]
    evidence += [trace(i, "billing", "Refunds take 5 days.") for i in range(13, 16)]  # no children: promotion's
    signals = anchored_signals(quiet(TREE), evidence, min_support=2, never={NONE})
    assert [(s.node, s.output) for s in signals] == [
        ("account", "Use the reset link."),
        ("root", "Shipping is free."),
        ("root", "Use the reset link."),
    ]
    dismissed = {signals[0].id}
    assert len(anchored_signals(quiet(TREE), evidence, min_support=2, never={NONE}, dismissed=dismissed)) == 2


def test_unserved_requests_are_none_answers_nobody_corrected() -> None:
    evidence = [trace(0, "root", NONE), trace(1, "root", f" {NONE} ", verdict=None)]
    evidence += [trace(2, "root", NONE, verdict="wrong", correction="Open at 9."), trace(3, "root", "Open at 9.")]
    assert [t.trace_id for t in unserved_requests(evidence, none_text=NONE)] == ["t-0000", "t-0001"]


def test_unserved_requests_join_transitively_and_the_largest_group_comes_first() -> None:
    traces = [trace(i, "root", NONE) for i in range(6)]
    # at 0°, 90°, 30°, ~90°, 60° in one plane, and one apart: 0-2-4-1-3 chain at cosine 0.866 (scale is no matter)
    vectors = [[1.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.866, 0.5, 0.0], [0.0, 1.0, 0.1], [1.0, 1.732, 0.0], [0, 0, 2.0]]
    groups = group_unserved(traces, vectors, threshold=0.85, min_support=2)
    assert [g.sources for g in groups] == [("t-0000", "t-0001", "t-0002", "t-0003", "t-0004")]
    assert groups[0].requests[0] == "request 0" and groups[0].support == 5
    two = group_unserved(traces, vectors, threshold=0.99, min_support=2)
    assert [g.sources for g in two] == [("t-0001", "t-0003")]
    assert [g.support for g in group_unserved(traces, vectors, threshold=0.99, min_support=1)] == [2, 1, 1, 1, 1]


def test_unserved_grouping_needs_one_vector_per_request() -> None:
    with pytest.raises(ConfigurationError):
        group_unserved([trace(0, "root", NONE)], [], threshold=0.8, min_support=1)
    assert group_unserved([], [], threshold=0.8, min_support=1) == []


async def test_unserved_signals_embed_the_requests_with_the_given_model() -> None:
    evidence = [trace(i, "root", NONE) for i in range(3)]
    groups = await unserved_signals(evidence, HashEmbeddingModel(), none_text=NONE, threshold=0.5, min_support=3)
    assert [g.requests for g in groups] == [("request 0", "request 1", "request 2")]
    assert await unserved_signals([], HashEmbeddingModel(), none_text=NONE, threshold=0.5, min_support=1) == []


async def test_a_round_reads_the_log_and_keeps_dismissed_signals_dismissed(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path)
    for index in range(3):
        record_request(store, index, path=("root", "account"), output="Use the reset link.", verdict="correct")
    for index in range(3, 5):
        record_request(store, index, state="are you open on sunday", output=NONE, verdict="correct")
    policy = DifferentiationPolicy(headroom=0, min_support=3, similarity=0.9, unserved_min_support=2)
    report = await prepare_differentiation_round(
        store, "support", full_tree(), policy, none_text=NONE, embedder=HashEmbeddingModel()
    )
    assert [s.node for s in report.capacity] == ["root"]
    assert report.anchored == []  # in this tree, account is no node: nothing is anchored there
    assert [g.sources for g in report.unserved] == [("t-0003", "t-0004")]
    report = await prepare_differentiation_round(
        store, "support", quiet(TREE), policy, none_text=NONE, embedder=HashEmbeddingModel()
    )
    [signal] = report.anchored
    ReviewLog(store).record("support", ReviewKind.DIFFERENTIATION, signal.id, "rejected")
    report = await prepare_differentiation_round(
        store, "support", quiet(TREE), policy, none_text=NONE, embedder=HashEmbeddingModel()
    )
    assert report.anchored == [] and len(report.unserved) == 1
