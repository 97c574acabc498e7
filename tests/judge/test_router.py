"""The judgment router: memory, then reflex, then deliberate once when the reflex is unsure; what it serves is kept."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gil_core.errors import ConfigurationError, ModelUnavailableError
from gil_core.judge.primitives import ChatPrimitives, Choice, Score, YesNo
from gil_core.judge.router import (
    InProcessJudgmentMemory,
    JudgmentKey,
    JudgmentRouter,
    JudgmentScope,
    RouterThresholds,
)
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.testing import HashEmbeddingModel, ScriptedOpenAIServer

SCOPE = JudgmentScope("acme", "tree-v1")
THRESHOLDS = RouterThresholds(choose=0.8, score=0.7, ask=0.9)
OPTIONS = ("billing", "shipping")


class ScriptedPrimitives:
    """Answers with fixed confidences and counts its calls (or fails with ``ModelUnavailableError``)."""

    def __init__(self, confidence: float, *, fails: bool = False) -> None:
        self.confidence = confidence
        self.fails = fails
        self.calls: list[str] = []

    def _called(self, name: str) -> None:
        self.calls.append(name)
        if self.fails:
            raise ModelUnavailableError("reflex down", endpoint="test://reflex")

    async def choose(self, request: str, options: Sequence[str]) -> Choice:
        self._called("choose")
        rest = (1 - self.confidence) / (len(options) - 1)
        return Choice.of(options, [rest] * (len(options) - 1) + [self.confidence])

    async def score(self, request: str, criterion: str) -> Score:
        self._called("score")
        return Score(60.0, self.confidence)

    async def ask(self, request: str, question: str) -> YesNo:
        self._called("ask")
        return YesNo(True, self.confidence)


def router(reflex: ScriptedPrimitives, deliberate: ScriptedPrimitives, **kwargs: Any) -> JudgmentRouter:
    return JudgmentRouter(
        kwargs.pop("scope", SCOPE), reflex, deliberate, THRESHOLDS, kwargs.pop("memory", InProcessJudgmentMemory())
    )


async def test_a_confident_reflex_is_served_and_the_deliberate_judge_is_not_asked() -> None:
    reflex, deliberate = ScriptedPrimitives(0.85), ScriptedPrimitives(0.99)
    routed = await router(reflex, deliberate).choose("where is my parcel?", OPTIONS)
    assert (routed.route, routed.value.selected, routed.confidence) == ("reflex", "shipping", 0.85)
    assert deliberate.calls == [] and routed.reflex is None


async def test_a_reflex_below_threshold_deliberates_exactly_once_and_the_result_is_cached() -> None:
    reflex, deliberate = ScriptedPrimitives(0.6), ScriptedPrimitives(0.55)  # deliberate is no surer
    memory = InProcessJudgmentMemory()
    judgment_router = router(reflex, deliberate, memory=memory)

    first = await judgment_router.choose("where is my parcel?", OPTIONS)
    second = await judgment_router.choose("where is my parcel?", OPTIONS)

    assert (first.route, first.confidence) == ("deliberate", 0.55)  # served whatever its confidence
    assert first.reflex is not None and first.reflex.confidence == 0.6
    assert deliberate.calls == ["choose"] and reflex.calls == ["choose"]
    assert (second.route, second.value) == ("cache", first.value)
    key = JudgmentKey(SCOPE, "choose", "where is my parcel?", OPTIONS)
    assert await memory.lookup(key) == {
        "options": list(OPTIONS),
        "probabilities": list(first.value.probabilities),
        "selected": "shipping",
    }


async def test_a_reflex_exactly_at_the_threshold_is_served() -> None:
    reflex, deliberate = ScriptedPrimitives(0.9), ScriptedPrimitives(0.99)
    routed = await router(reflex, deliberate).ask("charged twice", "billing?")
    assert routed.route == "reflex" and deliberate.calls == []


@pytest.mark.parametrize("primitive", ["score", "ask"])
async def test_score_and_ask_route_by_their_own_thresholds(primitive: str) -> None:
    reflex, deliberate = ScriptedPrimitives(0.75), ScriptedPrimitives(0.95)
    judgment_router = router(reflex, deliberate)
    routed = await getattr(judgment_router, primitive)("request", "subject")
    assert routed.route == ("reflex" if primitive == "score" else "deliberate")  # 0.75 ≥ 0.7, < 0.9
    assert (await getattr(judgment_router, primitive)("request", "subject")).route == "cache"


async def test_a_stored_answer_failing_re_validation_is_forgotten_and_judged_again() -> None:
    memory = InProcessJudgmentMemory()
    key = JudgmentKey(SCOPE, "choose", "where is my parcel?", OPTIONS)
    await memory.store(key, {"options": list(OPTIONS), "probabilities": [0.9, 0.9], "selected": "billing"})
    reflex, deliberate = ScriptedPrimitives(0.85), ScriptedPrimitives(0.99)

    routed = await router(reflex, deliberate, memory=memory).choose("where is my parcel?", OPTIONS)

    assert routed.route == "reflex" and reflex.calls == ["choose"]
    replaced = await memory.lookup(key)
    assert replaced is not None and replaced["selected"] == "shipping"
    assert replaced["probabilities"] == pytest.approx([0.15, 0.85])


@pytest.mark.parametrize("payload", [{}, {"value": "high", "confidence": 0.9}, {"value": 150, "confidence": 0.9}])
async def test_damaged_scores_are_not_served(payload: Mapping[str, Any]) -> None:
    memory = InProcessJudgmentMemory()
    await memory.store(JudgmentKey(SCOPE, "score", "r", ("c",)), payload)
    routed = await router(ScriptedPrimitives(0.9), ScriptedPrimitives(0.9), memory=memory).score("r", "c")
    assert routed.route == "reflex" and routed.value == Score(60.0, 0.9)


async def test_two_tenants_never_share_a_judgment() -> None:
    memory = InProcessJudgmentMemory(embedder=HashEmbeddingModel(), similarity_threshold=0.5)
    reflex = ScriptedPrimitives(0.9)
    await router(reflex, ScriptedPrimitives(0.9), memory=memory).ask("refund?", "billing?")
    other = router(reflex, ScriptedPrimitives(0.9), memory=memory, scope=JudgmentScope("globex", "tree-v1"))
    assert (await other.ask("refund?", "billing?")).route == "reflex"
    assert reflex.calls == ["ask", "ask"]


@pytest.mark.parametrize(("tenant", "schema"), [("", "v1"), ("acme", "  ")])
def test_a_scope_needs_a_non_blank_tenant_and_schema(tenant: str, schema: str) -> None:
    with pytest.raises(ConfigurationError):
        JudgmentScope(tenant, schema)


@pytest.mark.parametrize("value", [-0.1, 1.1, math.nan, True])
def test_thresholds_are_numbers_in_the_unit_interval(value: float) -> None:
    with pytest.raises(ConfigurationError):
        RouterThresholds(choose=value, score=0.5, ask=0.5)


class BrokenMemory(InProcessJudgmentMemory):
    def __init__(self, *, lookup_fails: bool = False) -> None:
        super().__init__()
        self.lookup_fails = lookup_fails

    async def lookup(self, key: JudgmentKey) -> Mapping[str, Any] | None:
        if self.lookup_fails:
            raise OSError("memory gone")
        return None

    async def store(self, key: JudgmentKey, payload: Mapping[str, Any]) -> None:
        raise OSError("disk full")


async def test_a_cache_write_failure_is_returned_beside_the_answer() -> None:
    routed = await router(ScriptedPrimitives(0.9), ScriptedPrimitives(0.9), memory=BrokenMemory()).ask("q", "ok?")
    assert routed.value == YesNo(True, 0.9) and isinstance(routed.cache_error, OSError)
    assert routed.lookup_error is None


async def test_a_failing_lookup_is_a_miss_reported_beside_the_answer() -> None:
    memory = BrokenMemory(lookup_fails=True)
    routed = await router(ScriptedPrimitives(0.9), ScriptedPrimitives(0.9), memory=memory).ask("q", "ok?")
    assert routed.route == "reflex" and isinstance(routed.lookup_error, OSError)


async def test_a_failing_reflex_hands_the_judgment_to_the_deliberate_judge() -> None:
    deliberate = ScriptedPrimitives(0.6)
    routed = await router(ScriptedPrimitives(0.9, fails=True), deliberate).score("r", "c")
    assert routed.route == "deliberate" and routed.reflex is None
    assert isinstance(routed.reflex_error, ModelUnavailableError) and deliberate.calls == ["score"]


async def test_the_semantic_memory_matches_exactly_then_by_similarity_within_its_group() -> None:
    memory = InProcessJudgmentMemory(embedder=HashEmbeddingModel(), similarity_threshold=0.8)
    stored = JudgmentKey(SCOPE, "choose", "where is my parcel? it has not arrived", OPTIONS)
    await memory.store(stored, {"answer": 1})

    assert await memory.lookup(stored) == {"answer": 1}
    assert await memory.lookup(JudgmentKey(SCOPE, "choose", "where is my parcel?? it has not arrived", OPTIONS))
    assert await memory.lookup(JudgmentKey(SCOPE, "choose", "please refund the double charge", OPTIONS)) is None
    other_options = JudgmentKey(SCOPE, "choose", stored.request, ("billing", "returns"))
    assert await memory.lookup(other_options) is None
    assert await memory.lookup(JudgmentKey(SCOPE, "ask", stored.request, OPTIONS)) is None
    await memory.forget(JudgmentKey(SCOPE, "choose", "where is my parcel?? it has not arrived", OPTIONS))
    assert await memory.lookup(stored) is None and len(memory) == 0


async def test_the_memory_keeps_the_most_recently_used_entries() -> None:
    memory = InProcessJudgmentMemory(capacity=2)
    keys = [JudgmentKey(SCOPE, "ask", f"request {n}", ("q",)) for n in range(3)]
    await memory.store(keys[0], {"n": 0})
    await memory.store(keys[1], {"n": 1})
    await memory.lookup(keys[0])
    await memory.store(keys[2], {"n": 2})
    assert await memory.lookup(keys[1]) is None and await memory.lookup(keys[0]) == {"n": 0}


async def test_a_semantic_search_uses_no_entry_and_the_latest_used_of_equals_answers() -> None:
    memory = InProcessJudgmentMemory(embedder=HashEmbeddingModel(), similarity_threshold=0.99, capacity=2)
    first, second = (JudgmentKey(SCOPE, "ask", text, ("q",)) for text in ("Where is my parcel", "WHERE IS MY PARCEL"))
    await memory.store(first, {"n": 1})
    await memory.store(second, {"n": 2})
    alike = JudgmentKey(SCOPE, "ask", "where is my parcel", ("q",))  # embeds as both do, matches neither exactly
    await memory.lookup(first)
    assert await memory.lookup(alike) == {"n": 1}
    await memory.lookup(second)
    assert await memory.lookup(alike) == {"n": 2}
    await memory.lookup(first)  # least recently used: the second; a search looking at both must not change that
    assert await memory.lookup(JudgmentKey(SCOPE, "ask", "an unrelated question", ("q",))) is None
    await memory.store(JudgmentKey(SCOPE, "ask", "a third request", ("q",)), {"n": 3})
    assert await memory.lookup(first) == {"n": 1} and await memory.lookup(second) == {"n": 1}  # the second is gone


def logprobs(*pairs: tuple[str, float]) -> list[tuple[str, float | None]]:
    return [(token, math.log(p)) for token, p in pairs]


async def test_choose_score_and_ask_route_over_http() -> None:
    with ScriptedOpenAIServer() as server:
        server.enqueue("B", top_logprobs=logprobs(("B", 0.55), ("C", 0.45)))  # reflex choose: unsure
        server.enqueue("C", top_logprobs=logprobs(("C", 0.97), ("B", 0.03)))  # deliberate choose
        server.enqueue("8", top_logprobs=logprobs(("8", 1.0)))  # reflex score: sure
        server.enqueue("yes", top_logprobs=logprobs(("yes", 0.6), ("no", 0.4)))  # reflex ask: unsure
        server.enqueue("no", top_logprobs=logprobs(("no", 0.7), ("yes", 0.3)))  # deliberate ask: served anyway
        async with (
            OpenAICompatibleChatModel(server.base_url, "small") as small,
            OpenAICompatibleChatModel(server.base_url, "big") as big,
        ):
            judgment_router = JudgmentRouter(
                SCOPE, ChatPrimitives(small), ChatPrimitives(big), THRESHOLDS, InProcessJudgmentMemory()
            )
            chosen = await judgment_router.choose("my parcel is late", OPTIONS)
            scored = await judgment_router.score("my parcel is late", "urgency")
            asked = await judgment_router.ask("my parcel is late", "Is the customer angry?")
            again = await judgment_router.choose("my parcel is late", OPTIONS)

    assert [request.body["model"] for request in server.requests] == ["small", "big", "small", "small", "big"]
    assert (chosen.route, chosen.value.selected) == ("deliberate", "shipping")
    assert (scored.route, scored.value) == ("reflex", Score(100.0 * 8 / 9, 1.0))
    assert (asked.route, asked.value.yes, asked.confidence) == ("deliberate", False, pytest.approx(0.7))
    assert (again.route, again.value) == ("cache", chosen.value)
