"""The per-server Prefect concurrency limit of resolve-batch: slots a killed batch left taken end a later batch
with an error naming the limit and the fix, never a wait without end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gil_core.telemetry import TelemetryStore
from tests.flows._support import write_task_file
from tests.resolver._support import Script, support_server


@pytest.mark.usefixtures("prefect_harness")
async def test_slots_left_taken_by_a_killed_batch_end_the_next_batch_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    import flows.batch
    from flows._prefect import endpoint_limit_name
    from gil_core.batch import model_endpoints
    from gil_core.taskfile import load_task_file

    monkeypatch.setattr(flows.batch, "SLOT_WAIT_SECONDS", 1.0)
    with support_server({}, default=Script(answers=["None of these"])) as server:
        task = str(write_task_file(tmp_path, server.base_url))
        tickets = tmp_path / "tickets.jsonl"
        tickets.write_text(json.dumps({"id": "t1", "text": "do you sell gift cards?"}) + "\n")
        first = await flows.batch.resolve_batch_flow(task, str(tickets))  # creates the limits
        assert first["resolved"] == 1

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
