"""A first tree drafted from an export of answered requests (a help desk's tickets with the replies they got), for
a person to edit: what ``gil init --from`` writes instead of the demo's tree.

**Options.** Answers that differ only in their numbers (``Order 1956 is on its way``, ``Order 32237 is on its
way``) are one template, each number a slot named by the word before it (``Order {order} is on its way``), taken
from the request by a pattern of the lengths seen where the request held the answer's number in most rows; an
answer holding a brace stays itself. Every other answer is itself. Each such habit the export gave at least
``min_count`` times becomes an option, so an answer key made from the same export grades the tree's answers
(``gil feedback --key``: a filled template is the answer it fills). A habit given fewer times is left out and
counted: it says too little to be one, and memory still learns it once a verdict confirms it. At most
``MAX_OPTIONS`` are kept, the most given first. A row answered "none", "none of these" or "해당 없음" (an answer
key's way of saying no answer of the tree fits) is no habit: the tree says it by its first label.

**Categories.** With a category column, each option goes to the category most of its rows name. Without one,
the options are grouped by what their requests mean: each option's requests are embedded (at most
``SAMPLE_PER_ANSWER`` of them) and averaged into one unit vector, and the vectors are clustered (scikit-learn's
agglomerative clustering, cosine distance, average linkage) into the number of groups, from 2 to 25, whose
silhouette is highest, a figure of the data rather than a chosen constant. A group holding more options than a
node may label (25, docs/tree-format.md) becomes a node of sub-groups of consecutive options in the order of a
dendrogram of its vectors (scipy), so similar answers stay together.

**Names.** A drafted category is named by its most distinctive words (each word's count in the group's requests
against how many groups use it: class-based TF-IDF), or, without one, by the start of the request nearest its
centre; its description gives those words and quotes that request. An option's label is the start of its answer,
and its description quotes the request nearest its own centre. Ids are made of those words, in ASCII, unique
across the tree. All of it is a draft: the categories found and their names are what a person checks first
(``DraftedTree.clustered`` says which way they were made).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from gil_core._record_files import BadInput
from gil_core._ticket_files import TicketColumns, TicketFormat
from gil_core.errors import ConfigurationError
from gil_core.language import ENGLISH, KOREAN, NONE_NAMES
from gil_core.llm.ports import EmbeddingModel
from gil_core.ontology.labels import LabelScheme
from gil_core.ontology.lint import content_words
from gil_core.ontology.model import Node, Option, OptionKind, Slot, Tree

__all__ = [
    "MAX_DRAFT_ROWS",
    "MAX_OPTIONS",
    "SAMPLE_PER_ANSWER",
    "AnsweredRequest",
    "DraftedTree",
    "draft_tree",
    "read_answered",
]

MAX_OPTIONS = 625
"""Answers kept as options at most: 25 groups of 25, what two layers of a tree may label."""
SAMPLE_PER_ANSWER = 64
"""Requests embedded per answer at most (the first ones), bounding the embedding work of a large export."""
_CAPACITY = LabelScheme.LETTERS.capacity
_LABEL_WORDS = 8
_ID_WORDS = 4
_ID_CHARS = 40
_QUOTE_CHARS = 120
_NAME_WORDS = 3
_NONE = frozenset({*NONE_NAMES, ENGLISH.none_of_these.casefold(), KOREAN.none_of_these.casefold()})
_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True, slots=True)
class AnsweredRequest:
    """One row of an export: a request, the answer it got, and the category the export files it under, if any."""

    text: str
    answer: str
    category: str | None = None


@dataclass(frozen=True)
class DraftedTree:
    """The drafted ``tree`` and what went into it: ``rows`` read; ``answers``, the distinct answers among them;
    ``options``, the habits kept (given at least ``min_count`` times), ``templates`` of them, and ``covered``, the
    rows whose answer is one; ``left_out``, the habits given too seldom (``rows - covered`` rows, with those past
    ``MAX_OPTIONS``); ``none``, the rows answered "none of these";
    ``categories``, the tree's top-level nodes; ``clustered``, whether they were found by clustering (else read
    from the export's category column) and ``silhouette``, the clustering's figure where it was."""

    tree: Tree
    rows: int
    answers: int
    options: int
    templates: int
    covered: int
    none: int
    left_out: int
    categories: int
    clustered: bool
    silhouette: float | None = None


async def draft_tree(
    rows: Sequence[AnsweredRequest], embedder: EmbeddingModel, *, min_count: int = 2, source: str | None = None
) -> DraftedTree:
    """A tree drafted from ``rows`` (module doc). Categories come from the rows' ``category`` when every row that
    gives a kept answer has one, else by clustering with ``embedder``. ``ConfigurationError`` when no answer is
    given ``min_count`` times, or the export names more categories than a node may label."""
    if min_count < 1:
        raise ConfigurationError(f"min_count must be at least 1, got {min_count}")
    given = Counter(row.answer.strip() for row in rows if row.answer.strip().casefold() not in _NONE)
    variants: dict[str, list[str]] = defaultdict(list)  # a habit's key (the answer, its numbers blanked): answers
    for answer in given:
        # An answer holding a brace stays itself: in a template, braces mark its blanks.
        variants[answer if "{" in answer or "}" in answer else _DIGITS.sub("\0", answer)].append(answer)
    habit_of = {answer: key for key, answers in variants.items() for answer in answers}
    counts = Counter({key: sum(given[answer] for answer in answers) for key, answers in variants.items()})
    kept = [key for key, count in counts.most_common() if count >= min_count][:MAX_OPTIONS]
    if not kept:
        raise ConfigurationError(
            f"no answer is given {min_count} times or more among {len(rows)} rows ({len(given)} distinct answers):"
            " nothing to draft options from (a lower --min-count, or an export with more rows)"
        )
    asked: dict[str, list[str]] = defaultdict(list)
    pairs: dict[str, list[tuple[str, str]]] = defaultdict(list)  # a template's (request, answer) rows
    filed: dict[str, Counter[str]] = defaultdict(Counter)
    wanted = set(kept)
    for row in rows:
        answer = row.answer.strip()
        key = habit_of.get(answer)
        if key in wanted:
            asked[key].append(_one_line(row.text))
            if len(variants[key]) > 1:
                pairs[key].append((row.text, answer))
            if row.category is not None and row.category.strip():
                filed[key][row.category.strip()] += 1
    sample = [text for answer in kept for text in asked[answer][:SAMPLE_PER_ANSWER]]
    vectors = await _embedded(embedder, sample)
    centres, nearest, at = {}, {}, 0
    for answer in kept:
        own = vectors[at : at + min(len(asked[answer]), SAMPLE_PER_ANSWER)]
        at += len(own)
        centres[answer] = _unit(own.mean(axis=0))
        nearest[answer] = asked[answer][int(np.argmax(own @ centres[answer]))]
    ids = _Ids()
    habits = {key: _habit(key, variants[key], pairs[key]) for key in kept}
    clustered = any(sum(filed[answer].values()) < len(asked[answer]) for answer in kept)
    silhouette: float | None = None
    if clustered:
        groups, silhouette = _clusters([centres[answer] for answer in kept])
        members = [[kept[i] for i in group] for group in groups]
        names: list[str | None] = [None] * len(members)
    else:
        by_category: dict[str, list[str]] = defaultdict(list)
        for answer in kept:
            by_category[filed[answer].most_common(1)[0][0]].append(answer)
        if len(by_category) > _CAPACITY:
            raise ConfigurationError(
                f"the export files its answers under {len(by_category)} categories; a node labels at most {_CAPACITY}"
                " (docs/tree-format.md): merge some, or draft without the category column (the answers are grouped"
                " by meaning then)"
            )
        members = list(by_category.values())
        names = list(by_category)
    words = _distinctive_words([[text for answer in group for text in asked[answer]] for group in members])
    children = tuple(
        _category(group, name, group_words, centres, nearest, habits, ids)
        for group, name, group_words in zip(members, names, words, strict=True)
    )
    root = (
        Node("root", options=children[0].options)
        if len(children) == 1 and not children[0].children
        else Node("root", children=children)
    )
    return DraftedTree(
        tree=Tree(root, source=source),
        rows=len(rows),
        answers=len(given),
        options=len(kept),
        templates=sum(1 for key in kept if len(variants[key]) > 1),
        covered=sum(len(asked[answer]) for answer in kept),
        none=sum(1 for row in rows if row.answer.strip().casefold() in _NONE),
        left_out=len(counts) - len(kept),
        categories=len(root.children) or 1,
        clustered=clustered,
        silhouette=silhouette,
    )


async def _embedded(embedder: EmbeddingModel, texts: list[str]) -> NDArray[np.float32]:
    """Unit vectors of ``texts``, one row each."""
    reply = await embedder.embed(texts)
    if len(reply.vectors) != len(texts):
        raise ConfigurationError(f"the embedder gave {len(reply.vectors)} vectors for {len(texts)} texts")
    vectors = np.asarray(reply.vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit: NDArray[np.float32] = vectors / np.maximum(norms, 1e-12)
    return unit


def _unit(vector: NDArray[np.float32]) -> NDArray[np.float32]:
    return vector / max(float(np.linalg.norm(vector)), 1e-12)


def _clusters(centres: list[NDArray[np.float32]]) -> tuple[list[list[int]], float | None]:
    """The options' indexes grouped by meaning, and the grouping's silhouette (None for fewer than 3 options,
    which stay one group)."""
    if len(centres) < 3:
        return [list(range(len(centres)))], None
    from sklearn.cluster import AgglomerativeClustering  # type: ignore[import-untyped]  # heavy: import when used
    from sklearn.metrics import silhouette_score  # type: ignore[import-untyped]

    points = np.vstack(centres)
    best: tuple[float, NDArray[np.int64]] | None = None
    for count in range(2, min(_CAPACITY, len(centres) - 1) + 1):
        labels = AgglomerativeClustering(n_clusters=count, metric="cosine", linkage="average").fit_predict(points)
        score = float(silhouette_score(points, labels, metric="cosine"))
        if best is None or score > best[0]:
            best = (score, labels)
    assert best is not None
    score, labels = best
    groups: dict[int, list[int]] = defaultdict(list)
    for index, label in enumerate(labels.tolist()):
        groups[label].append(index)
    # Largest group first, as a person reads a tree; ties by the first option (the most given answer) in each.
    return sorted(groups.values(), key=lambda group: (-len(group), group[0])), score


def _category(
    answers: list[str],
    name: str | None,
    words: list[str],
    centres: dict[str, NDArray[np.float32]],
    nearest: dict[str, str],
    habits: dict[str, Option],
    ids: _Ids,
) -> Node:
    """The node of one group: its options, or sub-nodes of consecutive options where they are more than a node may
    label."""
    centre = _unit(np.mean([centres[answer] for answer in answers], axis=0))
    example = nearest[max(answers, key=lambda answer: float(centres[answer] @ centre))]
    # Without a distinctive word (words of four letters or more: many Korean ones are shorter), the group's most
    # typical request names it.
    label = name if name is not None else ", ".join(words[:_NAME_WORDS]) or " ".join(example.split()[:_LABEL_WORDS])
    described = f"{', '.join(words)}: such as {_quoted(example)}" if words else f"such as {_quoted(example)}"
    node_id = ids.make(name if name is not None else " ".join(words[:_NAME_WORDS]), "category")
    if len(answers) <= _CAPACITY:
        options = tuple(_placed(habits[answer], nearest[answer], ids) for answer in answers)
        return Node(node_id, label=label, description=described, options=options)
    parts = _consecutive_parts([centres[answer] for answer in answers])
    children = tuple(
        Node(
            ids.make(f"{node_id} {number}", "category"),
            label=f"{label} ({number})",
            description=f"such as {_quoted(nearest[answers[part[0]]])}",
            options=tuple(_placed(habits[answers[i]], nearest[answers[i]], ids) for i in part),
        )
        for number, part in enumerate(parts, start=1)
    )
    return Node(node_id, label=label, description=described, children=children)


def _consecutive_parts(centres: list[NDArray[np.float32]]) -> list[list[int]]:
    """Indexes in a dendrogram's leaf order (similar ones adjacent), cut into the fewest near-equal runs of at most
    a node's capacity."""
    from scipy.cluster.hierarchy import leaves_list, linkage  # type: ignore[import-untyped]

    order = leaves_list(linkage(np.vstack(centres), method="average", metric="cosine")).tolist()
    count = math.ceil(len(order) / _CAPACITY)
    size = math.ceil(len(order) / count)
    return [order[start : start + size] for start in range(0, len(order), size)]


