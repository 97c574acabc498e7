"""Opening what a task file names: the chat model, the embedder, memory and the store, wired into a Resolver.

``open_runtime`` is an async context manager, so local model servers and HTTP clients are closed on the way out.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from gil_core.errors import ConfigurationError, LearnedStateError, TelemetryError
from gil_core.learned import DEFAULT_RANDOM_SHARE, Learner
from gil_core.learned.queue import FeedbackQueue, issue_queue
from gil_core.llm import ChatModel, EmbeddingModel, EmbeddingRecorder
from gil_core.llm.ports import Completion, Embeddings, Message
from gil_core.llm.trace_vectors import TraceVectorCache
from gil_core.maintenance import ENERGY_META_KEY
from gil_core.memory import CircuitBreakingMemory, LanceDBMemory, Memory
from gil_core.resolver import ClientSetup, Judging, Metering, Resolver
from gil_core.settings import ClientParts, load_settings
from gil_core.storage import is_object_store, load_s3_settings
from gil_core.taskfile import ModelSpec, TaskFile
from gil_core.telemetry import EnergyModel, TelemetryStore
from gil_core.testing import HashEmbeddingModel

__all__ = ["Runtime", "client_parts", "issue_task_queue", "open_learner", "open_runtime"]


@dataclass
class Runtime:
    """A task file opened: everything a flow or a CLI command needs."""

    task_file: TaskFile
    store: TelemetryStore
    resolver: Resolver
    memory: Memory | None
    chat_model_name: str
    embedder: EmbeddingModel | None = None

    @property
    def task(self) -> Any:
        return self.task_file.task


def _api_key(spec: ModelSpec) -> str | None:
    if spec.api_key_env is None:
        return None
    key = os.environ.get(spec.api_key_env)
    if key is None:
        raise ConfigurationError(f"the environment variable {spec.api_key_env} (api_key_env) is not set")
    return key


def _provider(spec: ModelSpec) -> str:
    """The rate limiter's bucket: the server a remote model lives on, or ``local``."""
    if spec.kind != "remote" or spec.url is None:
        return spec.kind
    import httpx  # a remote model's path only (httpx is imported by its adapter anyway)

    url = httpx.URL(spec.url)
    return f"{url.host}:{url.port}" if url.port else url.host


def client_parts(task_file: TaskFile) -> ClientParts:
    """The request cache, rate limiter and operation log the settings (``GIL_*``) and the task file's
    ``client`` key switch on. The loopback local server gets no limiter: it queues its own requests."""
    settings = load_settings(**task_file.client)
    if task_file.chat_model.kind == "local" and "requests_per_second" not in task_file.client:
        settings = load_settings(**{**task_file.client, "requests_per_second": 0})
    return ClientParts.from_settings(settings)


class _OnDemandChatModel:
    """The embedded local model, its server started (or a running one reused) on the first request: a command
    that never asks the model anything (a memory hit, feedback, a rebuild, a review) starts no server."""

    def __init__(self, stack: AsyncExitStack) -> None:
        from gil_core.local import find_smollm2_gguf  # the optional extra: imported only when asked for

        self._stack = stack
        self._name = find_smollm2_gguf().stem  # the name the server answers to (LocalLLMServer.model)
        self._model: ChatModel | None = None
        self._starting = asyncio.Lock()

    @property
    def name(self) -> str:
        return self._name

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_logprobs: int = 0,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Completion:
        model = await self._started()
        return await model.complete(
            messages, max_tokens=max_tokens, temperature=temperature, top_logprobs=top_logprobs, extra_body=extra_body
        )

    async def _started(self) -> ChatModel:
        async with self._starting:
            if self._model is None:
                from gil_core.llm.openai_compat import OpenAICompatibleChatModel
                from gil_core.local import LocalLLMServer

                server = await asyncio.to_thread(LocalLLMServer.ensure)
                self._model = await self._stack.enter_async_context(
                    OpenAICompatibleChatModel(server.base_url, server.model)
                )
            return self._model


class _OnDemandEmbeddingModel:
    """The embedded MiniLM, loaded on the first texts it embeds: a command that never embeds loads nothing."""

    def __init__(self) -> None:
        self._model: EmbeddingModel | None = None
        self._loading = asyncio.Lock()

    @property
    def name(self) -> str:
        from gil_core.local import MINILM_NAME

        return MINILM_NAME

    async def embed(self, texts: Sequence[str]) -> Embeddings:
        async with self._loading:
            if self._model is None:
                from gil_core.local import MiniLMEmbeddingModel

                self._model = await asyncio.to_thread(MiniLMEmbeddingModel)
        return await self._model.embed(texts)


async def _chat_model(spec: ModelSpec, stack: AsyncExitStack) -> ChatModel:
    if spec.kind == "local":
        return _OnDemandChatModel(stack)
    from gil_core.llm.openai_compat import OpenAICompatibleChatModel  # httpx: only for a model served over HTTP

    assert spec.url is not None and spec.name is not None
    return await stack.enter_async_context(OpenAICompatibleChatModel(spec.url, spec.name, api_key=_api_key(spec)))


