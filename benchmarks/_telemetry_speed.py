"""Telemetry speed (part B of issue #7): batched appends against a plain Parquet write of the same frame, and the
commit after each request, durable on its own or group-committed, against two bare durable file writes on the
same disk."""

from __future__ import annotations

import cProfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks._report import HotSpot, Row, Section, hot_spot_table, hot_spots, latency_text, percentile, verdict
from gil_core.atomic import atomic_write_bytes
from gil_core.telemetry import CallRecord, TelemetryStore, TraceRecord, utc_now
from gil_core.telemetry.records import CandidateShown

__all__ = ["TelemetryFigures", "measure_telemetry", "telemetry_section"]

STATS_SECTION = "Stats over a large store"  # written by benchmarks/stats_speed.py

_APPEND = "`TelemetryStore.append`"
_JSON = "… … JSON columns parsed (each distinct value once)"
_WRITE = "… the store folder's `write_parquet`: Parquet + fsync + rename"
_APPEND_SPOTS = (
    ("gil_core/telemetry/store.py", "append", _APPEND),
    ("gil_core/telemetry/_rows.py", "conform", "… `conform`: rows → Polars frame of the schema"),
    ("gil_core/telemetry/schemas.py", "validate_frame", "… `validate_frame`: schema checks"),
    ("gil_core/telemetry/schemas.py", "_all_json", _JSON),
    ("gil_core/storage.py", "write_parquet", _WRITE),
    ("polars/dataframe/frame.py", "write_parquet", "… … Polars `write_parquet`"),
    ("~", "<built-in method posix.fsync>", "… … `os.fsync`"),
)


GROUP = 50  # requests per group in the group-commit arm


@dataclass
class TelemetryFigures:
    rows: int
    append_seconds: dict[str, float]
    parquet_seconds: dict[str, float]
    commits: list[float]
    durable_writes: list[float]
    queued: list[float]  # record_trace inside a group: the rows typed and queued
    flushes: list[float]  # one flush of GROUP requests each
    grouped_seconds: float  # every grouped request, queued and flushed
    profiles: dict[str, list[HotSpot]]  # table → where one more batched append of it spends its time


def _durable_write(folder: Path, payload: bytes) -> None:
    """The floor of one acknowledged write: temporary file, fsync, rename, fsync of the folder."""
    atomic_write_bytes(folder / f"{uuid.uuid4().hex}.bin", payload)


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


