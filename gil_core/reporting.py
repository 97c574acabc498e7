"""Stats as a person reads them in the Prefect UI: the per-mode table and a cost-per-request chart, both drawn
from ``Stats`` (``TelemetryStore.stats``), so the figures are the same ones ``gil stats`` prints; and what Gil
saved per batch (``telemetry.savings``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from gil_core.learned import LearnedState, describe_nodes
from gil_core.telemetry import Stats
from gil_core.telemetry.savings import Savings
from gil_core.telemetry.schemas import DECIDERS

__all__ = [
    "decider_table",
    "learned_markdown",
    "next_judge_words",
    "refusal_table",
    "savings_markdown",
    "stats_markdown",
    "stats_table",
]

_BAR = 40


def stats_table(stats: Stats) -> list[dict[str, Any]]:
    """One row per mode: requests, judged, correct, accuracy and its 95% interval."""
    rows: list[dict[str, Any]] = stats.to_json()["modes"]
    return [{key: round(value, 4) if isinstance(value, float) else value for key, value in row.items()} for row in rows]


def decider_table(stats: Stats) -> list[dict[str, Any]]:
    """One row per decider (memory, learned judge, reflex, LLM, generation): share of requests, accuracy and its
    95% interval, energy per request."""
    rows: list[dict[str, Any]] = stats.to_json()["deciders"]
    return [{key: round(value, 4) if isinstance(value, float) else value for key, value in row.items()} for row in rows]


def refusal_table(stats: Stats) -> list[dict[str, Any]]:
    """One row per check that took memory hits back (``Stats.memory_refused``): the hits, how many were judged,
    how many memory would have got wrong, how many the rest of the way got right."""
    return [asdict(item) for item in stats.memory_refused]


def stats_markdown(stats: Stats) -> str:
    """Mean energy per request in consecutive windows of requests, as a bar chart in Markdown."""
    lines = [f"# Cost per request — task `{stats.task}`", ""]
    if not stats.windows:
        return "\n".join([*lines, "No requests yet."])
    peak = max([*(window.mean_energy for window in stats.windows), 1e-12])
    lines += ["| requests | mean energy | |", "|---:|---:|:---|"]
    for window in stats.windows:
        first = window.first + 1
        bar = "█" * max(1, round(_BAR * window.mean_energy / peak)) if window.mean_energy > 0 else ""
        lines.append(f"| {first}–{first + window.requests - 1} | {window.mean_energy:.1f} | `{bar}` |")
    return "\n".join(lines)


def learned_markdown(state: LearnedState) -> str:
    """The learned judge per node: its rows, the rule it serves by (or why not), its cut and what the log says
    at the cut, as a Markdown table (``gil fit-reflex`` prints the same figures)."""
    lines = [
        f"# Learned reflex — task `{state.task}`",
        "",
        f"Fitted {state.fitted_at} on {state.fitted_on.get('verdicts', 0):,} verdicts.",
        "",
        "| node | rows | classes | rule | evidence | cut | precision | lower bound | LLM p-value | coverage "
        "| LLM asked |",
        "|:---|---:|---:|:---|:---|---:|---:|---:|---:|---:|:---|",
    ]
    for row in describe_nodes(state):
        cells = [
            row["node"],
            f"{row['rows']:,}",
            str(row["classes"]),
            row["rule"],
            row["evidence"],
            *(_figure(row[name]) for name in ("cut", "precision", "lower_bound", "p_value", "coverage")),
            next_judge_words(row),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if state.memory is not None:
        lines += ["", f"Memory: {state.memory.describe()}."]
    if state.generation is not None:
        lines += ["", f"Generation: {state.generation.describe()}."]
    return "\n".join(lines)


def next_judge_words(row: Mapping[str, Any]) -> str:
    """Whether the next judge (reflex or LLM) is still asked where the node does not serve, and what the log
    says of it there (a ``describe_nodes`` row): "yes", or "audits only", with how many of the requests it was
    asked there it settled right ("0/53 right"), and the pooled count that decided, if one did."""
    figures = row.get("next_judge") or {}
    asked = f"{figures.get('settled_right', 0)}/{figures.get('asked', 0)} right"
    if figures.get("evidence") in ("layer", "tree"):  # the node's own asks were too few: its layer's or tree's
        asked += f"; {figures['evidence']} {figures.get('pooled_settled_right', 0)}/{figures.get('pooled_asked', 0)}"
    if row.get("asks_next_judge", True):
        return f"yes ({asked})" if figures.get("asked") else "yes"
    return f"audits only ({asked})"


def _figure(value: Any) -> str:
    return "—" if value is None else f"{value:.3f}"


def savings_markdown(savings: Savings, chart: str | None = None) -> str:
    """Per batch: who settled its requests and its energy per request against the estimate of full generation,
    as Markdown (``chart``: a Markdown image to put above the table, from ``gil_core.savings_plot``)."""
    lines = [f"# What Gil saved — task `{savings.task}`", ""]
    if savings.generation_energy is None:
        lines.append("No generation call in the log yet: no estimate of full generation to compare with.")
    else:
        lines.append(
            f"Full generation is *estimated* at {savings.generation_energy:.1f} energy per request: the mean of "
            f"this task's {savings.generation_calls:,} generation call{'s' if savings.generation_calls != 1 else ''}."
        )
    lines.append("")
    if chart is not None:
        lines += [chart, ""]
    if not savings.batches:
        return "\n".join([*lines, "No batch yet."])
    deciders = [name for name in DECIDERS if any(name in batch.shares for batch in savings.batches)]
    lines += [
        "| batch started (UTC) | requests | "
        + " | ".join(deciders)
        + " | energy / request | × full generation (est.) |",
        "|:---|---:|" + "---:|" * len(deciders) + "---:|---:|",
    ]
    for batch in savings.batches:
        shares = [f"{100 * batch.shares.get(name, 0.0):.0f}%" for name in deciders]
        ratio = savings.ratio(batch)
        cells = [
            batch.started_at.strftime("%Y-%m-%d %H:%M"),
            f"{batch.requests:,}",
            *shares,
            f"{batch.energy_per_request:.1f}",
            "—" if ratio is None else f"{ratio:.3f}×",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
