"""The slot filler: a template habit's blanks are read out of the request by the model, as one JSON object.

Fixed blanks are never asked, and neither is a blank whose slot's pattern matches the request: when every blank
is one of those, no call is made. The template is filled in one pass, so a value the model wrote (or a person
typed into the request) that looks like ``{name}`` stays text. When the blanks cannot be filled, the result names
them, so the caller can fall back to generation within the path above the habit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gil_core.errors import ConfigurationError
from gil_core.fallback._attempts import Asker, check_budget
from gil_core.fallback.contracts import Violation
from gil_core.language import PromptLanguage, fill, placeholders
from gil_core.llm.ports import ChatModel, Message
from gil_core.ontology.model import Option, OptionKind, Slot

__all__ = ["SlotFill", "SlotFiller", "build_slot_messages", "filled_without_model"]

# Small models wrap JSON in a Markdown fence however they are asked; that much is tolerated, nothing more.
_FENCE = re.compile(r"```(?:json)?[ \t]*\n?(.*?)\n?[ \t]*```", re.DOTALL | re.IGNORECASE)
# Patterns read at most the first 10,000 characters of the request. Tree authors are trusted (keeping a pattern
# fast is theirs to do), requests are not: however long a request is, the search over it stays bounded.
_PATTERN_WINDOW = 10_000


@dataclass(frozen=True, slots=True)
class SlotFill:
    """The filled template (None when some blank stayed empty), every slot's value known so far, the blanks
    still missing, the calls made and their priced energy."""

    output: str | None
    values: dict[str, str]
    missing: tuple[str, ...]
    attempts: int
    energy: float


def _template_slots(option: Option) -> tuple[str, tuple[Slot, ...]]:
    """The template and its slots, after checking every placeholder has a slot, every fixed slot a value and
    every pattern the shape that can fill a slot."""
    if option.kind is not OptionKind.TEMPLATE or option.template is None:
        raise ConfigurationError(f"option {option.id!r} is not a template")
    declared = {slot.name for slot in option.slots}
    undeclared = sorted(set(placeholders(option.template)) - declared)
    if undeclared:
        raise ConfigurationError(f"template {option.id!r} has blanks without a slot: {undeclared}")
    unset = [slot.name for slot in option.slots if slot.is_fixed and slot.fixed is None]
    if unset:
        raise ConfigurationError(f"template {option.id!r} has fixed slots without a value: {unset}")
    for slot in option.slots:
        if (problem := slot.pattern_problem()) is not None:
            raise ConfigurationError(f"template {option.id!r}, slot {slot.name!r}: {problem}")
    return option.template, option.slots


def _fixed_values(slots: Sequence[Slot]) -> dict[str, str]:
    return {slot.name: slot.fixed for slot in slots if slot.is_fixed and slot.fixed is not None}


def _matched_values(request: str, slots: Sequence[Slot]) -> dict[str, str]:
    """The value each pattern slot's first match in the request gives it: the one group's text, or the whole
    match. A match whose value is empty or blank is passed over, as an empty value from the model would be."""
    window = request[:_PATTERN_WINDOW]
    values: dict[str, str] = {}
    for slot in slots:
        if slot.pattern is None:
            continue
        compiled = re.compile(slot.pattern)
        for match in compiled.finditer(window):
            value = match.group(1 if compiled.groups else 0)
            if value is not None and value.strip():
                values[slot.name] = value.strip()
                break
    return values


def _known_values(request: str, slots: Sequence[Slot]) -> dict[str, str]:
    """The values no model is asked for: fixed ones, and those the patterns read out of the request."""
    return {**_fixed_values(slots), **_matched_values(request, slots)}


def filled_without_model(request: str, option: Option) -> str | None:
    """``option``'s template filled for ``request`` with what no model is asked for (its fixed blanks, and those its
    slots' patterns read out of the request), or None while a blank is left."""
    template, slots = _template_slots(option)
    known = _known_values(request, slots)
    if any(slot.name not in known for slot in slots):
        return None
    return fill(template, known)


