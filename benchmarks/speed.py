"""Speed (issue #7, part B): what Gil itself costs per request, how memory lookup scales, how fast telemetry
commits, and how much of a judge prompt the local server serves from its prompt cache.

Every figure stands beside a baseline measured in the same run (the bare scripted model call, numpy brute force,
a plain Parquet write, a bare durable file write), because on this shared 2-core machine seconds drift with the
load while ratios hold. Where a target is missed, the section says where the time goes (cProfile).

    uv run --extra local python -m benchmarks.speed [--quick] [--parts resolver,memory,telemetry,prefix]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._memory_lookup import LookupSizes, measure_lookup, memory_lookup_section
from benchmarks._prefix_reuse import measure_prefix, prefix_section
from benchmarks._report import (
    HotSpot,
    Row,
    Section,
    add_output_options,
    destination,
    hot_spot_table,
    hot_spots,
    latency_text,
    percentile,
    publish,
    support_tree,
)
from benchmarks._telemetry_speed import measure_telemetry, telemetry_section
from gil_core.fallback import TreeAnswerContract
from gil_core.language import ENGLISH
from gil_core.memory import LanceDBMemory, MemoryEntry
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition, TaskPolicy
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel, ScriptedChatModel, ScriptedReply
from gil_core.traverse import Thresholds

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "uv run --extra local python -m benchmarks.speed"
PARTS = ("resolver", "memory", "telemetry", "prefix")
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


FULL = Sizes(
    requests=300,
    batch=500,
    profiled=100,
    remembered=1000,
    lookup=LookupSizes(
        (10_000, 100_000, 1_000_000),
        queries=200,
        timed_queries=100,
        slow_queries=30,
        flat_limit=100_000,
        index_from=100_000,
    ),
    append_rows=100_000,
    commits=200,
    prefix_requests=16,
)
QUICK = Sizes(
    requests=30,
    batch=60,
    profiled=20,
    remembered=200,
    lookup=LookupSizes((10_000,), queries=20, timed_queries=20, slow_queries=20, flat_limit=10_000, index_from=10_000),
    append_rows=10_000,
    commits=20,
    prefix_requests=3,
)


def _first_label(messages: Sequence[Any], **_: Any) -> ScriptedReply:
    """A zero-latency model sure of the first candidate ("B"): every walk goes root → billing → a habit."""
    return ScriptedReply("B")


async def _time_each(count: int, run: Callable[[int], Awaitable[object]]) -> list[float]:
    walls = []
    for index in range(count):
        started = time.perf_counter()
        await run(index)
        walls.append(time.perf_counter() - started)
    return walls


# -- resolver overhead ----------------------------------------------------------------------------------------


@dataclass
class ResolverFigures:
    model_call: list[float]
    embed_call: list[float]
    tree_requests: list[float]
    memory_requests: list[float]
    batch_seconds: float
    batch_requests: int
    profile: list[HotSpot]  # per request through the tree
    files_per_request: float
    remembered: int


async def measure_resolver(sizes: Sizes, root: Path) -> ResolverFigures:
    from gil_core.batch import Ticket, resolve_batch
    from gil_core.judge.prompt import Candidate, build_judge_messages, label_candidates
    from gil_core.ontology.labels import LabelScheme

    tree = support_tree()
    task = TaskDefinition(
        "bench",
        TreeAnswerContract(tree),
        tree,
        TaskPolicy(thresholds=Thresholds(per_layer=(0.5,), leaf=0.5), memory_threshold=0.95),
        ENGLISH,
    )
    chat, embedder = ScriptedChatModel(responder=_first_label), HashEmbeddingModel(384)
    store = TelemetryStore(root / "store")
    memory = LanceDBMemory(root / "memory", embedder)
    remembered = [f"remembered request {i}: where is parcel {i}?" for i in range(sizes.remembered)]
    await memory.rebuild(
        task.name, [MemoryEntry(f"k{i}", text, "it is on its way") for i, text in enumerate(remembered)]
    )
    resolver = Resolver(chat, store, memory=memory)
    await resolver.resolve(task, "warm-up request")  # run config, shadow index, table handles

    shown = label_candidates([Candidate.of(child) for child in tree.root.children], LabelScheme.LETTERS)
    messages = build_judge_messages(ENGLISH, "where is my parcel?", shown)
    model_call = await _time_each(
        sizes.requests, lambda i: chat.complete(messages, max_tokens=1, temperature=0.0, top_logprobs=5)
    )
    embed_call = await _time_each(sizes.requests, lambda i: embedder.embed([f"my order {i} has not arrived yet"]))
    tree_requests = await _time_each(
        sizes.requests, lambda i: resolver.resolve(task, f"my order {i} has not arrived yet")
    )
    memory_requests = await _time_each(
        sizes.requests, lambda i: resolver.resolve(task, remembered[i % len(remembered)])
    )

    tickets = [Ticket(f"t{i}", f"batch request {i}: my parcel {i} is late") for i in range(sizes.batch)]
    started = time.perf_counter()
    report = await resolve_batch(resolver, task, tickets, concurrency=8)
    batch_seconds = time.perf_counter() - started

    files_before = sum(1 for _ in (root / "store").rglob("*.parquet"))
    profiler = cProfile.Profile()
    profiler.enable()
    for index in range(sizes.profiled):
        await resolver.resolve(task, f"profiled request {index}: my order has not arrived")
    profiler.disable()
    files_after = sum(1 for _ in (root / "store").rglob("*.parquet"))
    return ResolverFigures(
        model_call,
        embed_call,
        tree_requests,
        memory_requests,
        batch_seconds,
        report.resolved,
        hot_spots(profiler, sizes.profiled, _HOT_SPOTS),
        (files_after - files_before) / sizes.profiled,
        sizes.remembered,
    )


# Functions worth naming in the profile: (file suffix, function name, label). Those missing in a run are left out.
_HOT_SPOTS = (
    ("gil_core/resolver.py", "resolve", "`Resolver.resolve` (all of it)"),
    ("gil_core/resolver.py", "_lookup", "memory lookup (`LanceDBMemory.lookup`, hash embedding included)"),
    ("gil_core/resolver.py", "_walk", "tree walk (2 judge calls through `CallRecorder`)"),
    ("gil_core/telemetry/store.py", "record_trace", "`TelemetryStore.record_trace` (calls file + traces file)"),
    ("gil_core/resolver.py", "_record_walk", "`Resolver._record_walk` (node_stats + node_choices files)"),
    ("gil_core/telemetry/store.py", "append", "`TelemetryStore.append` (every table write)"),
    ("gil_core/telemetry/store.py", "_conform", "… `_conform`: rows → Polars frame"),
    ("gil_core/telemetry/schemas.py", "validate_frame", "… `validate_frame`: schema checks"),
    ("gil_core/telemetry/store.py", "_write_atomically", "… `_write_atomically`: Parquet + fsync + rename"),
    ("gil_core/storage.py", "write_parquet", "… the store folder's `write_parquet`: Parquet + fsync + rename"),
    ("~", "<built-in method posix.fsync>", "… … `os.fsync` (file and folder)"),
    ("polars/dataframe/frame.py", "write_parquet", "… … Polars `write_parquet`"),
    ("~", "<method 'collect' of 'builtins.PyLazyFrame' objects>", "Polars `collect` (inside append)"),
)


def resolver_section(figures: ResolverFigures, command: str) -> Section:
    model, embed = percentile(figures.model_call, 0.5), percentile(figures.embed_call, 0.5)
    tree = percentile(figures.tree_requests, 0.5)
    overhead = tree - 2 * model - embed
    rate = figures.batch_requests / figures.batch_seconds
    rows = [
        Row("baseline: bare scripted model call (`ScriptedChatModel.complete`)", "—", latency_text(figures.model_call)),
        Row("baseline: hash embedding of one request (384 dims)", "—", latency_text(figures.embed_call)),
        Row(
            "request through the tree (memory miss, 2 judge calls, habit answer)",
            "—",
            latency_text(figures.tree_requests),
        ),
        Row("request answered from memory", "—", latency_text(figures.memory_requests)),
        Row(
            "resolver overhead per request, p50 (tree request − 2 model calls − 1 embedding)",
            "≤ 1 ms",
            f"{overhead * 1000:.2f} ms ({tree / (2 * model + embed):.0f}× the model work)",
            overhead <= 0.001,
        ),
        Row(
            f"batch: `resolve_batch`, concurrency 8, {figures.batch_requests:,} requests",
            "≥ 1,000 requests/s",
            f"{rate:,.0f} requests/s",
            rate >= 1000,
        ),
    ]
    profile = hot_spot_table("where (cProfile, per request through the tree)", figures.profile)
    lead = (
        "One `Resolver` over the support tree with a zero-latency in-process model (`ScriptedChatModel` sure of its "
        "first candidate, so every walk is root → billing → an answer habit), memory on (`LanceDBMemory` with "
        f"`HashEmbeddingModel(384)`, holding {figures.remembered:,} entries) and telemetry on "
        "(`TelemetryStore` in a temporary folder). Requests are timed one by one after a warm-up; the batch runs "
        "`gil_core.batch.resolve_batch` over new tickets."
    )
    notes = []
    if overhead > 0.001 or rate < 1000:
        spots = {label: cumulative for label, _, cumulative, _ in figures.profile}
        store_ms = spots.get("`TelemetryStore.append` (every table write)", 0.0)
        fsync_ms = spots.get("… … `os.fsync` (file and folder)", 0.0)
        total_ms = spots.get("`Resolver.resolve` (all of it)", tree * 1000)
        notes.append(
            f"**Miss**, cause: our code. Where the time goes (profile below, {figures.files_per_request:.0f} "
            f"Parquet files written per request): telemetry writes take {store_ms:.1f} of {total_ms:.1f} ms per "
            f"request ({store_ms / total_ms:.0%}), of which {fsync_ms:.1f} ms is `fsync`. Every request appends "
            "four durable files (calls, traces, node_stats, node_choices), each validated, written as Parquet, "
            "fsync-ed, renamed and its folder fsync-ed. A 1 ms request needs those writes group-committed "
            "(one journal append per request, or one fsync for many requests in a batch) instead of a file per "
            "table per request; the resolver's own logic (lookup, walk, judging) is the small remainder."
        )
    return Section("Speed: resolver overhead (part B)", command, lead, rows, notes, extra_tables=[profile])


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
            "prefix": (
                "prompt prefix reuse on the local server",
                lambda: prefix_section(asyncio.run(measure_prefix(sizes.prefix_requests, root / "prefix")), command),
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
