"""A support task with the learned reflex on, the bundled support stream with its answer key, and a loopback model
that judges badly (it says "none of these" at every node and generates the none answer), so whatever Gil gets
right beyond that, the learned judge learned from feedback."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from gil_core.batch import Ticket, Verdict, resolve_batch, ticket_trace_id
from gil_core.batch_feedback import apply_verdicts
from gil_core.llm import ChatModel, EmbeddingModel, EmbeddingRecorder, OpenAICompatibleChatModel
from gil_core.llm.trace_vectors import TraceVectorCache
from gil_core.local import MiniLMEmbeddingModel
from gil_core.memory import LanceDBMemory
from gil_core.resolver import Resolver
from gil_core.tasks import LearnedPolicy, TaskDefinition
from gil_core.telemetry import EnergyModel, TelemetryStore
from gil_core.testing import ReceivedRequest, ScriptedOpenAIServer
from tests.resolver._support import ROOT, Script, SupportModel, support_task

NONE = "None of these"


@cache
def embedder() -> MiniLMEmbeddingModel:
    """One MiniLM per test process (loading it takes about a second)."""
    return MiniLMEmbeddingModel()


def recorded(model: EmbeddingModel, store: TelemetryStore) -> EmbeddingRecorder:
    """``model`` with its calls recorded and priced into ``store``, as the runtime wires it."""
    return EmbeddingRecorder(model, sink=store, energy=EnergyModel.tokens())


@dataclass(frozen=True)
class Example:
    id: str
    text: str
    answer: str
    option: str | None
    category: str


@cache
def support_stream() -> tuple[Example, ...]:
    tickets = [json.loads(line) for line in (ROOT / "data" / "support_tickets.jsonl").read_text().splitlines()]
    answers = {
        row["id"]: row for row in map(json.loads, (ROOT / "data" / "support_answers.jsonl").read_text().splitlines())
    }
    return tuple(
        Example(
            t["id"], t["text"], answers[t["id"]]["answer"], answers[t["id"]]["option_id"], answers[t["id"]]["category"]
        )
        for t in tickets
    )


def learned_task(name: str = "support", *, memory_threshold: float | None = None, **learned: Any) -> TaskDefinition:
    """The support task (thresholds 0.6 / 0.7) with ``learned_reflex`` on; memory off unless asked for."""
    policy = LearnedPolicy(**{"precision": 0.95, **learned})
    task = support_task(name, memory_threshold=memory_threshold)
    return replace(task, policy=replace(task.policy, learned=policy))


@contextmanager
def bad_model() -> Iterator[ScriptedOpenAIServer]:
    """A loopback model that answers "none of these" to every judgment and the none answer to every generation."""
    with ScriptedOpenAIServer(responder=SupportModel({}, default=Script(answers=[NONE]))) as server:
        yield server


@contextmanager
def good_model(stream: Sequence[Example]) -> Iterator[ScriptedOpenAIServer]:
    """A loopback model that routes every request of ``stream`` to its key's answer (the LLM as good as it gets)."""
    from gil_core.ontology import load_tree

    tree = load_tree(ROOT / "ontologies" / "support.yaml")
    scripts = {}
    for example in stream:
        if example.option is None:
            scripts[example.text] = Script(answers=[NONE])
            continue
        labels = [node.label for node in tree.path_to(tree.owner(example.option).id)[1:]]
        scripts[example.text] = Script(route=[*labels, tree.option(example.option).label], answers=[example.answer])
    with ScriptedOpenAIServer(responder=SupportModel(scripts, default=Script(answers=[NONE]))) as server:
        yield server


def resolver_with_memory(chat: ChatModel, root: Path) -> tuple[Resolver, LanceDBMemory]:
    """A resolver over a store and a LanceDB memory under ``root``, memory and the learned judge sharing one
    embedding per request, as the runtime wires them."""
    vectors = TraceVectorCache(embedder())
    memory = LanceDBMemory(root / "memory", vectors)
    return Resolver(chat, TelemetryStore(root / "store"), memory=memory, reflex_embedder=vectors), memory


async def run_with_feedback(
    resolver: Resolver, task: TaskDefinition, examples: Sequence[Example], *, suffix: str = ""
) -> dict[str, str | None]:
    """Resolve ``examples`` as one batch, then give every answer its verdict from the key; outputs by ticket id."""
    tickets = [Ticket(example.id + suffix, example.text) for example in examples]
    await resolve_batch(resolver, task, tickets, concurrency=4)
    outputs = outputs_of(resolver.store, task, tickets)
    verdicts = [
        Verdict(ticket_trace_id(task.name, ticket.id), outputs[ticket.id] == example.answer, example.answer)
        for ticket, example in zip(tickets, examples, strict=True)
    ]
    await apply_verdicts(resolver, task, verdicts)
    return outputs


def outputs_of(store: TelemetryStore, task: TaskDefinition, tickets: Sequence[Ticket]) -> dict[str, str | None]:
    ids = {ticket_trace_id(task.name, ticket.id): ticket.id for ticket in tickets}
    traces = store.read("traces")
    return {ids[row["trace_id"]]: row["output"] for row in traces.iter_rows(named=True) if row["trace_id"] in ids}


def deciders_of(store: TelemetryStore, trace_id: str) -> list[str | None]:
    """Who decided each step of a stored trace."""
    traces = store.read("traces")
    (row,) = traces.filter(traces["trace_id"] == trace_id).iter_rows(named=True)
    return [step.get("decided_by") for step in json.loads(row["path"])]


async def train(
    resolver: Resolver, task: TaskDefinition, count: int, *, chunk: int = 40, start: int = 0
) -> dict[str, str | None]:
    """The first ``count`` requests of the support stream (from ``start``) in chunks of ``chunk``, feedback after
    each; the outputs of all of them by ticket id."""
    stream = support_stream()
    outputs: dict[str, str | None] = {}
    for first in range(start, start + count, chunk):
        outputs |= await run_with_feedback(resolver, task, stream[first : min(first + chunk, start + count)])
    return outputs


async def trained_then_sent(
    root: Path, task: TaskDefinition, server: ScriptedOpenAIServer, trained: int, sent: int
) -> tuple[Resolver, dict[str, str | None], list[ReceivedRequest]]:
    """Train a resolver over a store at ``root`` on the first ``trained`` requests of the support stream (``train``),
    then send the next ``sent`` as one batch with feedback: the resolver, those requests' outputs, and what the
    server received for them."""
    async with OpenAICompatibleChatModel(server.base_url, "scripted") as chat:
        resolver = Resolver(chat, TelemetryStore(root), reflex_embedder=embedder())
        await train(resolver, task, trained)
        before = len(server.requests)
        outputs = await run_with_feedback(resolver, task, support_stream()[trained : trained + sent])
    return resolver, outputs, server.requests[before:]
