"""Two batches on one task at once (two ``gil resolve-batch`` processes on the same tickets and results file; the
resolve-batch flow while a manual batch runs): one holds the task's turn, the other waits up to its bound and
then skips, saying who holds it, with exit code 0 (a flow run: Completed, named Skipped); or, when the first ends
within the bound, takes the turn and finds every ticket done. No ticket is answered twice or lost, each has one
trace, and the results file has a line per ticket. A killed holder never blocks the next batch: the kernel lets go
of a file lock at once, an ``s3://`` lease once it expires by the object store's clock.

The first batch is held mid-batch by the model server itself (its replies wait on an event the test sets), so
the overlap is certain, never a matter of timing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from gil_core.batch_lock import hold_batch_turn
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedOpenAIServer
from tests.flows._support import write_task_file
from tests.flows.conftest import prefect_harness  # noqa: F401 - the session's Prefect engine, for the flow test
from tests.reliability._support import ROOT, check_one_trace_per_ticket, gil_command, make_tickets, write_jsonl
from tests.resolver._support import Script, SupportModel
from tests.telemetry._s3 import environment_for, new_bucket, s3_server, s3_settings

pytestmark = pytest.mark.reliability

TICKETS = 12


class HeldModel:
    """A responder that holds every reply until ``release()``; ``reached`` is set by the first request."""

    def __init__(self) -> None:
        self._model = SupportModel({}, default=Script(answers=["None of these"]))
        self.reached = threading.Event()
        self._released = threading.Event()

    def __call__(self, body: Mapping[str, Any]) -> Any:
        self.reached.set()
        self._released.wait(120.0)
        return self._model(body)

    def release(self) -> None:
        self._released.set()


class Batch:
    """One ``gil resolve-batch`` child process over the test's tickets and results file."""

    def __init__(self, task_file: Path, tickets: Path, out: Path, *extra: str, env: dict[str, str] | None = None):
        command = gil_command("resolve-batch", str(tickets), "-o", str(out), "-t", str(task_file), "--json", *extra)
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        )  # fmt: skip
        self.stderr: list[str] = []

    def wait_for_stderr(self, words: str) -> str:
        """Read stderr lines until one holds ``words`` (the child prints it, then blocks); that line."""
        stream = self.process.stderr
        assert stream is not None
        for line in stream:
            self.stderr.append(line)
            if words in line:
                return line
        raise AssertionError(f"the batch ended without saying {words!r}: {''.join(self.stderr)}")

    def finish(self) -> tuple[int, dict[str, Any], str]:
        out, err = self.process.communicate(timeout=300)
        stderr = "".join(self.stderr) + err
        summary = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        return self.process.returncode, summary, stderr


@pytest.fixture
def held() -> Iterator[tuple[HeldModel, ScriptedOpenAIServer]]:
    model = HeldModel()
    with ScriptedOpenAIServer(responder=model) as server:
        try:
            yield model, server
        finally:
            model.release()


def tickets_file(folder: Path) -> Path:
    return write_jsonl(folder / "tickets.jsonl", ({"id": t.id, "text": t.text} for t in make_tickets(TICKETS)))


def result_ids(out: Path) -> list[str]:
    return [json.loads(line)["id"] for line in out.read_text(encoding="utf-8").splitlines()]


def check_every_ticket_once(store: TelemetryStore, out: Path) -> None:
    check_one_trace_per_ticket(store, "support", make_tickets(TICKETS))
    assert result_ids(out) == [t.id for t in make_tickets(TICKETS)]


def first_batch_mid_way(folder: Path, held: tuple[HeldModel, ScriptedOpenAIServer]) -> tuple[Path, Path, Path, Batch]:
    """A task file, its tickets and results file, and a first batch over them held mid-batch by the model."""
    model, server = held
    task_file, tickets, out = write_task_file(folder, server.base_url), tickets_file(folder), folder / "out"
    first = Batch(task_file, tickets, out)
    assert model.reached.wait(120.0), "the first batch never reached the model"
    return task_file, tickets, out, first


def test_a_second_gil_resolve_batch_on_the_same_task_waits_its_bound_then_skips(
    tmp_path: Path, held: tuple[HeldModel, ScriptedOpenAIServer]
) -> None:
    model = held[0]
    task_file, tickets, out, first = first_batch_mid_way(tmp_path, held)
    second = Batch(task_file, tickets, out, "--lock-wait", "1")
    code, summary, stderr = second.finish()
    assert code == 0, stderr
    assert summary["batch_skipped"].startswith(f"another batch (pid {first.process.pid} on ")
    assert "of task 'support' holds" in summary["batch_skipped"] and summary["batch_skipped"].endswith("waited 1 s")
    assert (summary["resolved"], summary["written"]) == (0, 0)
    assert "waiting" in stderr and "skipped this batch" in stderr and "Traceback" not in stderr
    assert not out.exists()  # the skipped batch touched no results file

    model.release()
    code, summary, stderr = first.finish()
    assert code == 0, stderr
    assert (summary["resolved"], summary["failed"], summary["written"]) == (TICKETS, [], TICKETS)
    check_every_ticket_once(TelemetryStore(tmp_path / "store"), out)


def test_a_second_batch_that_waits_long_enough_takes_the_turn_and_finds_every_ticket_done(
    tmp_path: Path, held: tuple[HeldModel, ScriptedOpenAIServer]
) -> None:
    model = held[0]
    task_file, tickets, out, first = first_batch_mid_way(tmp_path, held)
    second = Batch(task_file, tickets, out, "--lock-wait", "300")
    assert f"pid {first.process.pid}" in second.wait_for_stderr("waiting")  # it is waiting for the first
    model.release()
    first_code, first_summary, first_err = first.finish()
    second_code, second_summary, second_err = second.finish()
    assert first_code == 0 and second_code == 0, first_err + second_err
    assert first_summary["resolved"] == TICKETS
    assert (second_summary["resolved"], second_summary["skipped"], second_summary["written"]) == (0, TICKETS, TICKETS)
    check_every_ticket_once(TelemetryStore(tmp_path / "store"), out)


