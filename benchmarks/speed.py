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
from contextlib import AbstractContextManager, nullcontext
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
        (10_000, 100_000, 1_000_000), (100_000, 1_000_000), queries=200, timed_queries=100, index_from=100_000
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
    lookup=LookupSizes((10_000,), (10_000,), queries=20, timed_queries=20, index_from=10_000, small_task=200),
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
class ResolverArm:
    """One way of committing a request's telemetry: durable before ``resolve`` returns, or group commit."""

    name: str
    tree_requests: list[float]  # each ``resolve`` call, one by one
    tree_seconds: float  # all of them, the flushes they caused included (and the last flush)
    memory_requests: list[float]
    batch_seconds: float
    batch_requests: int
    files_per_request: float  # Parquet files the tree requests wrote, per request


@dataclass
class ResolverFigures:
    model_call: list[float]
    embed_call: list[float]
    arms: list[ResolverArm]  # durable per request, then group commit
    profile: list[HotSpot]  # per request through the tree, group commit, flushes included
    remembered: int
    batch_size: int
    profiled: int


# resolve_batch's defaults, which the group-commit arm uses throughout
_GROUP_ROWS, _GROUP_DELAY_S = 1000, 0.2


async def measure_resolver(sizes: Sizes, root: Path) -> ResolverFigures:
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
    memory = LanceDBMemory(root / "memory", embedder)
    remembered = [f"remembered request {i}: where is parcel {i}?" for i in range(sizes.remembered)]
    await memory.rebuild(
        task.name, [MemoryEntry(f"k{i}", text, "it is on its way") for i, text in enumerate(remembered)]
    )

    shown = label_candidates([Candidate.of(child) for child in tree.root.children], LabelScheme.LETTERS)
    messages = build_judge_messages(ENGLISH, "where is my parcel?", shown)
    model_call = await _time_each(
        sizes.requests, lambda i: chat.complete(messages, max_tokens=1, temperature=0.0, top_logprobs=5)
    )
    embed_call = await _time_each(sizes.requests, lambda i: embedder.embed([f"my order {i} has not arrived yet"]))

    arms = []
    for name, grouped in (("durable per request", False), ("group commit", True)):
        # Each arm its own store (a batch starts by reading which tickets have a trace: the other arm's files
        # would slow it down), the same memory.
        resolver = Resolver(chat, TelemetryStore(root / name.replace(" ", "-")), memory=memory)
        await resolver.resolve(task, "warm-up request")  # run config, shadow index, table handles
        arms.append(await _measure_arm(name, grouped, resolver, task, sizes, remembered))

    # No timed flushes here: cProfile sees this thread only, so every flush must run on it (at max_rows, or when
    # the block is left) to be counted.
    store = resolver.store  # the group-commit arm's
    profiler = cProfile.Profile()
    profiler.enable()
    with store.group_commit(max_rows=_GROUP_ROWS, max_delay_s=None):
        for index in range(sizes.profiled):
            await resolver.resolve(task, f"profiled request {index}: my order has not arrived")
    profiler.disable()
    return ResolverFigures(
        model_call,
        embed_call,
        arms,
        hot_spots(profiler, sizes.profiled, _HOT_SPOTS),
        sizes.remembered,
        sizes.batch,
        sizes.profiled,
    )


async def _measure_arm(
    name: str, grouped: bool, resolver: Resolver, task: TaskDefinition, sizes: Sizes, remembered: Sequence[str]
) -> ResolverArm:
    from gil_core.batch import Ticket, resolve_batch

    store = resolver.store

    def group() -> AbstractContextManager[object]:
        return store.group_commit(max_rows=_GROUP_ROWS, max_delay_s=_GROUP_DELAY_S) if grouped else nullcontext()

    def parquet_files() -> int:
        return sum(1 for _ in store.root.rglob("*.parquet"))

    files_before = parquet_files()
    started = time.perf_counter()
    with group():
        tree_requests = await _time_each(
            sizes.requests, lambda i: resolver.resolve(task, f"my order {i} has not arrived yet")
        )
    tree_seconds = time.perf_counter() - started
    files = (parquet_files() - files_before) / sizes.requests
    with group():
        memory_requests = await _time_each(
            sizes.requests, lambda i: resolver.resolve(task, remembered[i % len(remembered)])
        )
    tickets = [Ticket(f"{name}-{i}", f"batch request {i}: my parcel {i} is late") for i in range(sizes.batch)]
    started = time.perf_counter()
    report = await resolve_batch(resolver, task, tickets, concurrency=8, commit_rows=_GROUP_ROWS if grouped else None)
    batch_seconds = time.perf_counter() - started
    return ResolverArm(name, tree_requests, tree_seconds, memory_requests, batch_seconds, report.resolved, files)


