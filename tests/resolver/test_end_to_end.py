"""The resolver end to end over real HTTP: one request per mode, memory on LanceDB (or lexical), telemetry on
disk; after each request the stored trace and its calls are checked."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gil_core.llm import EmbeddingRecorder, OpenAICompatibleChatModel, OpenAICompatibleEmbeddingModel
from gil_core.memory import LanceDBMemory, LexicalMemory, Memory
from gil_core.resolver import Metering, Resolver
from gil_core.tasks import Resolution
from gil_core.telemetry import EnergyModel, TelemetryStore
from gil_core.testing import ScriptedOpenAIServer
from tests.resolver._support import Script, support_server, support_task

REFUND = "Refunds reach the original payment method within 5 business days of approval."
PRICES = EnergyModel(fixed=1.0, per_fresh_prompt_token=0.01, per_cached_token=0.001, per_output_token=0.1)


def scripts() -> dict[str, Script]:
    return {
        "where is my refund?": Script(route=["billing", "refund status"]),
        "send me the invoice for order 8812": Script(route=["billing", "invoice copy"], slots={"order": "8812"}),
        "I want to change my email": Script(
            route=["account", "profile", "change email"], answers=["A code is on its way to the new address."]
        ),
        "my parcel arrived broken": Script(route=["shipping"], answers=["Outside this category", "None of these"]),
        "do you sell gift cards?": Script(answers=["None of these"]),
    }


# (request, mode, output, path nodes, call roles in order (embed calls aside))
SEQUENCE = [
    ("where is my refund?", "habit/answer", REFUND, ["root", "billing"], ["judge", "judge"]),
    (
        "send me the invoice for order 8812",
        "habit/template",
        "The invoice for order 8812 has been sent to the email address on the account.",
        ["root", "billing"],
        ["judge", "judge"],  # the order slot's pattern reads 8812 from the request: no slot-filling call
    ),
    (
        "I want to change my email",
        "habit/procedure",
        "A code is on its way to the new address.",
        ["root", "account", "profile"],
        ["judge", "judge", "judge", "fallback"],
    ),
    (
        "my parcel arrived broken",
        "partial",
        "None of these",
        ["root", "shipping"],
        ["judge", "judge", "fallback", "fallback"],
    ),
    ("do you sell gift cards?", "fallback", "None of these", ["root"], ["judge", "fallback"]),
    ("where is my refund?", "memory", REFUND, [], []),
]


MemoryFactory = Callable[[Path, ScriptedOpenAIServer, TelemetryStore], Memory]


def lancedb_memory(tmp: Path, server: ScriptedOpenAIServer, store: TelemetryStore) -> Memory:
    embedder = OpenAICompatibleEmbeddingModel(server.base_url, "hash-embedder")
    return LanceDBMemory(tmp / "memory", EmbeddingRecorder(embedder, sink=store, energy=PRICES))


def lexical_memory(tmp: Path, server: ScriptedOpenAIServer, store: TelemetryStore) -> Memory:
    return LexicalMemory(tmp / "lexical")


@pytest.fixture
async def server() -> AsyncIterator[ScriptedOpenAIServer]:
    with support_server(scripts()) as running:
        yield running


def stored(store: TelemetryStore, resolution: Resolution) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    traces = store.read("traces").filter(store.read("traces")["trace_id"] == resolution.trace_id).to_dicts()
    calls = store.read("calls").filter(store.read("calls")["trace_id"] == resolution.trace_id).to_dicts()
    assert len(traces) == 1
    return traces[0], calls


@pytest.mark.parametrize("make_memory", [lancedb_memory, lexical_memory], ids=["lancedb", "lexical"])
async def test_one_request_per_mode_is_stored_with_its_priced_calls(
    make_memory: MemoryFactory, server: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    store = TelemetryStore(tmp_path / "store")
    task = support_task()
    async with OpenAICompatibleChatModel(server.base_url, "support-model") as chat:
        resolver = Resolver(chat, store, memory=make_memory(tmp_path, server, store), metering=Metering(energy=PRICES))
        for text, mode, output, nodes, roles in SEQUENCE:
            resolution = await resolver.resolve(task, text)
            assert (resolution.mode, resolution.output) == (mode, output), text
            trace, calls = stored(store, resolution)
            assert (trace["mode"], trace["output"], trace["state"], trace["task"]) == (mode, output, text, "support")
            assert [step["node"] for step in json.loads(trace["path"])] == nodes
            assert [call["role"] for call in calls if call["role"] != "embed"] == roles
            assert all(call["energy"] > 0 for call in calls)
            assert trace["energy"] == pytest.approx(sum(call["energy"] for call in calls)) == resolution.energy
            recall = json.loads(trace["recall"]) if trace["recall"] else None
            if mode == "memory":
                assert recall is not None and recall["hit"] and recall["similarity"] >= 0.95
                assert trace["confidence"] == pytest.approx(recall["similarity"])
            await resolver.feedback(task, resolution.trace_id, correct=True)
    # Judge calls carry their reading; generation calls their content.
    judge_calls = store.read("calls").filter(store.read("calls")["role"] == "judge").to_dicts()
    assert all(call["outcome"] in ("accept", "exit") and call["label_mass"] > 0.99 for call in judge_calls)
    assert {row["task"] for row in store.read("run_configs").to_dicts()} == {"support"}


async def test_a_task_without_fallback_abstains_with_a_reason(server: ScriptedOpenAIServer, tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    task = support_task("strict", memory_threshold=None, allow_fallback=False)
    async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
        resolution = await Resolver(chat, store).resolve(task, "do you sell gift cards?")
    trace, calls = stored(store, resolution)
    assert resolution.mode == trace["mode"] == "abstain" and trace["output"] is None
    assert "none_selected" in trace["failure"] and [call["role"] for call in calls] == ["judge"]


@pytest.mark.parametrize(("attempts", "said"), [(1, "after 1 attempt:"), (2, "after 2 attempts:")])
async def test_a_generation_that_breaks_the_contract_says_after_how_many_attempts(
    attempts: int, said: str, tmp_path: Path
) -> None:
    task = support_task("strict", memory_threshold=None, fallback_max_attempts=attempts)
    with support_server({"anything else?": Script(answers=["Outside this tree"])}) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolution = await Resolver(chat, TelemetryStore(tmp_path / "store")).resolve(task, "anything else?")
        generated = [r for r in server.requests if not r.body.get("logprobs")]
    assert resolution.output is None and len(generated) == attempts
    assert (resolution.failure or "").startswith(f"contract violated {said} 'Outside this tree'"), resolution.failure


async def test_a_bare_root_goes_straight_to_generation_without_a_judgment(
    server: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    from dataclasses import replace

    from gil_core.fallback import TextContract
    from gil_core.ontology import Node, Tree

    store = TelemetryStore(tmp_path / "store")
    task = replace(support_task("bare", memory_threshold=None), tree=Tree(Node(id="root")), contract=TextContract())
    async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
        resolution = await Resolver(chat, store).resolve(task, "do you sell gift cards?")
    trace, calls = stored(store, resolution)
    assert (resolution.mode, resolution.output, trace["path"]) == ("fallback", "None of these", "[]")
    assert [call["role"] for call in calls] == ["fallback"]
    assert store.read("node_stats").is_empty()
