"""resolve-batch on a Dask LocalCluster of two worker processes, with the store and the memory on S3 (moto's
server, started here on loopback): each worker reaches them with the ``GIL_S3_*`` settings of its own environment,
the batch leaves exactly one trace per ticket whichever worker resolved it, a rerun resolves nothing, memory
answers a repeated batch exactly where feedback confirmed an answer, and the keys appear in no log."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from distributed import Client, LocalCluster, get_task_stream

from flows._prefect import local_cluster_options, spawned_workers
from flows.batch import apply_feedback_flow
from gil_core.batch import ticket_trace_id
from gil_core.memory import LanceDBMemory
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel, ScriptedOpenAIServer
from tests.flows._dask import (
    assert_memory_answers_what_was_confirmed,
    read_results,
    resolve_on_dask,
    scripts,
    ticket_texts,
    write_tickets,
    write_verdicts,
)
from tests.flows._support import write_task_file
from tests.resolver._support import SupportModel
from tests.telemetry._s3 import assert_no_key, environment_for, new_bucket, objects, s3_server, s3_settings

pytestmark = [pytest.mark.s3, pytest.mark.dask, pytest.mark.slow]

# The smallest batch the flow cuts into two chunks (at least 25 tickets each), so both workers resolve some.
TICKETS = 50
CORRECTED = range(0, 3)  # wrong, with a correction: memory answers the correction
WRONG = range(3, 6)  # wrong without a correction: memory never answers them
UNJUDGED = range(6, 9)  # no verdict: memory does not answer them either


async def prefect_records() -> str:
    """Every log line and flow-run parameter the Prefect API holds (the workers' task runs report there)."""
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        logs = await client.read_logs()
        runs = await client.read_flow_runs()
    return "\n".join([log.message for log in logs] + [json.dumps(run.parameters, default=str) for run in runs])


@pytest.mark.heavy
@pytest.mark.usefixtures("prefect_harness")
def test_a_batch_on_two_workers_over_s3_leaves_one_trace_per_ticket_and_memory_answers_after_feedback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    texts = ticket_texts(TICKETS)
    with s3_server() as endpoint, ScriptedOpenAIServer(responder=SupportModel(scripts(texts))) as server:
        # Set before the cluster starts: its spawned workers take their settings from this environment.
        for name, value in environment_for(endpoint).items():
            monkeypatch.setenv(name, value)
        bucket = new_bucket(endpoint)
        store, memory = f"s3://{bucket}/gil/store", f"s3://{bucket}/gil/memory"
        task = write_task_file(tmp_path, server.base_url, store=store, memory=memory)
        first, again = tmp_path / "tickets.jsonl", tmp_path / "again.jsonl"
        write_tickets(first, "t", texts)
        write_tickets(again, "again-", texts)

        with spawned_workers(), LocalCluster(**local_cluster_options(2)) as cluster:
            scheduler = ("--scheduler", cluster.scheduler_address)
            with Client(cluster, set_as_default=False) as client, get_task_stream(client) as stream:
                summary = resolve_on_dask(first, tmp_path / "results.jsonl", task, *scheduler)
            assert (summary["resolved"], summary["skipped"], summary["failed"]) == (TICKETS, 0, [])
            assert len({record["worker"] for record in stream.data}) == 2  # each worker process resolved a chunk

            traces = TelemetryStore(store).read("traces")
            assert traces.height == TICKETS
            assert set(traces["trace_id"]) == {ticket_trace_id("support", f"t{i}") for i in range(TICKETS)}

            rerun = resolve_on_dask(first, tmp_path / "rerun.jsonl", task, *scheduler)
            assert (rerun["resolved"], rerun["skipped"], rerun["written"]) == (0, TICKETS, TICKETS)
            assert TelemetryStore(store).read("traces").height == TICKETS

            results = read_results(tmp_path / "results.jsonl")
            verdicts = tmp_path / "verdicts.jsonl"
            judged = write_verdicts(verdicts, results, corrected=CORRECTED, wrong=WRONG, unjudged=UNJUDGED)
            applied = asyncio.run(apply_feedback_flow(str(task), str(verdicts)))
            assert (applied["applied"], applied["failed"]) == (judged, [])

            summary = resolve_on_dask(again, tmp_path / "again-results.jsonl", task, *scheduler)
            assert (summary["resolved"], summary["failed"]) == (TICKETS, [])

        traces = TelemetryStore(store).read("traces")
        assert traces.height == 2 * TICKETS and traces["trace_id"].n_unique() == 2 * TICKETS
        remembered = asyncio.run(LanceDBMemory(memory, HashEmbeddingModel()).entries("support"))
        confirmed = [i for i in range(TICKETS) if i not in (*WRONG, *UNJUDGED)]
        assert sorted(entry.key for entry in remembered) == sorted(
            ticket_trace_id("support", f"t{i}") for i in confirmed
        )
        stored = objects(s3_settings(endpoint), bucket, "gil")
        assert any(name.startswith("store/traces/") for name in stored)
        assert any(name.startswith("memory/memory.lance/") for name in stored)

    repeated = read_results(tmp_path / "again-results.jsonl")
    assert_memory_answers_what_was_confirmed(repeated, corrected=CORRECTED, wrong=WRONG, unjudged=UNJUDGED)
    assert sum(result["mode"] == "memory" for result in repeated) == len(confirmed)
    assert not list(tmp_path.glob("**/s3:*")) and not (tmp_path / ".gil").exists()  # nothing went to a local folder
    captured = capfd.readouterr()
    assert_no_key(captured.out, captured.err, caplog.text, asyncio.run(prefect_records()))