def _habit(key: str, answers: list[str], pairs: list[tuple[str, str]]) -> Option:
    """The option of one habit, without its id and description: the answer itself, or, for answers that differ
    only in their numbers, a template with a slot per number (module doc)."""
    if len(answers) == 1:
        return Option("-", text=answers[0])
    pieces = key.split("\0")
    names: list[str] = []
    for before in pieces[:-1]:
        words = re.findall(r"[A-Za-z]+", before)
        name = words[-1].lower() if words else "number"
        names.append(name if name not in names else f"{name}_{len(names) + 1}")
    numbers = [_DIGITS.findall(answer) for _, answer in pairs]
    slots = []
    for at, name in enumerate(names):
        seen = [found[at] for found in numbers]
        in_request = sum(1 for (request, _), number in zip(pairs, seen, strict=True) if number in request)
        lengths = [len(number) for number in seen]
        pattern = rf"\b([0-9]{{{min(lengths)},{max(lengths)}}})\b" if 2 * in_request > len(pairs) else None
        slots.append(Slot(name, f'the {name} number in the request, or "unknown"', pattern=pattern))
    template = "".join(piece + (f"{{{names[at]}}}" if at < len(names) else "") for at, piece in enumerate(pieces))
    return Option("-", kind=OptionKind.TEMPLATE, template=template, slots=tuple(slots))


