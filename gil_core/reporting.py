"""Stats as a person reads them: a table per mode and a cost-per-request chart, for Prefect artifacts and the CLI."""

from __future__ import annotations

from typing import Any

import polars as pl

from gil_core.telemetry import TelemetryStore

__all__ = ["stats_markdown", "stats_table"]

_BAR = 40


def _traces(store: TelemetryStore, task: str) -> pl.DataFrame:
    return store.scan("traces").filter(pl.col("task") == task).sort("created_at").collect()


def stats_table(store: TelemetryStore, task: str) -> list[dict[str, Any]]:
    """One row per mode: requests, judged, correct, accuracy, mean energy."""
    traces = _traces(store, task)
    if traces.is_empty():
        return []
    grouped = (
        traces.group_by("mode")
        .agg(
            pl.len().alias("requests"),
            pl.col("feedback_verdict").is_not_null().sum().alias("judged"),
            (pl.col("feedback_verdict") == "correct").sum().alias("correct"),
            pl.col("energy").mean().alias("mean_energy"),
        )
        .with_columns((pl.col("correct") / pl.col("judged")).alias("accuracy"))
        .sort(["requests", "mode"], descending=[True, False])
    )
    return [
        {key: (round(value, 4) if isinstance(value, float) else value) for key, value in row.items()}
        for row in grouped.iter_rows(named=True)
    ]


def stats_markdown(store: TelemetryStore, task: str, *, window: int = 50) -> str:
    """Mean energy per request in consecutive windows of ``window`` requests, as a bar chart in Markdown."""
    traces = _traces(store, task)
    lines = [f"# Cost per request — task `{task}`", ""]
    if traces.is_empty():
        return "\n".join([*lines, "No requests yet."])
    windows = (
        traces.with_row_index("n")
        .with_columns((pl.col("n") // window).alias("window"))
        .group_by("window", maintain_order=True)
        .agg(pl.len().alias("requests"), pl.col("energy").mean().alias("mean"), (pl.col("mode") == "memory").mean())
    )
    peak = max([*windows["mean"].fill_null(0.0).to_list(), 1e-12])
    lines += ["| requests | mean energy | memory share | |", "|---:|---:|---:|:---|"]
    for row in windows.iter_rows(named=True):
        first = row["window"] * window + 1
        bar = "█" * max(1, round(_BAR * row["mean"] / peak)) if row["mean"] > 0 else ""
        lines.append(f"| {first}–{first + row['requests'] - 1} | {row['mean']:.1f} | {row['mode']:.0%} | `{bar}` |")
    return "\n".join(lines)
