"""What every benchmark part shares: sections of BENCHMARKS.md (a table of targets beside measured figures, the
command and the date), the options that say where a run writes, and timing summaries.

A part builds ``Section`` objects and hands them to ``publish``; a section replaces only its own ``## heading``
in the file, so parts (and engineers) never overwrite each other's figures.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from gil_core.ontology import Tree, TreeLintWarning, load_tree

__all__ = [
    "BENCHMARKS_FILE",
    "ROOT",
    "RUNNER_COMMAND",
    "Row",
    "Section",
    "add_output_options",
    "destination",
    "hot_spot_table",
    "hot_spots",
    "latency_text",
    "machine",
    "markdown_table",
    "percentile",
    "publish",
    "replace_section",
    "support_tree",
    "verdict",
]

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_FILE = ROOT / "BENCHMARKS.md"
RUNNER_COMMAND = "uv run --extra local python -m benchmarks"


@dataclass(frozen=True)
class Row:
    """One line of a section's table: what was measured, the target, the figure, and whether it meets it
    (None for figures that have no target: baselines and context)."""

    what: str
    target: str
    measured: str
    meets: bool | None = None


@dataclass
class Section:
    """One ``## title`` section of BENCHMARKS.md: a lead paragraph, the table of rows, then notes."""

    title: str
    command: str
    lead: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra_tables: list[str] = field(default_factory=list)

    def render(self, *, run_date: date | None = None) -> str:
        """The section's markdown, heading included."""
        when = (run_date or date.today()).isoformat()
        parts = [
            f"## {self.title}",
            f"Command: `{self.command}` — run {when}. {machine()}",
            self.lead.strip(),
            markdown_table(
                ["what", "target", "measured", "verdict"],
                [[row.what, row.target, row.measured, _verdict_cell(row.meets)] for row in self.rows],
                align="lllc",
            )
            if self.rows
            else "",
            *self.extra_tables,
            *(note.strip() for note in self.notes),
        ]
        return "\n\n".join(part for part in parts if part) + "\n"

    @property
    def misses(self) -> list[Row]:
        return [row for row in self.rows if row.meets is False]


def _verdict_cell(meets: bool | None) -> str:
    return "" if meets is None else ("meets" if meets else "**misses**")


def verdict(meets: bool) -> str:
    """The word a sentence uses for a target: "meets" or "misses"."""
    return "meets" if meets else "misses"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]], *, align: str | None = None) -> str:
    """A GitHub markdown table; ``align`` holds one of l, r, c per column (default: all left)."""
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    align = align or "l" * len(header)
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(marks[a] for a in align) + "|",
        *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows),
    ]
    return "\n".join(lines)


def percentile(values: Sequence[float], share: float) -> float:
    """The ``share`` quantile (0.5 = median) of ``values``, interpolated."""
    if not values:
        raise ValueError("no values to summarise")
    if len(values) == 1:
        return float(values[0])
    return float(statistics.quantiles(values, n=1000, method="inclusive")[round(share * 1000) - 1])


def machine() -> str:
    """One sentence on where the figures were measured (a shared 2-core machine: load matters)."""
    load = os.getloadavg()[0]
    return (
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs shared with other work (1-minute load "
        f"{load:.1f} when the section was written), Python {platform.python_version()}."
    )


def replace_section(text: str, title: str, body: str) -> str:
    """``text`` (a BENCHMARKS.md) with its ``## title`` section replaced by ``body`` (which starts with that
    heading), or with ``body`` appended when there is none; other sections stay byte for byte."""
    marker = f"\n## {title}\n"
    padded = "\n" + text
    if marker not in padded:
        return f"{text.rstrip()}\n\n{body.rstrip()}\n"
    before, rest = padded.split(marker, 1)
    after = rest[rest.index("\n## ") + 1 :] if "\n## " in rest else ""
    joined = f"{before.strip()}\n\n{body.rstrip()}\n" if before.strip() else f"{body.rstrip()}\n"
    return f"{joined}\n{after}" if after else joined


def publish(sections: Sequence[Section], destination: Path | None) -> None:
    """Print every section; write them into ``destination`` (a BENCHMARKS.md) when one is given."""
    for section in sections:
        print(section.render(), flush=True)
    if destination is None:
        return
    text = destination.read_text(encoding="utf-8") if destination.exists() else "# Benchmarks\n"
    for section in sections:
        text = replace_section(text, section.title, section.render())
    destination.write_text(text, encoding="utf-8")
    print(f"wrote {len(sections)} section(s) into {destination}", flush=True)


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """``--quick``, ``--output`` and ``--no-write``: full runs write BENCHMARKS.md, quick runs only print."""
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI (under 3 minutes in all)")
    parser.add_argument(
        "--output",
        type=Path,
        help=f"write the sections into this file (default: {BENCHMARKS_FILE.name} on full runs, nowhere on quick)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only; write no file")


def destination(options: argparse.Namespace) -> Path | None:
    """Where a run writes its sections: ``--output``, else BENCHMARKS.md on a full run, else nowhere."""
    if options.no_write:
        return None
    if options.output is not None:
        return Path(options.output)
    return None if options.quick else BENCHMARKS_FILE


def latency_text(walls: Sequence[float]) -> str:
    """Median and 90th percentile of ``walls`` (seconds) in milliseconds."""
    return f"p50 {percentile(walls, 0.5) * 1000:.2f} ms, p90 {percentile(walls, 0.9) * 1000:.2f} ms"


def support_tree() -> Tree:
    """The bundled support tree (its lint warnings are the demo's business, not a benchmark's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        return load_tree(ROOT / "ontologies" / "support.yaml")


HotSpot = tuple[str, float, float, float]
"""A profiled function: its label, and per unit of work its calls, cumulative ms and own ms."""


def hot_spots(profiler: cProfile.Profile, per: int, spots: Sequence[tuple[str, str, str]]) -> list[HotSpot]:
    """The functions of ``spots`` (file suffix, function name, label) found in ``profiler``'s statistics, per
    ``per`` units of work; those the run never called are left out."""
    stats: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    found = []
    for suffix, name, label in spots:
        for (path, _, function), (_, calls, own, cumulative, _) in stats.items():
            if function == name and path.replace(os.sep, "/").endswith(suffix):
                found.append((label, calls / per, cumulative * 1000 / per, own * 1000 / per))
                break
    return found


def hot_spot_table(title: str, spots: Sequence[HotSpot], *, digits: int = 2) -> str:
    """``spots`` as a table headed ``title``."""
    return markdown_table(
        [title, "calls", "cumulative ms", "own ms"],
        [[label, f"{calls:.1f}", f"{total:.{digits}f}", f"{own:.{digits}f}"] for label, calls, total, own in spots],
        align="lrrr",
    )
