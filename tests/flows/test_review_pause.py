"""A promotion round that waits for decisions: it pauses with a form showing each proposal's evidence, is resumed
through the Prefect client with input (as the UI does), records the decisions once (a proposal decided meanwhile
with `gil review decide` keeps that decision, a stale row is reported), writes the accepted habit into a new tree
file and the round; nobody answering within the timeout leaves every proposal deferred and the run Completed."""

from __future__ import annotations

import asyncio
import contextvars
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from gil_core.habits.promotion import PromotionLog
from gil_core.habits.review_log import Decision, ReviewLog
from gil_core.ontology import load_tree
from gil_core.telemetry import TelemetryStore
from tests.flows._support import write_task_file
from tests.resolver._support import ROOT, Script, support_server

EXPRESS = "Express parcels arrive on the next business day."
GIFT = "Gift cards are sold in every store and online."
RETURNS = "Opened software cannot be returned, only exchanged for the same title."
# Each answer the generator gives four times, at the node the walk stops at.
ASKED = {
    EXPRESS: (
        ["shipping"],
        ["express shipping?", "is there express delivery?", "can I get it faster?", "next day delivery?"],
    ),
    GIFT: (
        ["billing"],
        ["do you sell gift cards?", "gift card for a friend", "where to buy a gift card", "gift vouchers?"],
    ),
    RETURNS: (
        ["returns"],
        ["return opened software?", "send back a program I installed", "software return", "used CD back?"],
    ),
}
runner = CliRunner()


def resolve_and_confirm(tmp_path: Path, tree_file: Path, answers: tuple[str, ...] = (EXPRESS, GIFT)) -> Path:
    """Answers the generator gave four times each, all confirmed: one promotion proposal per answer."""
    scripts = {
        text: Script(route=ASKED[answer][0], answers=[answer]) for answer in answers for text in ASKED[answer][1]
    }
    with support_server(scripts) as server:
        task = write_task_file(tmp_path, server.base_url, tree=str(tree_file), contract="text", memory_threshold=None)
        tickets = tmp_path / "tickets.jsonl"
        tickets.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(scripts)))
        result = runner.invoke(
            app, ["resolve-batch", str(tickets), "--out", str(tmp_path / "r.jsonl"), "-t", str(task)]
        )
        assert result.exit_code == 0, result.stderr
    results = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text("".join(json.dumps({"trace_id": r["trace_id"], "correct": True}) + "\n" for r in results))
    assert runner.invoke(app, ["feedback", str(verdicts), "-t", str(task)]).exit_code == 0
    return task


