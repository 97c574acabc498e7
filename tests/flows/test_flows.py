"""The flows under a real Prefect engine: a batch, feedback, a rerun that resolves nothing, maintenance, and a
review round with its artifacts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gil_core.telemetry import TelemetryStore
from tests.flows._support import write_task_file
from tests.resolver._support import Script, support_server

REFUND = "Refunds reach the original payment method within 5 business days of approval."


@pytest.mark.usefixtures("prefect_harness")
async def test_batch_feedback_rerun_and_maintenance_flows(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client

    from flows.batch import apply_feedback_flow, resolve_batch_flow
    from flows.maintenance import compact_telemetry_flow, fit_energy_flow, rebuild_memory_flow
    from flows.review import deactivation_round_flow, promotion_round_flow

    scripts = {"where is my refund?": Script(route=["billing", "refund status"])}
    with support_server(scripts, default=Script(answers=["None of these"])) as server:
        task = str(write_task_file(tmp_path, server.base_url))
        tickets = tmp_path / "tickets.jsonl"
        texts = ["where is my refund?", "do you sell gift cards?", "{not json", "where is my refund?"]
        tickets.write_text(
            "".join((json.dumps({"id": f"t{i}", "text": t}) if t[0] != "{" else t) + "\n" for i, t in enumerate(texts))
        )
        out = tmp_path / "results.jsonl"
        report = await resolve_batch_flow(task, str(tickets), out=str(out))
        assert (report["resolved"], report["skipped"], len(report["failed"])) == (3, 0, 1)
        results = [json.loads(line) for line in out.read_text().splitlines()]
        verdicts = tmp_path / "verdicts.jsonl"
        verdicts.write_text("".join(json.dumps({"trace_id": r["trace_id"], "correct": True}) + "\n" for r in results))
        assert (await apply_feedback_flow(task, str(verdicts)))["applied"] == 3
        again = await resolve_batch_flow(task, str(tickets), out=str(out))
        assert (again["resolved"], again["skipped"]) == (0, 3)
        assert await rebuild_memory_flow(task) == 3  # one entry per confirmed trace
        await fit_energy_flow(task)
        assert (await compact_telemetry_flow(task))["traces"] >= 2
        for round_flow in (promotion_round_flow, deactivation_round_flow):
            published = await round_flow(task)
            assert Path(published["file"]).is_file()

    store = TelemetryStore(tmp_path / "store")
    assert store.read("traces").height == 3
    async with get_client() as client:
        runs = await client.read_flow_runs()
        names = {run.name for run in runs}
        flows_seen = {(await client.read_flow(run.flow_id)).name for run in runs}
        artifacts = await client.read_artifacts()
    assert {"resolve-batch", "apply-feedback", "fit-energy", "compact-telemetry", "promotion-round"} <= flows_seen
    assert names and {a.key for a in artifacts} >= {
        "support-stats",
        "support-stats-cost",
        "support-stats-deciders",
        "support-promotion",
        "support-savings",
    }


@pytest.mark.usefixtures("prefect_harness")
async def test_a_promotion_round_on_a_task_with_no_requests_yet_proposes_nothing_and_says_why(tmp_path: Path) -> None:
    """A scheduled round on a young task (no judge call in the log to price a habit) completes with no items and
    a note, in its list file and its artifacts, instead of failing the run."""
    from prefect.client.orchestration import get_client

    from flows.review import promotion_round_flow

    task = str(write_task_file(tmp_path, "http://127.0.0.1:9/v1"))  # no model is asked: nothing is resolved
    published = await promotion_round_flow(task)
    assert published["items"] == 0
    listed = Path(published["file"]).read_text(encoding="utf-8")
    assert "note: 'nothing proposed yet: a habit is priced from the judge calls in the log" in listed, listed
    async with get_client() as client:  # the session's harness keeps other runs' versions of the key: the newest
        howto = max((a for a in await client.read_artifacts() if a.key == "support-promotion-howto"),
                    key=lambda artifact: artifact.created.timestamp() if artifact.created else 0.0)  # fmt: skip
    assert "nothing proposed yet" in str(howto.data) and "got 0" in str(howto.data)


@pytest.mark.usefixtures("prefect_harness")
async def test_memory_hits_the_guard_took_back_are_a_table_artifact_of_the_batch(tmp_path: Path) -> None:
    """An answer naming order 7 confirmed (a correction) for a request about order 7; the same request about
    order 8 is a memory hit the guard refuses. The stats the batch publishes hold a table of it: the guard's hit,
    judged once its verdict is in, memory wrong there (it would have served the answer about order 7), the
    tree's answer right."""
    from prefect.client.orchestration import get_client

    from flows.batch import apply_feedback_flow, resolve_batch_flow

    first, second = "refund for order 7 please", "refund for order 8 please"
    scripts = {text: Script(route=["billing", "refund status"]) for text in (first, second)}
    with support_server(scripts, default=Script(answers=["None of these"])) as server:
        task = str(write_task_file(tmp_path, server.base_url, memory_threshold=0.5, memory_guard=True))
        tickets, verdicts = tmp_path / "tickets.jsonl", tmp_path / "verdicts.jsonl"
        results = []
        for number, text in enumerate((first, second)):
            tickets.write_text(json.dumps({"id": f"t{number}", "text": text}) + "\n")
            out = tmp_path / f"results-{number}.jsonl"
            await resolve_batch_flow(task, str(tickets), out=str(out))
            (result,) = [json.loads(line) for line in out.read_text().splitlines()]
            results.append(result)
            given = {"trace_id": result["trace_id"], "correct": True}
            if number == 0:
                given = {**given, "correct": False, "correction": "The refund for order 7 was sent."}
            verdicts.write_text(json.dumps(given) + "\n")
            await apply_feedback_flow(task, str(verdicts))
        assert results[1]["mode"] != "memory"
        await resolve_batch_flow(task, str(tickets), out=str(tmp_path / "again.jsonl"))  # publishes stats again
    async with get_client() as client:
        artifacts = [a for a in await client.read_artifacts() if a.key == "support-stats-memory-refused"]
    newest = max(artifacts, key=lambda artifact: artifact.created)  # the harness keeps other runs' versions
    rows = json.loads(newest.data) if isinstance(newest.data, str) else newest.data
    assert rows == [{"check": "guard", "hits": 1, "judged": 1, "remembered_wrong": 1, "answered_right": 1}]


