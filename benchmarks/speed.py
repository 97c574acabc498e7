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
import json
import os
import pstats
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from benchmarks._memory_lookup import LookupSizes, measure_lookup, memory_lookup_section
from benchmarks._report import Row, Section, add_output_options, destination, markdown_table, percentile, publish
from gil_core.fallback import TreeAnswerContract
from gil_core.language import ENGLISH
from gil_core.memory import LanceDBMemory, MemoryEntry
from gil_core.ontology import Tree, TreeLintWarning, load_tree
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition, TaskPolicy
from gil_core.telemetry import CallRecord, TelemetryStore, TraceRecord, utc_now
from gil_core.telemetry.records import CandidateShown
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
    requests=1000,
    batch=2000,
    profiled=300,
    remembered=1000,
    lookup=LookupSizes(
        (10_000, 100_000, 1_000_000), queries=200, slow_queries=30, flat_limit=100_000, index_from=100_000
    ),
    append_rows=100_000,
    commits=300,
    prefix_requests=24,
)
QUICK = Sizes(
    requests=30,
    batch=60,
    profiled=20,
    remembered=200,
    lookup=LookupSizes((10_000,), queries=20, slow_queries=20, flat_limit=10_000, index_from=10_000),
    append_rows=10_000,
    commits=20,
    prefix_requests=3,
)


def _support_tree() -> Tree:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        return load_tree(ROOT / "ontologies" / "support.yaml")


def _first_label(messages: Sequence[Any], **_: Any) -> ScriptedReply:
    """A zero-latency model sure of the first candidate ("B"): every walk goes root → billing → a habit."""
    return ScriptedReply("B")


def _timings(walls: Sequence[float]) -> str:
    return f"p50 {percentile(walls, 0.5) * 1000:.2f} ms, p90 {percentile(walls, 0.9) * 1000:.2f} ms"


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
    profile: list[tuple[str, float, float, float]]  # function, calls, cumulative ms, own ms per request
    files_per_request: float
    remembered: int


async def measure_resolver(sizes: Sizes, root: Path) -> ResolverFigures:
    from gil_core.batch import Ticket, resolve_batch
    from gil_core.judge.prompt import Candidate, build_judge_messages, label_candidates
    from gil_core.ontology.labels import LabelScheme

    tree = _support_tree()
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
        hot_spots(profiler, sizes.profiled),
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


_APPEND_SPOTS = (
    ("gil_core/telemetry/store.py", "append", "`TelemetryStore.append`"),
    ("gil_core/telemetry/store.py", "_conform", "… `_conform`: rows → Polars frame of the schema"),
    ("gil_core/telemetry/schemas.py", "validate_frame", "… `validate_frame`: pandera checks"),
    ("gil_core/telemetry/store.py", "_write_atomically", "… `_write_atomically`: Parquet + fsync + rename"),
    ("gil_core/storage.py", "write_parquet", "… the store folder's `write_parquet`: Parquet + fsync + rename"),
    ("polars/dataframe/frame.py", "write_parquet", "… … Polars `write_parquet`"),
    ("~", "<built-in method posix.fsync>", "… … `os.fsync`"),
)


def hot_spots(
    profiler: cProfile.Profile, requests: int, spots: Sequence[tuple[str, str, str]] = _HOT_SPOTS
) -> list[tuple[str, float, float, float]]:
    """Per request: calls, cumulative ms and own ms of the functions in ``spots`` (file suffix, name, label)."""
    stats: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    found = []
    for suffix, name, label in spots:
        for (path, _, function), (_, calls, own, cumulative, _) in stats.items():
            if function == name and path.replace(os.sep, "/").endswith(suffix):
                found.append((label, calls / requests, cumulative * 1000 / requests, own * 1000 / requests))
                break
    return found


