"""The review log: decisions recorded in ``reviews`` and read back, the latest per item."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gil_core.errors import ConfigurationError, TelemetryError
from gil_core.habits.review_log import Decision, ReviewKind, ReviewLog
from gil_core.telemetry import TelemetryStore

EARLY = datetime(2025, 3, 1, 9, tzinfo=UTC)
LATE = EARLY + timedelta(days=7)


def test_a_decision_is_stored_as_a_reviews_row(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path)
    entry = ReviewLog(store).record("support", "promotion", "promoted-0123456789", "accepted", "검토 완료 — 좋음")
    assert (entry.kind, entry.decision) == (ReviewKind.PROMOTION, Decision.ACCEPTED)
    [row] = store.read("reviews").to_dicts()
    assert {k: v for k, v in row.items() if k != "reviewed_at"} == {
        "task": "support",
        "kind": "promotion",
        "item_id": "promoted-0123456789",
        "decision": "accepted",
        "note": "검토 완료 — 좋음",
    }
    assert row["reviewed_at"] == entry.reviewed_at


def test_the_latest_decision_per_item_counts(tmp_path: Path) -> None:
    log = ReviewLog(TelemetryStore(tmp_path))
    log.record("support", ReviewKind.DEACTIVATION, "refund", Decision.REJECTED, reviewed_at=LATE)
    log.record("support", ReviewKind.DEACTIVATION, "refund", Decision.ACCEPTED, reviewed_at=EARLY)  # entered late
    log.record("support", ReviewKind.DEACTIVATION, "cost", Decision.ACCEPTED, reviewed_at=LATE)
    log.record("support", ReviewKind.DEACTIVATION, "cost", Decision.DEFERRED, "ask billing", reviewed_at=LATE)
    decisions = log.decisions("support", ReviewKind.DEACTIVATION)
    assert {item: entry.decision for item, entry in decisions.items()} == {
        "refund": Decision.REJECTED,
        "cost": Decision.DEFERRED,  # the same time: the one written last
    }
    assert log.rejected("support", ReviewKind.DEACTIVATION) == {"refund"}


def test_kinds_and_tasks_are_kept_apart(tmp_path: Path) -> None:
    log = ReviewLog(TelemetryStore(tmp_path))
    log.record("support", ReviewKind.PROMOTION, "refund", Decision.REJECTED)
    log.record("support", ReviewKind.DEACTIVATION, "refund", Decision.ACCEPTED)
    log.record("sales", ReviewKind.PROMOTION, "refund", Decision.ACCEPTED)
    assert log.rejected("support", ReviewKind.PROMOTION) == {"refund"}
    assert log.rejected("support", ReviewKind.DEACTIVATION) == frozenset()
    assert log.rejected("sales", "promotion") == frozenset()
    assert sorted(log.decisions("support")) == ["deactivation:refund", "promotion:refund"]


def test_an_unknown_kind_or_decision_is_refused_on_write_and_reported_on_read(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path)
    log = ReviewLog(store)
    with pytest.raises(ConfigurationError, match="pruning"):
        log.record("support", "pruning", "refund", Decision.ACCEPTED)
    with pytest.raises(ConfigurationError, match="maybe"):
        log.record("support", ReviewKind.PROMOTION, "refund", "maybe")
    row = {"task": "support", "reviewed_at": EARLY, "kind": "promotion", "item_id": "x", "decision": "maybe"}
    store.append("reviews", [{**row, "note": None}])
    with pytest.raises(TelemetryError, match="'x'"):
        log.decisions("support")
