"""The fallback generator: its messages, the retry with the complaint, giving up, and widening."""

from __future__ import annotations

import pytest

from gil_core.errors import ConfigurationError, ModelUnavailableError
from gil_core.fallback import (
    FallbackGenerator,
    ScoreContract,
    TextContract,
    TreeAnswerContract,
    build_fallback_messages,
)
from gil_core.language import ENGLISH, KOREAN
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.testing import ScriptedChatModel, ScriptedOpenAIServer
from tests.fallback._support import recorded, small_tree


def test_messages_put_the_instructions_between_the_examples_and_the_contract() -> None:
    _, user = build_fallback_messages(
        ENGLISH, "it broke", TextContract(), path=["returns", "damage"], examples=["Sorry!"], instructions="1. Ask."
    )
    assert user["content"] == (
        "<request>\nit broke\n</request>\n\n"
        "Category: returns > damage (answer within it)\n\n"
        "Examples of good replies:\n- Sorry!\n\n"
        "Follow these steps:\n1. Ask.\n\n"
        "Reply in plain, natural sentences."
    )


async def test_a_violation_is_fed_back_on_the_retry() -> None:
    scripted = ScriptedChatModel()
    scripted.enqueue("  ")
    scripted.enqueue(" Your parcel is on its way. ")
    model, sink = recorded(scripted)
    generation = await FallbackGenerator(model, KOREAN).generate("where is it", TextContract(), node_id="shipping")

    assert (generation.output, generation.attempts, generation.complaint) == ("Your parcel is on its way.", 2, None)
    first, second = (call.messages[1]["content"] for call in scripted.history)
    assert not first.endswith("다시 답하라.")
    assert second == first + "\n\n직전 응답이 계약을 어겼다: 빈 응답. 다시 답하라."
    assert all(call.kwargs["max_tokens"] == 512 and call.kwargs["temperature"] == 0.0 for call in scripted.history)
    assert [(call.role, call.node_id) for call in sink.calls] == [("fallback", "shipping")] * 2
    assert generation.energy == pytest.approx(sum(call.energy for call in sink.calls)) and generation.energy > 0


async def test_it_gives_up_after_max_attempts_with_the_last_complaint() -> None:
    scripted = ScriptedChatModel()
    for reply in ("x", "9", "unused"):
        scripted.enqueue(reply)
    generator = FallbackGenerator(scripted, ENGLISH, max_attempts=2, max_tokens=8)
    generation = await generator.generate("rate us", ScoreContract(1, 5))

    assert (generation.output, generation.attempts) == (None, 2)
    assert generation.complaint == "9 is outside 1 to 5"
    assert (
        scripted.history[1]
        .messages[1]["content"]
        .endswith("Your last reply broke the format: not a whole number (got 'x'). Try again.")
    )
    assert len(scripted.history) == 2 and scripted.pending == 1


async def test_out_of_category_reruns_once_under_the_whole_tree_without_the_path() -> None:
    scripted = ScriptedChatModel()
    scripted.enqueue("Outside this category")
    scripted.enqueue("We accept cards and bank transfer.")
    model, sink = recorded(scripted)
    contract = TreeAnswerContract(small_tree()).narrowed("returns")
    generation = await FallbackGenerator(model, ENGLISH).generate(
        "can I pay by card", contract, path=["returns"], examples=["An example"], node_id="returns"
    )

    assert (generation.output, generation.attempts, generation.widened) == (
        "We accept cards and bank transfer.",
        2,
        True,
    )
    narrowed, widened = (call.messages[1]["content"] for call in scripted.history)
    assert "Category: returns" in narrowed and "Category:" not in widened
    assert "- An example" in widened and "- None of these" in widened and "Outside this category" not in widened
    assert len(sink.calls) == 2 and generation.energy == pytest.approx(sum(call.energy for call in sink.calls))


async def test_the_widened_rerun_gets_a_fresh_attempt_budget() -> None:
    scripted = ScriptedChatModel()
    for reply in ("bad", "Outside this category", "bad", "worse"):
        scripted.enqueue(reply)
    contract = TreeAnswerContract(small_tree()).narrowed("billing")
    generation = await FallbackGenerator(scripted, ENGLISH, max_attempts=2).generate("hello", contract)

    assert (generation.output, generation.attempts, generation.widened) == (None, 4, True)
    assert generation.complaint == "'worse' is not one of the choices"


async def test_none_of_these_under_the_full_tree_is_a_final_answer() -> None:
    scripted = ScriptedChatModel()
    scripted.enqueue("해당 없음")
    generation = await FallbackGenerator(scripted, KOREAN).generate("hello", TreeAnswerContract(small_tree()))
    assert (generation.output, generation.attempts, generation.widened) == ("해당 없음", 1, False)


async def test_a_model_failure_is_raised_not_counted_as_a_violation() -> None:
    scripted = ScriptedChatModel()
    scripted.enqueue_failure("503")
    with pytest.raises(ModelUnavailableError):
        await FallbackGenerator(scripted, ENGLISH).generate("hello", TextContract())


def test_the_attempt_budget_must_allow_one_reply() -> None:
    with pytest.raises(ConfigurationError):
        FallbackGenerator(ScriptedChatModel(), ENGLISH, max_attempts=0)


async def test_generation_over_http_sends_the_reference_settings() -> None:
    with ScriptedOpenAIServer() as server:
        server.enqueue("")
        server.enqueue("yes, it ships today")
        async with OpenAICompatibleChatModel(server.base_url, "small-model") as http_model:
            model, sink = recorded(http_model)
            generator = FallbackGenerator(model, ENGLISH, extra_body={"chat_template_kwargs": {"enable_thinking": 0}})
            generation = await generator.generate("does it ship today?", TextContract(max_length=40))

    assert (generation.output, generation.attempts) == ("yes, it ships today", 2)
    bodies = [request.body for request in server.requests]
    assert [(body["max_tokens"], body["temperature"]) for body in bodies] == [(512, 0.0)] * 2
    assert all(not body.get("logprobs") and body["chat_template_kwargs"] == {"enable_thinking": 0} for body in bodies)
    assert bodies[1]["messages"][1]["content"].endswith(
        "Your last reply broke the format: the reply was empty. Try again."
    )
    assert [call.model for call in sink.calls] == ["small-model"] * 2
    assert generation.energy == pytest.approx(sum(call.energy for call in sink.calls))
