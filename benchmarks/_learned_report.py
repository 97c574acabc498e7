"""The learned-reflex benchmark's figures: each arm's prequential figures after the warm-up, and from them the rows,
notes and plot of a stream's section, the grouped-order and leave-one-category-out tables."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._learned_runs import CHUNK, Record
from benchmarks._learned_setup import GROUPED_AFTER, WARMUP, StreamSpec
from benchmarks._report import Row, markdown_table
from gil_core.wilson import wilson_interval

__all__ = [
    "ArmFigures",
    "deciders_of",
    "grouped_rows",
    "loco_row",
    "paired_difference",
    "pct",
    "plot_stream",
    "share",
    "stream_section",
    "wilson",
]


def wilson(k: int, n: int) -> tuple[float, float]:
    return (math.nan, math.nan) if n == 0 else wilson_interval(k, n)


def pct(value: float) -> str:
    return "—" if math.isnan(value) else f"{100 * value:.1f}%"


def share(k: int, n: int) -> str:
    low, high = wilson(k, n)
    return f"{pct(k / n if n else math.nan)} ({k}/{n}; 95% CI {pct(low)}–{pct(high)})"


def paired_difference(first: Sequence[bool], second: Sequence[bool]) -> tuple[float, float, float]:
    """The difference of two accuracies over the same requests (``first`` − ``second``, each request right or
    not under each) and its 95% interval by Newcombe's method for paired proportions (his method 10, 1998: each
    accuracy's Wilson interval, combined with the correlation of the pairs), no continuity correction."""
    n = len(first)
    if n == 0 or len(second) != n:
        raise ValueError(f"need two equally long, non-empty outcome lists, got {n} and {len(second)}")
    pairs = Counter(zip(map(bool, first), map(bool, second), strict=True))
    both, only_first, only_second, neither = (pairs[True, True], pairs[True, False], pairs[False, True],
                                              pairs[False, False])  # fmt: skip
    p1, p2 = (both + only_first) / n, (both + only_second) / n
    (l1, u1), (l2, u2) = wilson_interval(both + only_first, n), wilson_interval(both + only_second, n)
    margins = (both + only_first) * (only_second + neither) * (both + only_second) * (only_first + neither)
    phi = (both * neither - only_first * only_second) / math.sqrt(margins) if margins else 0.0
    low = p1 - p2 - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = p1 - p2 + math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    return p1 - p2, low, high


@dataclass
class ArmFigures:
    """An arm's figures after the warm-up, over never-seen requests."""

    key: str
    title: str
    requests: int
    later: list[Record] = field(default_factory=list)
    chunks: list[tuple[float, float, float]] = field(default_factory=list)  # (accuracy, settled, energy)
    ends: list[int] = field(default_factory=list)  # requests of the stream sent when each chunk ended (plots' x)
    all: list[Record] = field(default_factory=list)

    @classmethod
    def of(
        cls, key: str, title: str, records: Sequence[Record], positions: Mapping[str, int] | None = None
    ) -> ArmFigures:
        """``positions``: for a sampled arm, each request's position in the whole stream, which decides whether
        it came after the warm-up (a baseline's answers do not depend on its own position)."""
        figures = cls(key, title, len(records))
        figures.all = list(records)
        where = (lambda r: positions[r.id]) if positions is not None else (lambda r: r.position)
        figures.later = [r for r in records if where(r) >= WARMUP and r.never_seen]
        for start in range(0, len(records), CHUNK):
            chunk = records[start : start + CHUNK]
            figures.chunks.append(
                (
                    sum(r.right for r in chunk) / len(chunk),
                    sum(r.settled_without_llm for r in chunk) / len(chunk),
                    statistics.fmean(r.energy for r in chunk),
                )
            )
            figures.ends.append(where(chunk[-1]) + 1)  # a sampled arm's chunk ends where its last request stood
        return figures

    @property
    def accuracy(self) -> tuple[int, int]:
        return sum(r.right for r in self.later), len(self.later)

    @property
    def settled(self) -> tuple[int, int]:
        return sum(r.settled_without_llm for r in self.later), len(self.later)

    @property
    def settled_precision(self) -> tuple[int, int]:
        served = [r for r in self.later if r.settled_without_llm]
        return sum(r.right for r in served), len(served)

    def energy(self, part: str = "all") -> float:
        if not self.later:
            return math.nan
        pick = {
            "all": lambda r: r.energy,
            "judging": lambda r: r.judging_energy,
            "producing": lambda r: r.producing_energy,
        }[part]
        return statistics.fmean(pick(r) for r in self.later)