# Functions worth naming in the profile: (file suffix, function name, label). Those missing in a run are left out.
_RESOLVE = "`Resolver.resolve` (all of it)"
_LOOKUP = "memory lookup (`LanceDBMemory.lookup`, hash embedding included)"
_RECORD = "`TelemetryStore.record_trace` (rows built, typed, queued)"
_WALK = "tree walk (2 judge calls through `CallRecorder`)"
_VERSION = "… memory: LanceDB table version check (at most every 0.5 s, and before each write)"
_WAITING = "… the event loop waiting (`epoll`: LanceDB's threads)"
_FLUSH = "group flushes, amortised (`TelemetryStore._flush`)"
_HOT_SPOTS = (
    ("gil_core/resolver.py", "resolve", _RESOLVE),
    ("gil_core/resolver.py", "_lookup", _LOOKUP),
    ("gil_core/memory/lancedb_memory.py", "_sync", _VERSION),
    ("~", "<method 'poll' of 'select.epoll' objects>", _WAITING),
    ("gil_core/resolver.py", "_walk", _WALK),
    ("gil_core/telemetry/store.py", "record_trace", _RECORD),
    ("gil_core/telemetry/_rows.py", "conformable", "… `conformable`: the cheap type check before queueing"),
    ("gil_core/telemetry/store.py", "_flush", _FLUSH),
    ("gil_core/telemetry/_group.py", "prepare", "… `prepare`: each table conformed and validated once per group"),
    ("gil_core/telemetry/schemas.py", "validate_frame", "… … `validate_frame`: schema checks"),
    ("gil_core/storage.py", "write_parquet", "… the store folder's `write_parquet`: Parquet + fsync + rename"),
    ("~", "<built-in method posix.fsync>", "… … `os.fsync` (file and folder)"),
)


def _overhead(figures: ResolverFigures, walls: Sequence[float]) -> float:
    """A request's wall time less what the zero-latency model and embedder themselves take (2 calls, 1 embed)."""
    model, embed = percentile(figures.model_call, 0.5), percentile(figures.embed_call, 0.5)
    return percentile(walls, 0.5) - 2 * model - embed


def resolver_section(figures: ResolverFigures, command: str) -> Section:
    model, embed = percentile(figures.model_call, 0.5), percentile(figures.embed_call, 0.5)
    rows = [
        Row("baseline: bare scripted model call (`ScriptedChatModel.complete`)", "—", latency_text(figures.model_call)),
        Row("baseline: hash embedding of one request (384 dims)", "—", latency_text(figures.embed_call)),
    ]
    for arm in figures.arms:
        mean = arm.tree_seconds / len(arm.tree_requests)
        rows += [
            Row(
                f"{arm.name}: request through the tree (memory miss, 2 judge calls, habit answer)",
                "—",
                f"{latency_text(arm.tree_requests)}; mean with every flush {mean * 1000:.2f} ms; "
                f"{arm.files_per_request:.2f} Parquet files per request",
            ),
            Row(f"{arm.name}: request answered from memory", "—", latency_text(arm.memory_requests)),
        ]
    for arm in figures.arms:
        overhead = _overhead(figures, arm.tree_requests)
        mean = arm.tree_seconds / len(arm.tree_requests) - 2 * model - embed
        rows.append(
            Row(
                f"{arm.name}: resolver overhead per request, p50 (tree request − 2 model calls − 1 embedding)",
                "≤ 1 ms",
                f"{overhead * 1000:.2f} ms (mean with every flush: {mean * 1000:.2f} ms)",
                overhead <= 0.001,
            )
        )
    for arm in figures.arms:
        rate = arm.batch_requests / arm.batch_seconds
        rows.append(
            Row(
                f"{arm.name}: batch, `resolve_batch`, concurrency 8, {arm.batch_requests:,} requests",
                "≥ 1,000 requests/s",
                f"{rate:,.0f} requests/s",
                rate >= 1000,
            )
        )
    profile = hot_spot_table(
        "where (cProfile, per request through the tree, group commit, the block's flush included)", figures.profile
    )
    lead = (
        "One `Resolver` over the support tree with a zero-latency in-process model (`ScriptedChatModel` sure of its "
        "first candidate, so every walk is root → billing → an answer habit), memory on (`LanceDBMemory` with "
        f"`HashEmbeddingModel(384)`, holding {figures.remembered:,} entries) and telemetry on "
        "(`TelemetryStore` in a temporary folder). Two arms, each with its own store: **durable per "
        "request** (a request's calls, trace and walk counters written as one `append_many`, one file per table, "
        "each fsync-ed, before `resolve` returns) and **group commit** (inside `store.group_commit(max_rows="
        f"{_GROUP_ROWS}, max_delay_s={_GROUP_DELAY_S})`, the defaults `resolve_batch` uses: `resolve` returns once "
        "its rows are queued; a flush writes one file per table per group). Requests are timed one by one after a "
        "warm-up; the mean adds every flush the requests caused, and the last one. Each batch runs "
        f"`gil_core.batch.resolve_batch` over {figures.batch_size:,} new tickets (with `commit_rows=None` in the "
        "durable arm); in the group arm a ticket counts only once its trace is flushed."
    )
    return Section(
        "Speed: resolver overhead (part B)",
        command,
        lead,
        rows,
        _resolver_notes(figures),
        extra_tables=[profile],
    )


