"""The savings chart (``telemetry.savings``) drawn with matplotlib: per batch, the share of requests each decider
settled (stacked bars) and the energy per request against the estimate of full generation (a line and a dashed
level). matplotlib is the optional ``plot`` extra (``pip install gil-core[plot]``); it is imported only here."""

from __future__ import annotations

import base64
import io
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gil_core.errors import ConfigurationError
from gil_core.telemetry.savings import BatchSavings, Savings

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["savings_figure", "savings_markdown_image", "write_savings_plot"]

_COLOURS = {
    "memory": "#2a9d8f",
    "learned": "#457b9d",
    "reflex": "#8ab17d",
    "llm": "#e9c46a",
    "generation": "#e76f51",
    "abstain": "#adb5bd",
}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ConfigurationError(
            "the savings chart needs matplotlib: install the plot extra (pip install 'gil-core[plot]')"
        ) from None
    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt

    return plt


def _batch_labels(batches: Sequence[BatchSavings]) -> list[str]:
    """Each batch's start to the minute, or to the second when two batches started in the same minute; a batch
    that started in the same second as an earlier one is numbered after it ("#2")."""
    minutes = [batch.started_at.strftime("%m-%d %H:%M") for batch in batches]
    if len(set(minutes)) == len(minutes):
        return minutes
    labels, seen = [], Counter[str]()
    for batch in batches:
        second = batch.started_at.strftime("%m-%d %H:%M:%S")
        seen[second] += 1
        labels.append(second if seen[second] == 1 else f"{second} #{seen[second]}")
    return labels


def savings_figure(savings: Savings) -> Figure:
    """The chart; a figure saying so when the task has no batch yet."""
    plt = _pyplot()
    figure, (shares, energy) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, height_ratios=(3, 2))
    batches = savings.batches
    x = list(range(len(batches)))
    bottom = [0.0] * len(batches)
    for decider, colour in _COLOURS.items():
        values = [100.0 * batch.shares.get(decider, 0.0) for batch in batches]
        if any(values):
            shares.bar(x, values, bottom=bottom, color=colour, label=decider, width=0.8)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    shares.set_ylabel("% of the batch's requests")
    shares.set_ylim(0, 100)
    shares.set_title(f"What settled each batch — task {savings.task}")
    # Legends beside the plots, not on them: a bar or a point never hides under one.
    beside = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0, "fontsize": 8}
    if batches:
        shares.legend(**beside)
    else:
        shares.text(0.5, 0.5, "no batch yet", ha="center", va="center", transform=shares.transAxes)
    energy.plot(x, [batch.energy_per_request for batch in batches], marker="o", color="#264653", label="Gil")
    if savings.generation_energy is not None:
        calls = f"{savings.generation_calls} generation call{'s' if savings.generation_calls != 1 else ''}"
        label = f"estimate: full generation\n(mean of {calls})"
        energy.axhline(savings.generation_energy, color="#e76f51", linestyle="--", label=label)
    energy.set_ylabel("energy per request")
    energy.set_ylim(bottom=0)
    energy.legend(**beside)
    energy.set_xticks(x, _batch_labels(batches), rotation=45, fontsize=7)
    energy.set_xlabel("batch (start, UTC)")
    figure.tight_layout()
    drawn: Figure = figure
    return drawn


def write_savings_plot(savings: Savings, path: Path) -> Path:
    """Write the chart to ``path`` (PNG, or whatever format its suffix names)."""
    plt = _pyplot()
    figure = savings_figure(savings)
    try:
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)
    return path


def savings_markdown_image(savings: Savings) -> str | None:
    """The chart as a Markdown image with an inline SVG (what the Prefect UI's markdown artifact shows), or None
    without matplotlib."""
    try:
        plt = _pyplot()
    except ConfigurationError:
        return None
    figure = savings_figure(savings)
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="svg")
    finally:
        plt.close(figure)
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f"![What settled each batch, and energy per request](data:image/svg+xml;base64,{encoded})"