def test_a_killed_holder_leaves_the_turn_free_at_once_on_a_local_store(
    tmp_path: Path, held: tuple[HeldModel, ScriptedOpenAIServer]
) -> None:
    model = held[0]
    task_file, tickets, out, first = first_batch_mid_way(tmp_path, held)
    first.process.send_signal(signal.SIGKILL)
    first.process.communicate(timeout=60)
    model.release()
    # Waiting 0 s: the kernel let go of the killed batch's lock, nothing has to expire.
    code, summary, stderr = Batch(task_file, tickets, out, "--lock-wait", "0").finish()
    assert code == 0, stderr
    assert (summary["resolved"], summary["failed"]) == (TICKETS, [])
    check_every_ticket_once(TelemetryStore(tmp_path / "store"), out)


@pytest.mark.usefixtures("prefect_harness")
def test_the_flow_skips_while_a_manual_batch_runs_and_its_run_is_completed_not_failed(
    tmp_path: Path, held: tuple[HeldModel, ScriptedOpenAIServer]
) -> None:
    """A scheduled run (the resolve-batch flow) while ``gil resolve-batch`` holds the task: the flow run ends in a
    Completed state named Skipped, its message and summary saying who holds the turn; it writes nothing."""
    from prefect import State

    from flows.batch import resolve_batch_flow

    model = held[0]
    task_file, tickets, out, manual = first_batch_mid_way(tmp_path, held)

    async def scheduled_run() -> State:
        flow_out = str(tmp_path / "flow-out")
        return await resolve_batch_flow(str(task_file), str(tickets), out=flow_out, lock_wait_s=0.5, return_state=True)

    state = asyncio.run(scheduled_run())
    assert state.is_completed() and state.name == "Skipped", state
    summary = cast(dict[str, Any], state.result())
    assert f"pid {manual.process.pid}" in summary["batch_skipped"] and summary["resolved"] == 0
    assert state.message is not None and state.message.startswith("skipped: another batch")
    assert not (tmp_path / "flow-out").exists()
    model.release()
    code, summary, stderr = manual.finish()
    assert code == 0 and summary["resolved"] == TICKETS, stderr
    check_every_ticket_once(TelemetryStore(tmp_path / "store"), out)


@pytest.mark.s3
def test_two_batches_on_a_task_stored_on_s3_take_turns_through_a_lease(
    tmp_path: Path, held: tuple[HeldModel, ScriptedOpenAIServer]
) -> None:
    """On ``s3://`` the turn is a lease object written put-if-absent: the second batch skips naming it, a third
    after the first took the released lease over, and found every ticket done."""
    model, server = held
    with s3_server() as endpoint:
        bucket = new_bucket(endpoint)
        store = f"s3://{bucket}/gil/store"
        env = environment_for(endpoint)
        task_file = write_task_file(tmp_path, server.base_url, store=store)
        tickets, out = tickets_file(tmp_path), tmp_path / "out"
        first = Batch(task_file, tickets, out, env=env)
        assert model.reached.wait(120.0)
        code, summary, stderr = Batch(task_file, tickets, out, "--lock-wait", "1", env=env).finish()
        assert code == 0, stderr
        assert f"pid {first.process.pid}" in summary["batch_skipped"]
        assert f"{store}/locks/batch-support.json" in summary["batch_skipped"]
        model.release()
        code, summary, stderr = first.finish()
        assert code == 0 and summary["resolved"] == TICKETS, stderr
        code, summary, stderr = Batch(task_file, tickets, out, "--lock-wait", "0", env=env).finish()
        assert code == 0 and (summary["resolved"], summary["skipped"]) == (0, TICKETS), stderr
        check_every_ticket_once(TelemetryStore(store, s3=s3_settings(endpoint)), out)


@pytest.mark.s3
def test_an_s3_lease_whose_holder_stopped_renewing_is_taken_over_once_it_expires_by_the_stores_clock() -> None:
    """A holder killed mid-batch stops renewing: its lease (2 s here) is taken over once the object store's own
    clock says 2 s passed since its last write (a conditional write on its ETag: of two that find it expired, one
    wins), and not before; a released lease is taken at once."""
    with s3_server() as endpoint:
        settings = s3_settings(endpoint)
        store = f"s3://{new_bucket(endpoint)}/gil/store"
        with hold_batch_turn(store, "support", wait_s=0, lease_s=2.0, s3=settings) as first:
            assert first.held
            with hold_batch_turn(store, "support", wait_s=0, lease_s=2.0, s3=settings) as second:
                assert not second.held and "holds" in second.reason
        with hold_batch_turn(store, "support", wait_s=0, lease_s=2.0, s3=settings) as after:
            assert after.held  # released: taken at once, nothing to expire
        # A holder that never renews (killed): write its lease and leave it.
        from gil_core.batch_lock import _Lease

        dead = _Lease(f"{store}/locks/batch-other.json", settings, 2.0)
        with httpx.Client() as client:
            dead._client = client
            assert dead._acquire(0) == (True, None)
        with hold_batch_turn(store, "other", wait_s=0, lease_s=2.0, s3=settings) as early:
            assert not early.held  # not expired yet
        with hold_batch_turn(store, "other", wait_s=30, lease_s=2.0, s3=settings) as late:
            assert late.held
