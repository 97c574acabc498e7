"""Speed (issue #7, part B): what Gil itself costs per request, how memory lookup scales, how fast telemetry
commits, how much of a judge prompt the local server serves from its prompt cache, and how long the commands take
in a fresh process, how fast a verdicts file is applied, and what reading the shadow index off a large log costs.

Every figure stands beside a baseline measured in the same run (the bare scripted model call, numpy brute force,
a plain Parquet write, a bare durable file write), because on this shared 2-core machine seconds drift with the
load while ratios hold. Where a target is missed, the section says where the time goes (cProfile).

    uv run --extra local python -m benchmarks.speed [--quick]
        [--parts resolver,memory,telemetry,prefix,commands,feedback,shadows]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks._command_speed import commands_section, measure_commands
from benchmarks._feedback_speed import feedback_section, measure_feedback
from benchmarks._memory_lookup import LookupSizes, measure_lookup, memory_lookup_section
from benchmarks._prefix_reuse import measure_prefix, prefix_section
from benchmarks._report import Section, add_output_options, destination, publish
from benchmarks._resolver_speed import measure_resolver, resolver_section
from benchmarks._shadow_read import measure_shadow_read, shadow_section
from benchmarks._telemetry_speed import measure_telemetry, telemetry_section

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "uv run --extra local python -m benchmarks.speed"
PARTS = ("resolver", "memory", "telemetry", "prefix", "commands", "feedback", "shadows")
STATS_SECTION = "Stats over a large store"  # written by benchmarks/stats_speed.py


@dataclass(frozen=True)
class Sizes:
    requests: int  # timed one by one
    batch: int  # resolved by resolve_batch
    profiled: int
    remembered: int  # entries in memory before the run
    lookup: LookupSizes
    append_rows: int
    commits: int
    prefix_requests: int
    command_runs: int  # fresh processes per command
    verdicts: int  # applied per run of each feedback arm
    feedback_runs: int
    shadow_traces: int  # judged traces the shadow index is read off
    shadow_runs: int


FULL = Sizes(
    requests=300,
    batch=500,
    profiled=100,
    remembered=1000,
    lookup=LookupSizes(
        (10_000, 100_000, 1_000_000), (100_000, 1_000_000), queries=200, timed_queries=100, index_from=100_000
    ),
    append_rows=100_000,
    commits=200,
    prefix_requests=16,
    command_runs=7,
    verdicts=1000,
    feedback_runs=3,
    shadow_traces=300_000,
    shadow_runs=3,
)
QUICK = Sizes(
    requests=30,
    batch=60,
    profiled=20,
    remembered=200,
    lookup=LookupSizes((10_000,), (10_000,), queries=20, timed_queries=20, index_from=10_000, small_task=200),
    append_rows=10_000,
    commits=20,
    prefix_requests=3,
    command_runs=2,
    verdicts=60,
    feedback_runs=1,
    shadow_traces=20_000,
    shadow_runs=1,
)


# -- the command ------------------------------------------------------------------------------------------------


def run(parts: Sequence[str], *, quick: bool, command: str) -> list[Section]:
    """Measure ``parts`` (in this module's order) and return their sections."""
    sizes = QUICK if quick else FULL
    if "prefix" in parts and os.environ.get("GIL_SKIP_LOCAL_MODEL") == "1":
        _log("prompt prefix reuse skipped: GIL_SKIP_LOCAL_MODEL=1")
        parts = [part for part in parts if part != "prefix"]
    sections = []
    with tempfile.TemporaryDirectory(prefix="gil-bench-speed-") as workdir:
        root = Path(workdir)
        measures: dict[str, tuple[str, Callable[[], Section]]] = {
            "resolver": (
                "resolver overhead",
                lambda: resolver_section(asyncio.run(measure_resolver(sizes, root / "resolver")), command),
            ),
            "memory": (
                f"memory lookup at {', '.join(f'{size:,}' for size in sizes.lookup.sizes)} entries",
                lambda: memory_lookup_section(asyncio.run(measure_lookup(sizes.lookup)), command),
            ),
            "telemetry": (
                "telemetry appends and commits",
                lambda: telemetry_section(
                    measure_telemetry(sizes.append_rows, sizes.commits, root / "telemetry"), command
                ),
            ),
            "commands": (
                "commands in a fresh process",
                lambda: commands_section(measure_commands(sizes.command_runs, root / "commands"), command),
            ),
            "prefix": (
                "prompt prefix reuse on the local server",
                lambda: prefix_section(asyncio.run(measure_prefix(sizes.prefix_requests, root / "prefix")), command),
            ),
            "feedback": (
                f"{sizes.verdicts:,} verdicts applied, one at a time and a chunk at a time",
                lambda: feedback_section(
                    asyncio.run(measure_feedback(sizes.verdicts, sizes.feedback_runs, root / "feedback")), command
                ),
            ),
            "shadows": (
                f"the shadow index off {sizes.shadow_traces:,} judged traces",
                lambda: shadow_section(
                    measure_shadow_read(sizes.shadow_traces, sizes.shadow_runs, root / "shadows"), command
                ),
            ),
        }
        for part in PARTS:
            if part in parts:
                what, measure = measures[part]
                _log(what)
                started = time.perf_counter()
                sections.append(measure())
                _log(f"{what}: {time.perf_counter() - started:.0f} s")
    return sections


def _log(message: str) -> None:
    print(f"[speed] {message}", file=sys.stderr, flush=True)


def main(arguments: list[str] | None = None) -> list[Section]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_output_options(parser)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}")
    parser.add_argument("--command", default=None, help=argparse.SUPPRESS)  # the runner names itself
    options = parser.parse_args(arguments)
    parts = [part.strip() for part in options.parts.split(",") if part.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    command = options.command or COMMAND + (" --quick" if options.quick else "")
    if options.command is None and parts != list(PARTS):
        command += f" --parts {','.join(parts)}"
    sections = run(parts, quick=options.quick, command=command)
    publish(sections, destination(options))
    return sections


if __name__ == "__main__":
    main(sys.argv[1:])