def resolver_section(figures: ResolverFigures, command: str) -> Section:
    model, embed = percentile(figures.model_call, 0.5), percentile(figures.embed_call, 0.5)
    tree = percentile(figures.tree_requests, 0.5)
    overhead = tree - 2 * model - embed
    rate = figures.batch_requests / figures.batch_seconds
    rows = [
        Row("baseline: bare scripted model call (`ScriptedChatModel.complete`)", "—", _timings(figures.model_call)),
        Row("baseline: hash embedding of one request (384 dims)", "—", _timings(figures.embed_call)),
        Row(
            "request through the tree (memory miss, 2 judge calls, habit answer)", "—", _timings(figures.tree_requests)
        ),
        Row("request answered from memory", "—", _timings(figures.memory_requests)),
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
    profile = markdown_table(
        ["where (cProfile, per request through the tree)", "calls", "cumulative ms", "own ms"],
        [
            [label, f"{calls:.1f}", f"{cumulative:.2f}", f"{own:.2f}"]
            for label, calls, cumulative, own in figures.profile
        ],
        align="lrrr",
    )
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


# -- telemetry ------------------------------------------------------------------------------------------------


@dataclass
class TelemetryFigures:
    rows: int
    append_seconds: dict[str, float]
    parquet_seconds: dict[str, float]
    commits: list[float]
    durable_writes: list[float]
    profile: list[tuple[str, float, float, float]]  # per batched append (one of each table)


def _durable_write(folder: Path, payload: bytes) -> None:
    """The floor of one acknowledged write: temporary file, fsync, rename, fsync of the folder."""
    temporary = folder / f".{uuid.uuid4().hex}.tmp"
    with temporary.open("wb") as file:
        file.write(payload)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, folder / f"{uuid.uuid4().hex}.bin")
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _request_records(index: int) -> tuple[TraceRecord, list[CallRecord]]:
    """One request's trace and its two judge calls, as the resolver records them."""
    trace_id, now = uuid.uuid4().hex, utc_now()
    shown = (CandidateShown(None, "A"), CandidateShown("billing", "B", "billing", "charges and refunds"))
    calls = [
        CallRecord(
            call_id=uuid.uuid4().hex,
            trace_id=trace_id,
            created_at=now,
            role="judge",
            model="smollm2",
            node_id=node,
            layer=layer,
            prompt_tokens=180,
            cached_tokens=60,
            completion_tokens=1,
            latency_ms=120.0,
            first_token="B",
            top_logprobs=(("B", -0.05), ("A", -3.2)),
            distribution={"billing": 0.95},
            label_mass=0.99,
            confidence=0.95,
            outcome="accept",
            energy=181.0,
            candidates=shown,
        )
        for layer, node in ((1, "root"), (2, "billing"))
    ]
    trace = TraceRecord(
        trace_id=trace_id,
        created_at=now,
        task="bench",
        state=f"where is my parcel {index}?",
        mode="habit/answer",
        path=[{"node": "root", "layer": 1, "outcome": "accept", "chosen": "billing", "p": 0.95}],
        output="Refunds reach the original payment method within 5 business days of approval.",
        confidence=0.95,
        energy=362.0,
        recall={"source": "k1", "similarity": 0.41, "threshold": 0.95, "hit": False},
    )
    return trace, calls


def measure_telemetry(sizes: Sizes, root: Path) -> TelemetryFigures:
    from benchmarks.stats_speed import call_chunk, trace_chunk  # the store's realistic rows, generated once

    rng = np.random.default_rng(0)
    store = TelemetryStore(root / "store")
    columns = store.scan("traces").collect_schema().names()
    traces = trace_chunk(rng, 0, sizes.append_rows)
    call_rows = call_chunk(rng, traces)
    energy = call_rows.group_by("trace_id").agg(pl.col("energy").sum())
    traces = traces.join(energy, on="trace_id", how="left").with_columns(pl.col("energy").fill_null(0.0))
    frames = {
        "calls": call_rows.head(sizes.append_rows),
        "traces": traces.select(column for column in columns if column in traces.columns),
    }
    append_seconds, parquet_seconds = {}, {}
    plain = root / "plain"
    plain.mkdir(parents=True)
    for table, frame in frames.items():
        started = time.perf_counter()
        frame.write_parquet(plain / f"{table}.parquet")
        parquet_seconds[table] = time.perf_counter() - started
        started = time.perf_counter()
        store.append(table, frame)
        append_seconds[table] = time.perf_counter() - started
    profiler = cProfile.Profile()
    profiler.enable()
    for frame in frames.values():
        store.append("traces" if "state" in frame.columns else "calls", frame)
    profiler.disable()
    commits, durable = [], []
    floor = root / "floor"
    floor.mkdir(parents=True)
    for index in range(sizes.commits):
        trace, calls = _request_records(index)
        started = time.perf_counter()
        store.record_trace(trace, calls)
        commits.append(time.perf_counter() - started)
        started = time.perf_counter()
        _durable_write(floor, b"x" * 4096)
        _durable_write(floor, b"x" * 4096)
        durable.append(time.perf_counter() - started)
    return TelemetryFigures(
        sizes.append_rows, append_seconds, parquet_seconds, commits, durable, hot_spots(profiler, 2, _APPEND_SPOTS)
    )


