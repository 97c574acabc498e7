"""Shadows: answers already confirmed at a node that are not habits yet.

They come from the log (fallback and partial traces whose answer was confirmed) and are shown beside a leaf's
habits, so the judge can say "this is that known answer" and generation is steered to it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import polars as pl

from gil_core import verdicts
from gil_core.judge.prompt import Candidate
from gil_core.ontology.model import OptionKind, Tree

__all__ = [
    "EVIDENCE_MODES",
    "Evidence",
    "build_shadow_index",
    "confirmed_answer",
    "item_id",
    "may_shadow",
    "may_shadow_rows",
    "short_label",
]

EVIDENCE_MODES = frozenset({"fallback", "partial"})
_LABEL_CODE_POINTS = 40


@dataclass(frozen=True, slots=True)
class Evidence:
    """One judged trace as review rounds and shadows read it; ``anchor`` is the last node its walk stood on."""

    state: str
    anchor: str
    mode: str
    output: str | None
    verdict: str | None
    correction: str | None = None
    explored_output: str | None = None


def may_shadow(mode: str, verdict: str | None) -> bool:
    """Whether a judged trace can make a shadow: a generated answer (``EVIDENCE_MODES``) confirmed either way, or
    any answer marked wrong (its correction)."""
    return mode in EVIDENCE_MODES or verdict == "wrong"


def may_shadow_rows() -> pl.Expr:
    """``may_shadow`` over a traces table, for a read to keep only the rows that can make a shadow (in a mature
    store, habit and memory answers confirmed right are nearly all of them, and none can)."""
    return pl.col("mode").is_in(sorted(EVIDENCE_MODES)) | (pl.col("feedback_verdict") == "wrong")


def confirmed_answer(evidence: Evidence) -> str | None:
    """The answer a verdict confirmed (``gil_core.verdicts``): the output when correct, the correction when wrong
    (if one was given)."""
    return verdicts.confirmed_answer(evidence.verdict, evidence.output, evidence.correction)


def item_id(prefix: str, anchor: str, text: str) -> str:
    """A stable id for an answer at an anchor: ``prefix-`` + the first 10 hex of SHA-1(anchor + newline + text)."""
    digest = hashlib.sha1((anchor + "\n" + text).encode("utf-8")).hexdigest()
    return f"{prefix}-{digest[:10]}"


def short_label(text: str) -> str:
    """The first 40 code points of an answer: what a judge prompt shows for it."""
    return text[:_LABEL_CODE_POINTS]


def build_shadow_index(
    tree: Tree, evidence: Iterable[Evidence], *, exclude: Sequence[str] = ()
) -> Mapping[str, list[Candidate]]:
    """Known answers per node, most supported first (ties: first confirmed first).

    Evidence counts at nodes that hold habits. A fallback or partial trace contributes the answer its verdict
    confirmed; a habit trace only a correction (its correct output is the habit itself). Texts the tree already
    answers with, and those in ``exclude`` (e.g. the "none of these" wording), are never shadows.
    """
    known = {option.text for option, _ in tree.options() if option.kind is OptionKind.ANSWER}
    known.update(exclude)
    support: dict[tuple[str, str], int] = {}
    first_request: dict[tuple[str, str], str] = {}
    for row in evidence:
        if not tree.has_node(row.anchor) or not tree.node(row.anchor).options:
            continue
        if not may_shadow(row.mode, row.verdict):
            continue
        answer = confirmed_answer(row)
        if answer is None or answer in known:
            continue
        key = (row.anchor, answer)
        support[key] = support.get(key, 0) + 1
        first_request.setdefault(key, row.state)
    index: dict[str, list[Candidate]] = {}
    for anchor, answer in sorted(support, key=lambda key: -support[key]):
        shadow = Candidate(
            id=item_id("shadow", anchor, answer),
            label=short_label(answer),
            description=first_request[(anchor, answer)],
            answer=answer,
            is_shadow=True,
        )
        index.setdefault(anchor, []).append(shadow)
    return index
