"""The port's value objects: a recall as the traces table's ``recall`` JSON, and a failed lookup as a miss."""

from __future__ import annotations

import pytest

from gil_core.memory import MemoryEntry, Recall


def test_a_recall_writes_its_json_without_null_fields() -> None:
    recall = Recall.from_nearest(MemoryEntry("t-1", "where is my refund", "Soon.", similarity=0.8), threshold=0.8)
    assert recall.hit and (recall.answer, recall.text) == ("Soon.", "where is my refund")
    assert recall.to_json() == {"source": "t-1", "similarity": 0.8, "threshold": 0.8, "hit": True}


def test_a_failed_lookup_is_a_miss_that_keeps_the_error() -> None:
    recall = Recall(threshold=0.9, hit=False, error="memory of task 'support': circuit open")
    assert recall.to_json() == {"threshold": 0.9, "hit": False, "error": "memory of task 'support': circuit open"}


def test_only_a_search_result_can_become_a_recall() -> None:
    with pytest.raises(ValueError, match="no similarity"):
        Recall.from_nearest(MemoryEntry("t-1", "where is my refund", "Soon."), threshold=0.8)
