"""Review rounds through the CLI: a recurring confirmed answer is proposed, accepted, and lands in the tree file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from gil_core.ontology import load_tree
from tests.flows._support import write_task_file
from tests.resolver._support import ROOT, Script, support_server

EXPRESS = "Express parcels arrive on the next business day."
runner = CliRunner()


def test_a_recurring_answer_is_proposed_then_accepted_into_the_tree_file(tmp_path: Path) -> None:
    tree_file = tmp_path / "support.yaml"
    shutil.copy(ROOT / "ontologies" / "support.yaml", tree_file)
    requests = ["express shipping?", "is there express delivery?", "can I get it faster?", "next day delivery?"]
    scripts = {text: Script(route=["shipping"], answers=[EXPRESS]) for text in requests}
    with support_server(scripts) as server:
        task = write_task_file(tmp_path, server.base_url, tree=str(tree_file), contract="text", memory_threshold=None)
        tickets = tmp_path / "tickets.jsonl"
        tickets.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(requests)))
        out = tmp_path / "r.jsonl"
        result = runner.invoke(app, ["resolve-batch", str(tickets), "--out", str(out), "-t", str(task)])
        assert result.exit_code == 0, result.stderr
    results = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert {r["mode"] for r in results} == {"partial"} and {r["output"] for r in results} == {EXPRESS}
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text("".join(json.dumps({"trace_id": r["trace_id"], "correct": True}) + "\n" for r in results))
    assert runner.invoke(app, ["feedback", str(verdicts), "-t", str(task)]).exit_code == 0

    result = runner.invoke(app, ["review", "promote", "-t", str(task), "--json"])
    assert result.exit_code == 0, result.stderr
    proposed = json.loads(result.stdout)
    (item,) = proposed["items"]
    assert (item["anchor"], item["text"], item["support"]) == ("shipping", EXPRESS, 4)
    assert Path(proposed["file"]).is_file()

    result = runner.invoke(app, ["review", "decide", "promotion", item["id"], "accepted", "-t", str(task), "--json"])
    assert result.exit_code == 0, result.stderr and json.loads(result.stdout)["tree_changed"]
    option = load_tree(tree_file).option(item["id"])
    assert option.text == EXPRESS and option.origin.value == "promoted"

    result = runner.invoke(app, ["review", "decide", "promotion", "nope", "sideways", "-t", str(task)])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1


def test_a_review_round_read_while_another_process_compacts_the_log_never_fails(tmp_path: Path) -> None:
    """Proposals are read from traces and calls; a compaction deleting those files mid-read makes the round
    read again (``TelemetryStore.rescanning``) and propose the same."""
    from gil_core.reviews import deactivation_review, promotion_review
    from gil_core.taskfile import load_task_file
    from gil_core.telemetry import TelemetryStore, TraceRecord, utc_now
    from tests._compacting import compacting

    requests = ["express shipping?", "is there express delivery?", "can I get it faster?", "next day delivery?"]
    scripts = {text: Script(route=["shipping"], answers=[EXPRESS]) for text in requests}
    with support_server(scripts) as server:
        task = write_task_file(tmp_path, server.base_url, contract="text", memory_threshold=None)
        tickets = tmp_path / "tickets.jsonl"
        tickets.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(requests)))
        out = tmp_path / "r.jsonl"
        assert runner.invoke(app, ["resolve-batch", str(tickets), "--out", str(out), "-t", str(task)]).exit_code == 0
    results = [json.loads(line) for line in out.read_text().splitlines()]
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text("".join(json.dumps({"trace_id": r["trace_id"], "correct": True}) + "\n" for r in results))
    assert runner.invoke(app, ["feedback", str(verdicts), "-t", str(task)]).exit_code == 0
    loaded = load_task_file(task)
    store = TelemetryStore(loaded.store)
    with compacting(Path(loaded.store), "traces", "calls") as merged:
        for index in range(40):  # another task's trace each time: a new file for the compactor to merge
            store.record_trace(TraceRecord(f"other-{index}", utc_now(), "other", "x", "none"))
            (item,) = promotion_review(store, loaded.task).items
            assert (item["anchor"], item["support"]) == ("shipping", 4)
            deactivation_review(store, loaded.task)
    assert sum(merged) > 0
