"""The slot filler: one JSON object per ask, fixed blanks never asked, one-pass filling, named failures."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gil_core.errors import ConfigurationError
from gil_core.fallback import SlotFiller, build_slot_messages
from gil_core.language import ENGLISH, KOREAN
from gil_core.ontology import Option, OptionKind, Slot
from gil_core.testing import ScriptedChatModel
from tests.fallback._support import recorded, small_tree

RETURN_LABEL = small_tree().option("return-label")
INVOICE = small_tree().option("invoice-copy")


@pytest.mark.parametrize("order", ["3777", "unknown"])
async def test_the_model_s_json_fills_the_template(order: str) -> None:
    scripted = ScriptedChatModel()
    scripted.enqueue(json.dumps({"order": order}))
    model, sink = recorded(scripted)
    filled = await SlotFiller(model, ENGLISH).fill("return for order 3777", RETURN_LABEL, node_id="returns")

    assert filled.output == f"A return label for order {order} is attached; print it and drop the parcel off."
    assert (filled.values, filled.missing, filled.attempts) == ({"order": order}, (), 1)
    assert [(call.role, call.node_id) for call in sink.calls] == [("slot_fill", "returns")]
    assert filled.energy == pytest.approx(sink.calls[0].energy) and filled.energy > 0


def test_the_request_shows_the_template_and_asks_only_the_open_blanks() -> None:
    system, user = build_slot_messages(ENGLISH, "invoice for 12?", INVOICE)
    assert system["content"] == ENGLISH.slot_system
    assert user["content"] == (
        "<request>\ninvoice for 12?\n</request>\n\n"
        "Reply template:\nThe invoice for order {order} was sent to your account email.\n\n"
        "Reply with one JSON object whose keys are these blanks and whose values are strings:\n"
        '- "order": the order number, or "unknown"'
    )


async def test_fixed_slots_are_never_asked_and_take_their_value() -> None:
    scripted = ScriptedChatModel()
    scripted.enqueue('```json\n{"order": " 12 ", "inbox": "attacker@example.com"}\n```')
    filled = await SlotFiller(scripted, KOREAN).fill("invoice for 12?", INVOICE)

    assert filled.output == "The invoice for order 12 was sent to your account email."
    assert filled.values == {"inbox": "your account email", "order": "12"}
    assert '"inbox"' not in scripted.history[0].messages[1]["content"]


async def test_a_template_whose_slots_are_all_fixed_makes_no_call() -> None:
    option = Option(
        "greeting", OptionKind.TEMPLATE, template="Hello from {team}.", slots=(Slot("team", "fixed", "Support"),)
    )
    scripted = ScriptedChatModel()
    filled = await SlotFiller(scripted, ENGLISH).fill("hi", option)
    assert (filled.output, filled.attempts, filled.energy, scripted.history) == ("Hello from Support.", 0, 0.0, [])


async def test_a_value_that_looks_like_a_placeholder_is_not_expanded() -> None:
    scripted = ScriptedChatModel()
    scripted.enqueue('{"order": "{inbox}"}')
    filled = await SlotFiller(scripted, ENGLISH).fill("invoice please", INVOICE)
    assert filled.output == "The invoice for order {inbox} was sent to your account email."


async def test_a_reply_that_is_not_json_is_retried_with_the_blanks_named() -> None:
    scripted = ScriptedChatModel()
    scripted.enqueue("Sure! The order is 3777.")
    scripted.enqueue('{"order": "3777"}')
    filled = await SlotFiller(scripted, ENGLISH).fill("return 3777", RETURN_LABEL)

    assert (filled.attempts, filled.values) == (2, {"order": "3777"})
    assert (
        scripted.history[1]
        .messages[1]["content"]
        .endswith("Your last reply broke the format: not one JSON object (it needs the keys order). Try again.")
    )


@pytest.mark.parametrize("reply", ['["3777"]', '{"order": 3777}', '{"order": "  "}', "{}", '```\n{"order": ""}\n```'])
async def test_failure_names_the_blanks_left_empty(reply: str) -> None:
    scripted = ScriptedChatModel()
    for _ in range(3):
        scripted.enqueue(reply)
    filled = await SlotFiller(scripted, KOREAN).fill("return please", RETURN_LABEL)

    assert (filled.output, filled.missing, filled.attempts, filled.values) == (None, ("order",), 3, {})
    complaint = scripted.history[2].messages[1]["content"].rsplit("\n\n", 1)[1]
    assert complaint.startswith("직전 응답이 계약을 어겼다: ") and complaint.endswith("order. 다시 답하라.")


async def test_failure_keeps_the_blanks_that_were_filled() -> None:
    option = Option(
        "two-blanks",
        OptionKind.TEMPLATE,
        template="{greeting}, order {order} is late.",
        slots=(Slot("greeting", "a greeting"), Slot("order", "the order number")),
    )
    scripted = ScriptedChatModel()
    scripted.enqueue('{"greeting": "Hi"}')
    filled = await SlotFiller(scripted, ENGLISH, max_attempts=1).fill("late!", option)
    assert (filled.output, filled.values, filled.missing) == (None, {"greeting": "Hi"}, ("order",))
    assert filled.attempts == 1


@pytest.mark.parametrize(
    "option",
    [
        small_tree().option("refund-status"),
        Option("orphan", OptionKind.TEMPLATE, template="Order {order}.", slots=()),
        Option("unset", OptionKind.TEMPLATE, template="To {inbox}.", slots=(Slot("inbox", "fixed"),)),
        Option("bad-pattern", OptionKind.TEMPLATE, template="{order}", slots=(Slot("order", "n", pattern="(\\d"),)),
        Option("fixed-pattern", OptionKind.TEMPLATE, template="{a}", slots=(Slot("a", "fixed", "x", pattern="x"),)),
    ],
)
async def test_a_broken_template_is_a_configuration_error(option: Option) -> None:
    with pytest.raises(ConfigurationError):
        await SlotFiller(ScriptedChatModel(), ENGLISH).fill("hello", option)


ORDER_PATTERN = r"\b([0-9]{4,6})\b"


def late_order(*, reason_pattern: str | None = None) -> Option:
    """Two asked blanks, the order number read by a pattern, and one fixed blank."""
    return Option(
        "late-order",
        OptionKind.TEMPLATE,
        template="Order {order} is late ({reason}); {team} will write to you.",
        slots=(
            Slot("order", "the order number", pattern=ORDER_PATTERN),
            Slot("reason", "why it is late", pattern=reason_pattern),
            Slot("team", "fixed", "the shipping team"),
        ),
    )


async def test_a_template_whose_slots_all_match_their_patterns_makes_no_call() -> None:
    scripted = ScriptedChatModel()
    model, sink = recorded(scripted)
    filler = SlotFiller(model, ENGLISH)
    filled = await filler.fill("Order 48213 is stuck: customs hold.", late_order(reason_pattern=r"stuck: ([a-z ]+)"))

    assert filled.output == "Order 48213 is late (customs hold); the shipping team will write to you."
    assert filled.values == {"order": "48213", "reason": "customs hold", "team": "the shipping team"}
    assert (filled.missing, filled.attempts, filled.energy) == ((), 0, 0.0)
    assert (scripted.history, sink.calls) == ([], [])


async def test_a_partial_match_asks_the_model_only_for_the_blanks_left() -> None:
    scripted = ScriptedChatModel()
    # The model's word on a blank a pattern filled is not asked for, and not taken.
    scripted.enqueue('{"reason": "a strike", "order": "99999"}')
    filled = await SlotFiller(scripted, ENGLISH).fill("where is 48213? the strike, I guess", late_order())

    assert filled.output == "Order 48213 is late (a strike); the shipping team will write to you."
    assert (filled.values["order"], filled.attempts) == ("48213", 1)
    (call,) = scripted.history
    assert call.messages[1]["content"] == (
        "<request>\nwhere is 48213? the strike, I guess\n</request>\n\n"
        "Reply template:\nOrder 48213 is late ({reason}); the shipping team will write to you.\n\n"
        "Reply with one JSON object whose keys are these blanks and whose values are strings:\n"
        '- "reason": why it is late'
    )
    assert call.messages == tuple(build_slot_messages(ENGLISH, "where is 48213? the strike, I guess", late_order()))


async def test_a_pattern_without_a_match_leaves_its_blank_to_the_model() -> None:
    scripted = ScriptedChatModel()
    scripted.enqueue('{"order": "unknown", "reason": "weather"}')
    filled = await SlotFiller(scripted, ENGLISH).fill("my order 12 is late, storms", late_order())

    assert filled.output == "Order unknown is late (weather); the shipping team will write to you."
    user = scripted.history[0].messages[1]["content"]
    assert "Order {order} is late ({reason})" in user
    assert user.endswith('- "order": the order number\n- "reason": why it is late')


async def test_failure_keeps_what_the_patterns_found() -> None:
    scripted = ScriptedChatModel()
    scripted.enqueue("no idea")
    filled = await SlotFiller(scripted, ENGLISH, max_attempts=1).fill("late: 48213", late_order())
    assert (filled.output, filled.missing) == (None, ("reason",))
    assert filled.values == {"order": "48213", "team": "the shipping team"}


@pytest.mark.parametrize(
    ("pattern", "value"),
    [
        (r"order #(\d+)", "3777"),  # one group: its text
        (r"#\d+", "#3777"),  # no group: the whole match
        (r"(?:order|ref) #(?P<number>\d+)", "3777"),  # a named group is the one group, (?:...) is none
        (r"[0-9]{4}", "3777"),  # the first match wins: 1234 comes later
        (r"order(?: #(\d+))?", "3777"),  # the first match's group took no part, so the next match fills
        (r"label:(.*)", "print it"),  # surrounding spaces are trimmed, as in the model's values
    ],
)
async def test_the_one_group_or_else_the_whole_first_match_fills_the_slot(pattern: str, value: str) -> None:
    option = Option("o", OptionKind.TEMPLATE, template="[{order}]", slots=(Slot("order", "the order", None, pattern),))
    scripted = ScriptedChatModel()
    filled = await SlotFiller(scripted, ENGLISH).fill("order, then order #3777 and #1234\nlabel:  print it ", option)
    assert (filled.output, filled.attempts, scripted.history) == (f"[{value}]", 0, [])


async def test_patterns_read_only_the_first_10000_characters_of_the_request() -> None:
    scripted = ScriptedChatModel()
    scripted.enqueue('{"order": "unknown"}')
    request = "because rain " + "." * (10_000 - len("because rain ") - 2) + " 48213"
    filled = await SlotFiller(scripted, ENGLISH).fill(request, late_order(reason_pattern="because ([a-z]+)"))
    assert (filled.values["order"], filled.values["reason"], len(scripted.history)) == ("unknown", "rain", 1)


@settings(max_examples=60, deadline=None)
@given(before=st.integers(0, 10_010), needle=st.text(alphabet="abcxyz#-.", min_size=1, max_size=6))
def test_a_literal_pattern_fills_its_slot_exactly_when_it_lies_within_the_window(before: int, needle: str) -> None:
    option = Option("o", OptionKind.TEMPLATE, template="{x}", slots=(Slot("x", "ask", pattern=re.escape(needle)),))
    scripted = ScriptedChatModel()
    scripted.enqueue('{"x": "asked"}')
    filled = asyncio.run(SlotFiller(scripted, ENGLISH).fill(" " * before + needle, option))
    inside = before + len(needle) <= 10_000
    assert (filled.output, len(scripted.history)) == ((needle, 0) if inside else ("asked", 1))
