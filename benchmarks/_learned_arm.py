"""The resolver-overhead arm where the learned judge serves: a resolver trained on confirmed support requests (as
tests/learned do) so that whole walks are the learned judge's, with no model call, then timed like the other arms.

The model judges badly (it says "none of these" at every node and generates the none answer), so the learned
judge, once fitted on the feedback, is significantly better and serves ("better" rule). Requests are embedded by
MiniLM ahead of the run and served from a dict during it (``StoredVectors``): the learned judge decides on real
embeddings, while the embedding a request makes costs microseconds and is measured in the same run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._report import ROOT, support_tree
from gil_core.fallback import TreeAnswerContract
from gil_core.language import ENGLISH
from gil_core.llm import EmbeddingModel, Embeddings, Usage
from gil_core.llm.trace_vectors import TraceVectorCache
from gil_core.memory import LanceDBMemory
from gil_core.resolver import Resolver
from gil_core.tasks import LearnedPolicy, TaskDefinition, TaskPolicy
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedChatModel, ScriptedReply
from gil_core.traverse import Thresholds

__all__ = ["LearnedSetup", "StoredVectors", "train_learned"]

NONE = ENGLISH.none_of_these
TRAINED = 200  # support requests fed back before the run (the rest are held out)
CHUNK = 40  # a batch, then its verdicts, as tests/learned/_support.py ``train`` does


class StoredVectors:
    """An ``EmbeddingModel`` answering from vectors computed ahead (``warm``) by ``model``; a text it does not
    hold is embedded by ``model`` then. ``calls`` counts ``embed`` calls."""

    def __init__(self, model: EmbeddingModel) -> None:
        self._model = model
        self._vectors: dict[str, tuple[float, ...]] = {}
        self.calls = 0

    @property
    def name(self) -> str:
        return self._model.name

    async def warm(self, texts: Sequence[str]) -> None:
        missing = [text for text in dict.fromkeys(texts) if text not in self._vectors]
        if missing:
            embedded = await self._model.embed(missing)
            self._vectors.update(zip(missing, embedded.vectors, strict=True))

    async def embed(self, texts: Sequence[str]) -> Embeddings:
        self.calls += 1
        await self.warm(texts)
        vectors = tuple(self._vectors[text] for text in texts)
        return Embeddings(vectors, usage=Usage(prompt_tokens=sum(len(t.split()) for t in texts)), model=self.name)


def _bad_judge(messages: Sequence[Any], *, top_logprobs: int = 0, **_: Any) -> ScriptedReply:
    """ "None of these" (the scheme's first label) to every judgment, the none answer to every generation."""
    return ScriptedReply("A") if top_logprobs > 0 else ScriptedReply(NONE)


@dataclass(frozen=True)
class Example:
    id: str
    text: str
    answer: str


def support_stream() -> list[Example]:
    tickets = [json.loads(line) for line in (ROOT / "data" / "support_tickets.jsonl").read_text().splitlines()]
    answers = {
        row["id"]: row["answer"]
        for row in map(json.loads, (ROOT / "data" / "support_answers.jsonl").read_text().splitlines())
    }
    return [Example(ticket["id"], ticket["text"], answers[ticket["id"]]) for ticket in tickets]


def learned_support_task() -> TaskDefinition:
    """The support task of tests/learned (thresholds 0.6 / 0.7, precision 0.95), memory on at 0.95 as set: the
    log would lower memory's cut on this stream until memory answered every held-out request (``memory_cut``),
    leaving no walk of the learned judge's own to time."""
    tree = support_tree()
    policy = TaskPolicy(
        thresholds=Thresholds(per_layer=(0.6,), leaf=0.7),
        memory_threshold=0.95,
        learned=LearnedPolicy(precision=0.95, memory_cut=False),
    )
    return TaskDefinition("bench-learned", TreeAnswerContract(tree), tree, policy, ENGLISH)


@dataclass
class LearnedSetup:
    resolver: Resolver
    task: TaskDefinition
    chat: ScriptedChatModel
    embedder: StoredVectors
    served: list[str]  # held-out requests the learned judge walks alone (memory misses, no model call)
    held_out: int
    train_seconds: float


async def train_learned(root: Path) -> LearnedSetup:
    """A resolver over its own store and memory, trained on the first ``TRAINED`` support requests; the held-out
    requests whose whole walk the learned judge serves (found by resolving each once, outside any timing)."""
    from gil_core.batch import Ticket, Verdict, resolve_batch, ticket_trace_id
    from gil_core.batch_feedback import apply_verdicts
    from gil_core.local import MiniLMEmbeddingModel

    stream = support_stream()
    embedder = StoredVectors(MiniLMEmbeddingModel())
    await embedder.warm([example.text for example in stream])
    vectors = TraceVectorCache(embedder)  # one embedding per request serves memory and the learned judge
    chat = ScriptedChatModel(responder=_bad_judge)
    store = TelemetryStore(root / "store")
    resolver = Resolver(chat, store, memory=LanceDBMemory(root / "memory", vectors), reflex_embedder=vectors)
    task = learned_support_task()
    started = time.perf_counter()
    for first in range(0, TRAINED, CHUNK):
        part = stream[first : first + CHUNK]
        await resolve_batch(resolver, task, [Ticket(e.id, e.text) for e in part], concurrency=4)
        traces = store.read("traces")
        outputs = dict(zip(traces["trace_id"].to_list(), traces["output"].to_list(), strict=True))
        verdicts = []
        for example in part:
            trace_id = ticket_trace_id(task.name, example.id)
            verdicts.append(Verdict(trace_id, outputs.get(trace_id) == example.answer, example.answer))
        await apply_verdicts(resolver, task, verdicts)
    await resolver.refresh_learned(task)
    train_seconds = time.perf_counter() - started
    held_out = stream[TRAINED:]
    served = []
    for example in held_out:
        before = len(chat.history)
        resolution = await resolver.resolve(task, example.text)
        learned = resolution.path and all(getattr(step, "decided_by", None) == "learned" for step in resolution.path)
        if resolution.mode != "memory" and learned and len(chat.history) == before:
            served.append(example.text)
    return LearnedSetup(resolver, task, chat, embedder, served, len(held_out), train_seconds)
