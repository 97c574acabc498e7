"""Progress artifacts (flows/_progress.py) against a real Prefect engine: updates are throttled on the clock given,
the last one is always sent, work counted from many threads adds up, and a batch ends its artifact at 100%
(its traces recording the batch and the flow run)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from gil_core.telemetry import TelemetryStore
from gil_core.testing import ManualClock
from tests.flows._support import write_task_file
from tests.resolver._support import Script, support_server


async def _progress_data(artifact_id: object) -> float:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterId

    async with get_client() as client:
        (artifact,) = await client.read_artifacts(
            artifact_filter=ArtifactFilter(id=ArtifactFilterId(any_=[artifact_id]))
        )
    return float(artifact.data)  # type: ignore[arg-type]


@pytest.mark.usefixtures("prefect_harness")
async def test_progress_updates_at_most_once_an_interval_and_always_at_the_end() -> None:
    import asyncio

    from prefect.artifacts import acreate_progress_artifact

    from flows._progress import FlowProgress

    clock = ManualClock(start=0.0)
    progress = FlowProgress(await acreate_progress_artifact(0.0, key="progress-test"), 10, interval=1.0, clock=clock)
    progress.advance(2)
    assert await asyncio.to_thread(progress.publish)  # 20%: the first update goes out at once
    progress.advance(3)
    clock.now = 0.5
    assert not await asyncio.to_thread(progress.publish)  # half a second later: held back
    clock.now = 1.0
    assert await asyncio.to_thread(progress.publish)
    assert not await asyncio.to_thread(progress.publish)  # unchanged: nothing to send
    assert await _progress_data(progress.artifact_id) == 50.0
    await progress.finish()  # the end is sent whatever the clock says
    assert progress.sent == [20.0, 50.0, 100.0]
    assert await _progress_data(progress.artifact_id) == 100.0


@pytest.mark.usefixtures("prefect_harness")
async def test_progress_of_an_async_flow_reaches_the_server_while_the_flow_runs() -> None:
    """The updating thread runs in a copy of the async flow's context: its updates are sent, not left as
    coroutines nobody awaits."""
    import asyncio
    import time

    from prefect import flow

    from flows._progress import flow_progress

    @flow(name="progress-midway")
    async def midway() -> list[float]:
        async with flow_progress("progress-midway", "midway", total=4, interval=0.05) as progress:
            progress.advance()
            deadline = time.monotonic() + 30
            while (seen := await _progress_data(progress.artifact_id)) != 25.0 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            progress.advance(3)
        return [seen, await _progress_data(progress.artifact_id)]

    assert await midway() == [25.0, 100.0]


def test_progress_counted_from_many_threads_adds_up() -> None:
    from uuid import uuid4

    from flows._progress import FlowProgress

    progress = FlowProgress(uuid4(), 8000)
    threads = [threading.Thread(target=lambda: [progress.advance() for _ in range(2000)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert progress.done == 8000 and progress.percent == 100.0


@pytest.mark.usefixtures("prefect_harness")
async def test_progress_of_a_batch_ends_at_one_hundred_on_its_flow_run(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows._progress import progress_of
    from flows.batch import resolve_batch_flow

    with support_server({}, default=Script(answers=["None of these"])) as server:
        task = str(write_task_file(tmp_path, server.base_url, task="progress-batch"))
        tickets = tmp_path / "tickets.jsonl"
        tickets.write_text("".join(json.dumps({"id": f"t{i}", "text": f"question {i}"}) + "\n" for i in range(12)))
        report = await resolve_batch_flow(task, str(tickets))
    assert report["resolved"] == 12
    async with get_client() as client:
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["progress-batch-batch-progress"]))
        )
        (artifact,) = found
        run = await client.read_flow_run(artifact.flow_run_id)  # type: ignore[arg-type]
    assert artifact.type == "progress" and float(artifact.data) == 100.0  # type: ignore[arg-type]
    assert run.name and "12 tickets" in (artifact.description or "")
    assert progress_of(str(artifact.id)) is None  # the run let go of it
    traces = TelemetryStore(tmp_path / "store").read("traces")
    assert traces["batch_id"].n_unique() == 1 and traces["batch_id"][0] == report["batch_id"]  # one batch
    assert set(traces["flow_run_id"]) == {str(run.id)}


@pytest.mark.usefixtures("prefect_harness")
async def test_progress_of_a_one_step_flow_is_done_when_the_flow_is(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.maintenance import rebuild_memory_flow

    with support_server({}, default=Script(answers=["None of these"])) as server:
        task = str(write_task_file(tmp_path, server.base_url, task="progress-rebuild"))
        assert await rebuild_memory_flow(task) == 0  # nothing confirmed yet: an empty memory
    async with get_client() as client:
        (artifact,) = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["progress-rebuild-rebuild-memory-progress"]))
        )
    assert artifact.type == "progress" and float(artifact.data) == 100.0  # type: ignore[arg-type]
    assert artifact.flow_run_id is not None


@pytest.mark.usefixtures("prefect_harness")
async def test_progress_of_a_review_round_is_done_when_the_round_is(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.review import deactivation_round_flow

    with support_server({}, default=Script(answers=["None of these"])) as server:
        task = str(write_task_file(tmp_path, server.base_url, task="progress-round"))
        published = await deactivation_round_flow(task, wait_for_decisions=True)  # nothing to retire: no wait
    assert published["items"] == 0
    async with get_client() as client:
        (artifact,) = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["progress-round-deactivation-progress"]))
        )
    assert artifact.type == "progress" and float(artifact.data) == 100.0  # type: ignore[arg-type]
    assert "propose, publish, decide" in (artifact.description or "")
