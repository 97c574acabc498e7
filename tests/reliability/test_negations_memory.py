"""Negations and amounts in memory (issue #19, case 13), on the demo's embedder (the local MiniLM) at the demo's
memory threshold (0.9): a confirmed request, then one that differs from it only in a negation or an amount. What
memory serves with ``memory_guard`` off (the default) is measured; with it on, none of them is a hit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gil_core.llm import OpenAICompatibleChatModel
from gil_core.memory import LanceDBMemory
from gil_core.memory.guard import has_negation
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition
from gil_core.telemetry import TelemetryStore
from tests.learned._support import bad_model, embedder
from tests.resolver._support import support_task

pytestmark = pytest.mark.reliability

# (confirmed request, its answer, the request that must not get that answer)
PAIRS = [
    ("Please cancel my order 48213.", "We have cancelled order 48213.", "Please don't cancel my order 48213."),
    ("I want to close my account.", "Your account will be closed.", "I don't want to close my account."),
    (
        "Send me the invoice for order 55120.",
        "The invoice is on its way.",
        "Do not send me the invoice for order 55120.",
    ),
    ("Turn on two-step sign-in for me.", "Two-step sign-in is on.", "Do not turn on two-step sign-in for me."),
    ("I want to return the headphones.", "Here is your return label.", "I don't want to return the headphones."),
    ("Change my email address, please.", "Your email address is changed.", "Don't change my email address, please."),
    ("Refund 5 euros to my card.", "We refunded 5 euros.", "Refund 50 euros to my card."),
    ("I was charged 19.99 twice.", "We refunded the second 19.99.", "I was charged 199.90 twice."),
    ("Where is order 31870?", "Order 31870 arrives on Friday.", "Where is order 31871?"),
    ("Please refund 120 dollars.", "We refunded 120 dollars.", "Please refund 12 dollars."),
]


async def _memory_hits(task: TaskDefinition, tmp_path: Path) -> list[bool]:
    """Each pair's first request confirmed with its answer, then the second sent: was it a memory hit?"""
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            memory = LanceDBMemory(tmp_path / "memory", embedder())
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), memory=memory)
            for confirmed, answer, _ in PAIRS:
                first = await resolver.resolve(task, confirmed)
                await resolver.feedback(task, first.trace_id, correct=False, correction=answer)
            hits = []
            for confirmed, _, other in PAIRS:
                again = await resolver.resolve(task, confirmed)
                assert again.mode == "memory", confirmed  # memory holds each confirmed request
                hits.append((await resolver.resolve(task, other)).mode == "memory")
    return hits


async def test_memory_serves_negated_and_changed_amount_requests_unless_the_guard_is_on(tmp_path: Path) -> None:
    task = support_task("support", memory_threshold=0.9)
    unguarded = await _memory_hits(replace(task, policy=replace(task.policy, memory_guard=False)), tmp_path / "off")
    guarded = await _memory_hits(replace(task, policy=replace(task.policy, memory_guard=True)), tmp_path / "on")
    negations = [has_negation(other) for _, _, other in PAIRS]
    served = sum(unguarded)
    print(
        f"memory_guard off: {served}/{len(PAIRS)} served the other request's answer "
        f"({sum(h for h, n in zip(unguarded, negations, strict=True) if n)} of {sum(negations)} negations, "
        f"{sum(h for h, n in zip(unguarded, negations, strict=True) if not n)} of {len(PAIRS) - sum(negations)} "
        "amounts and numbers); on: "
        f"{sum(guarded)}"
    )
    assert served >= 3  # the default serves such requests: the embedder barely tells them apart
    assert guarded == [False] * len(PAIRS)