def _placed(habit: Option, example: str, ids: _Ids) -> Option:
    """``habit`` with its id, label and description."""
    shown = habit.text if habit.text is not None else habit.template or ""
    words = shown.split()
    label = " ".join(words[:_LABEL_WORDS]) + (" …" if len(words) > _LABEL_WORDS else "")
    named = re.sub(r"\{[^}]*\}", " ", shown)
    return replace(habit, id=ids.make(named, "answer"), label=label, description=_quoted(example))


def _distinctive_words(groups: list[list[str]], top: int = 5) -> list[list[str]]:
    """Per group of texts, its ``top`` words by class-based TF-IDF: a word's share of the group's words (each
    text's ``content_words`` counted once) times the log of how few groups use it."""
    counts = [Counter(word for text in texts for word in content_words(text)) for texts in groups]
    used_by = Counter(word for count in counts for word in count)
    out = []
    for count in counts:
        total = sum(count.values()) or 1
        weight = {word: n / total * math.log(1 + len(groups) / used_by[word]) for word, n in count.items()}
        out.append(sorted(weight, key=lambda word: (-weight[word], word))[:top])
    return out


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _quoted(text: str) -> str:
    cut = text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 1].rstrip() + "…"
    return f"“{cut}”"


class _Ids:
    """Ids made of a text's words in ASCII (``refund-status``), unique across the tree (``-2``, ``-3`` after a
    repeat); a text with no ASCII word of letters gets ``<fallback>-<n>``."""

    def __init__(self) -> None:
        self._taken = {"root"}

    def make(self, text: str, fallback: str) -> str:
        ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
        words = re.findall(r"[a-z0-9]+", ascii_text)[:_ID_WORDS]
        base = "-".join(words)[:_ID_CHARS].strip("-") if any(word.isalpha() for word in words) else ""
        if base:
            candidate, number = base, 1
            while candidate in self._taken:
                number += 1
                candidate = f"{base}-{number}"
        else:
            number = 1
            while f"{fallback}-{number}" in self._taken:
                number += 1
            candidate = f"{fallback}-{number}"
        self._taken.add(candidate)
        return candidate


