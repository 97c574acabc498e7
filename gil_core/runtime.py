"""Opening what a task file names: the chat model, the embedder, memory and the store, wired into a Resolver.

``open_runtime`` is an async context manager, so local model servers and HTTP clients are closed on the way out.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from gil_core.errors import ConfigurationError
from gil_core.learned import Learner
from gil_core.llm import ChatModel, EmbeddingModel, EmbeddingRecorder, OpenAICompatibleChatModel
from gil_core.llm.openai_compat import OpenAICompatibleEmbeddingModel
from gil_core.llm.trace_vectors import TraceVectorCache
from gil_core.maintenance import ENERGY_META_KEY
from gil_core.memory import CircuitBreakingMemory, LanceDBMemory, Memory
from gil_core.resolver import Resolver
from gil_core.settings import ClientParts, load_settings
from gil_core.storage import is_object_store, load_s3_settings
from gil_core.taskfile import ModelSpec, TaskFile
from gil_core.telemetry import EnergyModel, TelemetryStore
from gil_core.testing import HashEmbeddingModel

__all__ = ["Runtime", "client_parts", "open_learner", "open_runtime"]


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
    url = httpx.URL(spec.url)
    return f"{url.host}:{url.port}" if url.port else url.host


def client_parts(task_file: TaskFile) -> ClientParts:
    """The request cache, rate limiter and operation log the settings (``GIL_*``) and the task file's
    ``client`` key switch on. The loopback local server gets no limiter: it queues its own requests."""
    settings = load_settings(**task_file.client)
    if task_file.chat_model.kind == "local" and "requests_per_second" not in task_file.client:
        settings = load_settings(**{**task_file.client, "requests_per_second": 0})
    return ClientParts.from_settings(settings)


async def _chat_model(spec: ModelSpec, stack: AsyncExitStack) -> ChatModel:
    if spec.kind == "local":
        from gil_core.local import LocalLLMServer  # the optional extra: imported only when asked for

        server = LocalLLMServer.ensure()
        return await stack.enter_async_context(OpenAICompatibleChatModel(server.base_url, server.model))
    assert spec.url is not None and spec.name is not None
    return await stack.enter_async_context(OpenAICompatibleChatModel(spec.url, spec.name, api_key=_api_key(spec)))


async def _embedding_model(spec: ModelSpec, stack: AsyncExitStack) -> EmbeddingModel | None:
    if spec.kind == "none":
        return None
    if spec.kind == "hash":
        return HashEmbeddingModel()
    if spec.kind == "local":
        from gil_core.local import MiniLMEmbeddingModel

        return MiniLMEmbeddingModel()
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
            energy=prices,
            order_seed=task_file.order_seed,
            reflex_embedder=requests,
            client=client_parts(task_file),
            provider=_provider(task_file.chat_model),
            fallback_chat=fallback,
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
    """The coefficients ``fit-energy`` last stored in ``store_meta``, if any."""
    meta = store.read("store_meta")
    rows = meta.filter(meta["key"] == ENERGY_META_KEY)
    if rows.is_empty():
        return None
    values = json.loads(rows["value"][0])
    return EnergyModel(**values)
