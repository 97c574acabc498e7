"""Review rounds through the CLI: a recurring confirmed answer is proposed, accepted, and lands in the tree file."""

from __future__ import annotations

import difflib
import json
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
    original = "# kept by hand\n" + (ROOT / "ontologies" / "support.yaml").read_text(encoding="utf-8")
    tree_file.write_text(original, encoding="utf-8")
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
    edits = list(difflib.ndiff(original.splitlines(), tree_file.read_text("utf-8").splitlines()))
    changed = [line for line in edits if line[:2] in ("+ ", "- ")]  # in place: the comment and every line kept
    assert changed[0] == f"+   - id: {item['id']}" and changed[-1] == "+     origin: promoted", changed
    assert all(line.startswith("+ ") for line in changed) and len(changed) == 5, changed

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


COMMENTED_TREE = """\
# Support tree, kept by hand: comments and key order must survive `gil review decide`.
id: root  # the root
children:
    # billing comes first on purpose
    -   description: charges and refunds  # description before id: a person's order
        id: billing
        options:
            -   id: refund-status  # retired below
                text: 'Refunds: within 5 days.'
            -   text: "Invoices are emailed.\\N Always."  # a NEL, double-quoted
                id: invoice-copy
    -   id: shipping
        options:
            # the one delivery answer
            -   id: delivery-time
                text: |
                    Two business days.
                    Usually.
"""


def _commented_task(tmp_path: Path) -> tuple[Path, Path]:
    tree_file = tmp_path / "support.yaml"
    tree_file.write_text(COMMENTED_TREE, encoding="utf-8")
    return tree_file, write_task_file(tmp_path, "http://127.0.0.1:9/v1", tree=str(tree_file))


def test_deciding_edits_the_tree_file_in_place_keeping_its_comments_and_key_order(tmp_path: Path) -> None:
    tree_file, task = _commented_task(tmp_path)
    result = runner.invoke(app, ["review", "decide", "deactivation", "refund-status", "accepted", "-t", str(task)])
    assert result.exit_code == 0, result.stderr
    expected = COMMENTED_TREE.replace(
        "            -   id: refund-status  # retired below\n                text: 'Refunds: within 5 days.'\n", ""
    )
    assert tree_file.read_text(encoding="utf-8") == expected  # every other line, comment and key order kept
    tree = load_tree(tree_file)
    assert not tree.has_option("refund-status")
    assert tree.option("invoice-copy").text == "Invoices are emailed.\x85 Always."


def test_accepting_a_retirement_says_how_many_remembered_answers_memory_stops_serving(tmp_path: Path) -> None:
    tree_file = tmp_path / "support.yaml"
    tree_file.write_text(COMMENTED_TREE, encoding="utf-8")
    with support_server({"where is my refund?": Script(route=["billing", "refund-status"])}) as server:
        task = write_task_file(tmp_path, server.base_url, tree=str(tree_file))
        result = runner.invoke(app, ["resolve", "where is my refund?", "-t", str(task), "--json"])
        assert result.exit_code == 0, result.stderr
    resolved = json.loads(result.stdout)
    assert resolved["output"] == "Refunds: within 5 days."
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text(json.dumps({"trace_id": resolved["trace_id"], "correct": True}) + "\n", encoding="utf-8")
    assert runner.invoke(app, ["feedback", str(verdicts), "-t", str(task)]).exit_code == 0
    decide = ["review", "decide", "deactivation", "invoice-copy", "accepted", "-t", str(task), "--json"]
    assert json.loads(runner.invoke(app, decide).stdout)["memory_stopped"] == 0  # no entry stood for it
    decide[3] = "refund-status"
    result = runner.invoke(app, decide[:-1])
    assert result.exit_code == 0, result.stderr
    assert "memory stops serving the entry that stood for the answer it removed" in result.stdout


def test_deciding_on_a_tree_file_turned_alias_bomb_is_refused_before_the_round_trip_reader(tmp_path: Path) -> None:
    """The tree file read when the task file was loaded is replaced by a billion-laughs file before the edit:
    the bounded loader refuses it (ruamel.yaml never reads it), naming file and line; nothing is recorded."""
    from gil_core.errors import TreeFileError
    from gil_core.habits.review_log import ReviewLog
    from gil_core.reviews import decide
    from gil_core.taskfile import load_task_file
    from gil_core.telemetry import TelemetryStore
    from tests.reliability.test_config_bombs import laughs

    tree_file, task = _commented_task(tmp_path)
    loaded = load_task_file(task)
    tree_file.write_text(laughs(9), encoding="utf-8")
    store = TelemetryStore(loaded.store)
    try:
        decide(store, loaded.task, "deactivation", "refund-status", "accepted")
    except TreeFileError as exc:
        assert "alias bomb" in str(exc) and f"{tree_file}:" in str(exc), exc
    else:
        raise AssertionError("an alias bomb was edited")
    assert tree_file.read_text(encoding="utf-8") == laughs(9)
    assert not ReviewLog(store).decisions(loaded.task.name)


def test_deciding_on_an_alias_bomb_tree_file_is_one_line_naming_file_and_line(tmp_path: Path) -> None:
    from tests.reliability.test_config_bombs import laughs

    tree_file = tmp_path / "bomb.yaml"
    tree_file.write_text(laughs(9), encoding="utf-8")
    task = write_task_file(tmp_path, "http://127.0.0.1:9/v1", tree=str(tree_file))
    result = runner.invoke(app, ["review", "decide", "deactivation", "o", "accepted", "-t", str(task)])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"{tree_file}:" in result.stderr and "alias bomb" in result.stderr, result.stderr
