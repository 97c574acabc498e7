"""A feedback queue that waits for verdicts: it pauses with a form showing each queued request and Gil's answer,
is resumed through the Prefect client with input (as the UI does), applies the answered rows like `gil feedback`
(the learned judge reads them with how they were chosen, and refits), counts a verdict given meanwhile with
`gil feedback` once, refuses a correction that is none of the tree's answers and says so; nobody answering within
the timeout leaves every row unanswered and the run Completed."""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flows.cli import app
from gil_core.learned import stored_state
from gil_core.learned.log import read_learned_log
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore
from tests.flows.test_queue_cli import store_with_unconfirmed
from tests.flows.test_review_pause import paused_run
from tests.learned._support import NONE, bad_model, embedder, support_stream

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
runner = CliRunner()
KEY = {example.text: example.answer for example in support_stream()}
NOT_AN_ANSWER = "Please call our hotline."


@pytest.fixture
def queued(tmp_path: Path) -> Iterator[Path]:
    """A task file whose store holds 40 confirmed support tickets and 20 answered without a verdict, its model
    up for as long as the test runs."""
    with bad_model() as server:
        yield store_with_unconfirmed(tmp_path, server.base_url)


def start_queue(task: Path, **parameters: Any) -> tuple[Future[dict[str, Any]], Callable[[], None]]:
    """The feedback-queue flow waiting for verdicts on its own thread (this test resumes it), with this thread's
    Prefect settings; and how to stop the pool."""
    from flows.queue import feedback_queue_flow

    def run() -> dict[str, Any]:
        # a short timeout, so that a failing test does not leave a run waiting for days
        return asyncio.run(
            feedback_queue_flow(str(task), wait_for_verdicts=True, verdict_timeout=600, poll_seconds=1, **parameters)
        )

    pool = ThreadPoolExecutor(max_workers=1)
    return pool.submit(contextvars.copy_context().run, run), pool.shutdown


def the_form(run: Any) -> tuple[dict[str, Any], str]:
    """The paused run's form: its JSON schema and the markdown above it."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        keyset = run.state.state_details.run_input_keyset
        schema = client.read_flow_run_input(run.id, keyset["schema"])
        description = client.read_flow_run_input(run.id, keyset["description"])
    return (json.loads(schema) if isinstance(schema, str) else schema), description


def queue_table(run_id: Any) -> list[dict[str, Any]]:
    """The queue's table artifact of one run: the items, as the person reads them."""
    rows = artifact_of(run_id, "support-feedback-queue").data
    return json.loads(rows) if isinstance(rows, str) else rows


