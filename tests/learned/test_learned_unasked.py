"""The next judge not asked where it does not help (``learned_reflex.llm_floor``), through the real resolver, store,
learned state and loopback model: where the learned judge does not serve, the LLM is asked unless the log shows it
settled almost none of the requests it was asked at that node with the confirmed child; then only the audit share
still asks it. A model that never helps is asked less and nothing it would have answered changes; a model that
helps keeps being asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gil_core.batch import ticket_trace_id
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from tests.learned._support import (
    bad_model,
    embedder,
    good_model,
    learned_task,
    support_stream,
    train,
    trained_then_sent,
)

TRAIN = 160  # four rounds of feedback: ~70 requests the root left to the LLM, enough for a floor of 10%
FLOOR = 0.1
SENT = 40


async def _run(root: Path, **learned: Any) -> tuple[Resolver, dict[str, str | None], int]:
    """Train on the first TRAIN requests with the bad model, then send the next SENT: the resolver, those
    requests' outputs, and the one-token judgments the model was asked for them."""
    with bad_model() as server:
        resolver, outputs, received = await trained_then_sent(root, learned_task(**learned), server, TRAIN, SENT)
    return resolver, outputs, sum(1 for request in received if request.body.get("logprobs"))


def _steps(store: TelemetryStore, task: str, ids: list[str]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    wanted = [ticket_trace_id(task, ticket) for ticket in ids]
    traces = store.read("traces").filter(pl.col("trace_id").is_in(wanted))
    return [(row, step) for row in traces.iter_rows(named=True) for step in json.loads(row["path"] or "[]")]


@pytest.mark.heavy
async def test_learned_judge_stops_asking_an_llm_that_never_helps_and_nothing_it_answered_changes(
    tmp_path: Path,
) -> None:
    """The same stream with a floor of 10% and of 0 (always ask): with the floor, the nodes where
    the bad model settled nothing right are marked not to ask it, their steps say "unasked", the model is asked
    for fewer judgments, and every output is the same as when it was always asked."""
    resolver, outputs, asked = await _run(tmp_path / "floor", llm_floor=FLOOR)
    always, always_outputs, always_asked = await _run(tmp_path / "always", llm_floor=0.0)
    assert resolver.learner is not None and always.learner is not None
    state = resolver.learner.state("support")
    assert state is not None
    marked = {node: model.report["next_judge"] for node, model in state.nodes.items() if not model.asks_next_judge}
    assert marked, "no node marked: the protocol no longer leaves enough requests to the model"
    for figures in marked.values():
        assert figures["settled_right"] == 0  # a node the model helped is judged on its own record
        decided = figures["upper_bound"] if figures["evidence"] == "node" else figures["pooled_upper_bound"]
        assert decided < FLOOR
    always_state = always.learner.state("support")
    assert always_state is not None and all(model.asks_next_judge for model in always_state.nodes.values())

    ids = [example.id for example in support_stream()[TRAIN : TRAIN + SENT]]
    unasked = [(row, step) for row, step in _steps(resolver.store, "support", ids) if step["decided_by"] == "unasked"]
    assert unasked, "no step left unasked"
    for row, step in unasked:
        assert step["node"] in marked and step["outcome"] == "exit"
        assert step["learned"]["why"] != "served"
        assert row["decider"] in ("generation", "learned")  # nobody asked the LLM there
    for row, step in _steps(resolver.store, "support", ids):
        if step["decided_by"] == "guess" and step.get("audit") is None:
            assert row["decider"] == "learned"  # a guess made without the LLM is no LLM judgment
    assert not any(step["decided_by"] == "unasked" for _, step in _steps(always.store, "support", ids))
    assert asked < always_asked, (asked, always_asked)
    assert outputs == always_outputs


async def test_learned_judge_keeps_asking_an_llm_that_helps(tmp_path: Path) -> None:
    """A model that routes every request right: no node is marked, and no step goes unasked."""
    task = learned_task()
    stream = support_stream()[:120]
    with good_model(stream) as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await train(resolver, task, len(stream))
    state = resolver.learner.state("support") if resolver.learner else None
    assert state is not None
    helped = [model.report["next_judge"] for model in state.nodes.values() if model.report["next_judge"]["asked"]]
    assert helped and all(figures["ask"] for figures in helped)
    assert any(figures["settled_right"] > 0 for figures in helped)
    ids = [example.id for example in stream]
    assert not any(step["decided_by"] == "unasked" for _, step in _steps(resolver.store, "support", ids))
