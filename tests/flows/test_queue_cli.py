"""``gil review queue``: the feedback queue printed for programs (``--json``) and for people, recorded as issued,
read back by the learned judge's log per verdict; and what ``gil feedback`` says of corrections it cannot learn."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flows.cli import app
from gil_core.batch import Ticket, resolve_batch
from gil_core.learned import read_chosen_by, read_waiting
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.resolver import Resolver
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore
from tests.flows._support import write_task_file
from tests.learned._support import NONE, bad_model, embedder, run_with_feedback, support_stream
from tests.reliability._support import REFUND

runner = CliRunner()


def store_with_unconfirmed(tmp_path: Path, base_url: str) -> Path:
    """A task file whose store holds 40 confirmed support tickets and 20 answered without a verdict."""
    path = write_task_file(tmp_path, base_url, memory_threshold=None, embedding_model="local",
                           learned_reflex={"precision": 0.95})  # fmt: skip
    task = load_task_file(path).task
    stream = support_stream()

    async def prepare() -> None:
        async with OpenAICompatibleChatModel(base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await run_with_feedback(resolver, task, stream[:40])
            await resolve_batch(resolver, task, [Ticket(e.id, e.text) for e in stream[40:60]])

    asyncio.run(prepare())
    return path


def test_queue_cli_prints_json_and_records_the_queue_as_issued(tmp_path: Path) -> None:
    with bad_model() as server:
        path = store_with_unconfirmed(tmp_path, server.base_url)
        result = runner.invoke(app, ["review", "queue", "-t", str(path), "--size", "5", "--json"])
        assert result.exit_code == 0, result.output
        queue = json.loads(result.stdout)
        assert queue["task"] == "support" and queue["random_share"] == 0.3
        items = queue["items"]
        assert Counter(item["chosen_by"] for item in items) == {"queue": 3, "random": 2}  # round(5 × 0.3) = 2
        assert {"trace_id", "request", "answer", "why", "score", "chance"} <= set(items[0])
        scores = [item["score"] for item in items if item["chosen_by"] == "queue"]
        assert scores == sorted(scores, reverse=True)
        chosen = read_chosen_by(TelemetryStore(tmp_path / "store"), "support")
        assert chosen == {item["trace_id"]: item["chosen_by"] for item in items}
        shown = runner.invoke(app, ["review", "queue", "-t", str(path), "--size", "3", "--random-share", "0"])
        assert shown.exit_code == 0, shown.output
        assert "feedback queue for support" in shown.stdout and "recorded as issued" in shown.stdout
        again = runner.invoke(app, ["review", "queue", "-t", str(path), "--size", "50", "--json"])
        later = json.loads(again.stdout)
        assert not {item["trace_id"] for item in later["items"]} & set(chosen)  # asked about once
        done = runner.invoke(app, ["review", "queue", "-t", str(path)])  # every answer asked about: says so
        said = " ".join(done.stdout.split())
        assert "0 of 0 unconfirmed answers not yet asked about" in said and "nothing to ask about" in said, said
        assert "┏" not in done.stdout  # no empty table
        refused = runner.invoke(app, ["review", "queue", "-t", str(path), "--random-share", "1.5"])
        assert refused.exit_code == 2 and "--random-share" in refused.output


def test_the_queue_as_a_sheet_filled_in_goes_back_through_gil_feedback_as_the_queue_s_verdicts(tmp_path: Path) -> None:
    with bad_model() as server:
        path = store_with_unconfirmed(tmp_path, server.base_url)
        refused = runner.invoke(app, ["review", "queue", "-t", str(path), "-o", str(tmp_path / "queue.xlsx")])
        assert refused.exit_code == 2 and ".csv or .tsv" in refused.output
        sheet = tmp_path / "queue.csv"
        result = runner.invoke(app, ["review", "queue", "-t", str(path), "--size", "4", "-o", str(sheet), "--json"])
        assert result.exit_code == 0, result.output
        queue = json.loads(result.stdout)
        assert queue["written"] == 4
        header, *rows = list(csv.reader(io.StringIO(sheet.read_text(encoding="utf-8-sig"))))
        assert header == ["trace_id", "request", "answer", "chosen", "why", "score", "correct", "correction"]
        assert [row[0] for row in rows] == [item["trace_id"] for item in queue["items"]]
        assert [row[1] for row in rows] == [item["request"] for item in queue["items"]]
        with sheet.open("w", encoding="utf-8", newline="") as filled:  # a person judges the first two
            csv.writer(filled).writerows(
                [header, *([*row[:6], "yes" if i < 2 else "", ""] for i, row in enumerate(rows))]
            )
        given = runner.invoke(app, ["feedback", str(sheet), "-t", str(path), "--json"])
        assert given.exit_code == 0, given.output
        assert json.loads(given.stdout)["applied"] == 2
        traces = TelemetryStore(tmp_path / "store").read("traces")
        judged = dict(zip(traces["trace_id"], traces["feedback_verdict"], strict=True))
        assert [judged[row[0]] for row in rows] == ["correct", "correct", None, None]
        # The two left are shown again as issued, and showing them issues nothing.
        chosen = read_chosen_by(TelemetryStore(tmp_path / "store"), "support")
        again = tmp_path / "waiting.csv"
        shown = runner.invoke(app, ["review", "queue", "-t", str(path), "--waiting", "-o", str(again), "--json"])
        assert shown.exit_code == 0, shown.output
        waiting = json.loads(shown.stdout)
        assert waiting["waiting"] == 2 and [q["queue_id"] for q in waiting["queues"]] == [queue["queue_id"]]
        assert waiting["queues"][0]["items"] == queue["items"][2:]  # the figures they were issued with
        assert [row[0] for row in csv.reader(io.StringIO(again.read_text(encoding="utf-8-sig")))][1:] == [
            row[0] for row in rows[2:]
        ]
        assert read_chosen_by(TelemetryStore(tmp_path / "store"), "support") == chosen
        assert read_waiting(TelemetryStore(tmp_path / "store"), "other") == []  # a task sees its own queues only
        told = " ".join(runner.invoke(app, ["review", "queue", "-t", str(path), "--waiting"]).stdout.split())
        assert "2 answers, from 1 issued queue" in told and rows[2][0][:12] in told, told  # ids fold in the table
        with again.open("w", encoding="utf-8", newline="") as filled:  # the rest judged: nothing waits
            csv.writer(filled).writerows([header, *([*row[:6], "no", ""] for row in rows[2:])])
        assert runner.invoke(app, ["feedback", str(again), "-t", str(path)]).exit_code == 0
        done = runner.invoke(app, ["review", "queue", "-t", str(path), "--waiting"])
        said = " ".join(done.stdout.split())
        assert "nothing waiting in support" in said and "┏" not in done.stdout, said


def test_gil_feedback_says_how_many_corrections_the_learned_reflex_cannot_learn_from(tmp_path: Path) -> None:
    with bad_model() as server:
        path = store_with_unconfirmed(tmp_path, server.base_url)
        traces = TelemetryStore(tmp_path / "store").read("traces")
        open_ids = traces.filter(traces["feedback_verdict"].is_null())["trace_id"].to_list()[:4]
        own_words = "So sorry! I've pushed your refund through, it'll be with you by Friday."
        corrections = [
            REFUND,
            own_words,
            NONE,
            "Order 4411 is on its way; the tracking link is in your confirmation email.",
        ]
        verdicts = tmp_path / "verdicts.jsonl"
        verdicts.write_text(
            "".join(
                json.dumps({"trace_id": trace_id, "correct": False, "correction": correction}) + "\n"
                for trace_id, correction in zip(open_ids, corrections, strict=True)
            )
            + json.dumps({"trace_id": "no-such-trace", "correct": False, "correction": own_words})
            + "\n",
            encoding="utf-8",
        )
        given = runner.invoke(app, ["feedback", str(verdicts), "-t", str(path), "--json"])
        assert given.exit_code == 0, given.output
        report = json.loads(given.stdout)
        # The tree's answer, none of these and a filled template teach it; the reply in a person's own words does
        # not, and the verdict on a trace the task does not have is not counted.
        assert report["applied"] == 4 and len(report["failed"]) == 1 and report["not_tree_answers"] == 1
        again = runner.invoke(app, ["feedback", str(verdicts), "-t", str(path)])  # carried already: said again
    said = " ".join(again.stdout.split())
    assert "unchanged 4" in said and "1 correction is none of the tree's answers" in said, said


def test_queue_flow_publishes_the_queue_as_a_table_artifact(tmp_path: Path, prefect_harness: None) -> None:
    from prefect.client.orchestration import get_client

    from flows.queue import feedback_queue_flow

    async def published() -> tuple[dict[str, Any], list[Any]]:
        queue = await feedback_queue_flow(str(path), size=4, random_share=0.5)
        async with get_client() as client:
            return queue, await client.read_artifacts()

    with bad_model() as server:
        path = store_with_unconfirmed(tmp_path, server.base_url)
        queue, artifacts = asyncio.run(published())
    assert Counter(item["chosen_by"] for item in queue["items"]) == {"queue": 2, "random": 2}
    (table,) = [artifact for artifact in artifacts if artifact.key == "support-feedback-queue"]
    assert table.type == "table"
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert [row["trace_id"] for row in rows] == [item["trace_id"] for item in queue["items"]]
    assert read_chosen_by(TelemetryStore(tmp_path / "store"), "support").keys() == {r["trace_id"] for r in rows}


@pytest.mark.usefixtures("prefect_harness")
async def test_queue_flow_of_a_task_without_a_learned_reflex_issues_nothing_and_says_why(tmp_path: Path) -> None:
    from flows.queue import feedback_queue_flow

    path = write_task_file(tmp_path, "http://127.0.0.1:9/v1")  # no learned_reflex: no model is ever asked
    queue = await feedback_queue_flow(str(path))
    assert queue["items"] == [] and queue["queue_id"] is None
    assert not (tmp_path / "store" / "queue").exists()  # nothing recorded as issued


def test_a_peek_shows_a_queue_without_issuing_it_and_a_verdict_on_it_counts_as_the_peek_chose_it(
    tmp_path: Path,
) -> None:
    with bad_model() as server:
        path = store_with_unconfirmed(tmp_path, server.base_url)
        store = TelemetryStore(tmp_path / "store")
        peeked = runner.invoke(app, ["review", "queue", "-t", str(path), "--size", "5", "--peek", "--json"])
        assert peeked.exit_code == 0, peeked.output
        queue = json.loads(peeked.stdout)
        assert queue["peek"] is True and queue["issued"] is False and len(queue["items"]) == 5
        how = {item["trace_id"]: item["chosen_by"] for item in queue["items"]}
        assert Counter(how.values()) == {"queue": 3, "random": 2}
        assert read_waiting(store, "support") == []  # nothing issued, nothing waits
        assert read_chosen_by(store, "support") == how  # a verdict on what it showed counts as the peek chose it
        assert read_chosen_by(store, "other") == {}  # another task's verdicts never read this task's peeks
        # Its answers stay eligible: an issued queue may ask about them, and its issue then decides how they were
        # chosen. The scored picks of the first peek are among the five best, in the same order (its two random
        # picks may have taken two of them).
        issued = runner.invoke(
            app, ["review", "queue", "-t", str(path), "--size", "5", "--random-share", "0", "--json"]
        )
        assert issued.exit_code == 0, issued.output
        first = json.loads(issued.stdout)
        assert first["issued"] is True and first["peek"] is False
        best = [item["trace_id"] for item in first["items"]]
        picked = [trace for trace, chosen in how.items() if chosen == "queue"]
        assert set(picked) <= set(best) and [trace for trace in best if trace in picked] == picked
        chosen = read_chosen_by(store, "support")
        assert all(chosen[trace] == "queue" for trace in best)  # as issued
        assert all(chosen[trace] == how[trace] for trace in how if trace not in best)  # as peeked
        said = " ".join(runner.invoke(app, ["review", "queue", "-t", str(path), "--peek"]).stdout.split())
        assert "(a peek: not issued)" in said and "stay eligible" in said and "recorded as issued" not in said, said
        for flags, named in ((["--out", str(tmp_path / "peek.csv")], "--out"), (["--waiting"], "--waiting")):
            refused = runner.invoke(app, ["review", "queue", "-t", str(path), "--peek", *flags])
            assert refused.exit_code == 2 and named in refused.output and "--peek" in refused.output, refused.output
        assert not (tmp_path / "peek.csv").exists()
