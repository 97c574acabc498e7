"""The reflex judge (embeddings) and the tiered judge that asks it before the LLM judge."""

from __future__ import annotations

import math

import pytest

from gil_core.errors import ConfigurationError
from gil_core.judge import Candidate, Judgment, SingleTokenJudge
from gil_core.judge.reflex import ReflexJudge, TieredJudge, TieredJudgment, candidate_text
from gil_core.language import ENGLISH
from gil_core.llm import CallRecorder, EmbeddingRecorder
from gil_core.ontology import LabelScheme
from gil_core.telemetry import EnergyModel
from gil_core.testing import HashEmbeddingModel, ScriptedChatModel
from tests.client._support import CountingEmbedder, ListSink

CANDIDATES = [
    Candidate("billing", "billing", "charges, invoices and refunds of a payment"),
    Candidate("shipping", "shipping", "where is my parcel, delivery is late"),
]
LETTERS = LabelScheme.LETTERS
PRICES = EnergyModel(fixed=1.0, per_fresh_prompt_token=1.0, per_cached_token=0.0, per_output_token=1.0)


def llm_judge(*replies: str, sink: ListSink | None = None) -> tuple[SingleTokenJudge, ScriptedChatModel]:
    model = ScriptedChatModel(name="judge-model")
    for reply in replies:
        model.enqueue(reply, top_logprobs=[(reply, math.log(0.95)), ("A", math.log(0.05))])
    return SingleTokenJudge(CallRecorder(model, sink=sink or ListSink(), energy=PRICES), ENGLISH), model


def test_a_candidate_is_compared_by_its_label_and_description() -> None:
    assert candidate_text(CANDIDATES[0]) == "billing — charges, invoices and refunds of a payment"
    assert candidate_text(Candidate("x", "just a label", "")) == "just a label"


async def test_the_reflex_picks_the_most_similar_candidate_and_records_its_embed_call() -> None:
    sink = ListSink()
    embedder = CountingEmbedder()
    judge = ReflexJudge(EmbeddingRecorder(embedder, sink=sink, energy=PRICES))

    judgment = await judge.judge("where is my parcel? delivery is late", "root", CANDIDATES, scheme=LabelScheme.LETTERS)

    assert judgment.choice == "shipping" and judgment.distribution.trusted
    assert judgment.distribution.label_mass == pytest.approx(1.0)
    assert [item.shown_as for item in judgment.shown] == ["A", "B", "C"]
    assert math.fsum([*judgment.distribution.probs.values(), judgment.distribution.none_prob]) == pytest.approx(1)
    (record,) = sink.calls
    assert (record.role, record.node_id, record.outcome) == ("embed", "root", "accept")
    assert record.distribution == judgment.distribution.probs and record.confidence == judgment.confidence
    assert [candidate.id for candidate in record.candidates] == [None, "billing", "shipping"]
    assert judgment.energy == record.energy > 0


async def test_none_wins_when_no_candidate_is_similar_enough() -> None:
    judge = ReflexJudge(HashEmbeddingModel(), none_similarity=0.5)
    judgment = await judge.judge("zzz qqq xxyy", "root", CANDIDATES, scheme=LabelScheme.DIGITS)
    assert judgment.distribution.none_selected and judgment.choice is None
    assert judgment.distribution.none_prob == judgment.confidence > 0.9


async def test_confirmed_examples_make_a_candidate_similar() -> None:
    request = "my kettle arrived broken"
    judge = ReflexJudge(HashEmbeddingModel(), examples={"billing": [request]})
    judgment = await judge.judge(request, "root", CANDIDATES, scheme=LabelScheme.LETTERS)
    assert judgment.choice == "billing" and judgment.confidence > 0.99


