"""resolve-batch on a Dask LocalCluster of worker processes: one trace per ticket whichever worker resolved it,
calls to the model server bounded across the workers, and memory that answers right after feedback."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.cli import app
from gil_core.batch import Ticket, plan_chunks, ticket_trace_id
from gil_core.batch_workers import model_endpoints, share_client_budget
from gil_core.errors import ConfigurationError
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedOpenAIServer, ScriptedReply
from tests.flows._dask import (
    ROUTES,
    assert_memory_answers_what_was_confirmed,
    read_results,
    resolve_on_dask,
    runner,
    scripts,
    ticket_texts,
    write_tickets,
    write_verdicts,
)
from tests.flows._support import write_task_file
from tests.resolver._support import Script, SupportModel

TICKETS = 60
LIMIT = 2  # the task file's concurrency: calls in flight to the server, across all workers
CORRECTED = range(0, 4)  # marked wrong with a correction: memory must answer the correction
FORGOTTEN = range(4, 8)  # marked wrong without one: memory must not answer them at all


class CountingModel(SupportModel):
    """Answers like SupportModel, a little slowly, and keeps the most chat calls it ever had in flight."""

    def __init__(self, scripts: Mapping[str, Script]) -> None:
        super().__init__(scripts)
        self.in_flight = 0
        self.most_in_flight = 0
        self._lock = threading.Lock()

    def __call__(self, body: Mapping[str, Any]) -> ScriptedReply:
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            time.sleep(0.02)  # holds the call open so that calls from several workers would overlap
            return super().__call__(body)
        finally:
            with self._lock:
                self.in_flight -= 1


@pytest.mark.heavy
@pytest.mark.dask
@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_batch_on_two_worker_processes_leaves_one_trace_per_ticket_and_memory_answers_after_feedback(
    tmp_path: Path,
) -> None:
    texts = ticket_texts(TICKETS)
    model = CountingModel(scripts(texts))
    with ScriptedOpenAIServer(responder=model) as server:
        task = write_task_file(tmp_path, server.base_url, concurrency=LIMIT)
        first = tmp_path / "tickets.jsonl"
        write_tickets(first, "t", texts)
        summary = resolve_on_dask(first, tmp_path / "results.jsonl", task, "--workers", "2")
        assert (summary["resolved"], summary["skipped"], summary["failed"]) == (TICKETS, 0, [])
        assert summary["written"] == TICKETS

        traces = TelemetryStore(tmp_path / "store").read("traces")
        assert traces.height == TICKETS
        assert set(traces["trace_id"]) == {ticket_trace_id("support", f"t{i}") for i in range(TICKETS)}
        assert model.most_in_flight <= LIMIT

        results = read_results(tmp_path / "results.jsonl")
        assert [r["output"] for r in results] == [ROUTES[i % 3][1] for i in range(TICKETS)]
        verdicts = tmp_path / "verdicts.jsonl"
        write_verdicts(verdicts, results, corrected=CORRECTED, wrong=FORGOTTEN)
        applied = runner.invoke(app, ["feedback", str(verdicts), "-t", str(task), "--json"])
        assert applied.exit_code == 0 and json.loads(applied.stdout)["applied"] == TICKETS

        again = tmp_path / "again.jsonl"
        write_tickets(again, "again-", texts)
        summary = resolve_on_dask(again, tmp_path / "again-results.jsonl", task, "--workers", "2")
        assert (summary["resolved"], summary["failed"]) == (TICKETS, [])
        assert model.most_in_flight <= LIMIT

    repeated = read_results(tmp_path / "again-results.jsonl")
    assert_memory_answers_what_was_confirmed(repeated, corrected=CORRECTED, wrong=FORGOTTEN)
    traces = TelemetryStore(tmp_path / "store").read("traces")
    assert traces.height == 2 * TICKETS and traces["trace_id"].n_unique() == 2 * TICKETS


@given(count=st.integers(0, 400), workers=st.integers(1, 8), min_size=st.integers(1, 50))
def test_chunks_hold_every_ticket_once_in_order_and_none_is_empty(count: int, workers: int, min_size: int) -> None:
    tickets = [Ticket(f"t{i}", "text") for i in range(count)]
    chunks = plan_chunks(tickets, workers, min_size=min_size)
    assert [ticket for chunk in chunks for ticket in chunk] == tickets
    assert all(chunks) and len(chunks) <= max(1, workers * 4)
    sizes = [len(chunk) for chunk in chunks]
    assert not sizes or max(sizes) - min(sizes) <= 1
    assert len(chunks) <= 1 or min(sizes) >= min_size  # only a batch too small to cut has a chunk below it
    with pytest.raises(ConfigurationError, match="workers"):
        plan_chunks(tickets, 0)


def test_each_worker_gets_its_share_of_the_rate_limit_and_servers_are_keyed_by_host_and_port(tmp_path: Path) -> None:
    task = write_task_file(
        tmp_path,
        "http://127.0.0.1:8080/v1",
        embedding_model={"url": "https://embed.example/v1", "name": "e"},
        fallback_chat_model={"url": "http://127.0.0.1:8080/other", "name": "f"},
        client={"requests_per_second": 8, "burst": 6},
    )
    loaded = load_task_file(task)
    assert model_endpoints(loaded) == ("127.0.0.1:8080", "embed.example:443")
    shared = share_client_budget(loaded, 4)
    assert (shared.client["requests_per_second"], shared.client["burst"]) == (2.0, 1)
    assert share_client_budget(loaded, 1) is loaded
    unlimited = load_task_file(write_task_file(tmp_path, "http://127.0.0.1:8080/v1", client={"requests_per_second": 0}))
    assert share_client_budget(unlimited, 4) is unlimited
