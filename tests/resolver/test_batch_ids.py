"""Every resolve_batch call is one batch: its traces record its id (and the orchestrator's run id when given),
a second batch records another, a request resolved outside any batch records none, and a verdict keeps the
batch its trace came from."""

from __future__ import annotations

import asyncio
from pathlib import Path

import polars as pl

from gil_core.batch import Ticket, Verdict, resolve_batch, ticket_trace_id
from gil_core.batch_feedback import apply_verdicts
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedChatModel, ScriptedReply
from tests.resolver._support import support_task


def test_batch_ids_one_per_batch_none_outside_and_kept_by_a_verdict(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    resolver = Resolver(ScriptedChatModel(responder=lambda *_, **__: ScriptedReply("B")), store)
    task = support_task(memory_threshold=None)

    async def run() -> tuple[str | None, str | None]:
        first = await resolve_batch(resolver, task, [Ticket(f"a{i}", f"first batch {i}") for i in range(6)])
        second = await resolve_batch(
            resolver, task, [Ticket(f"b{i}", f"second batch {i}") for i in range(4)], flow_run_id="run-7"
        )
        await resolver.resolve(task, "on its own", trace_id="alone")
        await apply_verdicts(resolver, task, [Verdict(ticket_trace_id(task.name, "a0"), True)])
        return first.batch_id, second.batch_id

    first, second = asyncio.run(run())
    assert first and second and first != second
    traces = store.read("traces")
    by_id = dict(zip(traces["trace_id"], zip(traces["batch_id"], traces["flow_run_id"], strict=True), strict=True))
    assert {by_id[ticket_trace_id(task.name, f"a{i}")] for i in range(6)} == {(first, None)}
    assert {by_id[ticket_trace_id(task.name, f"b{i}")] for i in range(4)} == {(second, "run-7")}
    assert by_id["alone"] == (None, None)
    judged = traces.filter(pl.col("trace_id") == ticket_trace_id(task.name, "a0"))
    assert judged["feedback_verdict"].to_list() == ["correct"] and judged["batch_id"].to_list() == [first]
