"""``gil init --from``: a tree drafted from a help desk's export, then taught the export's own answers by the two
commands ``gil init`` says to run next, run as it prints them."""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from gil_core.ontology import load_tree
from gil_core.ontology.model import OptionKind
from tests.learned._support import NONE, bad_model

DATA = Path(__file__).resolve().parents[2] / "data"
runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def write_export(path: Path, rows: int) -> None:
    """The first ``rows`` support tickets as a help desk's CSV export (its own column names), and two bad rows."""
    texts = {row["id"]: row["text"] for row in map(json.loads, (DATA / "support_tickets.jsonl").open())}
    key = [json.loads(line) for line in (DATA / "support_answers.jsonl").open()][:rows]
    with path.open("w", encoding="utf-8", newline="") as out:
        sheet = csv.writer(out)
        sheet.writerow(["ticket", "subject", "reply", "team"])
        sheet.writerows([row["id"], texts[row["id"]], row["answer"], row["category"]] for row in key)
        sheet.writerow(["x1", "", "We accept major credit cards, debit cards and bank transfer.", "billing"])
        sheet.writerow(["x2", "Where is my parcel?", "", "shipping"])


@pytest.mark.slow  # about 40 s: 150 tickets resolved with the embedded MiniLM
@pytest.mark.filterwarnings("ignore::gil_core.ontology.TreeLintWarning")  # the draft's descriptions share words
def test_a_tree_drafted_from_an_export_is_taught_its_answers_by_the_commands_init_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_export(tmp_path / "help desk export.csv", 150)  # a name with spaces: the commands printed quote it
    args = ["--id-column", "ticket", "--text-column", "subject", "--answer-column", "reply"]
    code, stdout, stderr = invoke("init", "desk", "--from", "help desk export.csv", *args)
    assert code == 0, stderr
    said, warned = " ".join(stdout.split()), " ".join(stderr.split())
    assert "drafted desk/tree.yaml from 150 answered requests of help desk export.csv" in said, said
    assert "skipped 2 rows without an id, a request and an answer; the first: help desk export.csv:152" in warned
    tree = load_tree(tmp_path / "desk" / "tree.yaml")
    options = [option for option, _ in tree.options()]
    assert any(option.kind is OptionKind.TEMPLATE for option in options)
    assert all(option.text != NONE for option in options)
    # What init says to run next, run as printed, against a model that judges nothing right: whatever the task
    # learns comes from the export's answers.
    resolve, feedback = (part.strip().rstrip(",") for part in said.split("teach the task the export's answers: ")[1]
                         .split(", and "))  # fmt: skip
    assert resolve.startswith("gil resolve-batch 'help desk export.csv'"), resolve
    assert feedback.startswith("gil feedback 'help desk export.csv' --key"), feedback
    with bad_model() as server:
        task_path = tmp_path / "desk" / "gil.yaml"
        task = yaml.safe_load(task_path.read_text(encoding="utf-8"))
        task["chat_model"] = {"url": server.base_url, "name": "scripted"}
        task_path.write_text(yaml.safe_dump(task, sort_keys=False), encoding="utf-8")
        code, _, stderr = invoke(*shlex.split(resolve)[1:], "--json")
        assert code == 0, stderr
        code, stdout, stderr = invoke(*shlex.split(feedback)[1:], "--json")
        assert code == 0, stderr
        graded = json.loads(stdout)
        code, stdout, stderr = invoke("fit-reflex", "-t", "desk/gil.yaml", "--json")
        assert code == 0, stderr
    nodes = {node["node"]: node for node in json.loads(stdout)["nodes"]}
    # Every verdict is a row of the root's model (a "none of these" one too), and each drafted category learns.
    assert nodes["root"]["rows"] == graded["applied"] == 150 and graded["not_tree_answers"] == 0
    assert {child.id for child in tree.root.children} <= set(nodes)


def test_init_from_an_export_refuses_what_it_cannot_draft_in_one_line(tmp_path: Path) -> None:
    export = tmp_path / "export.csv"
    export.write_text("id,text,answer\n1,hello,hi there\n2,hey,hello back\n", encoding="utf-8")
    code, _, stderr = invoke("init", str(tmp_path / "desk"), "--from", str(export))
    said = " ".join(stderr.split())
    assert code == 2 and "no answer is given 2 times or more among 2 rows" in said and "Traceback" not in said, said
    assert not (tmp_path / "desk").exists()
    code, _, stderr = invoke("init", str(tmp_path / "desk"), "--from", str(tmp_path / "missing.csv"))
    assert code == 2 and "missing.csv: no such file" in stderr
    code, _, stderr = invoke("init", str(tmp_path / "desk"), "--from", str(export), "--min-count", "0")
    assert code == 2 and "--min-count: at least 1, got 0" in stderr
    code, _, stderr = invoke("init", str(tmp_path / "desk"), "--from", str(export), "--answer-column", "reply")
    assert code == 2 and "no answered request read from it" in " ".join(stderr.split())
    code, _, stderr = invoke("init", str(tmp_path / "desk"), "--from", str(export), "--language", "fr")
    assert code == 2 and "--language: en or ko, got 'fr'" in stderr
    code, _, stderr = invoke(
        "init", str(tmp_path / "desk"), "--from", str(export), "--min-count", "1", "--language", "ko"
    )
    assert code == 0, stderr
    assert yaml.safe_load((tmp_path / "desk" / "gil.yaml").read_text(encoding="utf-8"))["language"] == "ko"
    assert {option.text for option, _ in load_tree(tmp_path / "desk" / "tree.yaml").options()} == {
        "hi there",
        "hello back",
    }


def test_a_draft_too_large_for_a_tree_file_is_refused_naming_the_file_it_would_have_been(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gil_core._config_yaml.MAX_CONFIG_BYTES", 1024 * 1024)  # 16 MiB as shipped: 1 here, faster
    export = tmp_path / "export.jsonl"
    long = "word " * 12_000  # 60 kB an answer: 20 of them make a tree past the 1 MiB
    with export.open("w", encoding="utf-8") as out:
        for n in range(40):
            answer = f"{chr(97 + n % 20)}{chr(97 + n % 20)} {long}"
            out.write(json.dumps({"id": n, "text": f"request {n % 20}", "answer": answer}) + "\n")
    code, _, stderr = invoke("init", str(tmp_path / "desk"), "--from", str(export))
    said = " ".join(stderr.split())
    assert code == 2 and f"{tmp_path / 'desk' / 'tree.yaml'}" in said and "larger than 1 MiB" in said, said[:300]
    assert "Traceback" not in said and not (tmp_path / "desk").exists()
