"""Reply contracts: what form a generated answer must take, said to the model and checked on its reply.

A contract is worded and checked in the task's language, so the complaint fed back on a retry reads like the
instruction it enforces. Validation never raises on a bad reply: the verdict is the answer or the complaint.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gil_core.errors import ConfigurationError
from gil_core.language import PromptLanguage, fill
from gil_core.ontology.model import Option, OptionKind, Tree

__all__ = [
    "Accepted",
    "ChoiceContract",
    "Contract",
    "ScoreContract",
    "TextContract",
    "TreeAnswerContract",
    "Verdict",
    "Violation",
]

# ASCII digits only: int() would also take "1_000" and Arabic-Indic digits, which no caller means by a score.
_INTEGER = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True, slots=True)
class Accepted:
    """The reply kept the contract; ``answer`` is it without surrounding white space."""

    answer: str


@dataclass(frozen=True, slots=True)
class Violation:
    """The reply broke the contract; ``complaint`` says how, in the task's language.

    ``unquoted`` is the same complaint with the reply's words replaced by their count, where ``complaint`` quotes
    them (None: it quotes nothing). A reply can echo its request, so what a do-not-record call keeps is this one;
    the model itself is still told what it said."""

    complaint: str
    unquoted: str | None = field(default=None, compare=False)

    @property
    def recordable(self) -> str:
        """The complaint without the reply's words: ``unquoted`` when there is one, else ``complaint``."""
        return self.unquoted if self.unquoted is not None else self.complaint


def _quoting(template: str, answer: str, **values: object) -> Violation:
    """A complaint that quotes the reply (``{value}`` in ``template``), with its unquoted twin."""
    unquoted = f"({len(answer)} characters, not quoted)"
    return Violation(fill(template, {**values, "value": answer}), fill(template, {**values, "value": unquoted}))


Verdict = Accepted | Violation


@runtime_checkable
class Contract(Protocol):
    """A form of reply: the instruction that asks for it, and the check of a reply against it."""

    def instruction(self, language: PromptLanguage) -> str:
        """The contract's section of the user message."""
        ...

    def validate(self, output: str, language: PromptLanguage) -> Verdict:
        """The stripped answer when ``output`` keeps the contract, else the complaint."""
        ...


def _empty(language: PromptLanguage) -> Violation:
    return Violation(language.violation_empty)


@dataclass(frozen=True, slots=True)
class TextContract:
    """Free text: anything non-empty, at most ``max_length`` code points when set."""

    max_length: int | None = None

    def __post_init__(self) -> None:
        if self.max_length is not None and self.max_length < 1:
            raise ConfigurationError(f"max_length must be at least 1, got {self.max_length}")

    def instruction(self, language: PromptLanguage) -> str:
        if self.max_length is None:
            return language.contract_text
        return fill(language.contract_text_max, {"max_length": self.max_length})

    def validate(self, output: str, language: PromptLanguage) -> Verdict:
        answer = output.strip()
        if not answer:
            return _empty(language)
        if self.max_length is not None and len(answer) > self.max_length:
            return Violation(fill(language.violation_too_long, {"length": len(answer), "max_length": self.max_length}))
        return Accepted(answer)


@dataclass(frozen=True, slots=True)
class ChoiceContract:
    """One of a fixed set of strings, copied exactly."""

    choices: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.choices:
            raise ConfigurationError("a choice contract needs at least one choice")
        # A choice with outer white space could never equal a stripped reply.
        if any(not choice or choice != choice.strip() for choice in self.choices):
            raise ConfigurationError(f"choices must be non-empty and stripped: {self.choices!r}")

    def instruction(self, language: PromptLanguage) -> str:
        return fill(language.contract_choice, {"choices": language.choice_separator.join(self.choices)})

    def validate(self, output: str, language: PromptLanguage) -> Verdict:
        return _one_of(output, self.choices, language)


def _one_of(output: str, allowed: tuple[str, ...], language: PromptLanguage) -> Verdict:
    answer = output.strip()
    if not answer:
        return _empty(language)
    if answer not in allowed:
        return _quoting(language.violation_not_a_choice, answer)
    return Accepted(answer)


@dataclass(frozen=True, slots=True)
class ScoreContract:
    """A whole number from ``low`` to ``high``, both included."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ConfigurationError(f"low must not exceed high ({self.low} > {self.high})")

    def instruction(self, language: PromptLanguage) -> str:
        return fill(language.contract_score, {"low": self.low, "high": self.high})

    def validate(self, output: str, language: PromptLanguage) -> Verdict:
        answer = output.strip()
        if not answer:
            return _empty(language)
        if _INTEGER.fullmatch(answer) is None:
            return _quoting(language.violation_not_integer, answer)
        if not self.low <= int(answer) <= self.high:
            return _quoting(language.violation_out_of_range, answer, low=self.low, high=self.high)
        return Accepted(answer)


@dataclass(frozen=True)
class TreeAnswerContract:
    """One of the tree's answer habits, copied exactly, or the escape.

    Narrowed to a node (``scope``), only the answers under that node are offered and the escape says "outside
    this category", which tells the generator to try again under the whole tree; the full contract's escape is
    "none of these", a final answer.
    """

    tree: Tree
    scope: str | None = None

    def __post_init__(self) -> None:
        if self.scope is not None and not self.tree.has_node(self.scope):
            raise ConfigurationError(f"cannot narrow the tree contract to unknown node {self.scope!r}")

    def narrowed(self, node_id: str) -> TreeAnswerContract:
        """The contract for answers under ``node_id`` only."""
        return TreeAnswerContract(self.tree, node_id)

    def widened(self) -> TreeAnswerContract:
        """The contract over the whole tree."""
        return TreeAnswerContract(self.tree)

    def answers(self) -> tuple[Option, ...]:
        """The answer habits offered, depth first in file order."""
        return tuple(option for option in self._options() if option.kind is OptionKind.ANSWER and option.text)

    def escape(self, language: PromptLanguage) -> str:
        return language.none_of_these if self.scope is None else language.out_of_category

    def is_escape(self, answer: str, language: PromptLanguage) -> bool:
        return answer.strip() == self.escape(language)

    def instruction(self, language: PromptLanguage) -> str:
        lines = [fill(language.list_item, {"item": self._line(option, language)}) for option in self.answers()]
        lines.append(fill(language.list_item, {"item": self.escape(language)}))
        return fill(language.contract_tree, {"choices": "\n".join(lines)})

    def validate(self, output: str, language: PromptLanguage) -> Verdict:
        allowed = (*(option.text for option in self.answers() if option.text), self.escape(language))
        return _one_of(output, allowed, language)

    def _options(self) -> Iterator[Option]:
        root = self.tree.root if self.scope is None else self.tree.node(self.scope)
        return (option for option, _ in Tree(root).options())

    @staticmethod
    def _line(option: Option, language: PromptLanguage) -> str:
        text = option.text or ""
        if not option.description:
            return text
        return text + fill(language.tree_choice_example, {"description": option.description})
