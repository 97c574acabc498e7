"""The parts one task's requests are served with, built on first use and kept: the chat model behind its client
stack, the judges of a walk, the generator and slot filler, memory's verifier, the tree's answer index.

The resolver asks ``Wiring`` for a part by task; what it is built from comes in three value objects: how requests
reach the chat model (``ClientSetup``), what judges instead of the chat model (``Judging``), and how every call is
priced and observed (``Metering``). Nothing here changes with feedback: what verdicts teach lives in
``gil_core.feedback``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gil_core.client import build_chat_stack
from gil_core.diagnostics import Diagnostics, default_diagnostics
from gil_core.errors import ConfigurationError
from gil_core.fallback import FallbackGenerator, SlotFiller
from gil_core.habits.attribution import AnswerIndex
from gil_core.judge import Judge, ReflexJudge, SingleTokenJudge, TieredJudge
from gil_core.judge.verify import SameRequestVerifier, Verifier
from gil_core.learned import LearnedJudge, Learner
from gil_core.llm import CallRecorder, ChatModel, EmbeddingModel
from gil_core.llm.trace_vectors import TraceVectorCache
from gil_core.settings import ClientParts
from gil_core.tasks import TaskDefinition
from gil_core.telemetry import EnergyModel, TelemetryStore

__all__ = ["ClientSetup", "Judging", "Metering", "Wiring", "require_learner"]


@dataclass(frozen=True, slots=True)
class ClientSetup:
    """How the resolver's requests reach the chat model.

    ``parts`` puts the request cache, the operation log and the rate limiter (those it holds) around the call
    recorder, one stack per task: the cache key carries the task (tenant) and the hash of its configuration
    (schema), so tasks never share an entry and a changed tree misses by itself; a cached answer is not a model
    call, so it is neither recorded nor priced. ``provider`` names the limiter's bucket, and ``fallback`` answers
    (recorded under its own name) when the limiter refuses or the model is down; without any part, the recorded
    model is called directly. ``extra_body`` is sent with every judgment, verification and generation.
    """

    parts: ClientParts | None = None
    provider: str = "default"
    fallback: ChatModel | None = None
    extra_body: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Judging:
    """What judges instead of the chat model: ``judge`` replaces the single-token judge (e.g. a reflex judge, or
    recorded judgments in a replay), ``verifier`` the yes/no verification of memory hits in a task's verify band;
    ``order_seed`` seeds the order in which the single-token judge shows candidates."""

    judge: Judge | None = None
    verifier: Verifier | None = None
    order_seed: str | None = None


@dataclass(frozen=True, slots=True)
class Metering:
    """How calls are priced (``energy``, tokens by default) and requests observed (``diagnostics``, OpenTelemetry
    under the name ``gil`` by default)."""

    energy: EnergyModel | None = None
    diagnostics: Diagnostics | None = None


def require_learner(learner: Learner | None, task: TaskDefinition) -> Learner:
    """The learned judges, for a task that asks for them; a resolver without an embedder has none."""
    if learner is None:
        raise ConfigurationError(f"task {task.name!r} asks for a learned reflex, but the resolver has no embedder")
    return learner


class Wiring:
    """Each task's parts, over one store and chat model: every call the chat model makes is recorded into
    ``store`` and priced; a judge of a walk is assembled from the outside in (learned judge, description reflex,
    LLM judge), and the parts that keep state across requests (client stacks, reflexes, answer indexes) are kept
    per task. ``reflex_embedder`` (wrapped in a ``TraceVectorCache`` unless it is one) serves the description
    reflex and the learned judges (``learners``, None without it)."""

    def __init__(
        self,
        chat: ChatModel,
        store: TelemetryStore,
        reflex_embedder: EmbeddingModel | None = None,
        *,
        client: ClientSetup | None = None,
        judging: Judging | None = None,
        metering: Metering | None = None,
    ) -> None:
        metering = metering or Metering()
        self.diagnostics = metering.diagnostics or default_diagnostics()
        energy = metering.energy or EnergyModel.tokens()
        self._chat = CallRecorder(chat, sink=store, energy=energy, diagnostics=self.diagnostics)
        self._client = client = client or ClientSetup()
        spare = client.fallback
        self._fallback = spare and CallRecorder(spare, sink=store, energy=energy, diagnostics=self.diagnostics)
        self._judging = judging or Judging()
        if reflex_embedder is not None and not isinstance(reflex_embedder, TraceVectorCache):
            reflex_embedder = TraceVectorCache(reflex_embedder)
        self._reflex_embedder = reflex_embedder
        self.learners = Learner(store, reflex_embedder) if reflex_embedder is not None else None
        self._stacks: dict[tuple[str, str], ChatModel] = {}
        self._reflexes: dict[str, ReflexJudge] = {}
        self._answer_indexes: dict[str, AnswerIndex] = {}

    def chat(self, task: TaskDefinition) -> ChatModel:
        """The recorded chat model behind the task's client stack (cache → log → limiter), one per schema."""
        parts = self._client.parts
        if parts is None or (parts.cache is None and parts.log is None and parts.limiter is None):
            return self._chat
        key = (task.name, task.schema)
        stack = self._stacks.get(key)
        if stack is None:
            stack = self._stacks[key] = build_chat_stack(
                self._chat,
                provider=self._client.provider,
                tenant=task.name,
                schema=task.schema,
                cache=parts.cache,
                language=task.language,
                log=parts.log,
                limiter=parts.limiter,
                fallback=self._fallback,
            )
        return stack

    def learner(self, task: TaskDefinition) -> Learner:
        return require_learner(self.learners, task)

    async def judge(self, task: TaskDefinition) -> Judge:
        """The judge of the task's walk: the learned judge in front when the task sets ``learned_reflex`` (its
        state read or fitted now, so an embedder's ``ModelError`` may come out), then the description reflex when
        ``reflex_threshold`` is set, then the LLM."""
        policy = task.policy.learned
        if policy is None:
            return self._tiered(task)
        learner = self.learner(task)
        state = await learner.serving_state(task)
        tree, thresholds = task.tree, task.policy.thresholds
        return LearnedJudge(
            state,
            vector_of=learner.request_vector,
            fallback=self._tiered(task),
            llm=self._deliberate(task),
            audit_rate=policy.audit_rate,
            threshold=lambda node_id, layer: thresholds.for_node(tree.node(node_id), layer),
            answers=self.answers(task),
            texts_of=learner.text_vectors,
            guess=policy.guess,
        )

    def answers(self, task: TaskDefinition) -> AnswerIndex:
        """Which option of the task's tree an answer text is, one index per schema."""
        index = self._answer_indexes.get(task.schema)
        if index is None:
            index = self._answer_indexes[task.schema] = AnswerIndex(task.tree)
        return index

    def verifier(self, task: TaskDefinition) -> Verifier:
        """Whether two requests mean the same: the given verifier, else a yes/no question to the chat model."""
        if self._judging.verifier is not None:
            return self._judging.verifier
        return SameRequestVerifier(self.chat(task), task.language, extra_body=self._client.extra_body)

    def generator(self, task: TaskDefinition) -> FallbackGenerator:
        return FallbackGenerator(
            self.chat(task),
            task.language,
            max_attempts=task.policy.fallback_max_attempts,
            max_tokens=task.policy.fallback_max_tokens,
            extra_body=self._client.extra_body,
        )

    def slot_filler(self, task: TaskDefinition) -> SlotFiller:
        return SlotFiller(
            self.chat(task),
            task.language,
            max_attempts=task.policy.slot_max_attempts,
            max_tokens=task.policy.fallback_max_tokens,
            extra_body=self._client.extra_body,
        )

    def _tiered(self, task: TaskDefinition) -> Judge:
        deliberate = self._deliberate(task)
        threshold = task.policy.reflex_threshold
        if threshold is None:
            return deliberate
        if self._reflex_embedder is None:
            raise ConfigurationError(f"task {task.name!r} asks for a reflex judge, but the resolver has no embedder")
        # One reflex per task keeps its candidate vectors warm across requests.
        reflex = self._reflexes.get(task.name)
        if reflex is None:
            reflex = self._reflexes[task.name] = ReflexJudge(self._reflex_embedder)
        return TieredJudge(reflex, deliberate, threshold)

    def _deliberate(self, task: TaskDefinition) -> Judge:
        if self._judging.judge is not None:
            return self._judging.judge
        return SingleTokenJudge(
            self.chat(task), task.language, order_seed=self._judging.order_seed, extra_body=self._client.extra_body
        )
