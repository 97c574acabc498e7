"""The single-token judge over real HTTP: what it sends, how it reads the reply, and what it records."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gil_core.errors import BadResponseError, LabelCapacityError
from gil_core.judge import Candidate, SingleTokenJudge, order_candidates
from gil_core.language import ENGLISH, KOREAN
from gil_core.llm import CallRecorder, OpenAICompatibleChatModel
from gil_core.ontology import LabelScheme
from gil_core.telemetry import EnergyModel
from gil_core.telemetry.records import CallRecord
from gil_core.testing import ScriptedOpenAIServer

CANDIDATES = [
    Candidate("billing", "billing", "charges and refunds"),
    Candidate("shipping", "shipping", "where a parcel is"),
]


class ListSink:
    """Keeps recorded calls in memory; the store-backed path is tested in tests/telemetry."""

    def __init__(self) -> None:
        self.calls: list[CallRecord] = []

    def record_calls(self, calls: Sequence[CallRecord]) -> None:
        self.calls.extend(calls)


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as running:
        yield running


async def test_a_judgment_sends_one_token_request_and_reads_the_logprobs(
    server: ScriptedOpenAIServer,
) -> None:
    server.enqueue("C", top_logprobs=[("C", math.log(0.9)), ("A", math.log(0.05)), ("B", math.log(0.05))])
    sink = ListSink()
    async with OpenAICompatibleChatModel(server.base_url, "judge-model") as model:
        recorder = CallRecorder(model, sink=sink, energy=EnergyModel(1.0, 0.5, 0.1, 2.0))
        judge = SingleTokenJudge(recorder, ENGLISH, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        judgment = await judge.judge("where is my parcel?", "root", CANDIDATES, scheme=LabelScheme.LETTERS, layer=1)

    body = server.requests[-1].body
    assert (body["max_tokens"], body["temperature"], body["logprobs"], body["top_logprobs"]) == (
        1,
        0.0,
        True,
        20,
    )
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["messages"][1]["content"].endswith(
        "A. None of these\nB. billing — charges and refunds\nC. shipping — where a parcel is\n"
        "Reply with one label only."
    )
    assert judgment.choice == "shipping" and math.isclose(judgment.confidence, 0.9)

    (call,) = sink.calls
    assert (call.role, call.node_id, call.layer, call.model) == ("judge", "root", 1, "judge-model")
    assert call.outcome == "accept" and call.distribution == judgment.distribution.probs
    assert [c.shown_as for c in call.candidates] == ["A", "B", "C"] and call.candidates[2].id == "shipping"
    assert call.first_token == "C" and call.top_logprobs[0] == ("C", math.log(0.9))
    expected = 1.0 + 0.5 * (call.prompt_tokens - call.cached_tokens) + 0.1 * call.cached_tokens + 2.0 * 1
    assert call.energy == judgment.energy == pytest.approx(expected)
    assert call.gpu_prompt_ms is not None and call.latency_ms > 0


async def test_a_reply_without_logprobs_is_a_typed_error_and_the_judge_records_nothing(
    server: ScriptedOpenAIServer,
) -> None:
    server.enqueue_failure("no_logprobs")
    sink = ListSink()
    async with OpenAICompatibleChatModel(server.base_url, "m") as model:
        judge = SingleTokenJudge(CallRecorder(model, sink=sink, energy=EnergyModel.tokens()), KOREAN)
        with pytest.raises(BadResponseError, match="logprobs"):
            await judge.judge("x", "root", CANDIDATES, scheme=LabelScheme.LETTERS)
    assert sink.calls == []


async def test_more_candidates_than_the_scheme_holds_is_refused_before_any_call(
    server: ScriptedOpenAIServer,
) -> None:
    many = [Candidate(f"c{i}", f"c{i}", "") for i in range(10)]
    async with OpenAICompatibleChatModel(server.base_url, "m") as model:
        judge = SingleTokenJudge(model, ENGLISH)
        with pytest.raises(LabelCapacityError, match="node 'root'"):
            await judge.judge("x", "root", many, scheme=LabelScheme.DIGITS)
    assert server.requests == []


async def test_digits_label_the_candidates_from_one(server: ScriptedOpenAIServer) -> None:
    server.enqueue("1", top_logprobs=[("1", 0.0)])
    async with OpenAICompatibleChatModel(server.base_url, "m") as model:
        judgment = await SingleTokenJudge(model, KOREAN).judge("x", "n", CANDIDATES, scheme=LabelScheme.DIGITS)
    assert [s.shown_as for s in judgment.shown] == ["0", "1", "2"] and judgment.choice == "billing"


_ids = st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=5), min_size=1, max_size=8, unique=True)


@given(_ids, st.randoms(use_true_random=False), st.text(max_size=10))
def test_the_order_seed_is_a_stable_shuffle(ids: list[str], rng: object, request: str) -> None:
    candidates = [Candidate(i, i, "") for i in ids]
    shuffled = list(candidates)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    first = order_candidates(candidates, seed="s1", node_id="root", request=request)
    assert order_candidates(shuffled, seed="s1", node_id="root", request=request) == first
    assert sorted(c.id for c in first) == sorted(ids)
    assert order_candidates(candidates, seed=None, node_id="root", request=request) == candidates


def test_the_order_seed_follows_the_documented_hash() -> None:
    import hashlib

    candidates = [Candidate(i, i, "") for i in ("b", "a", "c")]
    ordered = order_candidates(candidates, seed="7", node_id="n", request="hi")

    def key(cid: str) -> str:
        return hashlib.sha256(f"7\x1en\x1ehi\x1ea\x1fb\x1fc\x1d{cid}".encode()).hexdigest().upper()

    assert [c.id for c in ordered] == sorted(["a", "b", "c"], key=key)
    seeds = {
        tuple(c.id for c in order_candidates(candidates, seed=str(s), node_id="n", request="hi")) for s in range(30)
    }
    assert len(seeds) > 1