def _resolver_notes(figures: ResolverFigures) -> list[str]:
    durable, grouped = figures.arms
    notes = []
    speedup = percentile(durable.tree_requests, 0.5) / percentile(grouped.tree_requests, 0.5)
    batch_speedup = (grouped.batch_requests / grouped.batch_seconds) / (durable.batch_requests / durable.batch_seconds)
    notes.append(
        f"Group commit against a durable write per request, same run: a request through the tree is "
        f"{speedup:.1f}× faster at p50 ({durable.files_per_request:.1f} → {grouped.files_per_request:.2f} Parquet "
        f"files per request), a batch {batch_speedup:.1f}× faster. What a request gives up: it is acknowledged "
        f"when its group is flushed (within {_GROUP_DELAY_S} s, or at {_GROUP_ROWS:,} queued rows), not when "
        "`resolve` returns; a crash loses the requests not flushed yet, which a batch rerun resolves again."
    )
    if all(_overhead(figures, arm.tree_requests) <= 0.001 for arm in figures.arms[1:]) and all(
        arm.batch_requests / arm.batch_seconds >= 1000 for arm in figures.arms[1:]
    ):
        return notes
    spots = {label: cumulative for label, _, cumulative, _ in figures.profile}
    flushes = spots.get(_FLUSH, 0.0)
    total = spots.get(_RESOLVE, 0.0) + flushes  # the flushes here ran when the profiled block was left
    parts = [(label, spots[label]) for label in (_LOOKUP, _WALK, _RECORD) if label in spots] + [(_FLUSH, flushes)]
    shares = "; ".join(f"{label.split(' (')[0].strip('`')} {ms:.2f} ms ({ms / total:.0%})" for label, ms in parts)
    version, waiting = spots.get(_VERSION, 0.0), spots.get(_WAITING, 0.0)
    notes.append(
        f"**Miss** with group commit, cause: our code and LanceDB on this loaded machine; the telemetry writes "
        f"are no longer the bulk. Per request through the tree (cProfile, which slows Python down; flushes "
        f"amortised over the {figures.profiled:,} profiled requests): {total:.2f} ms, of which {shares}. Inside "
        f"the memory lookup, {version:.2f} ms is checking LanceDB's table version (on every lookup) and "
        f"{waiting:.2f} ms the event loop waiting for LanceDB's threads, which 2 busy cores make long; keeping the "
        "version for a moment, or checking it only on a miss, would save that (`gil_core/memory`, not changed "
        "here). The rest is the resolver's own Python (two judgments recorded through `CallRecorder`), building "
        "and typing the rows (JSON of the calls' candidates and logprobs) and each flush's fixed cost (a Parquet "
        "file per table, each fsync-ed with its folder) spread over a group's requests. A flush writes its tables "
        "one after another (calls, traces, counters: the order a reader relies on); fsyncing their data in "
        "parallel, then renaming in order, would need a two-step write in `gil_core/storage.py`."
    )
    return notes


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
