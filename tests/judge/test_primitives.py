"""Judgment primitives: results that cannot be invalid, and choose / score / ask over a model or embeddings."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gil_core.errors import ConfigurationError
from gil_core.judge.primitives import (
    ChatPrimitives,
    Choice,
    EmbeddingChooser,
    InvalidJudgmentError,
    JudgmentPrimitives,
    PrimitiveSet,
    Score,
    YesNo,
)
from gil_core.llm import CallRecorder, OpenAICompatibleChatModel
from gil_core.telemetry import EnergyModel
from gil_core.testing import HashEmbeddingModel, ScriptedOpenAIServer
from tests.client._support import CountingEmbedder, ListSink


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as running:
        yield running


def logprobs(*pairs: tuple[str, float]) -> list[tuple[str, float | None]]:
    return [(token, math.log(p)) for token, p in pairs]


@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=2, max_size=12).filter(lambda xs: sum(xs) > 0))
def test_a_choice_of_any_distribution_is_valid_and_selects_the_modal_option(weights: list[float]) -> None:
    total = math.fsum(weights)
    probabilities = [weight / total for weight in weights]
    options = [f"option {index}" for index in range(len(weights))]
    choice = Choice.of(options, probabilities)
    assert choice.confidence == max(choice.probabilities)
    assert choice.selected == options[probabilities.index(max(probabilities))]  # ties: the first given
    assert abs(math.fsum(choice.distribution.values()) - 1) <= 1e-6


@pytest.mark.parametrize(
    ("options", "probabilities", "selected"),
    [
        (("only",), (1.0,), "only"),  # fewer than two options
        (("a", "a"), (0.5, 0.5), "a"),  # not unique
        (("a", " "), (0.5, 0.5), "a"),  # blank
        (("a", "b"), (1.0,), "a"),  # one probability per option
        (("a", "b"), (0.5, 0.4), "a"),  # does not sum to 1
        (("a", "b"), (1.5, -0.5), "a"),  # out of [0, 1]
        (("a", "b"), (0.3, 0.7), "a"),  # not the modal option
        (("a", "b"), (0.3, 0.7), "c"),  # not an option
    ],
)
def test_an_invalid_choice_cannot_be_built(
    options: tuple[str, ...], probabilities: tuple[float, ...], selected: str
) -> None:
    with pytest.raises(InvalidJudgmentError):
        Choice(options, probabilities, selected)


def test_a_choice_tolerates_rounding_of_one_in_a_million() -> None:
    assert Choice(("a", "b"), (0.5, 0.5000009), "b").selected == "b"


@pytest.mark.parametrize(
    ("value", "confidence"), [(math.nan, 0.5), (math.inf, 0.5), (-1, 0.5), (100.5, 0.5), (50, 1.5), (True, 0.5)]
)
def test_an_invalid_score_cannot_be_built(value: float, confidence: float) -> None:
    with pytest.raises(InvalidJudgmentError):
        Score(value, confidence)


@pytest.mark.parametrize(("yes", "confidence"), [("yes", 0.5), (True, -0.1), (False, math.nan)])
def test_an_invalid_verdict_cannot_be_built(yes: bool, confidence: float) -> None:
    with pytest.raises(InvalidJudgmentError):
        YesNo(yes, confidence)


async def test_choose_asks_one_label_without_a_none_line_and_folds_off_label_mass(
    server: ScriptedOpenAIServer,
) -> None:
    server.enqueue("C", top_logprobs=logprobs(("C", 0.7), ("B", 0.2), ("Sure", 0.1)))
    sink = ListSink()
    async with OpenAICompatibleChatModel(server.base_url, "judge") as http:
        primitives = ChatPrimitives(CallRecorder(http, sink=sink, energy=EnergyModel.tokens()))
        choice = await primitives.choose("where is my parcel?", ["billing", "shipping"])

    body = server.requests[-1].body
    assert (body["max_tokens"], body["top_logprobs"]) == (1, 20)
    question = body["messages"][1]["content"]
    assert "B. billing\nC. shipping" in question and "A. " not in question and "None of these" not in question
    assert choice.selected == "shipping"
    assert choice.probabilities == pytest.approx((0.25, 0.75))  # 0.1 off-label mass spread evenly
    (record,) = sink.calls
    assert record.role == "judge" and record.distribution == pytest.approx({"billing": 0.25, "shipping": 0.75})


async def test_a_reply_with_no_valid_label_is_a_uniform_low_confidence_choice(server: ScriptedOpenAIServer) -> None:
    server.enqueue("Hello", top_logprobs=logprobs(("Hello", 0.9), ("Hi", 0.1)))
    async with OpenAICompatibleChatModel(server.base_url, "judge") as http:
        choice = await ChatPrimitives(http).choose("q", ["a", "b", "c", "d"])
    assert choice.probabilities == pytest.approx((0.25,) * 4) and choice.selected == "a"


async def test_too_many_options_for_one_prompt_are_refused() -> None:
    with pytest.raises(InvalidJudgmentError):
        await ChatPrimitives(OpenAICompatibleChatModel("http://127.0.0.1:9", "m")).choose(
            "q", [f"o{i}" for i in range(26)]
        )


async def test_score_is_the_expected_digit_with_confidence_from_its_spread(server: ScriptedOpenAIServer) -> None:
    server.enqueue("7", top_logprobs=logprobs(("7", 0.8), ("8", 0.2)))
    server.enqueue("0", top_logprobs=logprobs(("0", 0.5), ("9", 0.5)))
    async with OpenAICompatibleChatModel(server.base_url, "judge") as http:
        sure = await ChatPrimitives(http).score("the refund came in two days", "the customer is satisfied")
        torn = await ChatPrimitives(http).score("meh", "the customer is satisfied")

    assert sure.value == pytest.approx(80.0) and sure.confidence == pytest.approx(1 - 0.4 / 4.5)
    assert torn.value == pytest.approx(50.0) and torn.confidence == pytest.approx(0.0)
    assert "the customer is satisfied" in server.requests[0].body["messages"][1]["content"]


async def test_ask_reads_yes_and_no_in_any_case_with_the_winner_as_confidence(server: ScriptedOpenAIServer) -> None:
    server.enqueue("Yes", top_logprobs=logprobs(("Yes", 0.5), (" yes", 0.1), ("NO", 0.3), ("maybe", 0.1)))
    server.enqueue("no", top_logprobs=logprobs(("maybe", 1.0)))
    async with OpenAICompatibleChatModel(server.base_url, "judge") as http:
        verdict = await ChatPrimitives(http).ask("I was charged twice", "Is this about billing?")
        unsure = await ChatPrimitives(http).ask("hm", "Is this about billing?")
    assert verdict.yes and verdict.confidence == pytest.approx(0.65)
    assert unsure == YesNo(False, 0.5)  # a tie is "no"


async def test_the_embedding_chooser_prefers_the_most_similar_option_and_keeps_option_vectors() -> None:
    embedder = CountingEmbedder()
    chooser = EmbeddingChooser(embedder, descriptions={"shipping": "my parcel has not arrived, where is the parcel"})
    choice = await chooser.choose("where is my parcel? it has not arrived", ["billing", "shipping"])
    again = await chooser.choose("my parcel never arrived", ["billing", "shipping"])

    assert choice.selected == again.selected == "shipping" and choice.confidence > 0.9
    assert embedder.calls[1] == ["my parcel never arrived"]  # the options' vectors were kept


def test_the_embedding_chooser_needs_a_positive_temperature() -> None:
    with pytest.raises(ConfigurationError):
        EmbeddingChooser(HashEmbeddingModel(), temperature=0)


async def test_a_primitive_set_combines_judges(server: ScriptedOpenAIServer) -> None:
    server.enqueue("yes", top_logprobs=logprobs(("yes", 0.9)))
    async with OpenAICompatibleChatModel(server.base_url, "judge") as http:
        chat = ChatPrimitives(http)
        combined = PrimitiveSet(chooser=EmbeddingChooser(HashEmbeddingModel()), scorer=chat, asker=chat)
        assert isinstance(combined, JudgmentPrimitives) and isinstance(chat, JudgmentPrimitives)
        assert (await combined.ask("q", "ok?")).yes
        assert (await combined.choose("refund please", ["refund please", "zzz"])).selected == "refund please"
