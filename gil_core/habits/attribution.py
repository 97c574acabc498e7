"""Habit attribution: which habits and categories a verdict credits, blames, or shows to have been missed."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gil_core.ontology.model import Option, OptionKind, Tree
from gil_core.traverse import Step

__all__ = ["AnswerIndex", "ReliabilityDelta", "attribute_verdict", "habit_for_text"]

_BLANK = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")  # a template's blank, as gil_core.language reads them
HABIT_MODES = frozenset({"habit/answer", "habit/template", "habit/procedure"})
GENERATED_MODES = frozenset({"fallback", "partial"})


@dataclass(frozen=True, slots=True)
class ReliabilityDelta:
    """Increments of one item's counters in ``habit_reliability``."""

    item_id: str
    reinforced: int = 0
    penalized: int = 0
    missed: int = 0
    explored: int = 0
    disputed: int = 0


def habit_for_text(tree: Tree, text: str | None) -> str | None:
    """The id of the answer habit whose text is exactly ``text`` (stripped), if the tree has one."""
    if text is None:
        return None
    wanted = text.strip()
    return next(
        (option.id for option, _ in tree.options() if option.kind is OptionKind.ANSWER and option.text == wanted),
        None,
    )


class AnswerIndex:
    """Which of a tree's options an answer text is: an answer habit by its exact text, a template habit when the
    text is that template with every blank filled (a fixed blank with its fixed value, the others with any
    non-empty text). Procedures have no text of their own, so no answer names one. Built once per tree."""

    def __init__(self, tree: Tree) -> None:
        self._texts: dict[str, str] = {}
        self._templates: list[tuple[re.Pattern[str], str]] = []
        for option, _ in tree.options():
            if option.kind is OptionKind.ANSWER and option.text:
                self._texts.setdefault(option.text.strip(), option.id)
            elif option.kind is OptionKind.TEMPLATE and option.template:
                self._templates.append((_template_pattern(option), option.id))

    def option_for(self, text: str | None) -> str | None:
        """The id of the option ``text`` (stripped) is, or None when it is none of the tree's."""
        if text is None or not text.strip():
            return None
        wanted = text.strip()
        found = self._texts.get(wanted)
        if found is not None:
            return found
        return next((option_id for pattern, option_id in self._templates if pattern.fullmatch(wanted)), None)


def _template_pattern(option: Option) -> re.Pattern[str]:
    fixed = {slot.name: slot.fixed for slot in option.slots if slot.is_fixed and slot.fixed is not None}
    template = (option.template or "").strip()
    parts, position = [], 0
    for match in _BLANK.finditer(template):
        parts.append(re.escape(template[position : match.start()]))
        name = match.group(1)
        parts.append(re.escape(fixed[name]) if name in fixed else r"(.+?)")
        position = match.end()
    parts.append(re.escape(template[position:]))
    return re.compile("".join(parts), re.DOTALL)


def attribute_verdict(
    tree: Tree,
    *,
    mode: str,
    steps: Sequence[Step],
    output: str | None,
    correct: bool,
    correction: str | None,
) -> list[ReliabilityDelta]:
    """What a verdict says about the tree.

    * A correct habit answer reinforces every step accepted on the way to it.
    * A wrong one penalises the first accepted step that leaves the path to where the correction lives in the
      tree, or the last accepted step when the correction lives nowhere in it (or on the path taken).
    * A correct generated answer that the tree already holds as a habit marks that habit missed: the walk
      should have reached it.
    """
    taken = [step.chosen for step in steps if step.outcome == "accept" and step.chosen is not None]
    if mode in HABIT_MODES and taken:
        if correct:
            return [ReliabilityDelta(item, reinforced=1) for item in taken]
        return [ReliabilityDelta(_diverging_step(tree, taken, correction), penalized=1)]
    if mode in GENERATED_MODES and correct:
        habit = habit_for_text(tree, output)
        if habit is not None:
            return [ReliabilityDelta(habit, missed=1)]
    return []


def _diverging_step(tree: Tree, taken: Sequence[str], correction: str | None) -> str:
    habit = habit_for_text(tree, correction)
    if habit is None:
        return taken[-1]
    owner = tree.owner(habit)
    expected = [node.id for node in tree.path_to(owner.id)[1:]] + [habit]
    for chosen, wanted in zip(taken, expected, strict=False):
        if chosen != wanted:
            return chosen
    return taken[-1]
