"""Deactivation: habits that verdicts keep blaming, that cross-checks keep disputing, or that nobody uses any more
are proposed for retirement, so the judge stops being offered answers that do harm or no good.

Reliability is a smoothed share of credit: ``(prior/2 + wR·R) / (prior + wR·R + wP·P)`` starts every habit at
one half and moves with its reinforcements ``R`` and penalties ``P``. Recency halves every ``half_life`` requests
since the habit last answered one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

import polars as pl

from gil_core.errors import ConfigurationError
from gil_core.habits.attribution import HABIT_MODES
from gil_core.habits.costs import task_traces
from gil_core.habits.review_log import ReviewKind, ReviewLog
from gil_core.ontology import Tree
from gil_core.telemetry import TelemetryStore

__all__ = [
    "DeactivationPolicy",
    "DeactivationProposal",
    "DeactivationReason",
    "ReliabilityCounts",
    "ReliabilityWeights",
    "Usage",
    "count_usage",
    "prepare_deactivation_round",
    "propose_deactivations",
    "read_reliability",
    "read_usage",
    "recency",
    "reliability_score",
    "served_habit",
]


def _check_numbers(owner: Any, *, positive: Collection[str] = ()) -> None:
    """Every field a finite, non-negative number; those in ``positive`` above zero."""
    for field in fields(owner):
        value = getattr(owner, field.name)
        name = f"{type(owner).__name__}.{field.name}"
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ConfigurationError(f"{name} must be a finite, non-negative number, got {value!r}")
        if field.name in positive and value <= 0:
            raise ConfigurationError(f"{name} must be positive, got {value!r}")


@dataclass(frozen=True, slots=True)
class ReliabilityWeights:
    """How much a reinforcement and a penalty weigh, and how many verdicts' worth the prior of one half holds."""

    reinforce: float
    penalty: float
    prior_strength: float

    def __post_init__(self) -> None:
        _check_numbers(self, positive=("prior_strength",))


@dataclass(frozen=True, slots=True)
class DeactivationPolicy:
    """When a habit is proposed for retirement (docs/reference.md, "Review rounds")."""

    half_life: float
    stale_below: float
    reliability_below: float
    min_verdicts: int
    dispute_rate: float
    min_explored: int

    def __post_init__(self) -> None:
        _check_numbers(self, positive=("half_life",))


@dataclass(frozen=True, slots=True)
class ReliabilityCounts:
    """A habit's counters in ``habit_reliability``."""

    reinforced: int = 0
    penalized: int = 0
    missed: int = 0
    explored: int = 0
    disputed: int = 0


@dataclass(frozen=True, slots=True)
class Usage:
    """The index of the last request each habit answered, out of ``total`` requests (indices from 0)."""

    last_index: Mapping[str, int]
    total: int

    def since(self, item: str) -> int:
        """Requests since the habit last answered one; ``total`` when it never did."""
        return self.total - 1 - self.last_index.get(item, -1)


class DeactivationReason(StrEnum):
    """Why a habit should retire, heaviest first."""

    UNRELIABLE = "unreliable"
    DISPUTED = "disputed"
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class DeactivationProposal:
    """A habit proposed for retirement under its heaviest reason, with its reliability score and recency."""

    id: str
    anchor: str
    reason: DeactivationReason
    recency: float
    score: float


def reliability_score(counts: ReliabilityCounts, weights: ReliabilityWeights) -> float:
    reinforced = weights.reinforce * counts.reinforced
    penalized = weights.penalty * counts.penalized
    return (weights.prior_strength / 2 + reinforced) / (weights.prior_strength + reinforced + penalized)


def recency(usage: Usage, item: str, half_life: float) -> float:
    """``0.5 ** (since / half_life)``: 1 for the habit that answered the last request, halving every half life."""
    return math.pow(0.5, usage.since(item) / half_life)


def served_habit(mode: str, path: Sequence[Mapping[str, Any]]) -> str | None:
    """The habit that answered a request: the last step's choice when a habit mode answered, else None.

    A template whose slots could not be filled was reached but did not answer (the mode is ``partial``).
    """
    if mode not in HABIT_MODES or not path:
        return None
    chosen = path[-1].get("chosen")
    return str(chosen) if chosen is not None else None


def count_usage(served: Iterable[str | None]) -> Usage:
    """Usage from the habit that answered each request, in request order (None: no habit answered)."""
    last_index: dict[str, int] = {}
    total = 0
    for index, habit in enumerate(served):
        total = index + 1
        if habit is not None:
            last_index[habit] = index
    return Usage(last_index, total)


def propose_deactivations(
    tree: Tree,
    counts: Mapping[str, ReliabilityCounts],
    usage: Usage,
    weights: ReliabilityWeights,
    policy: DeactivationPolicy,
    *,
    kept: Collection[str] = (),
) -> list[DeactivationProposal]:
    """Every habit of the tree, in file order, that is unreliable, disputed or stale.

    ``kept`` lists habits a reviewer chose to keep (rejected retirements). They are not proposed as stale again:
    time alone only makes them staler, which the reviewer has already weighed. Verdicts are new evidence, so a
    kept habit that turns unreliable or disputed is proposed again.
    """
    proposals = []
    for option, node in tree.options():
        item = counts.get(option.id, ReliabilityCounts())
        score = reliability_score(item, weights)
        fresh = recency(usage, option.id, policy.half_life)
        reasons = _reasons(item, score, fresh, policy)
        if option.id in kept:
            reasons = [reason for reason in reasons if reason is not DeactivationReason.STALE]
        if reasons:
            proposals.append(DeactivationProposal(option.id, node.id, reasons[0], fresh, score))
    return proposals


def _reasons(
    counts: ReliabilityCounts, score: float, fresh: float, policy: DeactivationPolicy
) -> list[DeactivationReason]:
    reasons = []
    if counts.reinforced + counts.penalized >= policy.min_verdicts and score < policy.reliability_below:
        reasons.append(DeactivationReason.UNRELIABLE)
    explored = counts.explored
    if explored and explored >= policy.min_explored and counts.disputed / explored >= policy.dispute_rate:
        reasons.append(DeactivationReason.DISPUTED)
    if fresh < policy.stale_below:
        reasons.append(DeactivationReason.STALE)
    return reasons


def read_reliability(store: TelemetryStore, task: str) -> dict[str, ReliabilityCounts]:
    """The task's ``habit_reliability`` counters per item (nodes, habits and shadows alike)."""
    rows = store.scan("habit_reliability").filter(pl.col("scope") == task).collect()
    return {
        row["item_id"]: ReliabilityCounts(
            reinforced=row["reinforced"],
            penalized=row["penalized"],
            missed=row["missed"],
            explored=row["explored"],
            disputed=row["disputed"],
        )
        for row in rows.iter_rows(named=True)
    }


def read_usage(store: TelemetryStore, task: str, *, upto: int | None = None) -> Usage:
    """Which habit answered each of the task's first ``upto`` requests (all when None)."""
    traces = task_traces(store, task, upto=upto, columns=("mode", "path"))
    return count_usage(served_habit(mode, json.loads(path or "[]")) for mode, path in traces.iter_rows())


def prepare_deactivation_round(
    store: TelemetryStore, task: str, tree: Tree, weights: ReliabilityWeights, policy: DeactivationPolicy
) -> list[DeactivationProposal]:
    """Proposals from the task's whole log; habits whose retirement a reviewer rejected count as ``kept``."""
    kept = ReviewLog(store).rejected(task, ReviewKind.DEACTIVATION)
    return propose_deactivations(
        tree, read_reliability(store, task), read_usage(store, task), weights, policy, kept=kept
    )
