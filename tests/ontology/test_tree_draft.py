"""A tree drafted from an export of answered requests (``gil_core.tree_draft``): options from the answers given
often enough, templates from answers that differ in their numbers only, categories from the export's column or by
meaning, every node within what its labels allow, and the draft a tree file that loads and lints."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from gil_core.batch import TicketColumns, TicketFormat
from gil_core.errors import ConfigurationError
from gil_core.fallback.slots import filled_without_model
from gil_core.ontology import dump_tree, parse_tree
from gil_core.ontology.labels import LabelScheme
from gil_core.ontology.model import Option, OptionKind
from gil_core.testing import HashEmbeddingModel
from gil_core.tree_draft import AnsweredRequest, DraftedTree, draft_tree, read_answered
from tests.learned._support import NONE, embedder

DATA = Path(__file__).resolve().parents[2] / "data"
CAPACITY = LabelScheme.LETTERS.capacity


def support_export() -> list[AnsweredRequest]:
    """The bundled support tickets with the answers and categories of their key, as a help desk would export them."""
    texts = {row["id"]: row["text"] for row in map(json.loads, (DATA / "support_tickets.jsonl").open())}
    key = [json.loads(line) for line in (DATA / "support_answers.jsonl").open()]
    return [AnsweredRequest(texts[row["id"]], row["answer"], row["category"]) for row in key]


def filled(request: str, option: Option) -> str | None:
    """The template ``option`` filled from ``request`` by its slots' patterns, as the resolver fills it."""
    return filled_without_model(request, option)


def drafted(rows: list[AnsweredRequest], **kwargs: object) -> DraftedTree:
    return asyncio.run(draft_tree(rows, embedder(), **kwargs))  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore::gil_core.ontology.TreeLintWarning")  # the draft's descriptions share words
def test_answers_given_often_enough_become_options_and_answers_differing_in_numbers_one_template() -> None:
    rows = [AnsweredRequest(row.text, row.answer) for row in support_export()]  # no category column
    draft = drafted(rows)
    tree = parse_tree(dump_tree(draft.tree), source="draft.yaml")  # a tree file that loads back the same
    assert dump_tree(tree) == dump_tree(draft.tree)
    options = [option for option, _ in tree.options()]
    assert len(options) == draft.options and draft.clustered and draft.silhouette is not None
    templates = [option for option in options if option.kind is OptionKind.TEMPLATE]
    assert len(templates) == draft.templates >= 3
    # Every answer the export gave is the text of an option, or what a template fills in from its request.
    served = Counter()
    for row in rows:
        if row.answer == NONE:
            continue
        fits = [o for o in options if o.text == row.answer or (o in templates and filled(row.text, o) == row.answer)]
        served[bool(fits)] += 1
        assert len(fits) <= 1, row
    shapes = Counter(re.sub(r"[0-9]+", "#", row.answer) for row in rows if row.answer != NONE)
    often = sum(count for count in shapes.values() if count >= 2)
    assert served[True] == draft.covered == often  # all the rows of every habit given twice, and no other
    assert draft.none == sum(1 for row in rows if row.answer == NONE) > 0
    assert not any(option.text == NONE for option in options)  # the tree says none of these by its first label
    assert draft.rows == len(rows) and draft.covered + draft.none + (len(rows) - draft.covered - draft.none) == len(
        rows
    )
    ids = [node.id for node, _ in tree.iter_nodes()] + [option.id for option in options]
    assert len(ids) == len(set(ids)) and all(re.fullmatch(r"[a-z0-9-]+", item) for item in ids)
    assert all(len(node.children) <= CAPACITY and len(node.options) <= CAPACITY for node, _ in tree.iter_nodes())


def test_the_export_s_categories_file_the_options_when_every_row_names_one() -> None:
    rows = support_export()
    draft = drafted(rows)
    assert not draft.clustered and draft.silhouette is None
    named = {row.category for row in rows if row.answer != NONE and row.category}
    # A category whose answers were all given once has no option and no node.
    kept = {node.label for node in draft.tree.root.children}
    assert kept <= named and len(kept) == draft.categories >= 3
    for node in draft.tree.root.children:
        for option in node.options:
            filed = Counter(
                row.category
                for row in rows
                if row.answer == option.text
                or (option.kind is OptionKind.TEMPLATE and filled(row.text, option) == row.answer)
            )
            assert filed.most_common(1)[0][0] == node.label
    one_blank = [rows[0].__class__(rows[0].text, rows[0].answer, " "), *rows[1:]]
    assert drafted(one_blank).clustered == (rows[0].answer != NONE)  # a blank category is none: grouped by meaning