async def test_candidate_vectors_are_kept_so_a_node_seen_before_embeds_only_the_request() -> None:
    embedder = CountingEmbedder()
    judge = ReflexJudge(embedder)
    await judge.judge("first request", "root", CANDIDATES, scheme=LabelScheme.LETTERS)
    await judge.judge("second request", "root", CANDIDATES, scheme=LabelScheme.LETTERS)
    assert len(embedder.calls[0]) == 3 and embedder.calls[1] == ["second request"]


async def test_a_node_without_candidates_answers_none_without_a_call() -> None:
    embedder = CountingEmbedder()
    judgment = await ReflexJudge(embedder).judge("anything", "leaf", [], scheme=LabelScheme.LETTERS)
    assert judgment.choice is None and judgment.confidence == 1.0 and embedder.calls == []


@pytest.mark.parametrize("kwargs", [{"temperature": 0}, {"temperature": math.inf}, {"none_similarity": 1.5}])
def test_invalid_reflex_settings_are_configuration_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        ReflexJudge(HashEmbeddingModel(), **kwargs)  # type: ignore[arg-type]


async def test_a_confident_reflex_decides_and_the_llm_judge_is_not_asked() -> None:
    deliberate, model = llm_judge("B")
    tiered = TieredJudge(ReflexJudge(HashEmbeddingModel()), deliberate, threshold=0.6)
    judgment = await tiered.judge("where is my parcel? delivery is late", "root", CANDIDATES, scheme=LETTERS)
    assert isinstance(judgment, TieredJudgment) and isinstance(judgment, Judgment)
    assert (judgment.decided_by, judgment.choice, judgment.reflex) == ("reflex", "shipping", None)
    assert model.history == []


async def test_an_unsure_reflex_hands_over_to_the_llm_judge_once() -> None:
    judge_sink = ListSink()
    deliberate, model = llm_judge("B", sink=judge_sink)
    reflex = ReflexJudge(EmbeddingRecorder(HashEmbeddingModel(), sink=ListSink(), energy=PRICES))
    tiered = TieredJudge(reflex, deliberate, threshold=0.8)

    judgment = await tiered.judge("refund for my late parcel", "root", CANDIDATES, scheme=LabelScheme.LETTERS)

    assert (judgment.decided_by, judgment.choice) == ("deliberate", "billing")  # the LLM judge's label B
    assert len(model.history) == 1
    assert judgment.reflex is not None and judgment.reflex.choice == "shipping"
    (judge_call,) = judge_sink.calls
    assert judgment.reflex.energy > 0 and judge_call.energy > 0
    assert judgment.energy == pytest.approx(judgment.reflex.energy + judge_call.energy)  # both paid for


async def test_a_reflex_that_picks_none_defers_unless_told_not_to() -> None:
    deliberate, model = llm_judge("C", "C")
    reflex = ReflexJudge(HashEmbeddingModel(), none_similarity=0.9)
    deferring = await TieredJudge(reflex, deliberate, 0.5).judge("zzz", "root", CANDIDATES, scheme=LabelScheme.LETTERS)
    trusting = await TieredJudge(reflex, deliberate, 0.5, defer_none=False).judge(
        "zzz", "root", CANDIDATES, scheme=LabelScheme.LETTERS
    )
    assert (deferring.decided_by, deferring.choice) == ("deliberate", "shipping")
    assert (trusting.decided_by, trusting.choice) == ("reflex", None)
    assert len(model.history) == 1


async def test_a_failing_reflex_hands_over_to_the_llm_judge() -> None:
    deliberate, _ = llm_judge("C")
    tiered = TieredJudge(ReflexJudge(CountingEmbedder(fails=True)), deliberate, 0.5)
    judgment = await tiered.judge("parcel", "root", CANDIDATES, scheme=LabelScheme.LETTERS)
    assert (judgment.decided_by, judgment.reflex, judgment.choice) == ("deliberate", None, "shipping")


def test_a_tiered_threshold_is_in_the_unit_interval() -> None:
    with pytest.raises(ConfigurationError):
        TieredJudge(ReflexJudge(HashEmbeddingModel()), llm_judge()[0], 1.5)
