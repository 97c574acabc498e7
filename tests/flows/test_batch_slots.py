"""The per-server Prefect concurrency limit of resolve-batch: slots a killed batch left taken end a later batch
with an error naming the limit and the fix, never a wait without end; on a `gil ui` server they come back once
the killed batch's lease expires."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gil_core.batch import Ticket
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedOpenAIServer
from tests.flows._support import write_task_file
from tests.flows._ui_support import free_port, gil_command, healthy, log_tail, prefect_env, running, wait_for
from tests.reliability._support import ROOT, check_one_trace_per_ticket
from tests.resolver._support import Script, SupportModel, support_server


@pytest.mark.usefixtures("prefect_harness")
async def test_slots_left_taken_by_a_killed_batch_end_the_next_batch_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    import flows.batch
    from flows._prefect import endpoint_limit_name
    from gil_core.batch_workers import model_endpoints
    from gil_core.taskfile import load_task_file

    with support_server({}, default=Script(answers=["None of these"])) as server:
        task = str(write_task_file(tmp_path, server.base_url))
        tickets = tmp_path / "tickets.jsonl"
        tickets.write_text(json.dumps({"id": "t1", "text": "do you sell gift cards?"}) + "\n")
        first = await flows.batch.resolve_batch_flow(task, str(tickets))  # creates the limits
        assert first["resolved"] == 1
        # The short bound only for the batch that must be refused: the first one, which creates the limits on a
        # Prefect server busy with the suite, may take longer than a second to get its slots.
        monkeypatch.setattr(flows.batch, "SLOT_WAIT_SECONDS", 1.0)

        name = endpoint_limit_name(model_endpoints(load_task_file(task))[0])
        async with get_client() as client:
            limit = await client.read_global_concurrency_limit_by_name(name)
            # what a SIGKILLed batch leaves on a server that lost its leases: every slot taken, nobody holding it
            await client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=limit.limit))
        more = tmp_path / "more.jsonl"
        more.write_text(json.dumps({"id": "t2", "text": "where is my parcel?"}) + "\n")
        try:
            with pytest.raises(Exception, match=rf"concurrency limit\(s\) {name} within 1 s.*--active-slots 0"):
                await flows.batch.resolve_batch_flow(task, str(more))
        finally:
            async with get_client() as client:
                await client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=0))
    assert TelemetryStore(tmp_path / "store").read("traces").height == 1  # the refused ticket stays to be resolved


# The real resolve-batch flow in a child process, with two settings of the test: the lease its slots are held
# under (Prefect's shortest, 60 s, instead of the flow's 300 s) and how long it waits for slots.
BATCH_CHILD = """
import asyncio, functools, sys
import flows.batch
from prefect.concurrency.asyncio import concurrency
flows.batch.hold_slots = functools.partial(concurrency, lease_duration=float(sys.argv[3]))
flows.batch.SLOT_WAIT_SECONDS = float(sys.argv[4])
print(json.dumps(asyncio.run(flows.batch.resolve_batch_flow(sys.argv[1], sys.argv[2]))), flush=True)
""".replace("import asyncio", "import asyncio, json")
LEASE_SECONDS = 60.0
STARTUP_SECONDS = 300  # a first `prefect server start` (its migrations) on a busy 2-core machine


def active_slots(api_url: str, name: str) -> int | None:
    """The limit's taken slots as the server counts them; None before the limit exists."""
    reply = httpx.get(f"{api_url}/v2/concurrency_limits/{name}", timeout=10.0)
    return int(reply.json()["active_slots"]) if reply.status_code == 200 else None


@pytest.mark.heavy
@pytest.mark.slow  # about 2 minutes: a `gil ui` server, a 60 s lease running out, three batches
def test_a_sigkilled_batch_holding_slots_on_gil_ui_leaves_them_taken_until_its_lease_expires(tmp_path: Path) -> None:
    """A real batch (the resolve-batch flow, in its own process, against `gil ui`) holds both slots of its model
    server's limit and is SIGKILLed mid-batch. The server still counts the slots taken; a batch started then
    waits its bound (2 s here) and fails naming the limit and the fix. Once the killed batch's lease expires the
    server frees them, and the next batch finishes the tickets: one trace each."""
    from flows._prefect import endpoint_limit_name

    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    server_env = prefect_env(tmp_path / "prefect-home") | {"PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS": "1"}
    batch_env = server_env | {"PREFECT_API_URL": api_url, "PYTHONPATH": str(ROOT)}
    tickets = [Ticket(f"t{index}", f"question number {index}") for index in range(40)]
    responder = SupportModel({}, default=Script(answers=["None of these"]))
    with (
        running(gil_command("ui", "--port", str(port)), tmp_path / "ui.log", server_env, tmp_path) as ui,
        ScriptedOpenAIServer(responder=responder, latency_seconds=0.3) as model,  # a batch of ~12 s
    ):
        task = write_task_file(tmp_path, model.base_url, concurrency=2)
        tickets_file = tmp_path / "tickets.jsonl"
        tickets_file.write_text("".join(json.dumps({"id": t.id, "text": t.text}) + "\n" for t in tickets))
        limit = endpoint_limit_name(f"127.0.0.1:{model.base_url.split(':')[2].split('/')[0]}")
        wait_for(healthy(api_url), "gil ui /api/health", STARTUP_SECONDS, ui, tmp_path / "ui.log")

        def batch(wait_seconds: float, log: str) -> subprocess.Popen[bytes]:
            command = [sys.executable, "-c", BATCH_CHILD, str(task), str(tickets_file), str(LEASE_SECONDS)]
            output = (tmp_path / log).open("wb")
            return subprocess.Popen(
                [*command, str(wait_seconds)], cwd=ROOT, env=batch_env, stdout=output, stderr=subprocess.STDOUT
            )

        first = batch(600.0, "first.log")
        wait_for(
            lambda: (active_slots(api_url, limit) == 2 and len(model.requests) >= 4) or None,
            "the first batch holding both slots mid-batch",
            STARTUP_SECONDS,
            first,
            tmp_path / "first.log",
        )
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        killed_at = time.monotonic()  # the server records a request after its latency, by when it arrived
        assert active_slots(api_url, limit) == 2  # the killed batch's slots are still taken

        second = batch(2.0, "second.log")
        assert second.wait(timeout=STARTUP_SECONDS) != 0
        said = log_tail(tmp_path / "second.log", 200)
        assert f"concurrency limit(s) {limit} within 2 s" in said and "--active-slots 0" in said, said
        sent_since = [request for request in model.requests if request.received_at > killed_at]
        assert sent_since == []  # it waited, and sent nothing

        wait_for(
            lambda: active_slots(api_url, limit) == 0 or None,
            "the server freeing the slots once the lease expired",
            LEASE_SECONDS + 120,
            ui,
            tmp_path / "ui.log",
        )
        third = batch(600.0, "third.log")
        assert third.wait(timeout=STARTUP_SECONDS) == 0, log_tail(tmp_path / "third.log")
        assert active_slots(api_url, limit) == 0
    check_one_trace_per_ticket(TelemetryStore(tmp_path / "store"), "support", tickets)
