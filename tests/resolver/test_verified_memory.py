"""Verified memory hits: accept band, verify band (yes / no / unsure), miss band, per-entry evidence, and the
verification's cost in the log. All over the scripted server on loopback; similarities come from the
deterministic hash embedder (measured below, so the bands sit between them)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from gil_core.errors import ConfigurationError
from gil_core.habits.thresholds import choose_memory_bands
from gil_core.judge.verify import build_verify_messages, read_yes_no
from gil_core.language import ENGLISH, KOREAN
from gil_core.llm import OpenAICompatibleChatModel, TokenLogprob
from gil_core.memory import LanceDBMemory
from gil_core.memory.evidence import MemoryEvidence, wilson_lower_bound
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel, ScriptedOpenAIServer, ScriptedReply
from tests.resolver._support import Script, SupportModel, support_task

REFUND = "where is my refund?"
NEAR = "where is my refund??"  # cosine 0.935 to REFUND with the hash embedder
ORDER = "where is my refund for order 5?"  # 0.742
PARCEL = "where is my parcel?"  # 0.592
FAR = "how do I reset my password?"  # 0.081
ACCEPT, VERIFY = 0.9, 0.55
_EARLIER = re.compile(r"<earlier>\n(.*)\n</earlier>", re.DOTALL)
_REQUEST = re.compile(r"<request>\n(.*)\n</request>", re.DOTALL)


class Verifying:
    """SupportModel for the tree; for a verification, the scripted P(yes) of (request, remembered)."""

    def __init__(self, p_yes: Mapping[str, float]) -> None:
        self.p_yes = dict(p_yes)
        self.tree = SupportModel({}, default=Script(route=["billing", "refund status"]))
        self.verifications: list[tuple[str, str]] = []

    def __call__(self, body: Mapping[str, Any]) -> ScriptedReply:
        if body["messages"][0]["content"] != ENGLISH.verify_system:
            return self.tree(body)
        user = body["messages"][-1]["content"]
        request, earlier = _REQUEST.search(user), _EARLIER.search(user)
        assert request is not None and earlier is not None
        self.verifications.append((request.group(1), earlier.group(1)))
        p = self.p_yes.get(request.group(1), 0.5)
        return ScriptedReply("yes" if p >= 0.5 else "no", top_logprobs=[("yes", math.log(p)), ("no", math.log(1 - p))])


async def test_the_similarities_the_bands_are_set_between() -> None:
    vectors = np.asarray((await HashEmbeddingModel().embed([REFUND, NEAR, ORDER, PARCEL, FAR])).vectors)
    cosines = vectors[1:] @ vectors[0]
    assert cosines[0] >= ACCEPT > cosines[1] > cosines[2] >= VERIFY > cosines[3]


def _task() -> Any:
    return support_task(memory_threshold=ACCEPT, memory_verify=VERIFY, verify_confidence=0.8)


def _verify_calls(store: TelemetryStore, trace_id: str) -> pl.DataFrame:
    calls = store.read("calls")
    return calls.filter((pl.col("trace_id") == trace_id) & (pl.col("role") == "verify"))


async def test_each_band_serves_verifies_or_misses(tmp_path: Path) -> None:
    model = Verifying({ORDER: 0.95, PARCEL: 0.1})
    store = TelemetryStore(tmp_path / "store")
    memory = LanceDBMemory(tmp_path / "memory", HashEmbeddingModel())
    task = _task()
    with ScriptedOpenAIServer(responder=model) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(chat, store, memory=memory)
            first = await resolver.resolve(task, REFUND)
            assert first.mode == "habit/answer"
            await resolver.feedback(task, first.trace_id, correct=True)

            accepted = await resolver.resolve(task, NEAR)
            verified = await resolver.resolve(task, ORDER)
            refused = await resolver.resolve(task, PARCEL)
            missed = await resolver.resolve(task, FAR)

    assert accepted.mode == "memory" and accepted.recall is not None and accepted.recall.verified is None
    assert verified.mode == "memory" and verified.recall is not None and verified.recall.verified is True
    assert verified.output == first.output
    # A "no" falls through to the tree, which answers; the trace says the hit was refused by verification.
    assert refused.mode == "habit/answer" and refused.path and refused.recall is not None
    assert (refused.recall.hit, refused.recall.verified) == (False, False)
    assert missed.recall is not None and not missed.recall.hit and missed.recall.verified is None
    assert model.verifications == [(ORDER, REFUND), (PARCEL, REFUND)]  # only the verify band paid for one

    for resolution, expected in ((accepted, 0), (verified, 1), (refused, 1), (missed, 0)):
        assert len(_verify_calls(store, resolution.trace_id)) == expected
    calls = store.read("calls").filter(pl.col("trace_id") == verified.trace_id)
    verify_call = calls.filter(pl.col("role") == "verify").row(0, named=True)
    assert verify_call["energy"] > 0 and verify_call["confidence"] == pytest.approx(0.95)
    assert verified.energy == pytest.approx(calls["energy"].sum()) and verified.energy >= verify_call["energy"]
    row = store.read("traces").filter(pl.col("trace_id") == verified.trace_id).row(0, named=True)
    assert json.loads(row["recall"])["verified"] is True
    # The verification's cost is in the stats' cost windows.
    stats = store.stats(task.name, window=100)
    assert sum(w.total_energy for w in stats.windows) == pytest.approx(store.read("calls")["energy"].sum())


async def test_an_unsure_yes_is_not_served(tmp_path: Path) -> None:
    model = Verifying({ORDER: 0.7})  # yes, but below verify_confidence 0.8
    store = TelemetryStore(tmp_path / "store")
    task = _task()
    with ScriptedOpenAIServer(responder=model) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(chat, store, memory=LanceDBMemory(tmp_path / "memory", HashEmbeddingModel()))
            first = await resolver.resolve(task, REFUND)
            await resolver.feedback(task, first.trace_id, correct=True)
            unsure = await resolver.resolve(task, ORDER)
    assert unsure.mode != "memory" and unsure.recall is not None and unsure.recall.verified is False


async def test_a_wrong_verified_hit_is_forgotten_after_negative_feedback(tmp_path: Path) -> None:
    model = Verifying({ORDER: 0.95})
    store = TelemetryStore(tmp_path / "store")
    memory = LanceDBMemory(tmp_path / "memory", HashEmbeddingModel())
    task = _task()
    with ScriptedOpenAIServer(responder=model) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(chat, store, memory=memory)
            first = await resolver.resolve(task, REFUND)
            await resolver.feedback(task, first.trace_id, correct=True)
            wrong = await resolver.resolve(task, ORDER)
            assert wrong.mode == "memory" and wrong.recall is not None and wrong.recall.verified
            await resolver.feedback(task, wrong.trace_id, correct=False)
            assert [entry.key for entry in await memory.entries(task.name)] == []
            again = await resolver.resolve(task, ORDER)
    assert again.mode != "memory"


async def test_an_entry_whose_hits_keep_being_confirmed_skips_verification(tmp_path: Path) -> None:
    model = Verifying({ORDER: 0.95})
    store = TelemetryStore(tmp_path / "store")
    memory = LanceDBMemory(tmp_path / "memory", HashEmbeddingModel())
    task = _task()
    with ScriptedOpenAIServer(responder=model) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(chat, store, memory=memory)
            first = await resolver.resolve(task, REFUND)
            await resolver.feedback(task, first.trace_id, correct=True)
            for _ in range(5):  # five confirmed hits of the first entry (exact repeats: ties go to the earliest)
                hit = await resolver.resolve(task, REFUND)
                assert hit.recall is not None and hit.recall.source == first.trace_id
                await resolver.feedback(task, hit.trace_id, correct=True)
            trusted = await resolver.resolve(task, ORDER)
            # A new resolver reads the same evidence off the log.
            fresh = Resolver(chat, store, memory=memory)
            trusted_again = await fresh.resolve(task, ORDER)
    assert model.verifications == []
    for resolution in (trusted, trusted_again):
        assert resolution.mode == "memory" and resolution.recall is not None
        assert resolution.recall.source == first.trace_id and resolution.recall.verified is None


def test_the_per_entry_threshold_lies_between_verify_and_accept() -> None:
    evidence = MemoryEvidence()
    assert evidence.threshold("e", accept=0.9, verify=0.5) == 0.9  # no evidence: the accept threshold
    for index in range(5):
        evidence.record(f"t{index}", "e", correct=True)
    lower = wilson_lower_bound(5, 5)
    assert evidence.threshold("e", accept=0.9, verify=0.5) == pytest.approx(0.9 - 0.4 * lower)
    for index in range(1000):
        evidence.record(f"u{index}", "e", correct=True)
    assert 0.5 <= evidence.threshold("e", accept=0.9, verify=0.5) < 0.51
    evidence.record("t0", "e", correct=False)  # a later verdict on the same trace replaces the earlier one
    assert (evidence.entries["e"].confirmed, evidence.entries["e"].refuted) == (1004, 1)
    with pytest.raises(ConfigurationError):
        evidence.threshold("e", accept=0.5, verify=0.9)
    with pytest.raises(ConfigurationError):
        evidence.threshold("e", accept=float("inf"), verify=0.5)


def test_wilson_lower_bound_is_pinned_at_zero_and_grows_with_evidence() -> None:
    assert wilson_lower_bound(0, 0) == 0.0 and wilson_lower_bound(0, 10) == 0.0
    assert 0 < wilson_lower_bound(5, 5) < wilson_lower_bound(50, 50) < 1
    assert wilson_lower_bound(8, 10) == pytest.approx(0.4901624, abs=1e-6)


def test_the_verification_prompt_shows_both_requests_in_each_language() -> None:
    for language in (ENGLISH, KOREAN):
        system, user = build_verify_messages(language, "cancel my order", "don't cancel my order")
        assert system["content"] == language.verify_system
        assert "cancel my order" in user["content"] and "don't cancel my order" in user["content"]
    assert read_yes_no([TokenLogprob(" Yes", math.log(0.6)), TokenLogprob("no", math.log(0.2))], "yes", "no") == (
        pytest.approx(0.75),
        pytest.approx(0.25),
    )
    assert read_yes_no([TokenLogprob("maybe", 0.0)], "yes", "no") == (0.5, 0.5)


def test_bands_are_chosen_from_pairs_for_two_precisions() -> None:
    rng = np.random.default_rng(7)
    similarity = rng.uniform(0.3, 1.0, 4000)
    right = rng.uniform(0, 1, 4000) < (similarity - 0.3) / 0.7  # precision rises with similarity
    bands = choose_memory_bands(similarity, right, accept_precision=0.95, verify_precision=0.5, minimum_answered=20)
    assert bands.verify.threshold is not None and bands.accept.threshold is not None
    assert bands.verify.threshold < bands.accept.threshold
    with pytest.raises(ConfigurationError):
        choose_memory_bands(similarity, right, accept_precision=0.5, verify_precision=0.9, minimum_answered=1)


def test_policy_and_task_file_validate_the_bands() -> None:
    with pytest.raises(ConfigurationError, match="memory_verify"):
        support_task(memory_threshold=0.8, memory_verify=0.9)
    with pytest.raises(ConfigurationError, match="memory_verify needs"):
        support_task(memory_threshold=None, memory_verify=0.5)
    with pytest.raises(ConfigurationError, match="verify_confidence"):
        support_task(memory_threshold=0.9, memory_verify=0.5, verify_confidence=1.5)