@pytest.mark.usefixtures("prefect_harness")
async def test_the_feedback_flow_grades_resolved_tickets_by_an_answer_key(tmp_path: Path) -> None:
    """The apply-feedback flow given an answer key (``key=True``): each resolved ticket's answer graded against
    the key's, as ``gil feedback --key`` grades them; regraded, it counts nothing twice. A key naming the tree's
    answers (``option_column``) grades by answer, as ``--option-column`` does."""
    from flows.batch import apply_feedback_flow, resolve_batch_flow
    from gil_core.batch import ticket_trace_id

    refund = "Refunds reach the original payment method within 5 business days of approval."
    scripts = {"where is my refund?": Script(route=["billing", "refund status"])}
    with support_server(scripts, default=Script(answers=["None of these"])) as server:
        task = str(write_task_file(tmp_path, server.base_url))
        tickets = tmp_path / "history.jsonl"
        tickets.write_text(
            json.dumps({"id": "a", "text": "where is my refund?"}) + "\n"
            + json.dumps({"id": "b", "text": "do you sell gift cards?"}) + "\n"
            + json.dumps({"id": "c", "text": "how long does delivery take?"}) + "\n",
            encoding="utf-8",
        )  # fmt: skip
        await resolve_batch_flow(task, str(tickets), out=str(tmp_path / "results.jsonl"))
        key = tmp_path / "key.csv"
        key.write_text(f"Ticket,Reply\na,{refund}\nb,{refund}\n", encoding="utf-8")
        graded = {"key": True, "id_column": "Ticket", "answer_column": "Reply"}
        report = await apply_feedback_flow(task, str(key), **graded)
        again = await apply_feedback_flow(task, str(key), **graded)
        categories = tmp_path / "categories.csv"
        categories.write_text("Ticket,Category\nc,delivery time\n", encoding="utf-8")
        by_option = await apply_feedback_flow(
            task, str(categories), key=True, id_column="Ticket", option_column="Category"
        )
    assert (report["applied"], report["failed"]) == (2, [])
    assert (by_option["applied"], by_option["failed"]) == (1, [])
    assert (again["applied"], again["unchanged"]) == (0, 2)
    rows = TelemetryStore(tmp_path / "store").read("traces").iter_rows(named=True)
    got = {row["trace_id"]: (row["feedback_verdict"], row["feedback_correction"]) for row in rows}
    a, b, c = (ticket_trace_id("support", ticket) for ticket in "abc")
    assert got == {
        a: ("correct", None),
        b: ("wrong", refund),
        c: ("wrong", "Standard delivery takes 3 to 5 business days."),
    }


@pytest.mark.usefixtures("prefect_harness")
async def test_the_batch_flow_reads_a_csv_export_by_the_columns_it_is_given(tmp_path: Path) -> None:
    """A help desk's CSV export, its id and text under names of its own, saved by a spreadsheet in a legacy
    encoding: the flow plans, resolves and writes the results by those columns and that encoding (each of its
    three reads of the file), and a row without an id is a bad line."""
    from flows.batch import resolve_batch_flow

    scripts = {"Refund\n\nwhere is my refund?": Script(route=["billing", "refund status"])}
    with support_server(scripts, default=Script(answers=["None of these"])) as server:
        task = str(write_task_file(tmp_path, server.base_url))
        tickets = tmp_path / "export.csv"
        tickets.write_text(
            "Ticket ID,Subject,Body\n4711,Refund,where is my refund?\n4712,,do you sell gift cards at the café?\n"
            ",Refund,x\n",
            encoding="cp1252",  # é is one byte, not UTF-8
        )
        out = tmp_path / "results.jsonl"
        report = await resolve_batch_flow(
            task, str(tickets), out=str(out), id_column="Ticket ID", text_columns=["Subject", "Body"], encoding="cp1252"
        )
    assert (report["resolved"], report["tickets"], len(report["failed"])) == (2, 2, 1)
    assert report["failed"][0].startswith(f"{tickets}:4: a ticket needs")
    results = {line["id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert set(results) == {"4711", "4712"}
    assert results["4711"]["option_id"] is not None  # the joined text met the route scripted for it
