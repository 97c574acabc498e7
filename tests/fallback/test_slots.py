"""The slot filler: one JSON object per ask, fixed blanks never asked, one-pass filling, named failures."""

from __future__ import annotations

import json

import pytest

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
    ],
)
async def test_a_broken_template_is_a_configuration_error(option: Option) -> None:
    with pytest.raises(ConfigurationError):
        await SlotFiller(ScriptedChatModel(), ENGLISH).fill("hello", option)
