"""Generation not asked where it does not help (``learned_reflex.generation_floor``), through the real resolver,
store, learned state and loopback model: where the tree does not settle a request, generation is asked unless the
log shows it generated almost none of the confirmed answers of the requests it was asked for; then only the audit
share still asks it. A model whose generations are never confirmed is asked less and no answer changes; a model
whose generations are sometimes confirmed keeps being asked."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl

from gil_core.batch import ticket_trace_id
from gil_core.learned import audited
from gil_core.learned.generation_floor import GENERATION_AUDIT
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedOpenAIServer
from tests.learned._support import bad_model, embedder, learned_task, support_stream, train, trained_then_sent
from tests.resolver._support import Script, SupportModel

TRAIN = 80  # two rounds of feedback: most of them went to generation, enough asks for a floor of 10%
SENT = 40
FLOOR = 0.1
AUDIT_RATE = 0.2  # so that a few of the SENT requests are audits


@contextmanager
def unhelpful_model() -> Iterator[ScriptedOpenAIServer]:
    """A loopback model that answers "none of these" to every judgment and generates a reply that is none of the
    tree's answers (the contract refuses it: no answer is ever generated)."""
    script = Script(answers=["Sorry, I am not sure what you mean."])
    with ScriptedOpenAIServer(responder=SupportModel({}, default=script)) as server:
        yield server


async def _run(root: Path, **learned: Any) -> tuple[Resolver, dict[str, str | None], int]:
    """Train on the first TRAIN requests with the unhelpful model, then send the next SENT: the resolver, those
    requests' outputs, and the generations (not one-token judgments) the model was asked for them."""
    task = learned_task(audit_rate=AUDIT_RATE, **learned)
    with unhelpful_model() as server:
        resolver, outputs, received = await trained_then_sent(root, task, server, TRAIN, SENT)
    return resolver, outputs, sum(1 for request in received if not request.body.get("logprobs"))


def _traces(store: TelemetryStore, ids: list[str]) -> list[dict[str, Any]]:
    wanted = [ticket_trace_id("support", ticket) for ticket in ids]
    return list(store.read("traces").filter(pl.col("trace_id").is_in(wanted)).iter_rows(named=True))


async def test_learned_generation_not_asked_where_it_never_generates_a_confirmed_answer(tmp_path: Path) -> None:
    """The same stream with a generation floor of 10% and of 0 (always ask): with the floor, the state marks
    generation (none of its asks confirmed), the requests that reach it end as abstain saying why, except exactly
    the audited ones, which still generate; the model is asked for fewer generations, and every output is the
    same as when it was always asked."""
    resolver, outputs, generated = await _run(tmp_path / "floor", generation_floor=FLOOR)
    always, always_outputs, always_generated = await _run(tmp_path / "always", generation_floor=0.0)
    assert resolver.learner is not None and always.learner is not None
    state = resolver.learner.state("support")
    assert state is not None and state.generation is not None
    assert not state.generation.ask and state.generation.right == 0 and state.generation.upper_bound < FLOOR
    always_state = always.learner.state("support")
    assert always_state is not None and always_state.asks_generation

    ids = [example.id for example in support_stream()[TRAIN : TRAIN + SENT]]
    skipped = audits = 0
    for row in _traces(resolver.store, ids):
        failure = row["failure"] or ""
        if failure.startswith("not generated:"):
            skipped += 1
            assert row["mode"] == "abstain" and row["output"] is None and row["decider"] != "generation"
            assert "0 of the latest" in failure and "generation_floor" in failure
            assert not audited(row["trace_id"], GENERATION_AUDIT, AUDIT_RATE)
        elif row["mode"] in ("fallback", "partial"):
            audits += 1
            assert audited(row["trace_id"], GENERATION_AUDIT, AUDIT_RATE)  # only the audit share still generates
    assert skipped > 0, "no request reached the floor: the protocol no longer leaves requests to generation"
    assert audits > 0, "no audit among the requests left to generation"
    assert not any((row["failure"] or "").startswith("not generated:") for row in _traces(always.store, ids))
    assert generated < always_generated, (generated, always_generated)
    assert outputs == always_outputs


async def test_learned_generation_keeps_being_asked_where_it_is_sometimes_confirmed(tmp_path: Path) -> None:
    """A model that generates the none answer, which the key confirms for the support stream's out-of-scope
    requests: some of its generations are confirmed, so generation is never marked."""
    task = learned_task(generation_floor=FLOOR)
    with bad_model() as server:
        async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
            resolver = Resolver(chat, TelemetryStore(tmp_path / "store"), reflex_embedder=embedder())
            await train(resolver, task, 120)
    state = resolver.learner.state("support") if resolver.learner else None
    assert state is not None and state.generation is not None
    assert state.generation.ask and state.generation.right > 0 and state.generation.asked > 0
    ids = [example.id for example in support_stream()[:120]]
    assert not any((row["failure"] or "").startswith("not generated:") for row in _traces(resolver.store, ids))
