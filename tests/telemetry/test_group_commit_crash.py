"""Group commit against SIGKILL, across real processes: a writer killed inside a group loses only what no flush had
written yet (never an acknowledged row, never a file half-written), and a batch killed halfway, run again, ends
with exactly one trace per ticket and counters that count no ticket twice."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import polars as pl

from gil_core.batch import BatchReport, Ticket, resolve_batch, ticket_trace_id, write_results
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedChatModel, ScriptedReply
from tests.resolver._support import support_task
from tests.telemetry.test_durability import all_parquet_files_open, go, killed_after, reaped, spawn

TICKETS = 600


def test_a_writer_killed_inside_a_group_loses_only_unflushed_rows(tmp_path: Path) -> None:
    root = tmp_path / "store"
    acknowledged = killed_after("group", root, 60)  # most likely while appending, or in a flush

    files = all_parquet_files_open(root)  # every file a reader lists is whole
    store = TelemetryStore(root)
    traces = store.read("traces")["trace_id"].to_list()
    assert set(acknowledged) <= set(traces)
    # Flushes write the queue in order, so what is stored is every trace up to a point, with no gap.
    assert sorted(int(trace_id.split("-")[1]) for trace_id in traces) == list(range(len(traces)))
    assert {f"{trace_id}/judge" for trace_id in traces} <= set(store.read("calls")["call_id"])
    assert files < 2 * len(traces)  # groups, not a file per table per trace


def resolver_over(root: Path) -> Resolver:
    return Resolver(ScriptedChatModel(responder=lambda messages, **_: ScriptedReply("B")), TelemetryStore(root))


def test_a_batch_killed_inside_a_group_and_run_again_has_one_trace_per_ticket(tmp_path: Path) -> None:
    root = tmp_path / "store"
    child = spawn("batch", str(root), str(TICKETS))
    done = 0
    with reaped(child):
        go(child)
        assert child.stdout is not None
        while done < 100:
            line = child.stdout.readline()
            assert line.startswith("done "), f"the batch died early: {line!r} {child.communicate()[1]}"
            done = int(line.split()[1])
        assert done < TICKETS, "the batch ended before the kill"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    all_parquet_files_open(root)
    task = support_task(memory_threshold=None)
    tickets = [Ticket(f"t{index}", f"ticket {index}: where is my parcel?") for index in range(TICKETS)]
    stored = TelemetryStore(root).read("traces")["trace_id"]
    assert stored.n_unique() == len(stored) >= done  # every ticket counted done was durable

    # Results come from stored traces only: a ticket whose trace was never flushed has no line.
    everything = BatchReport(trace_ids={ticket.id: ticket_trace_id(task.name, ticket.id) for ticket in tickets})
    assert write_results(TelemetryStore(root), task, everything, tmp_path / "before.jsonl") == len(stored)

    resolver = resolver_over(root)
    report = asyncio.run(resolve_batch(resolver, task, tickets))
    assert (report.skipped, report.resolved, report.failed) == (len(stored), TICKETS - len(stored), [])
    traces = TelemetryStore(root).read("traces")["trace_id"]
    assert traces.n_unique() == len(traces) == TICKETS
    assert write_results(resolver.store, task, report, tmp_path / "results.jsonl") == TICKETS
    # Counters of a flush are written after its traces: a ticket resolved twice was never counted twice.
    root_hits = TelemetryStore(root).read("node_stats").filter(pl.col("node_id") == "root")["hits"].item()
    assert TICKETS - 60 <= root_hits <= TICKETS
