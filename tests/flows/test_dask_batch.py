"""resolve-batch on a Dask LocalCluster of worker processes: one trace per ticket whichever worker resolved it,
calls to the model server bounded across the workers, and memory that answers right after feedback."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from flows.cli import app
from gil_core.batch import Ticket, model_endpoints, plan_chunks, share_client_budget, ticket_trace_id
from gil_core.errors import ConfigurationError
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedOpenAIServer, ScriptedReply
from tests.flows._support import write_task_file
from tests.resolver._support import Script, SupportModel

TICKETS = 60
LIMIT = 2  # the task file's concurrency: calls in flight to the server, across all workers
ROUTES = {
    0: (["billing", "refund status"], "Refunds reach the original payment method within 5 business days of approval."),
    1: (["shipping", "delivery time"], "Standard delivery takes 3 to 5 business days."),
    2: (["billing", "payment methods"], "We accept major credit cards, debit cards and bank transfer."),
}
CORRECTED = range(0, 4)  # marked wrong with a correction: memory must answer the correction
FORGOTTEN = range(4, 8)  # marked wrong without one: memory must not answer them at all
CORRECTION = "A person will look into this ticket today."
runner = CliRunner()


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


def ticket_texts() -> list[str]:
    """Distinct requests that share few character 3-grams, so only a request itself is a memory hit."""
    words = [
        "parcel",
        "invoice",
        "refund",
        "card",
        "courier",
        "password",
        "address",
        "receipt",
        "voucher",
        "login",
        "basket",
        "warranty",
    ]
    draw = random.Random(9)
    return [f"{' '.join(draw.sample(words, 5))} number {draw.randrange(10**6)}" for _ in range(TICKETS)]


def resolve_on_dask(tickets: Path, out: Path, task: Path) -> dict[str, Any]:
    command = ["resolve-batch", str(tickets), "--out", str(out), "-t", str(task), "--json"]
    result = runner.invoke(app, [*command, "--task-runner", "dask", "--workers", "2"])
    assert result.exit_code == 0, result.stderr or result.stdout
    return json.loads(result.stdout.strip().splitlines()[-1])


def write_tickets(path: Path, prefix: str, texts: list[str]) -> None:
    path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "text": t}) + "\n" for i, t in enumerate(texts)))


@pytest.mark.dask
@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_batch_on_two_worker_processes_leaves_one_trace_per_ticket_and_memory_answers_after_feedback(
    tmp_path: Path,
) -> None:
    texts = ticket_texts()
    model = CountingModel({text: Script(route=ROUTES[i % 3][0]) for i, text in enumerate(texts)})
    with ScriptedOpenAIServer(responder=model) as server:
        task = write_task_file(tmp_path, server.base_url, concurrency=LIMIT)
        first = tmp_path / "tickets.jsonl"
        write_tickets(first, "t", texts)
        summary = resolve_on_dask(first, tmp_path / "results.jsonl", task)
        assert (summary["resolved"], summary["skipped"], summary["failed"]) == (TICKETS, 0, [])
        assert summary["written"] == TICKETS

        traces = TelemetryStore(tmp_path / "store").read("traces")
        assert traces.height == TICKETS
        assert set(traces["trace_id"]) == {ticket_trace_id("support", f"t{i}") for i in range(TICKETS)}
        assert model.most_in_flight <= LIMIT

        results = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
        assert [r["output"] for r in results] == [ROUTES[i % 3][1] for i in range(TICKETS)]
        verdicts = tmp_path / "verdicts.jsonl"
        lines = []
        for i, result in enumerate(results):
            verdict: dict[str, Any] = {"trace_id": result["trace_id"], "correct": i not in (*CORRECTED, *FORGOTTEN)}
            if i in CORRECTED:
                verdict["correction"] = CORRECTION
            lines.append(json.dumps(verdict) + "\n")
        verdicts.write_text("".join(lines))
        applied = runner.invoke(app, ["feedback", str(verdicts), "-t", str(task), "--json"])
        assert applied.exit_code == 0 and json.loads(applied.stdout)["applied"] == TICKETS

        again = tmp_path / "again.jsonl"
        write_tickets(again, "again-", texts)
        summary = resolve_on_dask(again, tmp_path / "again-results.jsonl", task)
        assert (summary["resolved"], summary["failed"]) == (TICKETS, [])
        assert model.most_in_flight <= LIMIT

    repeated = [json.loads(line) for line in (tmp_path / "again-results.jsonl").read_text().splitlines()]
    for i, result in enumerate(repeated):
        if i in FORGOTTEN:
            assert result["mode"] != "memory", (i, result)
        else:
            expected = CORRECTION if i in CORRECTED else ROUTES[i % 3][1]
            assert (result["mode"], result["output"]) == ("memory", expected), (i, result)
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