def telemetry_section(figures: TelemetryFigures, command: str) -> Section:
    rows = []
    for table, seconds in figures.append_seconds.items():
        rate, plain = figures.rows / seconds, figures.rows / figures.parquet_seconds[table]
        rows.append(
            Row(
                f"batched append: `store.append('{table}', {figures.rows:,} rows)`",
                "≥ 50,000 rows/s",
                f"{rate:,.0f} rows/s ({seconds:.2f} s; plain `write_parquet` of the same frame: {plain:,.0f} rows/s)",
                rate >= 50_000,
            )
        )
    commit = percentile(figures.commits, 0.5)
    rows.append(
        Row(
            "single-request commit: `store.record_trace(trace, 2 calls)`, p50",
            "≤ 5 ms",
            f"{commit * 1000:.2f} ms (p90 {percentile(figures.commits, 0.9) * 1000:.2f} ms)",
            commit <= 0.005,
        )
    )
    rows.append(
        Row(
            "baseline: two bare durable 4 KiB writes (write, fsync, rename, fsync folder)",
            "—",
            _timings(figures.durable_writes),
        )
    )
    rows.append(Row("stats over 1M traces", "≤ 1 s", f"see “{STATS_SECTION}” (`benchmarks/stats_speed.py`)"))
    lead = (
        "`TelemetryStore` in a temporary folder. Batched appends write one validated frame of generated trace and "
        "call rows (the generator of `benchmarks/stats_speed.py`); a single-request commit is what the resolver "
        "does after each request: the calls file, then the trace file, each acknowledged (fsync-ed) before return."
    )
    notes = []
    if commit > 0.005:
        notes.append(
            f"**Miss**, cause: our code over this disk. A commit writes two durable files; two bare durable writes "
            f"take {percentile(figures.durable_writes, 0.5) * 1000:.2f} ms p50 here, so the rest "
            f"({(commit - percentile(figures.durable_writes, 0.5)) * 1000:.2f} ms) is validation and Parquet encoding."
        )
    profile = markdown_table(
        ["where (cProfile, per batched append of one table)", "calls", "cumulative ms", "own ms"],
        [
            [label, f"{calls:.1f}", f"{cumulative:.1f}", f"{own:.1f}"]
            for label, calls, cumulative, own in figures.profile
        ],
        align="lrrr",
    )
    return Section("Speed: telemetry (part B)", command, lead, rows, notes, extra_tables=[profile])


# -- prompt prefix reuse --------------------------------------------------------------------------------------


@dataclass
class PrefixFigures:
    requests: int
    walks: int
    calls: pl.DataFrame  # judge calls of depth-2 walks: layer, prompt_tokens, cached_tokens
    seconds: float


async def measure_prefix(sizes: Sizes, root: Path) -> PrefixFigures:
    from gil_core.judge import SingleTokenJudge
    from gil_core.llm import CallRecorder, trace_scope
    from gil_core.local import LocalLLMServer
    from gil_core.telemetry import EnergyModel
    from gil_core.traverse import GreedyTraverser

    tree = _support_tree()
    tickets = [json.loads(line)["text"] for line in (ROOT / "data" / "support_tickets.jsonl").open(encoding="utf-8")]
    texts = list(dict.fromkeys(tickets))[: sizes.prefix_requests]
    store = TelemetryStore(root / "store")
    started = time.perf_counter()
    deep: list[str] = []
    with LocalLLMServer(cache_dir=root / "server") as server:
        async with server.chat_model(timeout=600.0) as chat:
            recorder = CallRecorder(chat, sink=store, energy=EnergyModel.tokens())
            # As the demo task judges (its order seed); the tiny model judges poorly, so nothing stops a walk early.
            judge = SingleTokenJudge(recorder, ENGLISH, trust_threshold=0.0, order_seed="demo")
            traverser = GreedyTraverser(judge, Thresholds(per_layer=(0.0,), leaf=0.0))
            for text in texts:
                trace_id = uuid.uuid4().hex
                with trace_scope(trace_id):
                    walk = await traverser.traverse(text, tree)
                if len(walk.steps) >= 2:
                    deep.append(trace_id)
    calls = (
        store.read("calls")
        .filter((pl.col("role") == "judge") & pl.col("trace_id").is_in(deep) & (pl.col("layer") <= 2))
        .select("trace_id", "layer", "prompt_tokens", "cached_tokens")
    )
    return PrefixFigures(len(texts), len(deep), calls, time.perf_counter() - started)


