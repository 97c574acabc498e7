"""Promotion: which generated answers are proposed as habits, how a review writes them, and the round log."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gil_core.habits.costs import CostModelError, EvidenceTrace, JudgeCostModel
from gil_core.habits.promotion import (
    PromotionLog,
    PromotionPolicy,
    Proposal,
    RefusalReason,
    RejectReason,
    prepare_promotion_round,
    propose_promotions,
    review_promotions,
)
from gil_core.habits.review_log import ReviewKind, ReviewLog
from gil_core.habits.shadows import Evidence
from gil_core.ontology import Origin, Tree, TreeLintWarning, parse_tree
from gil_core.telemetry import CallRecord, CandidateShown, TelemetryStore, TraceRecord

BASE = datetime(2025, 3, 1, tzinfo=UTC)
NONE = "None of these"
TREE = """\
id: root
children:
- id: billing
  description: money
  options:
  - id: refund
    text: Refunds take 5 days.
- id: shipping
  description: parcels
  options:
  - id: cost
    text: Shipping is free.
- id: account
  description: sign-in
  children:
  - id: security
    description: passwords
    options:
    - id: reset
      text: Use the reset link.
- id: warranty
  description: repairs
"""
MODEL = JudgeCostModel(fixed=20.0, per_char=0.2, mean_state_chars=30.0, none_chars=5.0)
POLICY = PromotionPolicy(min_support=2, from_corrections=False, never_promote=frozenset({NONE}))


def quiet(text: str) -> Tree:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        return parse_tree(text)


def trace(
    index: int,
    anchor: str,
    output: str | None,
    *,
    verdict: str | None = "correct",
    correction: str | None = None,
    energy: float = 100.0,
    mode: str = "partial",
) -> EvidenceTrace:
    evidence = Evidence(f"request {index}", anchor, mode, output, verdict, correction)
    return EvidenceTrace(f"t-{index:04d}", evidence, energy)


def record_request(
    store: TelemetryStore,
    index: int,
    *,
    state: str = "a request",
    mode: str = "fallback",
    path: Sequence[str] = ("root",),
    habit: str | None = None,
    output: str | None = None,
    verdict: str | None = None,
    correction: str | None = None,
    judged: Sequence[tuple[str, Sequence[tuple[str, str]], float]] = (),
    fallback_energy: float = 0.0,
    task: str = "support",
) -> str:
    """Record request ``index`` (it arrived ``index`` seconds after BASE) with its judge and fallback calls."""
    trace_id = f"t-{index:04d}"
    at = BASE + timedelta(seconds=index)
    steps = [
        {"node": node, "layer": layer, "chosen": nxt, "outcome": "accept" if nxt else "exit"}
        for layer, (node, nxt) in enumerate(zip(path, [*path[1:], habit], strict=True), start=1)
    ]
    calls = [
        CallRecord(
            call_id=f"{trace_id}-j{number}",
            trace_id=trace_id,
            created_at=at,
            role="judge",
            model="m",
            node_id=node,
            energy=energy,
            candidates=[CandidateShown(None, "A")]
            + [CandidateShown(label, "B", label, description) for label, description in shown],
        )
        for number, (node, shown, energy) in enumerate(judged)
    ]
    if fallback_energy:
        calls.append(CallRecord(f"{trace_id}-f", trace_id, at, "fallback", "m", energy=fallback_energy))
    record = TraceRecord(
        trace_id,
        at,
        task,
        state,
        mode,
        path=steps,
        output=output,
        feedback_verdict=verdict,
        feedback_correction=correction,
    )
    store.record_trace(record, calls)
    return trace_id


def test_answers_are_grouped_by_anchor_and_exact_text_and_priced_against_the_anchor_volume() -> None:
    tree = quiet(TREE)
    evidence = [
        trace(0, "shipping", "Delivery takes 3 days.", energy=90.0),
        trace(1, "shipping", "Delivery takes 3 days. ", energy=110.0),  # trimmed: the same text
        trace(2, "shipping", "delivery takes 3 days", verdict="wrong"),  # counts toward the volume only
        trace(3, "shipping", None, verdict=None),
    ]
    [proposal] = propose_promotions(tree, evidence, MODEL, POLICY).proposals
    assert (proposal.anchor, proposal.text, proposal.sources) == (
        "shipping",
        "Delivery takes 3 days.",
        ("t-0000", "t-0001"),
    )
    assert (proposal.support, proposal.anchor_volume, proposal.expected_saving) == (2, 4, 2 / 4 * 100.0)
    assert proposal.description == "request 0"
    assert proposal.added_cost == MODEL.marginal(len(proposal.label) + len("request 0"))


def test_the_id_hashes_anchor_and_text_and_the_label_is_forty_code_points() -> None:
    text = "배송은 영업일 기준 3일에서 5일 정도 걸리며, 도서 산간 지역은 하루 이틀 더 걸릴 수 있습니다."
    [proposal] = propose_promotions(
        quiet(TREE), [trace(0, "shipping", text), trace(1, "shipping", text)], MODEL, POLICY
    ).proposals
    assert proposal.label == text[:40] and len(proposal.label) == 40
    assert proposal.id.startswith("promoted-") and len(proposal.id) == len("promoted-") + 10


def test_corrections_confirm_an_answer_only_when_the_policy_says_so() -> None:
    evidence = [trace(i, "billing", "Wrong.", verdict="wrong", correction="Invoices are emailed.") for i in range(2)]
    assert propose_promotions(quiet(TREE), evidence, MODEL, POLICY).proposals == ()
    with_corrections = PromotionPolicy(min_support=2, from_corrections=True)
    [proposal] = propose_promotions(quiet(TREE), evidence, MODEL, with_corrections).proposals
    assert proposal.text == "Invoices are emailed."


def test_nodes_with_children_and_habit_answers_give_no_evidence() -> None:
    evidence = [trace(i, "account", "Call us.") for i in range(3)] + [
        trace(i, "billing", "Call us.", mode="habit/answer") for i in range(3, 6)
    ]
    found = propose_promotions(quiet(TREE), evidence, MODEL, POLICY)
    assert (found.proposals, found.rejections) == ((), ())


def test_known_texts_and_never_promoted_texts_are_skipped_without_a_rejection() -> None:
    evidence = [trace(i, "shipping", text) for i, text in enumerate(["Shipping is free.", NONE] * 3)]
    found = propose_promotions(quiet(TREE), evidence, MODEL, POLICY)
    assert (found.proposals, found.rejections) == ((), ())


def test_rejections_say_why() -> None:
    tree = quiet(TREE)
    evidence = [
        trace(0, "shipping", "Only once."),
        trace(1, "shipping", "shipping is  FREE"),
        trace(2, "shipping", "shipping is  FREE"),
        trace(3, "billing", "Cheap.", energy=1.0),
        trace(4, "billing", "Cheap.", energy=1.0),
    ]
    found = propose_promotions(tree, evidence, MODEL, POLICY)
    assert [(r.anchor, r.text, r.support, r.reason) for r in found.rejections] == [
        ("shipping", "Only once.", 1, RejectReason.MIN_SUPPORT),
        ("shipping", "shipping is  FREE", 2, RejectReason.SAME_AS_EXISTING),
        ("billing", "Cheap.", 2, RejectReason.ENERGY),
    ]
    assert found.rejected_counts() == {"n_min": 1, "same_as_existing": 1, "energy": 1}


def test_a_label_the_judge_could_not_tell_from_a_sibling_is_same_as_existing() -> None:
    tree = quiet(TREE.replace("  - id: cost\n", "  - id: cost\n    label: Free shipping\n"))
    evidence = [trace(i, "shipping", "free shipping") for i in range(2)]
    assert propose_promotions(tree, evidence, MODEL, POLICY).rejected_counts() == {"same_as_existing": 1}


def test_a_node_without_habits_is_priced_a_new_call() -> None:
    [proposal] = propose_promotions(
        quiet(TREE), [trace(i, "warranty", "Two years.") for i in range(2)], MODEL, POLICY
    ).proposals
    assert proposal.added_cost == MODEL.new_call(len("Two years.") + len("request 0"))


def test_proposals_come_by_net_saving_highest_first() -> None:
    evidence = [trace(i, "billing", "Cheap answer.", energy=60.0) for i in range(2)]
    evidence += [trace(i, "shipping", "Dear answer.", energy=300.0) for i in range(2, 4)]
    found = propose_promotions(quiet(TREE), evidence, MODEL, POLICY)
    assert [p.text for p in found.proposals] == ["Dear answer.", "Cheap answer."]
    assert found.proposals[0].net_saving > found.proposals[1].net_saving > 0


def test_a_proposal_rejected_in_an_earlier_review_is_not_proposed_again() -> None:
    evidence = [trace(i, "billing", "Invoices are emailed.") for i in range(2)]
    [proposal] = propose_promotions(quiet(TREE), evidence, MODEL, POLICY).proposals
    again = propose_promotions(quiet(TREE), evidence, MODEL, POLICY, rejected_ids={proposal.id})
    assert again.proposals == () and again.rejected_counts() == {"rejected_before": 1}


def full_tree() -> Tree:
    options = "".join(f"  - id: o{n}\n    text: answer {n}\n" for n in range(9))
    return quiet(f"id: root\nlabel_scheme: digits\noptions:\n{options}")


def test_a_full_node_is_warned_and_the_review_refuses_it_as_needing_splitting() -> None:
    tree = full_tree()
    [proposal] = propose_promotions(
        tree, [trace(i, "root", "A tenth answer.") for i in range(2)], MODEL, POLICY
    ).proposals
    assert proposal.warned
    review = review_promotions(tree, [proposal])
    assert review.applied == () and [r.reason for r in review.refused] == [RefusalReason.NEEDS_SPLITTING]
    assert review.after_yaml == review.before_yaml


def test_a_review_appends_accepted_proposals_as_promoted_options() -> None:
    tree = quiet(TREE)
    evidence = [trace(i, "shipping", "Delivery takes 3 days.") for i in range(2)]
    evidence += [trace(i, "billing", "Invoices are emailed.") for i in range(2, 4)]
    first, second = propose_promotions(tree, evidence, MODEL, POLICY).proposals
    review = review_promotions(tree, [first, second], accepted={first.id})
    assert review.applied == (first,)
    assert [(r.proposal, r.reason) for r in review.refused] == [(second, RefusalReason.NOT_ACCEPTED)]
    added = review.tree.option(first.id)
    assert (added.origin, added.text, review.tree.owner(first.id).id) == (Origin.PROMOTED, first.text, first.anchor)
    assert [o.id for o in review.tree.node(first.anchor).options][-1] == first.id
    assert "origin: promoted" in review.after_yaml and "origin: promoted" not in review.before_yaml
    assert parse_tree(review.after_yaml).option(first.id) == added


@pytest.mark.parametrize(
    ("anchor", "text", "reason"),
    [
        ("gone", "Anything.", RefusalReason.NO_ANCHOR),
        ("account", "Anything.", RefusalReason.NO_ANCHOR),
        ("shipping", "Shipping is free.", RefusalReason.DUPLICATE),
    ],
)
def test_a_review_refuses_what_the_tree_cannot_take(anchor: str, text: str, reason: RefusalReason) -> None:
    proposal = Proposal(anchor, "promoted-0000000000", text[:40], "d", text, ("t",), 3, 3, 50.0, 1.0)
    assert [r.reason for r in review_promotions(quiet(TREE), [proposal]).refused] == [reason]


def test_the_round_log_reads_back_what_each_round_promoted(tmp_path: Path) -> None:
    log = PromotionLog(TelemetryStore(tmp_path))
    proposal = Proposal("shipping", "promoted-0123456789", "Fast.", "request", "Fast.", ("a", "b"), 2, 5, 40.0, 3.5)
    log.record("support", 120, [proposal])
    log.record("support", 60, [])
    log.record("other", 10, [proposal])
    assert log.rounds("support") == [60, 120]
    assert log.promotions("support", 120) == [proposal]
    assert log.promotions("support", 60) == []


def record_answered_at_shipping(store: TelemetryStore, count: int, output: str, *, state: str) -> None:
    """``count`` generated answers at shipping, each request a character longer, each judged at root and shipping."""
    shown = [("billing", "money"), ("shipping", "parcels")]
    for index in range(count):
        record_request(
            store,
            index,
            state=state + "?" * index,
            path=("root", "shipping"),
            output=output,
            verdict="correct",
            judged=[("root", shown, 60.0 + index), ("shipping", shown[1:], 40.0 + index)],
            fallback_energy=200.0,
        )


def test_a_round_over_the_store_fits_its_cost_model_and_honours_rejections(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path)
    record_answered_at_shipping(store, 4, "Delivery takes 3 days.", state="how long does delivery take ")
    tree = quiet(TREE)
    prepared = prepare_promotion_round(store, "support", tree, POLICY, none_text=NONE, at_index=3)
    assert prepared.at_index == 3 and prepared.cost_model.mean_state_chars == pytest.approx(29.0)
    assert list(prepared.judge_energy) == ["root", "shipping"]
    [proposal] = prepared.proposals.proposals
    assert proposal.sources == ("t-0000", "t-0001", "t-0002")
    ReviewLog(store).record("support", ReviewKind.PROMOTION, proposal.id, "rejected", "too vague")
    again = prepare_promotion_round(store, "support", tree, POLICY, none_text=NONE)
    assert again.at_index == 4 and again.proposals.rejected_counts() == {"rejected_before": 1}


def test_a_round_without_judge_calls_to_price_a_habit_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(CostModelError):
        prepare_promotion_round(TelemetryStore(tmp_path), "support", quiet(TREE), POLICY, none_text=NONE)


def test_a_round_never_promotes_none_of_these_and_stops_at_the_log_it_has(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path)
    record_answered_at_shipping(store, 3, NONE, state="are you open on sunday")
    lenient = PromotionPolicy(min_support=2, from_corrections=False)
    prepared = prepare_promotion_round(store, "support", quiet(TREE), lenient, none_text=NONE, at_index=99)
    assert prepared.at_index == 3
    assert (prepared.proposals.proposals, prepared.proposals.rejections) == ((), ())