MAX_DRAFT_ROWS = 100_000
"""Rows of an export read for a draft at most (the first ones): more says little more about which answers recur."""


def read_answered(
    path: str | Path, form: TicketFormat, *, answer_column: str = "answer", category_column: str | None = None
) -> tuple[list[AnsweredRequest], list[BadInput], bool]:
    """The answered requests among the first ``MAX_DRAFT_ROWS`` rows of an export (JSONL, CSV or Parquet, read as
    ``form`` reads a ticket file: its id and text columns), each with its answer from ``answer_column`` and its
    category from ``category_column``; the rows that lack one of the first three (or are bad lines) as
    ``BadInput``; and whether rows past the cap were left unread. A blank category is no category."""
    path = Path(path)
    texts, bad, more = _column(path, form, form.columns)
    answers, bad_answers, _ = _column(path, form, TicketColumns(form.columns.id, (answer_column,)))
    categories: dict[str, str] = {}
    if category_column is not None:
        categories, _, _ = _column(path, form, TicketColumns(form.columns.id, (category_column,)))
    seen = {item.where for item in bad}
    bad += [item for item in bad_answers if item.where not in seen]
    rows = [
        AnsweredRequest(text, answers[ticket_id], categories.get(ticket_id))
        for ticket_id, text in texts.items()
        if ticket_id in answers
    ]
    return rows, bad, more


def _column(path: Path, form: TicketFormat, columns: TicketColumns) -> tuple[dict[str, str], list[BadInput], bool]:
    """Per ticket id among the first ``MAX_DRAFT_ROWS`` rows, what ``columns`` read as its text; the bad rows among
    them; and whether the file goes on past them."""
    values: dict[str, str] = {}
    bad: list[BadInput] = []
    for item in replace(form, columns=columns).read(path):
        if len(values) + len(bad) == MAX_DRAFT_ROWS:
            return values, bad, True
        if isinstance(item, BadInput):
            bad.append(item)
        else:
            values[item.id] = item.text
    return values, bad, False
