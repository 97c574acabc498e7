"""The voice-assistant benchmark stream (data/assistant_*.jsonl, ontologies/assistant.yaml): aligned, true to the
tree and to the package's labels, not dominated by one intent, and reproducible by scripts/make_assistant_data.py."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gil_core.ontology import Tree, lint_tree, load_tree
from gil_core.taskfile import load_task_file

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "make_assistant_data.py"
TREE = ROOT / "ontologies" / "assistant.yaml"
REQUESTS, ANSWERS = (ROOT / "data" / name for name in ("assistant_requests.jsonl", "assistant_answers.jsonl"))

Row = dict[str, Any]


@pytest.fixture(scope="module")
def pairs() -> list[tuple[Row, Row]]:
    """(request, answer) line by line."""
    requests, answers = (
        [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines()] for p in (REQUESTS, ANSWERS)
    )
    assert len(requests) == len(answers)
    return list(zip(requests, answers, strict=True))


@pytest.fixture(scope="module")
def generator() -> dict[str, Any]:
    """The generator's globals (its functions and constants), without running its main."""
    return runpy.run_path(str(SCRIPT), run_name="make_assistant_data")


def test_ids_align_and_count_up(pairs: list[tuple[Row, Row]]) -> None:
    expected = [f"a{number:04d}" for number in range(1, len(pairs) + 1)]
    assert [request["id"] for request, _ in pairs] == expected
    assert [answer["id"] for _, answer in pairs] == expected
    assert all(request["text"] and request["text"] == request["text"].strip() for request, _ in pairs)


def test_800_or_more_distinct_texts_each_with_one_intent(pairs: list[tuple[Row, Row]]) -> None:
    assert len({request["text"] for request, _ in pairs}) == len(pairs) >= 800
    assert len({answer["answer"] for _, answer in pairs}) >= 25


def test_no_intent_dominates(pairs: list[tuple[Row, Row]], generator: dict[str, Any]) -> None:
    per_intent = Counter(answer["answer"] for _, answer in pairs)
    assert max(per_intent.values()) <= generator["PER_INTENT"]
    assert max(per_intent.values()) <= 0.05 * len(pairs)


def test_each_answer_is_its_options_text_in_its_category(pairs: list[tuple[Row, Row]]) -> None:
    tree = load_tree(TREE)
    for _, answer in pairs:
        assert tree.option(answer["option_id"]).text == answer["answer"], answer
        assert tree.owner(answer["option_id"]).id == answer["category"], answer


def test_every_package_example_is_there_with_the_package_label(
    pairs: list[tuple[Row, Row]], generator: dict[str, Any]
) -> None:
    label_of = {request["text"]: answer["answer"] for request, answer in pairs}
    examples = generator["load_examples"]()
    assert len(examples) >= 600
    assert [label_of.get(example.text) for example in examples] == [example.intent for example in examples]


def test_two_levels_ten_categories_and_a_clean_lint() -> None:
    tree: Tree = load_tree(TREE)
    assert {layer for node, layer in tree.iter_nodes() if node.options} == {2}
    assert not tree.root.options and len(tree.root.children) == 10
    assert lint_tree(tree) == []
    task = load_task_file(ROOT / "ontologies" / "assistant-task.yaml")
    assert task.task.tree == tree
    assert (task.chat_model.kind, task.embedding_model.kind) == ("local", "local")


def test_a_rerun_writes_the_same_bytes(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], check=True, capture_output=True)
    assert (tmp_path / REQUESTS.name).read_bytes() == REQUESTS.read_bytes()
    assert (tmp_path / ANSWERS.name).read_bytes() == ANSWERS.read_bytes()


def test_a_thing_is_swapped_only_where_it_is_the_whole_noun_phrase(generator: dict[str, Any]) -> None:
    example, span, swap = generator["Example"], generator["_span"], generator["_swap"]
    assert span(example("open the gate now", "cover.open", {"cover": "gate"}), "cover") == (9, 13)
    assert span(example("open the main cover", "cover.open", {"cover": "main"}), "cover") is None
    assert span(example("lock the door behind me", "lock.lock", {"door": "door"}), "door") is None
    assert span(example("please lock the door", "lock.lock", {"door": "the door"}), "door") is None
    translate = example("translate hello into thai", "translate.phrase", {"phrase": "hello", "language": "thai"})
    assert swap(translate, ("phrase",), ("good night",)) == "translate good night into thai"
    setting = example("set my location to london", "settings.change", {"setting": "location", "value": "london"})
    assert swap(setting, ("setting", "value"), ("units", "metric")) == "set my units to metric"