def artifact_of(run_id: Any, key: str) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    wanted = ArtifactFilter(key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(artifact_filter=wanted)
    return artifact


def run_logs(run_id: Any, wanted: str) -> list[str]:
    """The run's log messages once one of them contains ``wanted`` (the API's log worker sends them in batches)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    deadline = time.monotonic() + 60
    with get_client(sync_client=True) as client:
        while True:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
            messages = [log.message for log in logs]
            if any(wanted in message for message in messages) or time.monotonic() > deadline:
                return messages
            time.sleep(0.5)


def stored_verdicts(task: Path) -> dict[str, tuple[str, str | None]]:
    traces = TelemetryStore(load_task_file(task).store).read("traces")
    return {
        row["trace_id"]: (row["feedback_verdict"], row["feedback_correction"])
        for row in traces.iter_rows(named=True)
        if row["feedback_verdict"] is not None
    }


def test_a_paused_queue_resumed_with_verdicts_applies_the_answered_rows_once(queued: Path) -> None:
    from prefect.flow_runs import resume_flow_run

    outcome, stop = start_queue(queued, size=3, random_share=0.34)  # round(3 × 0.34) = 1 drawn at random
    run = paused_run(queued)
    rows = queue_table(run.id)
    assert sorted(row["chosen_by"] for row in rows) == ["queue", "queue", "random"]
    schema, description = the_form(run)
    assert list(schema["properties"]) == [row["trace_id"] for row in rows]  # one row per answer, by trace id
    row_schema = schema["definitions"]["VerdictRow"]["properties"]
    assert row_schema["verdict"]["enum"] == ["unanswered", "correct", "wrong"]
    assert row_schema["verdict"]["default"] == "unanswered"
    choices = row_schema["correction"]["enum"]
    assert "Standard delivery takes 3 to 5 business days." in choices and choices[-1] == NONE
    for number, row in enumerate(rows, start=1):  # above the form: each request and Gil's answer, readably
        assert f"{number}. **Request:** " in description and row["why"] in description
    assert "Gil answered:" in description and "starts **unanswered**" in description
    with pytest.raises(RuntimeError, match="Validation failed"):  # the server checks the rows against the form
        resume_flow_run(run.id, run_input={rows[0]["trace_id"]: {"verdict": "maybe"}})

    right, wrong, untouched = rows
    # The key's answer where the form lists it (a filled template is not: it would go in written_correction), else
    # the first listed one that differs from Gil's: which answers are asked varies (the queue's random share).
    listed = choices[1:]
    correction = next(text for text in (KEY[wrong["request"]], *listed) if text in listed and text != wrong["answer"])
    resume_flow_run(
        run.id,
        run_input={
            right["trace_id"]: {"verdict": "correct"},
            wrong["trace_id"]: {"verdict": "wrong", "correction": correction},
        },
    )
    result = outcome.result(timeout=300)
    stop()
    verdicts = result["verdicts"]
    assert verdicts["applied"] == [right["trace_id"], wrong["trace_id"]]
    assert verdicts["unanswered"] == [untouched["trace_id"]] and verdicts["problems"] == []
    assert verdicts["report"] == {"applied": 2, "unchanged": 0, "failed": [], "not_learned": 0, "not_tree_answers": 0}
    stored = stored_verdicts(queued)
    assert stored[right["trace_id"]] == ("correct", None) and stored[wrong["trace_id"]] == ("wrong", correction)
    assert untouched["trace_id"] not in stored and len(stored) == 40 + 2

    loaded = load_task_file(queued)
    store, task = TelemetryStore(loaded.store), loaded.task
    log = read_learned_log(store, task.name, task.tree, none_text=NONE, embedder=embedder().name)
    ways = {item.trace_id: item.chosen_by for item in log.confirmed}
    assert {trace_id: ways[trace_id] for trace_id in (right["trace_id"], wrong["trace_id"])} == {
        right["trace_id"]: right["chosen_by"],
        wrong["trace_id"]: wrong["chosen_by"],
    }
    state = stored_state(store, task)
    assert state is not None and state.fitted_on["verdicts"] == 42  # the learned judge refitted on them
    applied = artifact_of(run.id, "support-feedback-queue-verdicts").data
    assert f"`{right['trace_id']}`" in applied and "**correct**" in applied and "1 left unanswered" in applied


def test_a_verdict_given_meanwhile_counts_once_and_a_correction_outside_the_tree_is_refused(queued: Path) -> None:
    from prefect.flow_runs import resume_flow_run

    outcome, stop = start_queue(queued, size=3, random_share=0.0)
    run = paused_run(queued)
    meanwhile, same, outside = queue_table(run.id)
    # While the form is open, two of its answers get their verdicts through `gil feedback`.
    verdicts_file = queued.parent / "meanwhile.jsonl"
    verdicts_file.write_text(
        json.dumps({"trace_id": meanwhile["trace_id"], "correct": False}) + "\n"
        + json.dumps({"trace_id": same["trace_id"], "correct": True}) + "\n"
    )  # fmt: skip
    given = runner.invoke(app, ["feedback", str(verdicts_file), "-t", str(queued), "--json"])
    assert given.exit_code == 0, given.output
    assert json.loads(given.stdout)["applied"] == 2
    resume_flow_run(
        run.id,
        run_input={
            meanwhile["trace_id"]: {"verdict": "correct"},  # says otherwise: the earlier verdict stands
            same["trace_id"]: {"verdict": "correct"},
            outside["trace_id"]: {"verdict": "wrong", "written_correction": NOT_AN_ANSWER},
        },
    )
    result = outcome.result(timeout=300)
    stop()
    verdicts = result["verdicts"]
    assert verdicts["applied"] == [] and verdicts["report"] is None  # nothing applied twice, nothing refused applied
    assert verdicts["already_answered"] == {meanwhile["trace_id"]: "wrong", same["trace_id"]: "correct"}
    assert list(verdicts["refused"]) == [outside["trace_id"]]
    assert "none of the tree's answers" in verdicts["refused"][outside["trace_id"]]
    (stale, refused) = verdicts["problems"]
    assert meanwhile["trace_id"] in stale and "already answered" in stale
    assert outside["trace_id"] in refused and NOT_AN_ANSWER in refused
    stored = stored_verdicts(queued)
    assert stored[meanwhile["trace_id"]] == ("wrong", None) and stored[same["trace_id"]] == ("correct", None)
    assert outside["trace_id"] not in stored
    artifact = artifact_of(run.id, "support-feedback-queue-verdicts").data
    assert "already answered (outside this form): counted once" in artifact
    assert "## Problems" in artifact and NOT_AN_ANSWER in artifact
    logs = run_logs(run.id, "none of the tree's answers")
    assert any(outside["trace_id"] in message and "none of the tree's answers" in message for message in logs)


def test_a_queue_nobody_answers_leaves_every_row_unanswered_and_completes(queued: Path) -> None:
    from flows.queue import feedback_queue_flow

    # Prefect fails a run whose pause times out; the queue resumes itself at its deadline instead.
    state = asyncio.run(
        feedback_queue_flow(
            str(queued), size=2, wait_for_verdicts=True, verdict_timeout=2, poll_seconds=1, return_state=True
        )
    )
    assert state.is_completed(), state.message
    result = state.result()
    verdicts = result["verdicts"]
    assert verdicts["timed_out"] and verdicts["applied"] == [] and verdicts["report"] is None
    assert verdicts["unanswered"] == [item["trace_id"] for item in result["items"]]
    assert len(stored_verdicts(queued)) == 40  # nothing applied
    run_id = state.state_details.flow_run_id
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    assert run.state is not None and run.state.is_completed()
    assert "every answer stays unanswered" in artifact_of(run_id, "support-feedback-queue-verdicts").data