def prefix_section(figures: PrefixFigures, command: str) -> Section:
    calls = figures.calls
    prompt, cached = int(calls["prompt_tokens"].sum() or 0), int(calls["cached_tokens"].sum() or 0)
    share = cached / prompt if prompt else 0.0
    per_layer = (
        calls.group_by("layer")
        .agg(pl.col("prompt_tokens").sum(), pl.col("cached_tokens").sum(), pl.len())
        .sort("layer")
    )
    rows = [
        Row(
            "judge prompt tokens served from the server's prompt cache, depth-2 paths (layers 1 and 2)",
            "≥ 50%",
            f"{share:.1%} ({cached:,} of {prompt:,} tokens, {figures.walks} walks of {figures.requests} requests)",
            share >= 0.5 and figures.walks > 0,
        )
    ]
    layers = markdown_table(
        ["layer", "judge calls", "prompt tokens", "cached tokens", "cached share"],
        [
            [row["layer"], row["len"], f"{row['prompt_tokens']:,}", f"{row['cached_tokens']:,}",
             f"{row['cached_tokens'] / row['prompt_tokens']:.1%}" if row["prompt_tokens"] else "—"]
            for row in per_layer.iter_rows(named=True)
        ],
        align="rrrrr",
    )  # fmt: skip
    lead = (
        "SmolLM2-135M on the local llama.cpp server (`gil_core.local.LocalLLMServer`, started for this run), "
        "judging the bundled support tickets down the support tree (`SingleTokenJudge`, the demo's order seed, "
        "every threshold 0 so walks go deep). Cached tokens are the server's own count of prompt tokens it did "
        "not evaluate again (`usage.prompt_tokens_details.cached_tokens`), read from the recorded calls."
    )
    layer_share = {
        row["layer"]: row["cached_tokens"] / max(row["prompt_tokens"], 1) for row in per_layer.iter_rows(named=True)
    }
    notes = [
        "Measured only. The judge prompt is the system message, then the request, then the candidates, and the "
        "server (llama-cpp-python, started without `--cache`) keeps the state of one prompt: the last one. A "
        "layer-2 judgment follows its own request's layer-1 judgment and reuses the system message and the request "
        f"({layer_share.get(2, 0.0):.0%} of its tokens here); a layer-1 judgment follows another request's layer-2 "
        f"prompt and reuses only the chat template and system message ({layer_share.get(1, 0.0):.0%})."
        + (
            " The target is met with the prompt as it is: its order need not change."
            if share >= 0.5
            else " **Miss**, cause: prompt order together with a one-prompt cache. Reordering alone does not "
            "fix it: with candidates before the request, layer 1 would follow a layer-2 prompt whose candidates "
            "differ, and layer 2 would lose the request it now reuses. The prompt order would need to change "
            "(system, the node's candidates in a fixed order, then the request; the order seed shuffles them per "
            "request today) and the server would need to keep several prompt states (llama-cpp-python's `--cache`), "
            "so that each node's prefix is found again; not measured here, and the order change alters the "
            "conformance-pinned prompt bytes."
        )
    ]
    return Section("Speed: prompt prefix reuse (part B)", command, lead, rows, notes, extra_tables=[layers])


# -- the command ------------------------------------------------------------------------------------------------


def run(parts: Sequence[str], *, quick: bool, command: str) -> list[Section]:
    """Measure ``parts`` (in this module's order) and return their sections."""
    sizes = QUICK if quick else FULL
    sections = []
    with tempfile.TemporaryDirectory(prefix="gil-bench-speed-") as workdir:
        root = Path(workdir)
        if "resolver" in parts:
            _log("resolver overhead")
            sections.append(resolver_section(asyncio.run(measure_resolver(sizes, root / "resolver")), command))
        if "memory" in parts:
            _log(f"memory lookup at {', '.join(f'{size:,}' for size in sizes.lookup.sizes)} entries")
            sections.append(memory_lookup_section(asyncio.run(measure_lookup(sizes.lookup)), command))
        if "telemetry" in parts:
            _log("telemetry appends and commits")
            sections.append(telemetry_section(measure_telemetry(sizes, root / "telemetry"), command))
        if "prefix" in parts:
            if os.environ.get("GIL_SKIP_LOCAL_MODEL") == "1":
                _log("prompt prefix reuse skipped: GIL_SKIP_LOCAL_MODEL=1")
            else:
                _log("prompt prefix reuse on the local server")
                sections.append(prefix_section(asyncio.run(measure_prefix(sizes, root / "prefix")), command))
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
    sections = run(parts, quick=options.quick, command=command)
    publish(sections, destination(options))
    return sections


if __name__ == "__main__":
    main(sys.argv[1:])