def stream_section(
    spec: StreamSpec, arms: dict[str, ArmFigures], plot: Path | None, deciders: dict[str, int]
) -> tuple[list[Row], list[str]]:
    learned, reflex, generation = arms.get("learned"), arms.get("reflex"), arms.get("generation")
    rows: list[Row] = []
    notes: list[str] = []
    if learned is None:
        return rows, notes
    size = spec.size >= 500
    if not learned.later:  # cut short before the warm-up ended: nothing to read yet
        rows.append(Row(f"{spec.name}: {learned.title}", "≥ 90%" if size else "(reported)",
                        f"not measured: {learned.requests} requests run, none after the first {WARMUP}"))  # fmt: skip
        return rows, notes
    k, n = learned.accuracy
    rows.append(Row(f"{spec.name}: never-seen right after {WARMUP} confirmed", "≥ 90%" if size else "(reported)",
                    share(k, n), (k / n >= 0.9) if size and n else None))  # fmt: skip
    for base in (reflex, generation):
        if base is not None and base.later:
            bk, bn = base.accuracy
            rows.append(Row(f"{spec.name}: baseline {base.title}", "", share(bk, bn)))
    sk, sn = learned.settled
    pk, pn = learned.settled_precision
    rows.append(Row(f"{spec.name}: settled with no LLM judgment", "≥ 60%" if size else "(reported)", share(sk, sn),
                    (sk / sn >= 0.6) if size and sn else None))  # fmt: skip
    rows.append(Row(f"{spec.name}: precision of what was settled so", "≥ 97%" if size else "(reported)",
                    share(pk, pn), (pk / pn >= 0.97) if size and pn else None))  # fmt: skip
    cost_of_generation = ""
    if generation is not None and not generation.later and generation.all:
        # Cut short before the warm-up ended: full generation's cost per request does not learn (every request
        # is generated), so its never-seen requests so far price it; the row says so.
        fresh = [r for r in generation.all if r.never_seen] or generation.all
        generation.later = fresh
        cost_of_generation = f"; full generation priced on its first {len(generation.all)} requests (cut short)"
    if generation is not None and generation.later:
        full = generation.energy()
        judging, producing = learned.energy("judging"), learned.energy("producing")
        rows.append(Row(f"{spec.name}: energy of judging / full generation", "≤ 0.05×" if size else "(reported)",
                        f"{judging / full:.3f}× ({judging:.1f} / {full:.1f} tokens per request{cost_of_generation})",
                        (judging / full <= 0.05) if size else None))  # fmt: skip
        rows.append(Row(f"{spec.name}: energy of everything / full generation", "≤ 0.2×" if size else "(reported)",
                        f"{(judging + producing) / full:.3f}× (judging {judging:.1f} + generation and slots "
                        f"{producing:.1f})", ((judging + producing) / full <= 0.2) if size else None))  # fmt: skip
    total = sum(deciders.values()) or 1
    notes.append(
        f"**{spec.name}**, who settled the never-seen requests after {WARMUP} (learned arm): "
        + ", ".join(f"{name} {100 * count / total:.1f}%" for name, count in sorted(deciders.items()))
        + "."
    )
    if plot is not None:
        notes.append(f"![{spec.name}: accuracy and share settled without the LLM per chunk]({plot.as_posix()})")
    return rows, notes


