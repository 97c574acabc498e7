"""The counter rows a request's walk and a verdict add to the store: node visits and choices, habit reliability.

Counter tables store increments that a read sums per key (``telemetry.schemas.COUNTERS``); these functions only
build the rows, which the resolver stores together with the trace they belong to.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gil_core.habits.attribution import ReliabilityDelta
from gil_core.traverse import Step

__all__ = ["reliability_rows", "walk_rows"]

Rows = list[dict[str, Any]]


def walk_rows(task: str, steps: Sequence[Step], deltas: Sequence[ReliabilityDelta], now: datetime) -> dict[str, Rows]:
    """The counters one resolved request adds, per table: a visit per judged node (accepted or exited there),
    a choice per accepted step, and the reliability deltas of its habit (tables without rows are left out)."""
    tables: dict[str, Rows] = {}
    if steps:
        tables["node_stats"] = [
            {
                "scope": task,
                "node_id": step.node,
                "hits": 1,
                "accepts": int(step.outcome == "accept"),
                "exits": int(step.outcome == "exit"),
                "last_used_at": now,
            }
            for step in steps
        ]
        choices = [
            {"scope": task, "node_id": step.node, "chosen_id": step.chosen, "accepts": 1}
            for step in steps
            if step.outcome == "accept" and step.chosen is not None
        ]
        if choices:
            tables["node_choices"] = choices
    if deltas:
        tables["habit_reliability"] = reliability_rows(task, deltas)
    return tables


def reliability_rows(task: str, deltas: Sequence[ReliabilityDelta]) -> Rows:
    """One ``habit_reliability`` increment per delta."""
    return [
        {
            "scope": task,
            "item_id": delta.item_id,
            "reinforced": delta.reinforced,
            "penalized": delta.penalized,
            "missed": delta.missed,
            "explored": delta.explored,
            "disputed": delta.disputed,
        }
        for delta in deltas
    ]
