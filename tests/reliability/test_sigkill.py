"""SIGKILL in the middle of apply-feedback and of compact-telemetry, then a rerun: every ticket keeps exactly one
trace, every acknowledged verdict is present, every Parquet file reads, and memory agrees with the feedback history.

(SIGKILL during resolve-batch is tests/flows/test_batch_crash.py.) The children run the library functions the
flows call (``apply_verdicts``, ``compact_store``), without a Prefect server, so a kill leaves no orphan behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from gil_core.maintenance import compact_store
from gil_core.memory import LanceDBMemory
from gil_core.resolver import Resolver
from gil_core.telemetry import CallRecord, TelemetryStore, TraceRecord, utc_now
from gil_core.testing import HashEmbeddingModel, ScriptedChatModel
from tests.flows._support import write_task_file
from tests.reliability._support import (
    check_one_trace_per_ticket,
    every_parquet_file_reads,
    expected_verdict,
    given_verdicts,
    make_tickets,
    memory_matches_history,
    resolve_tickets,
    spawn_child,
    verdicts_for,
    write_jsonl,
)
from tests.resolver._support import Script, support_server
from tests.telemetry.test_durability import reaped

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

TICKETS = 16
runner = CliRunner()


def check_after_rerun(tmp_path: Path, task_file: Path, verdicts: list[dict[str, object]]) -> None:
    """Rerun ``gil feedback`` on the whole file; then every verdict is there once and memory agrees."""
    code = runner.invoke(app, ["feedback", str(tmp_path / "verdicts.jsonl"), "-t", str(task_file), "--json"])
    assert code.exit_code == 0, code.stderr
    rerun = json.loads(code.stdout)
    assert rerun["failed"] == [] and rerun["applied"] + rerun["unchanged"] == TICKETS

    store = TelemetryStore(tmp_path / "store")
    check_one_trace_per_ticket(store, "support", make_tickets(TICKETS))
    assert given_verdicts(store) == {str(v["trace_id"]): expected_verdict(v) for v in verdicts}
    assert every_parquet_file_reads(tmp_path / "store") > 0
    resolver = Resolver(ScriptedChatModel(), store)
    memory = LanceDBMemory(tmp_path / "memory", HashEmbeddingModel())
    assert asyncio.run(memory_matches_history(resolver, memory, "support")) == TICKETS


def test_apply_feedback_killed_midway_then_rerun_keeps_every_acknowledged_verdict(tmp_path: Path) -> None:
    with support_server({}, default=Script(answers=["None of these"])) as server:
        task_file = write_task_file(tmp_path, server.base_url)
        trace_ids = asyncio.run(resolve_tickets(task_file, make_tickets(TICKETS)))
    verdicts = verdicts_for(trace_ids)
    verdicts_path = write_jsonl(tmp_path / "verdicts.jsonl", verdicts)

    child = spawn_child("feedback", str(task_file), str(verdicts_path))
    acknowledged: list[str] = []
    with reaped(child):
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n", child.communicate()[1]
        while len(acknowledged) < TICKETS // 3:
            line = child.stdout.readline()
            assert line, f"the feedback child died early: {child.communicate()[1]}"
            acknowledged.append(line.strip())
        os.kill(child.pid, signal.SIGKILL)  # most likely in the middle of the next verdict
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL

    store = TelemetryStore(tmp_path / "store")
    given = given_verdicts(store)
    by_trace = {str(v["trace_id"]): expected_verdict(v) for v in verdicts}
    assert {trace_id: given.get(trace_id) for trace_id in acknowledged} == {t: by_trace[t] for t in acknowledged}
    assert len(given) < TICKETS  # the kill really came before the end
    every_parquet_file_reads(tmp_path / "store")

    check_after_rerun(tmp_path, task_file, verdicts)


def test_apply_feedback_killed_while_memory_learns_then_rerun_makes_memory_agree(tmp_path: Path) -> None:
    """The verdict row is durable before memory learns it: kill the child while its memory write hangs on the
    embedding endpoint, and the rerun must still leave memory holding what the history confirms."""
    with support_server({}, default=Script(answers=["None of these"])) as server:
        task_file = write_task_file(tmp_path, server.base_url, embedding_model={"url": server.base_url, "name": "e"})
        trace_ids = asyncio.run(resolve_tickets(task_file, make_tickets(TICKETS)))
        verdicts = verdicts_for(trace_ids)
        verdicts_path = write_jsonl(tmp_path / "verdicts.jsonl", verdicts)
        server.enqueue_failure("hang")  # the first embedding request (memory learning verdict 1) never answers

        child = spawn_child("feedback", str(task_file), str(verdicts_path))
        with reaped(child):
            store = TelemetryStore(tmp_path / "store")
            deadline = time.monotonic() + 120
            # The verdict row is written, and memory's embedding request has reached the server and hangs there.
            while trace_ids[0] not in given_verdicts(store) or server.pending:
                assert child.poll() is None and time.monotonic() < deadline, child.communicate()[1]
                time.sleep(0.05)
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=60)
        assert given_verdicts(store) == {trace_ids[0]: ("correct", None)}
        assert asyncio.run(LanceDBMemory(tmp_path / "memory", HashEmbeddingModel()).entries("support")) == []

        check_after_rerun(tmp_path, task_file, verdicts)


def fill_store(store: TelemetryStore, traces: int) -> None:
    """``traces`` traces with a call each, one file per append: many small files for compaction to merge."""
    for index in range(traces):
        trace_id = f"trace-{index}"
        call = CallRecord(call_id=f"{trace_id}/judge", trace_id=trace_id, created_at=utc_now(), role="judge", model="m")
        trace = TraceRecord(
            trace_id=trace_id, created_at=utc_now(), task="support", state=f"q {index}", mode="fallback"
        )
        store.record_trace(trace, [call])
        store.append("node_stats", [{"scope": "support", "node_id": "root", "hits": 1, "accepts": 0, "exits": 1}])


def test_compact_telemetry_killed_midway_keeps_every_row_and_a_rerun_finishes(tmp_path: Path) -> None:
    with support_server({}) as server:
        task_file = write_task_file(tmp_path, server.base_url)
    store = TelemetryStore(tmp_path / "store")
    fill_store(store, 100)
    before = {table: store.read(table) for table in store.tables()}

    child = spawn_child("compact", str(task_file))
    with reaped(child):
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n", child.communicate()[1]
        traces = tmp_path / "store" / "traces"
        while child.poll() is None and not any(".compacted." in name for name in os.listdir(traces)):
            pass  # no sleep: the kill should land right after the first merged file appears
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL, "compaction finished before the kill"

    every_parquet_file_reads(tmp_path / "store")
    for reader in (store, TelemetryStore(tmp_path / "store")):  # also a reader with no cached file metadata
        assert all(reader.read(table).equals(frame) for table, frame in before.items())
    compact_store(store)
    for table, frame in before.items():
        assert store.read(table).equals(frame)
        files = list((tmp_path / "store" / table).glob("*.parquet")) if frame.height else []
        assert len(files) == (1 if frame.height else 0), table