def paused_run(task: Path) -> Any:
    """The promotion-round run of this task file once it is paused (waits for the other thread to get there)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    paused = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])))
    deadline = time.monotonic() + 180
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = client.read_flow_runs(flow_run_filter=paused)
            mine = [run for run in runs if run.parameters.get("task_file") == str(task)]
            if mine:
                return mine[0]
            time.sleep(0.5)
    raise AssertionError("the promotion round never paused")


def decisions_artifact(run_id: Any) -> Any:
    """The filter for a promotion round's decisions artifact of one run."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    return ArtifactFilter(
        key=ArtifactFilterKey(any_=["support-promotion-decisions"]), flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])
    )


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.filterwarnings("ignore::gil_core.ontology.TreeLintWarning")  # the promoted habit's description
def test_a_paused_promotion_round_resumed_with_decisions_records_and_applies_them(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.flow_runs import resume_flow_run

    from flows.review import promotion_round_flow, review_path

    tree_file = tmp_path / "support.yaml"
    shutil.copy(ROOT / "ontologies" / "support.yaml", tree_file)
    original = tree_file.read_text(encoding="utf-8")
    task = resolve_and_confirm(tmp_path, tree_file)

    def run_round() -> dict[str, Any]:  # the paused run lives on its own thread; this test resumes it
        # a short timeout, so that a failing test does not leave a run waiting for days
        return asyncio.run(
            promotion_round_flow(str(task), wait_for_decisions=True, decision_timeout=600, poll_seconds=1)
        )

    pool = ThreadPoolExecutor(max_workers=1)
    round_result = pool.submit(contextvars.copy_context().run, run_round)  # with this thread's Prefect settings
    run = paused_run(task)
    listed = yaml.safe_load(review_path(str(task), "promotion").read_text(encoding="utf-8"))
    by_text = {item["text"]: item["id"] for item in listed["items"]}
    accept, reject = by_text[EXPRESS], by_text[GIFT]
    assert listed["at_index"] == 8

    with get_client(sync_client=True) as client:  # the form the UI renders: one row per proposal, keyed by its id
        keyset = run.state.state_details.run_input_keyset
        schema = client.read_flow_run_input(run.id, keyset["schema"])
        description = client.read_flow_run_input(run.id, keyset["description"])
    schema = json.loads(schema) if isinstance(schema, str) else schema
    assert set(schema["properties"]) == {accept, reject}
    row = schema["definitions"]["ItemDecisionInput"]["properties"]
    assert row["decision"]["default"] == "deferred" and row["reason"] == {
        "default": "",
        "description": "why (kept in the review log)",
        "title": "Reason",
        "type": "string",
    }
    # Above the form: each proposal with its evidence, 4 of 4 confirmed with its 95% Wilson interval.
    assert f"`{accept}`" in description and f"`{reject}`" in description
    assert "4 of 4 generated requests (100%, 95% interval 51%–100%)" in description
    with pytest.raises(RuntimeError, match="Validation failed"):  # the server checks the answers against that form
        resume_flow_run(run.id, run_input={accept: {"decision": "sideways"}})

    # Decided meanwhile on the command line: that decision stands, and the form's stale row is reported.
    cli = runner.invoke(
        app, ["review", "decide", "promotion", reject, "rejected", "--note", "seasonal", "-t", str(task)]
    )
    assert cli.exit_code == 0, cli.stderr
    resume_flow_run(
        UUID(str(run.id)),
        run_input={
            accept: {"decision": "accepted", "reason": "customers ask every day"},
            reject: {"decision": "accepted", "reason": "opened before the CLI decision"},
        },
    )
    outcome = round_result.result(timeout=300)
    pool.shutdown()
    assert outcome["decided_meanwhile"] == {reject: "rejected"} and len(outcome["problems"]) == 1
    assert "stale form" in outcome["problems"][0] and reject in outcome["problems"][0]
    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(artifact_filter=decisions_artifact(run.id))
    assert "## Problems" in artifact.data and "stale form" in artifact.data

    new_file = tmp_path / "support.v2.yaml"
    assert outcome["tree_file"] == str(new_file) and outcome["at_index"] == 8
    store = TelemetryStore(tmp_path / "store")
    assert store.read("reviews")["item_id"].to_list().count(reject) == 1  # recorded once
    decisions = ReviewLog(store).decisions("support", "promotion")
    assert {item: (entry.decision, entry.note) for item, entry in decisions.items()} == {
        accept: (Decision.ACCEPTED, "customers ask every day"),
        reject: (Decision.REJECTED, "seasonal"),
    }
    promoted = load_tree(new_file)
    assert promoted.option(accept).text == EXPRESS and promoted.option(accept).origin.value == "promoted"
    assert promoted.owner(accept).id == "shipping" and not promoted.has_option(reject)
    assert tree_file.read_text(encoding="utf-8") == original  # the old version stays as it was
    log = PromotionLog(store)
    assert log.rounds("support") == [8] and [p.id for p in log.promotions("support", 8)] == [accept]

    result = runner.invoke(app, ["review", "promote", "-t", str(task), "--json"])  # a rejection is not asked again
    assert result.exit_code == 0, result.stderr
    assert reject not in {item["id"] for item in json.loads(result.stdout)["items"]}


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_round_nobody_answers_leaves_every_proposal_deferred_and_completes(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client

    from flows.review import promotion_round_flow

    tree_file = tmp_path / "support.yaml"
    shutil.copy(ROOT / "ontologies" / "support.yaml", tree_file)
    task = resolve_and_confirm(tmp_path, tree_file)
    # Prefect fails a run whose pause times out; the round resumes itself at its deadline instead.
    state = asyncio.run(
        promotion_round_flow(str(task), wait_for_decisions=True, decision_timeout=2, poll_seconds=1, return_state=True)
    )
    assert state.is_completed(), state.message
    outcome = state.result()
    assert outcome["timed_out"] and outcome["decisions"] == {} and outcome["items"] == 2
    assert TelemetryStore(tmp_path / "store").read("reviews").height == 0  # nothing recorded: asked again next round
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
        (artifact,) = client.read_artifacts(artifact_filter=decisions_artifact(run.id))
    assert run.state is not None and run.state.is_completed()
    assert "every proposal stays deferred" in artifact.data


def test_a_decision_made_meanwhile_stands_and_only_a_contrary_row_is_a_problem() -> None:
    from datetime import UTC, datetime

    from flows.review import check_decisions
    from gil_core.habits.review_log import ReviewDecision, ReviewKind
    from gil_core.reviews import ItemDecision

    def logged(item: str, decision: Decision, minute: int) -> ReviewDecision:
        at = datetime(2026, 1, 1, 12, minute, tzinfo=UTC)
        return ReviewDecision("support", ReviewKind.PROMOTION, item, decision, "by hand", at)

    before = {"old": logged("old", Decision.DEFERRED, 0), "same": logged("same", Decision.DEFERRED, 0)}
    now = before | {
        "same": logged("same", Decision.REJECTED, 5),
        "untouched": logged("untouched", Decision.ACCEPTED, 5),
        "contrary": logged("contrary", Decision.REJECTED, 5),
    }
    answers = [
        ItemDecision("old", Decision.ACCEPTED, "now I know"),  # decided before the round: the form decides again
        ItemDecision("fresh", Decision.REJECTED),
        ItemDecision("same", Decision.REJECTED),
        ItemDecision("untouched", Decision.DEFERRED),
        ItemDecision("contrary", Decision.ACCEPTED, "looks right"),
    ]
    checked = check_decisions(answers, before, now)
    assert [answer.item_id for answer in checked.to_record] == ["old", "fresh"]
    assert set(checked.decided_meanwhile) == {"same", "untouched", "contrary"}
    (problem,) = checked.problems
    assert problem.startswith("`contrary`: the form said accepted (looks right), but it was decided rejected at")


def test_accepted_retirements_go_into_a_new_tree_version_and_what_the_tree_cannot_take_is_deferred(
    tmp_path: Path,
) -> None:
    from gil_core.errors import ConfigurationError
    from gil_core.habits.review_log import ReviewKind
    from gil_core.reviews import ItemDecision, ReviewList, apply_decisions
    from gil_core.taskfile import load_task_file

    tree_file = tmp_path / "support.yaml"
    shutil.copy(ROOT / "ontologies" / "support.yaml", tree_file)
    (tmp_path / "support.v2.yaml").write_text("taken: by hand\n", encoding="utf-8")  # never overwritten
    task = load_task_file(write_task_file(tmp_path, "http://127.0.0.1:9/v1", tree=str(tree_file))).task
    store = TelemetryStore(tmp_path / "store")
    items = [{"id": "two-factor", "anchor": "security"}, {"id": "gone", "anchor": "billing"}, {"id": "shipping-cost"}]
    review = ReviewList(ReviewKind.DEACTIVATION, "support", items)
    with pytest.raises(ConfigurationError, match="'nope'"):
        apply_decisions(store, task, review, [ItemDecision("nope", Decision.ACCEPTED)])
    assert store.read("reviews").height == 0  # nothing written before the check

    decided = [
        ItemDecision("two-factor", Decision.ACCEPTED, "nobody uses it"),
        ItemDecision("gone", Decision.ACCEPTED),
        ItemDecision("shipping-cost", Decision.REJECTED),
    ]
    applied = apply_decisions(store, task, review, decided)
    assert applied.tree_file == tmp_path / "support.v3.yaml" and list(applied.refused) == ["gone"]
    assert not load_tree(applied.tree_file).has_option("two-factor")
    assert load_tree(applied.tree_file).has_option("shipping-cost") and load_tree(tree_file).has_option("two-factor")
    logged = ReviewLog(store).decisions("support", "deactivation")
    assert {item: entry.decision for item, entry in logged.items()} == {
        "two-factor": Decision.ACCEPTED,
        "gone": Decision.DEFERRED,
        "shipping-cost": Decision.REJECTED,
    }
    assert "no habit 'gone'" in (logged["gone"].note or "")


@pytest.mark.usefixtures("prefect_harness")
def test_a_round_that_retires_an_answer_memory_remembered_says_so_in_its_artifact(tmp_path: Path) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.review import CheckedDecisions, apply_decisions_task
    from gil_core.habits.review_log import ReviewKind
    from gil_core.reviews import ItemDecision, ReviewList

    tree_file = tmp_path / "support.yaml"
    shutil.copy(ROOT / "ontologies" / "support.yaml", tree_file)
    with support_server({"where is my refund?": Script(route=["billing", "refund status"])}) as server:
        task = write_task_file(tmp_path, server.base_url, tree=str(tree_file))
        result = runner.invoke(app, ["resolve", "where is my refund?", "-t", str(task), "--json"])
        assert result.exit_code == 0, result.stderr
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text(json.dumps({"trace_id": json.loads(result.stdout)["trace_id"], "correct": True}) + "\n")
    assert runner.invoke(app, ["feedback", str(verdicts), "-t", str(task)]).exit_code == 0

    review = ReviewList(ReviewKind.DEACTIVATION, "support", [{"id": "refund-status", "anchor": "billing"}])

    @flow
    async def retire() -> dict[str, Any]:
        checked = CheckedDecisions([ItemDecision("refund-status", Decision.ACCEPTED)])
        return await apply_decisions_task(str(task), review, checked)

    outcome = asyncio.run(retire())
    assert outcome["tree_file"] == str(tmp_path / "support.v2.yaml") and outcome["memory_stopped"] == 1
    with get_client(sync_client=True) as client:
        key = ArtifactFilterKey(any_=["support-deactivation-decisions"])
        (artifact,) = client.read_artifacts(artifact_filter=ArtifactFilter(key=key))
    assert "memory stops serving 1 remembered answer that stood for the answers it removes" in artifact.data


def test_the_form_explains_retirements_and_signals_with_their_counts_and_intervals() -> None:
    from flows.review import explain, wilson_interval
    from gil_core.habits.deactivation import ReliabilityCounts
    from gil_core.habits.review_log import ReviewKind
    from gil_core.reviews import ReviewList

    low, high = wilson_interval(3, 10)
    assert 0.10 < low < 0.3 < high < 0.61  # around the 30% observed, as Wilson's 95% interval is (10.8%, 60.3%)
    retire = ReviewList(
        ReviewKind.DEACTIVATION,
        "support",
        [{"id": "two-factor", "anchor": "security", "reason": "unreliable", "recency": 0.5, "score": 0.3}],
    )
    (item,) = explain(retire, {"two-factor": ReliabilityCounts(reinforced=1, penalized=4, explored=2, disputed=1)})
    assert item.why == "unreliable: reliability 0.30, recency 0.5"
    assert item.evidence == (
        "in its favour: 1 of 5 verdicts (20%, 95% interval 4%–62%); "
        "disputed in 1 of 2 cross-checks (50%, 95% interval 9%–91%)"
    )
    signals = ReviewList(
        ReviewKind.DIFFERENTIATION,
        "support",
        [
            {"id": "capacity-billing", "signal": "capacity", "node": "billing", "candidates": 8, "capacity": 9},
            {"id": "unserved-1", "signal": "unserved", "support": 3, "requests": ["a", "b", "c"], "sources": []},
        ],
    )
    capacity, unserved = explain(signals, {})
    assert capacity.evidence == "8 of 9 labels in use" and unserved.evidence == "3 unserved requests"
