"""The review log: what a person decided about each proposal of a review round, kept in the ``reviews`` table.

Rounds read it back so a person is not asked the same question twice: a promotion rejected once is not proposed
again, a habit a person chose to keep is not proposed as stale again, a dismissed differentiation signal stays
dismissed (each proposer's docstring says how it honours rejections). The table is a log: nothing is
overwritten, and the latest decision per item is the one that counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TypeVar

import polars as pl

from gil_core.errors import ConfigurationError, TelemetryError
from gil_core.telemetry import TelemetryStore, utc_now

__all__ = ["Decision", "ReviewDecision", "ReviewKind", "ReviewLog"]

_Enum = TypeVar("_Enum", bound=StrEnum)


class ReviewKind(StrEnum):
    """Which review round an item belongs to."""

    PROMOTION = "promotion"
    DEACTIVATION = "deactivation"
    DIFFERENTIATION = "differentiation"


class Decision(StrEnum):
    """What a person decided. ``DEFERRED`` records that an item was seen and left for later: it rejects nothing."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    DEFERRED = "deferred"


@dataclass(frozen=True, slots=True)
class ReviewDecision:
    """One decision on one item (a proposal id, a habit id, a signal id) of one kind of round."""

    task: str
    kind: ReviewKind
    item_id: str
    decision: Decision
    note: str | None
    reviewed_at: datetime


def _member(kind: type[_Enum], value: str) -> _Enum:
    try:
        return kind(value)
    except ValueError:
        known = ", ".join(member.value for member in kind)
        raise ConfigurationError(f"unknown {kind.__name__} {value!r} (known: {known})") from None


class ReviewLog:
    """Decisions on review items, over a store's ``reviews`` table."""

    def __init__(self, store: TelemetryStore) -> None:
        self._store = store

    def record(
        self,
        task: str,
        kind: ReviewKind | str,
        item_id: str,
        decision: Decision | str,
        note: str | None = None,
        *,
        reviewed_at: datetime | None = None,
    ) -> ReviewDecision:
        """Append a decision (durable on return). An unknown ``kind`` or ``decision`` raises ``ConfigurationError``."""
        return self.record_all(task, kind, [(item_id, decision, note)], reviewed_at=reviewed_at)[0]

    def record_all(
        self,
        task: str,
        kind: ReviewKind | str,
        decisions: Sequence[tuple[str, Decision | str, str | None]],
        *,
        reviewed_at: datetime | None = None,
    ) -> list[ReviewDecision]:
        """Append the decisions of one review, ``(item_id, decision, note)`` each, in one write: after a crash
        either all of them are in the log or none is. Unknown kinds or decisions raise before anything is written."""
        when = reviewed_at or utc_now()
        entries = [
            ReviewDecision(
                task=task,
                kind=_member(ReviewKind, kind),
                item_id=item_id,
                decision=_member(Decision, decision),
                note=note,
                reviewed_at=when,
            )
            for item_id, decision, note in decisions
        ]
        rows = [
            {
                "task": entry.task,
                "reviewed_at": entry.reviewed_at,
                "kind": entry.kind.value,
                "item_id": entry.item_id,
                "decision": entry.decision.value,
                "note": entry.note,
            }
            for entry in entries
        ]
        if rows:
            self._store.append("reviews", rows)
        return entries

    def decisions(self, task: str, kind: ReviewKind | str | None = None) -> dict[str, ReviewDecision]:
        """The latest decision per item (by ``reviewed_at``; equal times: the one written last), items in the
        order of their latest decision. With ``kind``, that kind's items only; without, keys are per kind too
        (an id may be reviewed in two kinds of round), so the key is ``"kind:item_id"``."""
        rows = self._store.scan("reviews").filter(pl.col("task") == task)
        if kind is not None:
            rows = rows.filter(pl.col("kind") == ReviewKind(kind).value)
        frame = rows.collect().sort("reviewed_at", maintain_order=True)
        latest: dict[str, ReviewDecision] = {}
        for row in frame.iter_rows(named=True):
            try:
                entry = ReviewDecision(
                    task=row["task"],
                    kind=_member(ReviewKind, row["kind"]),
                    item_id=row["item_id"],
                    decision=_member(Decision, row["decision"]),
                    note=row["note"],
                    reviewed_at=row["reviewed_at"],
                )
            except ConfigurationError as exc:  # written by another tool, or by hand
                raise TelemetryError(f"table 'reviews': item {row['item_id']!r}: {exc}") from exc
            key = entry.item_id if kind is not None else f"{entry.kind.value}:{entry.item_id}"
            latest.pop(key, None)
            latest[key] = entry
        return latest

    def rejected(self, task: str, kind: ReviewKind | str) -> frozenset[str]:
        """Items of ``kind`` whose latest decision is a rejection."""
        return frozenset(
            item for item, entry in self.decisions(task, kind).items() if entry.decision is Decision.REJECTED
        )
