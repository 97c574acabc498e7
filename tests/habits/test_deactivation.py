"""Deactivation: reliability, recency, the reasons a habit is proposed for retirement, and the store's view."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gil_core.errors import ConfigurationError
from gil_core.habits.deactivation import (
    DeactivationPolicy,
    DeactivationReason,
    ReliabilityCounts,
    ReliabilityWeights,
    Usage,
    count_usage,
    prepare_deactivation_round,
    propose_deactivations,
    read_reliability,
    read_usage,
    recency,
    reliability_score,
    served_habit,
)
from gil_core.habits.review_log import ReviewKind, ReviewLog
from gil_core.telemetry import TelemetryStore
from tests.habits.test_promotion import TREE, quiet, record_request

WEIGHTS = ReliabilityWeights(reinforce=1.0, penalty=3.0, prior_strength=2.0)
POLICY = DeactivationPolicy(
    half_life=100.0, stale_below=0.5, reliability_below=0.4, min_verdicts=3, dispute_rate=0.5, min_explored=4
)
RECENT = Usage({"refund": 99, "cost": 99, "reset": 99}, total=100)


def test_the_score_starts_at_one_half_and_moves_with_weighted_verdicts() -> None:
    assert reliability_score(ReliabilityCounts(), WEIGHTS) == 0.5
    assert reliability_score(ReliabilityCounts(reinforced=0, penalized=6), WEIGHTS) == 1 / 20
    assert reliability_score(ReliabilityCounts(reinforced=4, penalized=1), WEIGHTS) == 5 / 9


@given(reinforced=st.integers(0, 10_000), penalized=st.integers(0, 10_000))
def test_the_score_is_a_share_between_zero_and_one(reinforced: int, penalized: int) -> None:
    assert 0.0 < reliability_score(ReliabilityCounts(reinforced, penalized), WEIGHTS) < 1.0


def test_recency_halves_every_half_life_and_a_habit_never_used_counts_from_before_the_first_request() -> None:
    usage = Usage({"used": 49}, total=250)
    assert recency(usage, "used", 100.0) == 0.5**2
    assert recency(usage, "never", 125.0) == 0.25
    assert recency(Usage({"last": 9}, total=10), "last", 5.0) == 1.0


def test_a_habit_answered_only_in_a_habit_mode() -> None:
    accepted = [{"node": "billing", "outcome": "accept", "chosen": "invoice"}]
    assert served_habit("habit/template", accepted) == "invoice"
    assert served_habit("partial", accepted) is None  # its slots could not be filled: generation answered
    assert served_habit("habit/answer", []) is None
    usage = count_usage(["a", None, "b", "a", None])
    assert (dict(usage.last_index), usage.total) == ({"a": 3, "b": 2}, 5)


def test_each_habit_is_proposed_once_under_its_heaviest_reason_in_file_order() -> None:
    counts = {
        "reset": ReliabilityCounts(penalized=3, explored=4, disputed=4),
        "refund": ReliabilityCounts(explored=4, disputed=2),
    }
    usage = Usage({"reset": 0, "cost": 99}, total=100)
    proposals = propose_deactivations(quiet(TREE), counts, usage, WEIGHTS, POLICY)
    assert [(p.id, p.anchor, p.reason) for p in proposals] == [
        ("refund", "billing", DeactivationReason.DISPUTED),
        ("reset", "security", DeactivationReason.UNRELIABLE),
    ]
    assert proposals[1].score == 1 / 11 and proposals[1].recency == 0.5**0.99


def test_unreliable_needs_enough_verdicts_and_disputed_enough_cross_checks() -> None:
    counts = {"refund": ReliabilityCounts(penalized=2), "cost": ReliabilityCounts(explored=3, disputed=3)}
    assert propose_deactivations(quiet(TREE), counts, RECENT, WEIGHTS, POLICY) == []


def test_a_kept_habit_is_not_proposed_as_stale_again_but_is_when_verdicts_turn_against_it() -> None:
    counts = {"reset": ReliabilityCounts(penalized=3)}
    stale = Usage({}, total=200)
    proposals = propose_deactivations(quiet(TREE), counts, stale, WEIGHTS, POLICY, kept={"refund", "reset"})
    assert [(p.id, p.reason) for p in proposals] == [
        ("cost", DeactivationReason.STALE),
        ("reset", DeactivationReason.UNRELIABLE),
    ]


@pytest.mark.parametrize("field", ["half_life", "stale_below", "min_verdicts"])
def test_a_policy_with_a_negative_or_missing_scale_is_refused(field: str) -> None:
    values = {
        "half_life": 100.0,
        "stale_below": 0.5,
        "reliability_below": 0.4,
        "min_verdicts": 3,
        "dispute_rate": 0.5,
        "min_explored": 4,
    }
    with pytest.raises(ConfigurationError, match=field):
        DeactivationPolicy(**{**values, field: 0.0 if field == "half_life" else -1})
    with pytest.raises(ConfigurationError, match="prior_strength"):
        ReliabilityWeights(reinforce=1.0, penalty=1.0, prior_strength=0.0)


def test_a_round_reads_counters_and_usage_from_the_store_and_honours_kept_habits(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path)
    record_request(store, 0, mode="habit/answer", path=("root", "billing"), habit="refund")
    record_request(store, 1, mode="habit/answer", path=("root", "shipping"), habit="cost")
    record_request(store, 2, mode="fallback")
    row = {"scope": "support", "item_id": "cost", "reinforced": 0, "penalized": 2, "missed": 1, "explored": 0}
    store.append("habit_reliability", [{**row, "disputed": 0}, {**row, "penalized": 1, "missed": 0, "disputed": 0}])
    assert read_reliability(store, "support") == {"cost": ReliabilityCounts(penalized=3, missed=1)}
    usage = read_usage(store, "support")
    assert (dict(usage.last_index), usage.total) == ({"refund": 0, "cost": 1}, 3)
    policy = DeactivationPolicy(
        half_life=1.0, stale_below=0.3, reliability_below=0.4, min_verdicts=3, dispute_rate=0.5, min_explored=4
    )
    proposals = prepare_deactivation_round(store, "support", quiet(TREE), WEIGHTS, policy)
    assert [(p.id, p.reason) for p in proposals] == [
        ("refund", DeactivationReason.STALE),
        ("cost", DeactivationReason.UNRELIABLE),
        ("reset", DeactivationReason.STALE),
    ]
    ReviewLog(store).record("support", ReviewKind.DEACTIVATION, "reset", "rejected", "seasonal")
    kept = prepare_deactivation_round(store, "support", quiet(TREE), WEIGHTS, policy)
    assert [p.id for p in kept] == ["refund", "cost"]
