"""The energy side of review rounds, read from the log: what generated answers cost, and what one more candidate
costs the judge.

A promotion trades generation energy for judge energy. Generated (``fallback``/``partial``) traces carry what
their generation spent (``EvidenceTrace``). The judge's price is read from the log rather than assumed:
judge calls are fitted as ``energy ≈ fixed + per_char · chars``, where ``chars`` counts the request and every
shown label and description (the "none of these" wording included). A habit added to a node that already has
habits only lengthens an existing prompt (``marginal``); one added to a node without habits costs a whole new
call (``new_call``), priced for a typical request.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from gil_core.errors import GilError
from gil_core.habits.shadows import EVIDENCE_MODES, Evidence
from gil_core.telemetry import TelemetryStore

__all__ = [
    "EVIDENCE_COLUMNS",
    "CostModelError",
    "CostSample",
    "EvidenceTrace",
    "JudgeCostModel",
    "evidence_from_row",
    "mean_judge_energy",
    "read_cost_samples",
    "read_evidence",
    "shown_chars",
    "task_traces",
]


class CostModelError(GilError):
    """The judge cost model cannot be fitted: too few samples, or all of them show as many characters."""


@dataclass(frozen=True, slots=True)
class CostSample:
    """One judge call: characters shown, its energy, and the parts of ``chars`` every call of a round shares."""

    chars: int
    energy: float
    state_chars: int
    none_chars: int
    node: str | None = None


def shown_chars(request: str, none_text: str, shown: Iterable[tuple[str, str]]) -> int:
    """Characters (code points) a judge prompt shows: the request, "none of these", each label and description."""
    return len(request) + len(none_text) + sum(len(label) + len(description) for label, description in shown)


@dataclass(frozen=True, slots=True)
class EvidenceTrace:
    """One generated (``fallback``/``partial``) trace as review rounds read it: its evidence and its cost."""

    trace_id: str
    evidence: Evidence
    fallback_energy: float


@dataclass(frozen=True, slots=True)
class JudgeCostModel:
    """``energy = fixed + per_char · chars`` for one judge call, with the means a new call is priced at."""

    fixed: float
    per_char: float
    mean_state_chars: float
    none_chars: float

    @classmethod
    def fit(cls, samples: Sequence[CostSample]) -> JudgeCostModel:
        """Least squares on centred sums (exactly rounded), as the reference fits it; coefficients non-negative.

        A negative slope falls back to the mean energy, a negative intercept to a line through the origin.
        Raises ``CostModelError`` when fewer than two samples are given or all show the same characters.
        """
        count = len(samples)
        if count < 2:
            raise CostModelError(f"the judge cost model needs at least 2 samples, got {count}")
        chars = [float(sample.chars) for sample in samples]
        energy = [float(sample.energy) for sample in samples]
        mean_chars = math.fsum(chars) / count
        mean_energy = math.fsum(energy) / count
        spread = math.fsum((x - mean_chars) ** 2 for x in chars)
        if spread == 0.0:
            raise CostModelError(f"all {count} judge calls show {chars[0]:.0f} characters: the slope is undetermined")
        per_char = math.fsum((x - mean_chars) * (y - mean_energy) for x, y in zip(chars, energy, strict=True)) / spread
        fixed = mean_energy - per_char * mean_chars
        if per_char < 0.0:
            per_char, fixed = 0.0, mean_energy
        elif fixed < 0.0:
            fixed = 0.0
            per_char = math.fsum(x * y for x, y in zip(chars, energy, strict=True)) / math.fsum(x * x for x in chars)
        return cls(
            fixed=fixed,
            per_char=per_char,
            mean_state_chars=math.fsum(sample.state_chars for sample in samples) / count,
            none_chars=math.fsum(sample.none_chars for sample in samples) / count,
        )

    def marginal(self, chars: int) -> float:
        """What showing ``chars`` more characters in a call that is made anyway costs."""
        return self.per_char * chars

    def new_call(self, chars: int) -> float:
        """What a new call showing ``chars`` of candidates costs for a typical request (plus "none of these")."""
        return self.fixed + self.per_char * (self.mean_state_chars + self.none_chars + chars)


def mean_judge_energy(samples: Iterable[CostSample]) -> dict[str, float]:
    """Mean energy of the judge calls at each node, nodes sorted by id; samples without a node are left out."""
    energies: dict[str, list[float]] = {}
    for sample in samples:
        if sample.node is not None:
            energies.setdefault(sample.node, []).append(sample.energy)
    return {node: sum(values) / len(values) for node, values in sorted(energies.items())}


EVIDENCE_COLUMNS = ("state", "path", "mode", "output", "feedback_verdict", "feedback_correction", "explored_output")
"""The columns of a ``traces`` row ``evidence_from_row`` reads."""


def task_traces(
    store: TelemetryStore,
    task: str,
    *,
    upto: int | None = None,
    where: pl.Expr | None = None,
    columns: Sequence[str] = (),
) -> pl.DataFrame:
    """The task's traces in arrival order (``created_at``), the first ``upto`` of them when given; of those, the
    ones ``where`` holds for, and only ``columns`` (all when empty). The scan reads only the columns these need.

    Review rounds index traces by this order: a round "at index n" has seen the first n requests.
    """
    traces = store.scan("traces").filter(pl.col("task") == task).sort("created_at", maintain_order=True)
    if upto is not None:
        traces = traces.head(upto)
    if where is not None:
        traces = traces.filter(where)
    return (traces.select(columns) if columns else traces).collect()


def read_cost_samples(store: TelemetryStore, task: str, *, none_text: str, upto: int | None = None) -> list[CostSample]:
    """The judge calls of the task's first ``upto`` traces, as cost samples, in request order.

    ``none_text`` is the task language's "none of these": the store records that line's symbol, not its words.
    """
    traces = task_traces(store, task, upto=upto, columns=("trace_id", "state"))
    if traces.is_empty():
        return []
    states: Mapping[str, str] = dict(zip(traces["trace_id"], traces["state"], strict=True))
    order = {trace_id: index for index, trace_id in enumerate(traces["trace_id"])}
    calls = (
        store.scan("calls")
        .filter((pl.col("role") == "judge") & pl.col("trace_id").is_in(list(order)))
        .select("trace_id", "node_id", "energy", "candidates")
        .collect()
    )
    rows = sorted(calls.iter_rows(named=True), key=lambda row: order[row["trace_id"]])  # stable: call order kept
    samples = []
    for row in rows:
        state = states[row["trace_id"]]
        shown = [(item["label"], item["description"]) for item in json.loads(row["candidates"]) if item["id"]]
        samples.append(
            CostSample(
                chars=shown_chars(state, none_text, shown),
                energy=row["energy"],
                state_chars=len(state),
                none_chars=len(none_text),
                node=row["node_id"],
            )
        )
    return samples


def read_evidence(store: TelemetryStore, task: str, *, upto: int | None = None) -> list[EvidenceTrace]:
    """The ``fallback``/``partial`` traces among the task's first ``upto`` requests, with their generation energy
    (the ``fallback`` calls' energy summed; a narrowed answer that was rerun counts both runs)."""
    where = pl.col("mode").is_in(sorted(EVIDENCE_MODES))
    traces = task_traces(store, task, upto=upto, where=where, columns=("trace_id", *EVIDENCE_COLUMNS))
    if traces.is_empty():
        return []
    energy = (
        store.scan("calls")
        .filter((pl.col("role") == "fallback") & pl.col("trace_id").is_in(traces["trace_id"].to_list()))
        .group_by("trace_id")
        .agg(pl.col("energy").sum())
        .collect()
    )
    spent = dict(zip(energy["trace_id"], energy["energy"], strict=True))
    result = []
    for row in traces.iter_rows(named=True):
        evidence = evidence_from_row(row)
        if evidence is not None:
            result.append(EvidenceTrace(row["trace_id"], evidence, spent.get(row["trace_id"], 0.0)))
    return result


def evidence_from_row(row: Mapping[str, Any]) -> Evidence | None:
    """A ``traces`` row as evidence, anchored at the last node its walk stood on; None when it walked none."""
    path = json.loads(row["path"] or "[]")
    if not path:
        return None
    return Evidence(
        state=row["state"],
        anchor=path[-1]["node"],
        mode=row["mode"],
        output=row["output"],
        verdict=row["feedback_verdict"],
        correction=row["feedback_correction"],
        explored_output=row["explored_output"],
    )
