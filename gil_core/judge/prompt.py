"""The judge's request: candidates, their order, the labels they are shown as, and the two messages."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gil_core.language import PromptLanguage, fill
from gil_core.llm.ports import Message
from gil_core.ontology.labels import LabelScheme
from gil_core.ontology.model import Node, Option
from gil_core.telemetry.records import CandidateShown

__all__ = ["Candidate", "build_judge_messages", "label_candidates", "order_candidates"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """Something a judge may choose: a child node, a habit, or a shadow (a known answer not yet a habit)."""

    id: str
    label: str
    description: str
    answer: str | None = None
    is_shadow: bool = False

    @classmethod
    def of(cls, item: Node | Option) -> Candidate:
        answer = item.text if isinstance(item, Option) else None
        return cls(id=item.id, label=item.label, description=item.description, answer=answer)


def order_candidates(
    candidates: Sequence[Candidate], *, seed: str | None, node_id: str, request: str
) -> list[Candidate]:
    """The order to show candidates in. Without a seed, as given. With one, by the uppercase hex SHA-256 of
    ``seed␞node␞request␞sorted ids joined by ␟`` + ``␝`` + candidate id: stable for a request, shuffled across
    requests, which breaks a small model's habit of picking the first line."""
    if seed is None:
        return list(candidates)
    ids = "\x1f".join(sorted(candidate.id for candidate in candidates))
    prefix = f"{seed}\x1e{node_id}\x1e{request}\x1e{ids}\x1d"

    def key(candidate: Candidate) -> str:
        return hashlib.sha256((prefix + candidate.id).encode("utf-8")).hexdigest().upper()

    return sorted(candidates, key=key)


def label_candidates(
    candidates: Sequence[Candidate], scheme: LabelScheme, *, node_id: str | None = None
) -> tuple[CandidateShown, ...]:
    """ "None of these" takes the scheme's first symbol; the candidates take the following ones, in order."""
    # A node shows the same candidates to every request (unless shuffled): label them once. The traverser hands
    # over the same tuple for a node every time: found by identity first, without hashing every candidate.
    if not isinstance(candidates, tuple):
        return _labelled(tuple(candidates), scheme, node_id)
    key = (id(candidates), id(scheme), node_id)
    kept = _LABELLED.get(key)
    if kept is not None and kept[0] is candidates and kept[1] is scheme:
        return kept[2]
    shown = _labelled(candidates, scheme, node_id)
    _keep(_LABELLED, key, (candidates, scheme, shown))
    return shown


_KEPT = 4096
# (id of the candidates, id of the scheme, node) → the candidates and scheme (held: their ids name nothing else
# meanwhile) and their labels; (id of the language, id of the labels) → the language, the labels, the question.
_Labels = tuple[CandidateShown, ...]
_LABELLED: dict[tuple[int, int, str | None], tuple[tuple[Candidate, ...], LabelScheme, _Labels]] = {}
_QUESTIONS: dict[tuple[int, int], tuple[PromptLanguage, _Labels, str]] = {}


def _keep(kept: dict[Any, Any], key: Any, value: Any) -> None:
    if len(kept) >= _KEPT:  # trees or languages made again: forget the old ones
        kept.clear()
    kept[key] = value


@lru_cache(maxsize=4096)
def _labelled(
    candidates: tuple[Candidate, ...], scheme: LabelScheme, node_id: str | None
) -> tuple[CandidateShown, ...]:
    symbols = scheme.candidate_symbols(len(candidates), node=node_id)
    shown = [CandidateShown(id=None, shown_as=scheme.none_symbol)]
    shown += [
        CandidateShown(c.id, symbol, c.label, c.description, c.answer)
        for c, symbol in zip(candidates, symbols, strict=True)
    ]
    return tuple(shown)


def build_judge_messages(language: PromptLanguage, request: str, shown: Sequence[CandidateShown]) -> list[Message]:
    """System = the judge instruction; user = the framed request, a blank line, and the question with one
    line per shown label, "none of these" first."""
    return [
        {"role": "system", "content": language.judge_system},
        {"role": "user", "content": language.with_input(request) + _question_for(language, shown)},
    ]


def _question_for(language: PromptLanguage, shown: Sequence[CandidateShown]) -> str:
    """``_question``, found by the identity of the language and of the labels first (``label_candidates`` gives a
    node's labels as the same tuple every time): hashing a language hashes every piece of its wording."""
    if not isinstance(shown, tuple):
        return _question(language, tuple(shown))
    key = (id(language), id(shown))
    kept = _QUESTIONS.get(key)
    if kept is not None and kept[0] is language and kept[1] is shown:
        return kept[2]
    question = _question(language, shown)
    _keep(_QUESTIONS, key, (language, shown, question))
    return question


@lru_cache(maxsize=4096)
def _question(language: PromptLanguage, shown: tuple[CandidateShown, ...]) -> str:
    """The part of a judge's user message after the request (the same for every request shown ``shown``)."""
    lines = [
        fill(language.judge_none_choice, {"symbol": item.shown_as, "none": language.none_of_these})
        if item.id is None
        else fill(
            language.judge_choice,
            {"symbol": item.shown_as, "label": item.label, "description": item.description},
        )
        for item in shown
    ]
    return language.section_separator + fill(language.judge_question, {"choices": "\n".join(lines)})
