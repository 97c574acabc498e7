"""The gil command through typer's runner, against the scripted server over real HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from gil_core.testing import ScriptedOpenAIServer
from tests.flows._support import write_task_file
from tests.resolver._support import ROOT, Script, support_server

REFUND = "Refunds reach the original payment method within 5 business days of approval."
runner = CliRunner()


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    scripts = {
        "where is my refund?": Script(route=["billing", "refund status"]),
        "do you sell gift cards?": Script(answers=["None of these"]),
    }
    with support_server(scripts, default=Script(answers=["None of these"])) as running:
        yield running


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    "command",
    [
        "resolve",
        "resolve-batch",
        "feedback",
        "stats",
        "lint-tree",
        "rebuild-memory",
        "fit-energy",
        "fit-reflex",
        "export-sqlite",
        "import-sqlite",
        "doctor",
        "demo",
        "serve",
        "ui",
        "review promote",
        "review deactivate",
        "review differentiate",
        "review decide",
        "review queue",
    ],
)
def test_every_command_has_help(command: str) -> None:
    code, out, _ = invoke(*command.split(), "--help")
    assert code == 0 and "Usage" in out and len(out.splitlines()) > 4


def test_resolve_prints_json_a_program_can_read(server: ScriptedOpenAIServer, tmp_path: Path) -> None:
    task = write_task_file(tmp_path, server.base_url)
    code, out, _ = invoke("resolve", "where is my refund?", "-t", str(task), "--json")
    assert code == 0
    result = json.loads(out)
    assert (result["mode"], result["output"], result["path"]) == ("habit/answer", REFUND, ["root", "billing"])


def test_resolve_refuses_an_empty_request_and_says_why_there_is_no_answer(tmp_path: Path) -> None:
    """An empty request is refused before any model is asked (as a batch refuses a ticket without text); a
    request that got no answer prints why, not "None"."""
    with support_server({"anything else?": Script(answers=["Outside this tree"])}) as server:
        task = write_task_file(tmp_path, server.base_url, fallback_max_attempts=1)
        code, _, stderr = invoke("resolve", "   ", "-t", str(task))
        assert code == 2 and "the request is empty" in stderr and not server.requests
        code, stdout, _ = invoke("resolve", "anything else?", "-t", str(task))
    said = " ".join(stdout.split())
    assert code == 0 and said.startswith("fallback: no answer (contract violated after 1 attempt: "), said


def test_a_batch_with_a_bad_line_reports_it_and_resolves_the_rest_then_feedback_and_stats(
    server: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    task = write_task_file(tmp_path, server.base_url)
    tickets = tmp_path / "tickets.jsonl"
    lines = [
        '{"id": "a", "text": "where is my refund?"}',
        "this is not json",
        '{"id": "b", "text": "do you sell gift cards?"}',
    ]
    tickets.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "results.jsonl"
    code, stdout, stderr = invoke("resolve-batch", str(tickets), "--out", str(out), "-t", str(task), "--json")
    assert code == 0, stderr
    assert f"{tickets}:2: not JSON" in stderr
    summary = json.loads(stdout)
    assert (summary["resolved"], summary["skipped"], summary["written"]) == (2, 0, 2)
    results = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(r["id"], r["mode"], r["option_id"]) for r in results] == [
        ("a", "habit/answer", "refund-status"),
        ("b", "fallback", None),
    ]
    assert set(results[0]) == {
        "id",
        "trace_id",
        "mode",
        "output",
        "option_id",
        "confidence",
        "energy",
        "path",
        "failure",
    }
    # A rerun resolves nothing new.
    code, stdout, _ = invoke("resolve-batch", str(tickets), "--out", str(out), "-t", str(task), "--json")
    assert (json.loads(stdout)["resolved"], json.loads(stdout)["skipped"]) == (0, 2)

    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text(
        json.dumps({"trace_id": results[0]["trace_id"], "correct": True})
        + "\n"
        + json.dumps({"trace_id": results[1]["trace_id"], "correct": False, "correction": "We do not sell them."})
        + "\n",
        encoding="utf-8",
    )
    code, stdout, _ = invoke("feedback", str(verdicts), "-t", str(task), "--json")
    assert code == 0 and json.loads(stdout)["applied"] == 2
    code, stdout, _ = invoke("feedback", str(verdicts), "-t", str(task), "--json")
    assert json.loads(stdout) == {
        "applied": 0,
        "unchanged": 2,
        "failed": [],
        "not_learned": 0,
        "not_tree_answers": 0,
        "bad_lines": [],
    }

    code, stdout, _ = invoke("stats", "-t", str(task), "--json")
    by_mode = {row["mode"]: row for row in json.loads(stdout)["modes"]}
    assert by_mode["habit/answer"]["correct"] == 1 and by_mode["fallback"]["judged"] == 1
    assert by_mode["habit/answer"]["high"] == 1.0 and 0.0 < by_mode["habit/answer"]["low"] < 1.0

    code, stdout, _ = invoke("resolve", "do you sell gift cards?", "-t", str(task), "--json")
    assert (json.loads(stdout)["mode"], json.loads(stdout)["output"]) == ("memory", "We do not sell them.")

    code, stdout, _ = invoke("rebuild-memory", "-t", str(task), "--json")
    assert json.loads(stdout) == {"entries": 2}

    code, stdout, stderr = invoke("fit-energy", "-t", str(task), "--json")  # the scripted server's timings
    fitted = json.loads(stdout)
    assert code == 0 and set(fitted) == {"fixed", "per_fresh_prompt_token", "per_cached_token", "per_output_token"}
    code, stdout, _ = invoke("fit-energy", "-t", str(task))  # as a person reads it: one line a coefficient
    assert code == 0 and "fitted to the server's timings" in stdout, stdout
    assert f"per output token: {fitted['per_output_token']:.4g}" in stdout.splitlines()[-1], stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["resolve", "x", "-t", "missing.yaml"], "missing.yaml"),
        (["lint-tree", "nowhere.yaml"], "nowhere.yaml"),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(args: list[str], words: str) -> None:
    code, _, stderr = invoke(*args)
    assert code == 2 and words in stderr and len(stderr.strip().splitlines()) == 1


def test_a_bad_task_file_key_names_file_line_and_key(server: ScriptedOpenAIServer, tmp_path: Path) -> None:
    task = write_task_file(tmp_path, server.base_url, colour="red")
    code, _, stderr = invoke("resolve", "x", "-t", str(task))
    assert code == 2 and f"{task}:" in stderr and "colour: unknown key" in stderr


def test_lint_tree_lists_nodes_and_warnings() -> None:
    code, out, _ = invoke("lint-tree", str(ROOT / "ontologies" / "support.yaml"), "--json")
    assert code == 0 and json.loads(out)["nodes"] == 8


def test_lint_tree_against_a_task_says_which_confirmed_answers_an_edit_changes(tmp_path: Path) -> None:
    delivery = "Standard delivery takes 3 to 5 business days."
    tickets, key = tmp_path / "tickets.csv", tmp_path / "key.csv"
    tickets.write_text("id,text\na,where is my refund?\nb,how long does delivery take?\n", encoding="utf-8")
    key.write_text(f"id,answer\na,{REFUND}\nb,{delivery}\n", encoding="utf-8")
    with support_server({}, default=Script(route=["billing", "refund status"])) as scripted:
        task = write_task_file(tmp_path, scripted.base_url)
        assert invoke("resolve-batch", str(tickets), "-o", str(tmp_path / "r.jsonl"), "-t", str(task))[0] == 0
        assert invoke("feedback", str(key), "--key", "-t", str(task))[0] == 0  # a right; b corrected to delivery
    support = ROOT / "ontologies" / "support.yaml"
    code, out, _ = invoke("lint-tree", str(support), "-t", str(task))
    assert code == 0 and "task 'support': this tree gives every answer its verdicts confirmed (2 remembered)" in out
    block = "  - id: delivery-time\n    label: delivery time\n    description: asks how many days delivery takes\n"
    text = support.read_text(encoding="utf-8")
    assert block in text and REFUND in text
    edited = tmp_path / "edited.yaml"
    edited.write_text(text.replace(block + f"    text: {delivery}\n", "").replace("5 business", "3 business"), "utf-8")
    code, out, _ = invoke("lint-tree", str(edited), "-t", str(task), "--json")
    assert code == 0 and json.loads(out)["task"] == {
        "name": "support",
        "remembered": 2,
        "changed": [
            {"option_id": "delivery-time", "removed": True, "remembered": 1, "confirmed": 1},
            {"option_id": "refund-status", "removed": False, "remembered": 1, "confirmed": 1},
        ],
    }
    out = invoke("lint-tree", str(edited), "-t", str(task))[1]
    assert "memory stops serving 2 of its 2 entries" in out
    assert "  delivery-time  removed: 1 remembered, 1 confirmed (the learned reflex no longer learns them)" in out
    assert "  refund-status  changed: 1 remembered, 1 confirmed (the learned reflex learns them as before)" in out


def test_export_then_import_sqlite_through_the_cli(tmp_path: Path) -> None:
    import sqlite3

    from gil_core.telemetry import TelemetryStore
    from gil_core.testing import write_compat_fixture

    store_path, _ = write_compat_fixture(tmp_path / "compat")
    out = tmp_path / "out.sqlite"
    code, stdout, stderr = invoke("export-sqlite", str(store_path), str(out), "--json")
    assert code == 0, stderr
    with sqlite3.connect(out) as connection:
        assert connection.execute("select count(*) from traces").fetchone()[0] == json.loads(stdout)["rows"]["traces"]
    code, said, stderr = invoke("import-sqlite", str(out), str(tmp_path / "copy"))  # as a person reads it
    assert code == 0, stderr
    assert f"{json.loads(stdout)['rows']['traces']:,} traces, " in " ".join(said.split()), said
    original, copy = TelemetryStore(store_path), TelemetryStore(tmp_path / "copy")
    assert all(original.read(table).equals(copy.read(table)) for table in original.tables())
    code, _, stderr = invoke("import-sqlite", str(tmp_path / "absent.sqlite"), str(tmp_path / "copy"))
    assert code == 2 and "no such file" in stderr


def test_doctor_finds_broken_files_moves_nothing_until_repair_then_quarantines_and_puts_back_what_casts(
    tmp_path: Path,
) -> None:
    """A file whose pages do not decode (only a whole decode finds it), a truncated one, and one whose energy
    column is Float32 (it casts to Float64 and back without loss): gil doctor lists all three and exits 1; with
    --repair the first two stay in quarantine and the third is back in its table, its row read as before."""
    import polars as pl

    from gil_core.telemetry import TelemetryStore
    from tests.telemetry._s3 import fill
    from tests.telemetry.test_quarantine import a_traces_file, broken

    task = write_task_file(tmp_path, "http://127.0.0.1:9/v1")
    root = tmp_path / "store"
    fill(TelemetryStore(root))
    before = TelemetryStore(root).read("traces")
    good = a_traces_file(root)
    names = {kind: f"0179600000000000000{index}-1-0badf11e000{index}.parquet" for index, kind in enumerate(
        ("pages that do not decode", "truncated", "float32")
    )}  # fmt: skip
    (root / "traces" / names["pages that do not decode"]).write_bytes(broken("pages that do not decode", good))
    (root / "traces" / names["truncated"]).write_bytes(broken("truncated", good))
    widened = pl.read_parquet(good)
    widened.with_columns(pl.col("energy").cast(pl.Float32)).write_parquet(root / "traces" / names["float32"])

    code, out, _ = invoke("doctor", "-t", str(task), "--json")
    found = json.loads(out)
    assert code == 1 and sorted(item["name"] for item in found["broken"]) == sorted(names.values())
    assert not any(item["moved"] for item in found["broken"]) and found["quarantined"] == []
    assert all((root / "traces" / name).exists() for name in names.values())  # nothing moved without --repair

    code, out, _ = invoke("doctor", "-t", str(task), "--repair", "--json")
    repaired = json.loads(out)
    assert code == 0 and all(item["moved"] for item in repaired["broken"])
    assert [item["name"] for item in repaired["restored"]] == [names["float32"]]
    assert sorted(item["name"] for item in repaired["quarantined"]) == sorted(
        [names["pages that do not decode"], names["truncated"]]
    )
    assert (root / "traces" / names["float32"]).exists()
    assert pl.read_parquet_schema(root / "traces" / names["float32"])["energy"] == pl.Float64
    assert TelemetryStore(root).read("traces").equals(before)  # the put-back row is the one t0 already had

    code, out, _ = invoke("doctor", "-t", str(task))
    assert code == 0 and "0 broken, 0 put back, 2 quarantined" in out and "rows unknown" in out
    code, out, _ = invoke("stats", "-t", str(task))
    assert code == 0 and "quarantined: 2 broken files" in out


def test_stats_plot_writes_the_savings_chart(tmp_path: Path) -> None:
    from gil_core.batch import Ticket, resolve_batch
    from gil_core.llm import OpenAICompatibleChatModel
    from gil_core.resolver import Resolver
    from gil_core.taskfile import load_task_file
    from gil_core.telemetry import TelemetryStore

    with support_server({}, default=Script(answers=["None of these"])) as server:
        path = write_task_file(tmp_path, server.base_url, memory_threshold=None)

        async def batch() -> None:
            async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
                resolver = Resolver(chat, TelemetryStore(tmp_path / "store"))
                await resolve_batch(resolver, load_task_file(path).task, [Ticket("t1", "gift cards?")])

        asyncio.run(batch())
    chart = tmp_path / "savings.png"
    result = runner.invoke(app, ["stats", "-t", str(path), "--plot", str(chart)])
    assert result.exit_code == 0, result.output
    assert "savings chart (1 batches) written to" in result.output
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serve_takes_the_waits_of_the_review_rounds_and_the_feedback_queue() -> None:
    result = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "--decision-timeout" in result.output and "--verdict-timeout" in result.output
    refused = runner.invoke(app, ["serve", "--decision-timeout", "5"], env={"COLUMNS": "200"})
    assert refused.exit_code == 2 and "decision-timeout" in refused.output  # under a minute: refused at once


def test_serve_s_batch_and_feedback_deployments_read_the_queue_files_by_the_columns_and_encoding_given(
    tmp_path: Path,
) -> None:
    from flows.batch import apply_feedback_flow, resolve_batch_flow
    from flows.deployments import build_deployments
    from gil_core.batch import TicketColumns, TicketFormat

    task = write_task_file(tmp_path, "http://127.0.0.1:9/v1")
    tickets, verdicts = tmp_path / "export.csv", tmp_path / "verdicts.csv"
    plain = {d.name: d.parameters for d in build_deployments(task, tickets, verdicts)}
    assert set(plain["resolve-batch"]) == {"task_file", "tickets", "out"}  # the flows' defaults otherwise
    assert set(plain["apply-feedback"]) == {"task_file", "verdicts"}
    form = TicketFormat(TicketColumns("Ticket ID", ("Subject", "Body")), "CP949", max_line_bytes=1 << 20)
    built = build_deployments(task, tickets, verdicts, form=form)
    given = {d.name: d.parameters for d in built}
    export = {"id_column": "Ticket ID", "text_columns": ["Subject", "Body"], "encoding": "cp949"}
    export["max_line_bytes"] = 1 << 20
    assert given["resolve-batch"] == {**plain["resolve-batch"], **export}
    assert given["apply-feedback"] == {**plain["apply-feedback"], "encoding": "cp949"}
    # Named as the flows name their parameters: a run refuses any other name (SignatureMismatchError).
    checked = resolve_batch_flow.validate_parameters(given["resolve-batch"])
    assert checked["text_columns"] == ["Subject", "Body"] and checked["max_line_bytes"] == 1 << 20
    assert apply_feedback_flow.validate_parameters(given["apply-feedback"])["encoding"] == "cp949"
    # The command refuses a bad one in one line, before it looks for a Prefect server.
    code, _, stderr = invoke("serve", "-t", str(task), "--encoding", "klingon", "--api-url", "http://127.0.0.1:9/api")
    assert code == 2 and "unknown text encoding 'klingon'" in stderr and "Prefect" not in stderr
    code, _, stderr = invoke("serve", "-t", str(task), "--text-column", "id", "--api-url", "http://127.0.0.1:9/api")
    assert code == 2 and "a ticket column is named twice" in stderr


def test_init_writes_a_task_file_and_a_tree_that_load_and_lint_and_writes_over_nothing_unless_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gil_core.taskfile import load_task_file

    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = invoke("init", "desk")
    assert code == 0, stderr
    assert "wrote desk/gil.yaml (task 'desk') and desk/tree.yaml" in " ".join(stdout.split())
    desk = tmp_path / "desk"
    loaded = load_task_file(desk / "gil.yaml")
    assert loaded.task.name == "desk" and loaded.task.policy.memory_guard
    assert loaded.task.policy.learned is not None and loaded.task.policy.learned.precision == 0.97
    assert (str(loaded.store), str(loaded.memory)) == (str(desk / ".gil" / "store"), str(desk / ".gil" / "memory"))
    assert invoke("lint-tree", "desk/tree.yaml")[0] == 0
    monkeypatch.chdir(desk)  # the task file is found where commands look by default
    code, stdout, stderr = invoke("stats", "--json")
    assert code == 0 and json.loads(stdout)["task"] == "desk", stderr
    (desk / "tree.yaml").write_text("id: root\n", encoding="utf-8")  # edited since
    code, _, stderr = invoke("init", str(desk))
    assert code == 2 and "already there; gil init writes over nothing unless --force" in " ".join(stderr.split())
    assert (desk / "tree.yaml").read_text(encoding="utf-8") == "id: root\n"
    code, _, stderr = invoke("init", str(desk), "--task", "yes: #1 desk", "--force")  # a name YAML would misread
    assert code == 0, stderr
    assert load_task_file(desk / "gil.yaml").task.name == "yes: #1 desk"
    assert (desk / "tree.yaml").read_text(encoding="utf-8").startswith("id: root\nchildren:")
    monkeypatch.setattr("flows._cli_init.STARTER_TREE", tmp_path / "not-installed.yaml")  # a wheel has no trees
    code, _, stderr = invoke("init", str(tmp_path / "elsewhere"))
    assert code == 2 and "no starter tree there" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "elsewhere").exists()


def test_without_a_task_file_a_command_says_how_to_give_one_and_names_the_demo_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newcomer's first `gil stats` after `gil demo`, in a folder with no gil.yaml: one line saying so, how to
    give a task file, and where the demo's is; the same when $GIL_TASK_FILE names a missing file."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GIL_TASK_FILE", raising=False)
    code, _, stderr = invoke("stats")
    said = " ".join(stderr.split())
    assert code == 2 and "gil.yaml: no task file there (the default)" in said, said
    assert "--task-file/-t or $GIL_TASK_FILE" in said and str(ROOT / "ontologies" / "support-task.yaml") in said
    assert said.endswith("or start one with gil init")
    assert "Traceback" not in stderr
    monkeypatch.setenv("GIL_TASK_FILE", "elsewhere.yaml")
    code, _, stderr = invoke("review", "queue")
    assert code == 2 and "elsewhere.yaml: no task file there ($GIL_TASK_FILE)" in " ".join(stderr.split())
    code, _, stderr = invoke("stats", "-t", "given.yaml")  # a path given on the command line: as before
    assert code == 2 and "given.yaml: cannot read the task file" in " ".join(stderr.split())
