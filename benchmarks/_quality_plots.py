"""The quality benchmark's plots (matplotlib, Agg): cost per request over time windows, per arm, per stream."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a CI runner

import matplotlib.pyplot as plt

from benchmarks._quality_report import TARGET_MEMORY_SHARE, WARMUP_SHARE, ArmFigures

COLORS = {"full": "#d62728", "tree": "#1f77b4", "reflex": "#2ca02c", "memory": "#9467bd"}


def plot_stream(title: str, arms: Sequence[ArmFigures], window: int, path: Path, *, unit: str) -> Path:
    """Left: mean energy per request in consecutive windows of ``window`` requests, one line per arm. Right: the
    memory arm's share of requests answered by memory per window, beside its cost."""
    fig, (cost, memory) = plt.subplots(1, 2, figsize=(11, 5), gridspec_kw={"width_ratios": [3, 2]})
    for arm in arms:
        xs = [first + min(window, arm.requests - first) / 2 for first, _ in arm.windows]
        cost.plot(xs, [value for _, value in arm.windows], marker="o", label=arm.title, color=COLORS.get(arm.key))
    cost.set_title(f"{title}: cost per request")
    cost.set_xlabel(f"request number (mean over windows of {window})")
    cost.set_ylabel(f"energy per request ({unit})")
    cost.set_ylim(bottom=0)
    cost.grid(alpha=0.3)
    cost.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=2, frameon=False)
    remembering = next((arm for arm in arms if arm.memory_windows), None)
    if remembering is not None:
        xs = [first + min(window, remembering.requests - first) / 2 for first, _ in remembering.memory_windows]
        memory.bar(xs, [100 * v for _, v in remembering.memory_windows], width=window * 0.8, color="#c5b0d5")
        memory.set_ylim(0, 100)
        memory.set_ylabel("answered by memory (%)")
        memory.set_xlabel("request number of the repeating stream")
        memory.set_title(remembering.title)
        memory.axhline(100 * TARGET_MEMORY_SHARE, color="grey", linestyle="--", linewidth=1, label="target")
        memory.axvspan(0, remembering.requests * WARMUP_SHARE, color="grey", alpha=0.15, label="warm-up")
        memory.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=2, frameon=False)
        memory.grid(alpha=0.3, axis="y")
    else:
        memory.set_axis_off()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
