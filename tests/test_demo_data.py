"""The bundled demo data (data/*.jsonl): aligned, true to the support tree, shaped as documented, reproducible."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gil_core.language import ENGLISH
from gil_core.ontology import OptionKind, Tree, TreeLintWarning, load_tree

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
SCRIPT = ROOT / "scripts" / "make_demo_data.py"
FILES = ("support_tickets.jsonl", "support_answers.jsonl")
ORDER_NUMBER = re.compile(r"(?<!\d)\d{4,5}(?!\d)")
# The ranges data/README.md states.
REPEAT_SHARE = (0.20, 0.30)
PARAPHRASE_SHARE = (0.30, 0.40)
OUT_OF_SCOPE_SHARE = (0.08, 0.12)
NO_HABIT_CATEGORIES = {"warranty", "root"}


def _rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def tree() -> Tree:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        return load_tree(ROOT / "ontologies" / "support.yaml")


@pytest.fixture(scope="module")
def tickets() -> list[dict[str, Any]]:
    return _rows("support_tickets.jsonl")


@pytest.fixture(scope="module")
def answers() -> list[dict[str, Any]]:
    return _rows("support_answers.jsonl")


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_demo_data", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def readme() -> str:
    return (DATA / "README.md").read_text(encoding="utf-8")


def test_ids_are_unique_and_aligned(tickets: list[dict[str, Any]], answers: list[dict[str, Any]]) -> None:
    ids = [row["id"] for row in tickets]
    assert ids == [row["id"] for row in answers]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"t\d{4}", i) for i in ids)
    assert all(set(row) == {"id", "text"} and row["text"].strip() for row in tickets)
    assert all(set(row) == {"id", "answer", "option_id", "category"} for row in answers)


def test_there_are_enough_tickets(tickets: list[dict[str, Any]]) -> None:
    assert len(tickets) >= 240


def test_every_answer_option_of_the_tree_is_covered(tree: Tree, answers: list[dict[str, Any]]) -> None:
    used = {row["option_id"] for row in answers} - {None}
    assert used == {option.id for option, _ in tree.options()}


def test_answers_are_the_tree_texts_and_filled_templates(
    tree: Tree, tickets: list[dict[str, Any]], answers: list[dict[str, Any]], readme: str
) -> None:
    procedure_answers = set()
    for ticket, row in zip(tickets, answers, strict=True):
        if row["option_id"] is None:
            assert row["answer"] == ENGLISH.none_of_these, row
            assert row["category"] in NO_HABIT_CATEGORIES, row
            continue
        option = tree.option(row["option_id"])
        assert row["category"] == tree.owner(option.id).id, row
        if option.kind is OptionKind.ANSWER:
            assert row["answer"] == option.text, row
        elif option.kind is OptionKind.TEMPLATE:
            orders = ORDER_NUMBER.findall(ticket["text"])
            assert len(orders) == 1, ticket  # every template ticket names exactly one order number
            values = {s.name: s.fixed if s.is_fixed else orders[0] for s in option.slots}
            assert row["answer"] == str(option.template).format(**values), row
        else:
            procedure_answers.add(row["answer"])
    assert len(procedure_answers) == 1  # one canonical reply for change-email ...
    assert procedure_answers.pop() in readme  # ... written down in data/README.md


def test_the_same_text_always_expects_the_same_answer(
    tickets: list[dict[str, Any]], answers: list[dict[str, Any]]
) -> None:
    expected: dict[str, dict[str, Any]] = {}
    for ticket, row in zip(tickets, answers, strict=True):
        assert expected.setdefault(ticket["text"], row) | {"id": row["id"]} == row


def test_no_habit_tickets_are_warranty_and_out_of_scope(tree: Tree, answers: list[dict[str, Any]]) -> None:
    assert tree.node("warranty").options == ()
    categories = Counter(row["category"] for row in answers if row["option_id"] is None)
    assert set(categories) == NO_HABIT_CATEGORIES
    low, high = OUT_OF_SCOPE_SHARE
    assert low <= categories["root"] / len(answers) <= high


def test_intents_are_zipf_like(answers: list[dict[str, Any]]) -> None:
    counts = sorted(Counter(row["option_id"] for row in answers if row["option_id"]).values(), reverse=True)
    assert counts[0] >= 5 * counts[-1]
    assert sum(counts[:3]) >= sum(counts) / 2


def test_repeat_and_paraphrase_shares(
    generator: ModuleType, tree: Tree, tickets: list[dict[str, Any]], answers: list[dict[str, Any]]
) -> None:
    built = generator.build(tree)
    assert [t.text for t in built] == [row["text"] for row in tickets]
    assert [t.answer for t in built] == [row["answer"] for row in answers]
    kinds: Counter[str] = Counter()
    texts: set[str] = set()
    case_answers: dict[str, str] = {}
    for t in built:  # the first ticket of a case is its original; exact copies are repeats
        kinds["repeat" if t.text in texts else "paraphrase" if t.case in case_answers else "original"] += 1
        assert case_answers.setdefault(t.case, t.answer) == t.answer
        texts.add(t.text)
    assert kinds["repeat"] == len(tickets) - len({row["text"] for row in tickets})
    for kind, (low, high) in (("repeat", REPEAT_SHARE), ("paraphrase", PARAPHRASE_SHARE)):
        assert low <= kinds[kind] / len(tickets) <= high, kinds


def test_readme_states_the_counts(
    generator: ModuleType, tree: Tree, answers: list[dict[str, Any]], readme: str
) -> None:
    stated = {m[1]: int(m[2]) for m in re.finditer(r"^\| `([\w-]+)` \|.*\| (\d+) \|$", readme, re.MULTILINE)}
    assert stated == Counter(row["option_id"] for row in answers if row["option_id"])
    stated_kinds = {m[1]: int(m[2]) for m in re.finditer(r"^\| (\w+) \| (\d+) \|", readme, re.MULTILINE)}
    kinds = Counter(generator.kinds(generator.build(tree)))
    assert {k: stated_kinds.get(k) for k in kinds} == kinds
    assert re.search(rf"\b{len(answers)} tickets\b", readme)


def test_the_generator_reproduces_the_files_byte_for_byte(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], check=True, capture_output=True, cwd=ROOT)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name
