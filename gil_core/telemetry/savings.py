"""What Gil saved, batch by batch: for each batch (``gil_core.batch_scope``), the share of its requests each
decider settled (a request counts for the most expensive decider it used: ``telemetry.stats.decider_expression``)
and its energy per request, against an estimate of answering every request by generation.

The estimate is the mean recorded energy of the task's own generation calls (role ``fallback``): what one
request costs when it goes to generation, in this task's log, on this server. It is labelled an estimate
wherever it is shown: the requests Gil settled without generation never made that call.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

from gil_core.errors import ConfigurationError
from gil_core.telemetry.schemas import DECIDERS
from gil_core.telemetry.stats import decider_expression

if TYPE_CHECKING:
    from gil_core.telemetry.store import TelemetryStore

__all__ = ["BATCHES", "BatchSavings", "Savings", "compute_savings"]

BATCHES = 30
"""How many of the latest batches a savings report shows by default."""


@dataclass(frozen=True)
class BatchSavings:
    """One batch: when its first request was logged, how many requests, each decider's share of them, and the
    mean energy per request."""

    batch_id: str
    started_at: dt.datetime
    requests: int
    shares: Mapping[str, float]
    energy_per_request: float


@dataclass(frozen=True)
class Savings:
    """The latest batches of a task, oldest first, and the generation estimate (None: the log holds no
    generation call to estimate from), with how many calls it rests on."""

    task: str
    batches: tuple[BatchSavings, ...] = field(default_factory=tuple)
    generation_energy: float | None = None
    generation_calls: int = 0

    def ratio(self, batch: BatchSavings) -> float | None:
        """The batch's energy per request against the generation estimate."""
        if self.generation_energy is None or self.generation_energy <= 0:
            return None
        return batch.energy_per_request / self.generation_energy

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "generation_energy_estimate": self.generation_energy,
            "generation_calls": self.generation_calls,
            "batches": [
                {
                    "batch_id": batch.batch_id,
                    "started_at": batch.started_at.isoformat(),
                    "requests": batch.requests,
                    "shares": dict(batch.shares),
                    "energy_per_request": batch.energy_per_request,
                    "against_generation": self.ratio(batch),
                }
                for batch in self.batches
            ],
        }


def compute_savings(store: TelemetryStore, task: str, *, batches: int = BATCHES) -> Savings:
    """The latest ``batches`` batches of ``task`` (traces without a batch id, resolved one by one, are left out)."""
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise ConfigurationError(f"a savings report shows at least one batch, got {batches!r}")
    traces = (
        store.scan("traces")
        .filter((pl.col("task") == task) & pl.col("batch_id").is_not_null())
        .select("trace_id", "created_at", "batch_id", "energy", decider=decider_expression())
        .collect()
    )
    generation = (
        store.scan("calls")
        .filter(pl.col("role") == "fallback")
        .join(store.scan("traces").filter(pl.col("task") == task).select("trace_id"), on="trace_id", how="semi")
        .select(calls=pl.len(), energy=pl.col("energy").mean())
        .collect()
    )
    calls, energy = generation.row(0)
    if traces.is_empty():
        return Savings(task, (), energy if calls else None, int(calls))
    per_batch = (
        traces.group_by("batch_id")
        .agg(
            started_at=pl.col("created_at").min(),
            requests=pl.len().cast(pl.Int64),
            energy_per_request=pl.col("energy").mean(),
            **{f"share_{name}": (pl.col("decider") == name).mean() for name in DECIDERS},
        )
        .sort("started_at", "batch_id")
        .tail(batches)
    )
    found = tuple(
        BatchSavings(
            batch_id=row["batch_id"],
            started_at=row["started_at"],
            requests=row["requests"],
            shares={name: row[f"share_{name}"] for name in DECIDERS if row[f"share_{name}"]},
            energy_per_request=row["energy_per_request"],
        )
        for row in per_batch.iter_rows(named=True)
    )
    return Savings(task, found, energy if calls else None, int(calls))
