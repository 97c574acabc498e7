"""The judge's request: candidates, their order, the labels they are shown as, and the two messages."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

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
    # A node shows the same candidates to every request (unless shuffled): label them once.
    return _labelled(tuple(candidates), scheme, node_id)


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
        {"role": "user", "content": language.with_input(request) + _question(language, tuple(shown))},
    ]


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