def build_slot_messages(
    language: PromptLanguage, request: str, option: Option, *, complaint: str | None = None
) -> list[Message]:
    """System = the slot instruction; user = the framed request, the template (fixed and pattern-filled blanks
    already in), the blanks to fill with their instructions, and the complaint about the last reply when there is
    one."""
    template, slots = _template_slots(option)
    return _slot_messages(language, request, template, slots, _known_values(request, slots), complaint)


def _slot_messages(
    language: PromptLanguage,
    request: str,
    template: str,
    slots: Sequence[Slot],
    known: Mapping[str, str],
    complaint: str | None,
) -> list[Message]:
    asked = [slot for slot in slots if slot.name not in known]
    shown = fill(template, {**{slot.name: f"{{{slot.name}}}" for slot in asked}, **known})
    blanks = "\n".join(
        fill(language.list_item, {"item": fill(language.slot_blank, {"name": s.name, "instruction": s.instruction})})
        for s in asked
    )
    sections = [
        language.with_input(request),
        fill(language.slot_template, {"template": shown}),
        fill(language.slot_question, {"blanks": blanks}),
    ]
    if complaint is not None:
        sections.append(fill(language.complaint, {"complaint": complaint}))
    return [
        {"role": "system", "content": language.slot_system},
        {"role": "user", "content": language.section_separator.join(sections)},
    ]


def _read_object(output: str) -> dict[str, Any] | None:
    text = output.strip()
    fenced = _FENCE.fullmatch(text)
    if fenced is not None:
        text = fenced.group(1)
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _read_blanks(output: str | None, names: Sequence[str]) -> tuple[dict[str, str] | None, tuple[str, ...]]:
    """The non-empty string values of ``names`` in the reply (None when it is no JSON object), and the rest."""
    found = _read_object(output) if output is not None else None
    if found is None:
        return None, tuple(names)
    values = {name: value.strip() for name in names if isinstance(value := found.get(name), str) and value.strip()}
    return values, tuple(name for name in names if name not in values)


class SlotFiller:
    """Fills a template habit's blanks from the request: what the slots' patterns find is taken as found, and
    ``model`` is asked for the rest, up to ``max_attempts`` times."""

    def __init__(
        self,
        model: ChatModel,
        language: PromptLanguage,
        *,
        max_attempts: int = 3,
        max_tokens: int = 512,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        check_budget(max_attempts, max_tokens)
        self._language = language
        self._asker = Asker(model, "slot_fill", max_attempts, max_tokens, extra_body)

    async def fill(self, request: str, option: Option, *, node_id: str | None = None) -> SlotFill:
        """The template filled for ``request``; calls are recorded with role ``slot_fill`` and ``node_id``."""
        template, slots = _template_slots(option)
        known = _known_values(request, slots)
        names = [slot.name for slot in slots if slot.name not in known]
        if not names:
            return SlotFill(fill(template, known), known, (), 0, 0.0)
        language = self._language

        def check(output: str) -> dict[str, str] | Violation:
            values, missing = _read_blanks(output, names)
            listed = language.blank_separator.join(missing)
            if values is None:
                return Violation(fill(language.violation_not_json, {"names": listed}))
            if missing:
                return Violation(fill(language.violation_missing_blanks, {"names": listed}))
            return values

        def build(complaint: str | None) -> list[Message]:
            return _slot_messages(language, request, template, slots, known, complaint)

        result = await self._asker.ask(build, check, node_id=node_id)
        if result.value is not None:
            values = {**known, **result.value}
            return SlotFill(fill(template, values), values, (), result.attempts, result.energy)
        partial, missing = _read_blanks(result.last_output, names)
        return SlotFill(None, {**known, **(partial or {})}, missing, result.attempts, result.energy)