def deciders_of(records: Iterable[Record]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for record in records:
        counts[record.decider or record.mode] += 1
    return dict(counts)


def plot_stream(spec: StreamSpec, arms: dict[str, ArmFigures], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (accuracy, settled) = plt.subplots(1, 2, figsize=(11, 4.5))
    for key, figures in arms.items():
        xs = figures.ends
        accuracy.plot(xs, [100 * a for a, _, _ in figures.chunks], marker="o", label=figures.title)
        if key == "learned" or key.startswith("standin"):
            settled.plot(xs, [100 * s for _, s, _ in figures.chunks], marker="o", label=figures.title)
    for axis, title in ((accuracy, "right per chunk (%)"), (settled, "settled with no LLM judgment (%)")):
        axis.set_title(f"{spec.name}: {title}")
        axis.set_xlabel("requests sent (chunks of 50, feedback after each)")
        axis.set_ylim(0, 100)
        axis.grid(alpha=0.3)
        axis.axvline(WARMUP, color="grey", linestyle="--", linewidth=1)
        axis.legend(fontsize=8, loc="upper left")  # the baselines sit near 0, the learned arm climbs to the right
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def grouped_rows(spec: StreamSpec, mixed: list[Record], grouped: list[Record]) -> tuple[Row, str]:
    """Per category: accuracy on its requests after its first GROUPED_AFTER confirmed, grouped vs mixed, with the
    paired difference's 95% interval (``paired_difference``), per category and over all of them."""

    def per_category(records: list[Record]) -> dict[str | None, list[Record]]:
        """The requests of each category sent once GROUPED_AFTER of its requests were confirmed (verdicts arrive
        at the end of each chunk)."""
        confirmed: dict[str | None, int] = defaultdict(int)
        out: dict[str | None, list[Record]] = defaultdict(list)
        for start in range(0, len(records), CHUNK):
            chunk = records[start : start + CHUNK]
            for record in chunk:
                if confirmed[record.category] >= GROUPED_AFTER:
                    out[record.category].append(record)
            for record in chunk:
                confirmed[record.category] += 1
        return out

    in_mixed = {r.id: r.right for r in mixed}
    lines: list[list[object]] = []
    pooled_grouped: list[bool] = []
    pooled_mixed: list[bool] = []
    worst, worst_interval = 0.0, (math.nan, math.nan)
    for category, records in sorted(per_category(grouped).items(), key=lambda item: str(item[0])):
        pairs = [(r.right, in_mixed[r.id]) for r in records if r.id in in_mixed]  # the same requests, mixed order
        if len(records) < 5 or not pairs:
            continue
        first, second = [a for a, _ in pairs], [b for _, b in pairs]
        difference, low, high = paired_difference(first, second)
        pooled_grouped += first
        pooled_mixed += second
        if -difference > worst:
            worst, worst_interval = -difference, (low, high)
        lines.append([category or "none", len(pairs), pct(statistics.fmean(first)), pct(statistics.fmean(second)),
                      f"{100 * difference:+.1f}", f"{100 * low:+.1f} to {100 * high:+.1f}"])  # fmt: skip
    if pooled_grouped:
        difference, low, high = paired_difference(pooled_grouped, pooled_mixed)
        lines.append(["all of the above", len(pooled_grouped), pct(statistics.fmean(pooled_grouped)),
                      pct(statistics.fmean(pooled_mixed)), f"{100 * difference:+.1f}",
                      f"{100 * low:+.1f} to {100 * high:+.1f}"])  # fmt: skip
    table = markdown_table(["category", "requests", "grouped", "mixed", "points", "95% interval (paired)"], lines,
                           align="lrrrrl")  # fmt: skip
    measured = f"{-100 * worst:+.1f} points"
    if not math.isnan(worst_interval[0]):
        measured += f" (95% interval {100 * worst_interval[0]:+.1f} to {100 * worst_interval[1]:+.1f}, paired)"
    row = Row(f"{spec.name}: grouped order, worst category against mixed", "within 5 points", measured,
              worst <= 0.05)  # fmt: skip
    return row, f"**{spec.name}**, grouped against mixed order (design arms), per category:\n\n{table}"


def loco_row(spec: StreamSpec, folds: dict[str, Any]) -> tuple[Row, str]:
    sent = sum(fold["sent"] for fold in folds.values())
    served = sum(fold["served_as_another"] for fold in folds.values())
    memory = sum(fold["memory_hits"] for fold in folds.values())
    lines = [
        [category, fold["sent"], fold["served_as_another"], fold["memory_hits"], pct(fold["in_scope_settled"])]
        for category, fold in folds.items()
    ]
    table = markdown_table(
        ["left out", "sent", "served as another category", "memory hits", "in-scope settled (last chunk)"],
        lines,
        align="lrrrr",
    )
    row = Row(f"{spec.name}: left-out category served as another", "≤ 3%" if spec.size >= 500 else "(reported)",
              share(served, sent) + (f"; memory hits {memory}" if memory else ""),
              (served / sent <= 0.03) if sent and spec.size >= 500 else None)  # fmt: skip
    return row, f"**{spec.name}**, leave-one-category-out (design arms):\n\n{table}"