def measure_telemetry(rows: int, requests: int, root: Path) -> TelemetryFigures:
    """Append ``rows`` rows to two tables (timed, then once more profiled), then commit ``requests`` requests."""
    from benchmarks.stats_speed import call_chunk, trace_chunk  # the store's realistic rows, generated once

    rng = np.random.default_rng(0)
    store = TelemetryStore(root / "store")
    columns = store.scan("traces").collect_schema().names()
    traces = trace_chunk(rng, 0, rows)
    call_rows = call_chunk(rng, traces)
    energy = call_rows.group_by("trace_id").agg(pl.col("energy").sum())
    traces = traces.join(energy, on="trace_id", how="left").with_columns(pl.col("energy").fill_null(0.0))
    frames = {
        "calls": call_rows.head(rows),
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
    profiles = {}
    for table, frame in frames.items():
        profiler = cProfile.Profile()
        profiler.enable()
        store.append(table, frame)
        profiler.disable()
        profiles[table] = hot_spots(profiler, 1, _APPEND_SPOTS)
    commits, durable = [], []
    floor = root / "floor"
    floor.mkdir(parents=True)
    for index in range(requests):
        trace, calls = _request_records(index)
        started = time.perf_counter()
        store.record_trace(trace, calls)
        commits.append(time.perf_counter() - started)
        started = time.perf_counter()
        _durable_write(floor, b"x" * 4096)
        _durable_write(floor, b"x" * 4096)
        durable.append(time.perf_counter() - started)
    queued, flushes = [], []
    records = [_request_records(index) for index in range(requests)]
    started_all = time.perf_counter()
    with store.group_commit(max_rows=10 * GROUP * 3, max_delay_s=None):  # flushed by hand, every GROUP requests
        for index, (trace, calls) in enumerate(records, start=1):
            started = time.perf_counter()
            store.record_trace(trace, calls)
            queued.append(time.perf_counter() - started)
            if index % GROUP == 0 or index == len(records):
                started = time.perf_counter()
                store.flush()
                flushes.append(time.perf_counter() - started)
    grouped_seconds = time.perf_counter() - started_all
    return TelemetryFigures(
        rows,
        append_seconds,
        parquet_seconds,
        commits,
        durable,
        queued,
        flushes,
        grouped_seconds,
        profiles,
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
            latency_text(figures.durable_writes),
        )
    )
    amortised = figures.grouped_seconds / len(figures.queued)
    rows += [
        Row(
            f"group commit, per request: `record_trace` in `store.group_commit()`, flushed every {GROUP} requests "
            "(queueing plus its share of the flushes)",
            "≤ 5 ms",
            f"{amortised * 1000:.2f} ms (queueing alone: {latency_text(figures.queued)})",
            amortised <= 0.005,
        ),
        Row(
            f"group commit: one flush of {GROUP} requests (calls file + traces file): the wait until acknowledged",
            "—",
            latency_text(figures.flushes),
        ),
    ]
    rows.append(Row("stats over 1M traces", "≤ 1 s", f"see “{STATS_SECTION}” (`benchmarks/stats_speed.py`)"))
    lead = (
        "`TelemetryStore` in a temporary folder. Batched appends write one validated frame of generated trace and "
        "call rows (the generator of `benchmarks/stats_speed.py`). A single-request commit is a request's trace "
        "and its two calls: durable on its own (the calls file, then the trace file, each fsync-ed before "
        f"`record_trace` returns), or group-committed (the same requests queued and flushed every {GROUP}: one "
        "calls file and one traces file per group; a request is acknowledged when its group's flush returns)."
    )
    notes = []
    slow_appends = [table for table, seconds in figures.append_seconds.items() if figures.rows / seconds < 50_000]
    for table in slow_appends:
        spots = {label: cumulative for label, _, cumulative, _ in figures.profiles[table]}
        total, json = spots.get(_APPEND, 0.0), spots.get(_JSON, 0.0)
        write = spots.get(_WRITE, 0.0)
        plain = figures.rows / figures.parquet_seconds[table]
        if total > 0:
            notes.append(
                f"**Miss** (batched append of {table}), cause: our code's JSON check, on this loaded machine. Of "
                f"{total:,.0f} ms per append of {figures.rows:,} rows (cProfile, below), {json:,.0f} ms "
                f"({json / total:.0%}) parse the table's JSON columns with Python's json scanner (each distinct "
                f"value once; here nearly every value is distinct) and {write:,.0f} ms write the file; a plain "
                f"`write_parquet` of the same frame alone runs at {plain:,.0f} rows/s in this run. The calls table, "
                "whose JSON values repeat (candidates, logprobs), is parsed once per distinct value and keeps "
                "well above the target."
            )
    if commit > 0.005:
        floor = percentile(figures.durable_writes, 0.5)
        notes.append(
            f"**Miss** (single-request commit, durable on its own), cause: this disk's fsync, then our code. A "
            f"commit writes two durable files; two bare durable writes take {floor * 1000:.2f} ms p50 here (the "
            f"floor of a durable write per request, {'above' if floor > 0.005 else 'within'} the 5 ms target on "
            f"its own), and the rest ({(commit - floor) * 1000:.2f} ms) is conforming, validating and encoding two "
            f"one-row frames. Group commit pays that floor once per group: {amortised * 1000:.2f} ms per request "
            f"({verdict(amortised <= 0.005)} the target), each request waiting for its group's flush "
            f"({percentile(figures.flushes, 0.5) * 1000:.1f} ms p50) to be acknowledged."
        )
    shown = slow_appends[0] if slow_appends else "traces"
    profile = hot_spot_table(
        f"where (cProfile, one more batched append of {figures.rows:,} {shown} rows)", figures.profiles[shown], digits=1
    )
    return Section("Speed: telemetry (part B)", command, lead, rows, notes, extra_tables=[profile])
