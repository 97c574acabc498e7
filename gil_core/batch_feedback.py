"""Verdicts applied in order, a batch at a time: a verdict the trace already carries is not applied twice, so a
rerun after a crash counts nothing twice, and an unknown trace is reported while the rest go on.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gil_core._ticket_files import BadInput, TicketColumns, Verdict
from gil_core.errors import ConfigurationError
from gil_core.fallback.slots import filled_without_model
from gil_core.habits.attribution import AnswerIndex
from gil_core.language import NONE_NAMES
from gil_core.learned.log import learnable_option
from gil_core.ontology import Option, OptionKind
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition

__all__ = [
    "NONE_NAMES",
    "VERDICT_CHUNK",
    "AnswerKey",
    "FeedbackReport",
    "apply_verdicts",
    "graded",
    "key_option",
    "option_graded",
]

VERDICT_CHUNK = 1_000  # verdicts stored in one append and taught to memory in one write


@dataclass
class FeedbackReport:
    applied: int = 0
    unchanged: int = 0
    failed: list[BadInput] = field(default_factory=list)
    not_learned: int = 0  # verdicts stored (applied or unchanged) that memory failed to learn: a rebuild replays them
    # Corrections on the task's traces (applied or unchanged), with the learned reflex on, that are none of its
    # tree's answers (a reply in a person's own words, say): memory keeps them; the learned reflex learns nothing.
    not_tree_answers: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "unchanged": self.unchanged,
            "failed": [str(item) for item in self.failed],
            "not_learned": self.not_learned,
            "not_tree_answers": self.not_tree_answers,
        }


def graded(trace_id: str, output: str | None, expected: str) -> Verdict:
    """The verdict an answer key gives a trace: right when its output is the expected answer (spaces around either
    aside), else wrong, with the expected answer as the correction."""
    if (output or "").strip() == expected.strip():
        return Verdict(trace_id, True)
    return Verdict(trace_id, False, expected.strip())


@dataclass(frozen=True, slots=True)
class AnswerKey:
    """How an answer key names each resolved ticket and its right answer: the ticket's id under ``id_column``, and
    the answer's text under ``answer_column``, or with ``option_column`` the tree answer it names there instead
    (``key_option``). A bad pair of names raises ``ConfigurationError`` when the key is read (``columns``)."""

    id_column: str = "id"
    answer_column: str = "answer"
    option_column: str | None = None

    @property
    def columns(self) -> TicketColumns:
        """The key file's columns as a ticket file's: the answer (or the option's name) read as the text."""
        return TicketColumns(self.id_column, (self.option_column or self.answer_column,))

    @property
    def by_option(self) -> bool:
        return self.option_column is not None


def key_option(task: TaskDefinition, value: str) -> tuple[bool, Option | None]:
    """The tree answer an answer key's option cell names: (found, the option, or None for "none of these"). An
    option is named by its id or its label, case and surrounding spaces aside."""
    wanted = value.strip().casefold()
    if wanted in (*NONE_NAMES, task.language.none_of_these.strip().casefold()):
        return True, None
    for option, _ in task.tree.options():
        if wanted in (option.id.casefold(), option.label.strip().casefold()):
            return True, option
    return False, None


def option_graded(
    task: TaskDefinition, trace_id: str, answered: str | None, output: str | None, request: str, expected: Option | None
) -> Verdict:
    """The verdict an answer key that names tree answers gives a trace: right when the trace's answer is the one
    named (``answered``: the result line's ``option_id``; "none of these" by its text), graded by which answer it
    is, not by the blanks a template filled in; else wrong, corrected to the named answer's text: an answer's own,
    a template's filled for ``request`` without a model (``filled_without_model``), "none of these". A procedure,
    or a template whose blanks the request does not fill, has no text to correct to: wrong without a correction."""
    none_text = task.language.none_of_these
    if expected is None:
        if (output or "").strip() == none_text:
            return Verdict(trace_id, True)
        return Verdict(trace_id, False, none_text)
    if answered == expected.id:
        return Verdict(trace_id, True)
    if expected.kind is OptionKind.ANSWER:
        return Verdict(trace_id, False, expected.text)
    if expected.kind is OptionKind.TEMPLATE:
        return Verdict(trace_id, False, filled_without_model(request, expected))
    return Verdict(trace_id, False)


async def apply_verdicts(
    resolver: Resolver, task: TaskDefinition, verdicts: Iterable[Verdict], *, chunk: int = VERDICT_CHUNK
) -> FeedbackReport:
    """Apply verdicts in order, ``chunk`` at a time (each chunk stored in one append and taught to memory in one
    write). A verdict the trace already carries is not applied twice (so a rerun after a crash counts nothing
    twice) but taught to memory again; an unknown trace is reported and the rest go on."""
    if chunk < 1:
        raise ConfigurationError(f"chunk must be at least 1, got {chunk}")
    report = FeedbackReport()
    outside = _outside_tree(task)
    stream = iter(verdicts)
    while part := list(itertools.islice(stream, chunk)):
        outcome = await resolver.feedback_many(task, part, skip_carried=True)
        unknown = {error.trace_id for error in outcome.unknown}
        report.not_tree_answers += sum(1 for v in part if v.trace_id not in unknown and outside(v))
        report.applied += outcome.stored
        report.unchanged += outcome.carried
        report.failed.extend(BadInput(f"trace {error.trace_id!r}", str(error)) for error in outcome.unknown)
        if not outcome.learned:  # stored, so applied; memory's failure was logged
            report.not_learned += outcome.stored + outcome.carried
    if report.applied:
        await resolver.refresh_learned(task)  # the touched nodes refit before the next batch
    return report


def _outside_tree(task: TaskDefinition) -> Callable[[Verdict], bool]:
    """Whether a verdict's correction is one the task's learned reflex cannot learn from (``learnable_option``, the
    rule its log reads verdicts by). Never, for a task without it."""
    if task.policy.learned is None:
        return lambda verdict: False
    answers = AnswerIndex(task.tree)
    escape = task.language.none_of_these

    def outside(verdict: Verdict) -> bool:
        correction = (verdict.correction or "").strip()
        return bool(correction) and not learnable_option(answers, correction, escape)[0]

    return outside