async def _embedding_model(spec: ModelSpec, stack: AsyncExitStack) -> EmbeddingModel | None:
    if spec.kind == "none":
        return None
    if spec.kind == "hash":
        return HashEmbeddingModel()
    if spec.kind == "local":
        return _OnDemandEmbeddingModel()
    from gil_core.llm.openai_compat import OpenAICompatibleEmbeddingModel  # as in _chat_model

    assert spec.url is not None and spec.name is not None
    return await stack.enter_async_context(OpenAICompatibleEmbeddingModel(spec.url, spec.name, api_key=_api_key(spec)))


@asynccontextmanager
async def open_runtime(
    task_file: TaskFile, *, energy: EnergyModel | None = None, chat: ChatModel | None = None
) -> AsyncIterator[Runtime]:
    """Open the task file's models, memory and store. ``chat`` replaces the named chat model (tests, benchmarks).

    Calls are priced with ``energy``, else with the coefficients last fitted into the store, else by tokens.
    A store or memory at an ``s3://`` URI is reached with the ``GIL_S3_*`` settings of this process, read once
    here: each process (a Dask worker too) takes endpoint and keys from its own environment, never from a caller.
    """
    async with AsyncExitStack() as stack:
        s3 = load_s3_settings() if is_object_store(task_file.store) or is_object_store(task_file.memory) else None
        store = TelemetryStore(task_file.store, s3=s3)
        prices = energy or load_fitted_energy(store) or EnergyModel.tokens()
        chat_model = chat or await _chat_model(task_file.chat_model, stack)
        embedder = await _embedding_model(task_file.embedding_model, stack)
        memory: Memory | None = None
        # One recorded embedder for memory and the judges, keeping each request's vector for its trace: a
        # request is embedded once, whoever asks first.
        requests = TraceVectorCache(EmbeddingRecorder(embedder, sink=store, energy=prices)) if embedder else None
        if requests is not None and task_file.task.policy.memory_threshold is not None:
            # The breaker spares a failing embedding endpoint: after a failed lookup, lookups are misses without a
            # request until its cooldown ends (memory is a cache in front of the tree; a miss costs no answer).
            # Verdicts are still learnt (tried every time): they are rare, and memory must agree with them.
            memory = CircuitBreakingMemory(
                LanceDBMemory(task_file.memory, requests, s3=s3),
                guard_writes=False,
            )
        fallback = (
            await _chat_model(task_file.fallback_chat_model, stack)
            if task_file.fallback_chat_model is not None
            else None
        )
        resolver = Resolver(
            chat_model,
            store,
            memory=memory,
            reflex_embedder=requests,
            client=ClientSetup(client_parts(task_file), provider=_provider(task_file.chat_model), fallback=fallback),
            judging=Judging(order_seed=task_file.order_seed),
            metering=Metering(energy=prices),
        )
        yield Runtime(task_file, store, resolver, memory, chat_model.name, embedder)


@asynccontextmanager
async def open_learner(task_file: TaskFile, *, energy: EnergyModel | None = None) -> AsyncIterator[Learner]:
    """The task's learned judges over its store and embedder only: no chat model is started (refits and reports
    need none). ``ConfigurationError`` when the task file names no embedder."""
    async with AsyncExitStack() as stack:
        s3 = load_s3_settings() if is_object_store(task_file.store) else None
        store = TelemetryStore(task_file.store, s3=s3)
        embedder = await _embedding_model(task_file.embedding_model, stack)
        if embedder is None:
            raise ConfigurationError(f"{task_file.path}: learned_reflex needs an embedding_model, and it is none")
        prices = energy or load_fitted_energy(store) or EnergyModel.tokens()
        yield Learner(store, TraceVectorCache(EmbeddingRecorder(embedder, sink=store, energy=prices)))


def load_fitted_energy(store: TelemetryStore) -> EnergyModel | None:
    """The coefficients ``fit-energy`` last stored in ``store_meta``, if any. A stored value that is not the JSON
    of an ``EnergyModel`` (edited by hand, written by another version) raises ``TelemetryError`` naming the key:
    fit the model again (``gil fit-energy``)."""
    meta = store.read("store_meta")
    rows = meta.filter(meta["key"] == ENERGY_META_KEY)
    if rows.is_empty():
        return None
    try:
        values = json.loads(rows["value"][0])
        return EnergyModel(**values)
    except (ValueError, TypeError, RecursionError, ConfigurationError) as exc:
        raise TelemetryError(
            f"table 'store_meta' at {store.location}: key {ENERGY_META_KEY!r} holds no energy model "
            f"({type(exc).__name__}: {exc}); run gil fit-energy again"
        ) from exc


async def issue_task_queue(
    task_file: TaskFile, *, size: int, random_share: float = DEFAULT_RANDOM_SHARE, peek: bool = False
) -> FeedbackQueue:
    """Issue a queue for the task of ``task_file``, ranked by its learned judge's current state (refit first when
    the log moved on; no chat model is started); with ``peek``, show one without issuing it (recorded as a peek,
    ``gil_core.learned.queue``). ``LearnedStateError`` when the task has no learned_reflex."""
    task = task_file.task
    if task.policy.learned is None:
        raise LearnedStateError(f"{task_file.path}: the task has no learned_reflex (see README, Task file)")
    async with open_learner(task_file) as learner:
        state = await learner.refresh(task)
    store = TelemetryStore(task_file.store)
    return issue_queue(store, task.name, task.tree, state, size=size, random_share=random_share, peek=peek)