def test_a_group_of_more_answers_than_a_node_labels_becomes_a_node_of_consecutive_parts() -> None:
    words = [f"{chr(97 + n % 26)}{chr(97 + n // 26)}" for n in range(60)]  # answers that differ in letters
    rows = [AnsweredRequest(f"question about {word}", f"Answer {word} here", "all") for word in words for _ in range(2)]
    draft = asyncio.run(draft_tree(rows, HashEmbeddingModel()))
    (node,) = draft.tree.root.children
    assert [len(part.options) for part in node.children] == [20, 20, 20]
    assert sorted(option.text for part in node.children for option in part.options) == sorted(
        {row.answer for row in rows}
    )
    parse_tree(dump_tree(draft.tree))  # loads: every node within its labels


def test_what_cannot_be_drafted_is_refused_with_what_to_do() -> None:
    once = [AnsweredRequest(f"request {word}", f"answer {word}") for word in ("one", "two", "three", "four", "five")]
    with pytest.raises(ConfigurationError, match="no answer is given 2 times or more among 5 rows"):
        asyncio.run(draft_tree(once, HashEmbeddingModel()))
    assert asyncio.run(draft_tree(once, HashEmbeddingModel(), min_count=1)).options == 5
    letters = [chr(97 + n) * 3 for n in range(26)] + ["zz" + chr(97 + n) for n in range(4)]
    many = [AnsweredRequest(f"request {w}", f"answer {w}", f"category {w}") for w in letters for _ in range(2)]
    with pytest.raises(ConfigurationError, match="under 30 categories; a node labels at most 25"):
        asyncio.run(draft_tree(many, HashEmbeddingModel()))
    with pytest.raises(ConfigurationError, match="min_count must be at least 1"):
        asyncio.run(draft_tree(once, HashEmbeddingModel(), min_count=0))


def test_answers_holding_braces_are_never_made_a_template() -> None:
    rows = [AnsweredRequest(f"status of job {n}", f'{{"job": {n}, "state": "done"}}') for n in (11, 12) for _ in "ab"]
    rows += [AnsweredRequest(f"where is order {n}", f"Order {n} is on its way.") for n in (1234, 5678)]
    draft = asyncio.run(draft_tree(rows, HashEmbeddingModel(), min_count=1))
    kinds = sorted((option.kind.value, option.text or option.template) for option, _ in draft.tree.options())
    assert kinds == [
        ("answer", '{"job": 11, "state": "done"}'),
        ("answer", '{"job": 12, "state": "done"}'),
        ("template", "Order {order} is on its way."),
    ]
    parse_tree(dump_tree(draft.tree))


def test_ids_of_answers_without_ascii_words_are_numbered_and_unique() -> None:
    rows = [AnsweredRequest("환불은 언제 되나요", "환불은 5영업일 안에 처리됩니다")] * 2 + [
        AnsweredRequest("비밀번호를 잊었어요", "비밀번호 찾기를 눌러 주세요")
    ] * 2
    draft = asyncio.run(draft_tree(rows, HashEmbeddingModel()))
    ids = sorted(option.id for option, _ in draft.tree.options())
    assert ids == ["answer-1", "answer-2"]
    assert {option.text for option, _ in draft.tree.options()} == {row.answer for row in rows}
    asked = (("배송은 얼마나 걸리나요", "배송은 사흘 걸립니다"), ("영수증을 보내 주세요", "영수증을 메일로 보냈습니다"))
    more = [AnsweredRequest(f"{question} {n}번", answer) for n in range(2) for question, answer in asked]
    none = [AnsweredRequest("날씨 어때요", "해당 없음")] * 2  # the Korean prompts' "none of these": no option
    grouped = asyncio.run(draft_tree(rows + more + none, HashEmbeddingModel()))
    assert grouped.none == 2 and all(option.text != "해당 없음" for option, _ in grouped.tree.options())
    labels = [node.label for node in grouped.tree.root.children]
    assert len(labels) >= 2 and all(labels) and len(set(labels)) == len(labels), labels  # named by a request


def test_an_export_is_read_by_its_own_column_names_and_its_bad_rows_named(tmp_path: Path) -> None:
    export = tmp_path / "export.csv"
    export.write_text(
        "ticket,subject,reply,team\n"
        't1,"Where is my refund?",Refunds take 5 days.,billing\n'
        "t2,,Refunds take 5 days.,billing\n"  # no request: a bad row
        "t3,Refund still missing,,billing\n"  # no answer: a bad row
        "t4,Refund not here yet,Refunds take 5 days.,\n",  # a blank category is none
        encoding="utf-8",
    )
    form = TicketFormat(TicketColumns("ticket", ("subject",)))
    rows, bad, more = read_answered(export, form, answer_column="reply", category_column="team")
    assert rows == [
        AnsweredRequest("Where is my refund?", "Refunds take 5 days.", "billing"),
        AnsweredRequest("Refund not here yet", "Refunds take 5 days.", None),
    ]
    assert [item.where for item in bad] == [f"{export}:3", f"{export}:4"] and not more
    assert '"subject"' in bad[0].reason and '"reply"' in bad[1].reason
