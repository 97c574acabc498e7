"""Process settings (environment variables ``GIL_*``) and the client stack they switch on.

Nothing is read from the environment when this module is imported: ``load_settings()`` (or ``GilSettings()``)
reads it when called. ``ClientParts.from_settings`` makes the cache, limiter and operation log the settings ask
for, once, to share between stacks; ``build_chat_model`` wraps a model in them (``gil_core.client.stack``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from gil_core.client import (
    InProcessOperationLog,
    InProcessRequestCache,
    JsonLinesOperationLog,
    OperationLog,
    RateLimiter,
    RequestCache,
    TokenBucketLimiter,
    build_chat_stack,
)
from gil_core.errors import ConfigurationError
from gil_core.fallback.contracts import Contract
from gil_core.language import ENGLISH, PromptLanguage
from gil_core.llm.ports import ChatModel, EmbeddingModel

__all__ = ["IN_PROCESS_LOG", "ClientParts", "GilSettings", "build_chat_model", "load_settings"]

IN_PROCESS_LOG = ":memory:"
"""The ``log_path`` that keeps the operation log in this process instead of under a store root."""


class GilSettings(BaseSettings):
    """Settings of one Gil process; each field reads ``GIL_<FIELD NAME>`` (e.g. ``GIL_CACHE_ENABLED=false``).

    * ``log_path``: the store root the operation log is written under (``<root>/operation_log/``);
      ``":memory:"`` keeps it in process (last ``log_max_entries``, 0 = all); ``""`` turns the log off.
    * ``cache_enabled``, ``cache_capacity``, ``cache_ttl_seconds``: the request cache.
    * ``requests_per_second`` (0 = no limiter), ``burst``, ``limiter_max_wait_seconds``: the rate limiter.
    """

    model_config = SettingsConfigDict(env_prefix="GIL_", frozen=True, extra="forbid")

    log_path: str = ""
    log_max_entries: int = Field(default=10_000, ge=0)
    cache_enabled: bool = True
    cache_capacity: int = Field(default=1_000, ge=1)
    cache_ttl_seconds: float = Field(default=3_600.0, gt=0, allow_inf_nan=False)
    requests_per_second: float = Field(default=5.0, ge=0, allow_inf_nan=False)
    burst: int = Field(default=10, ge=1)
    limiter_max_wait_seconds: float = Field(default=30.0, ge=0, allow_inf_nan=False)


def load_settings(**overrides: Any) -> GilSettings:
    """The settings from the environment now, ``overrides`` winning; invalid ones raise ``ConfigurationError``."""
    try:
        return GilSettings(**overrides)
    except ValidationError as exc:
        raise ConfigurationError(f"invalid Gil settings: {exc}") from exc


@dataclass(frozen=True, slots=True)
class ClientParts:
    """The cache, limiter and log one process shares between its model stacks (None: switched off)."""

    cache: RequestCache | None = None
    limiter: RateLimiter | None = None
    log: OperationLog | None = None

    @classmethod
    def from_settings(
        cls,
        settings: GilSettings,
        *,
        cache: RequestCache | None = None,
        limiter: RateLimiter | None = None,
        log: OperationLog | None = None,
        log_embedder: EmbeddingModel | None = None,
    ) -> ClientParts:
        """The parts ``settings`` switch on. A part given here replaces the built-in one, but only while its
        setting is on: a switched-off part stays off whatever is given. ``log_embedder`` lets the built-in
        log recall by embeddings."""
        if not settings.cache_enabled:
            cache = None
        elif cache is None:
            cache = InProcessRequestCache(settings.cache_capacity, settings.cache_ttl_seconds)
        if settings.requests_per_second == 0:
            limiter = None
        elif limiter is None:
            limiter = TokenBucketLimiter(
                settings.requests_per_second, settings.burst, max_wait=settings.limiter_max_wait_seconds
            )
        if not settings.log_path:
            log = None
        elif log is None and settings.log_path == IN_PROCESS_LOG:
            log = InProcessOperationLog(settings.log_max_entries, embedder=log_embedder)
        elif log is None:
            if "://" in settings.log_path:  # pathlib would fold s3://b/x into a local folder s3:/b/x
                raise ConfigurationError(
                    f"log_path {settings.log_path!r}: the operation log is kept in a local folder; a URI is not one"
                )
            log = JsonLinesOperationLog(settings.log_path, embedder=log_embedder)
        return cls(cache, limiter, log)


def build_chat_model(
    model: ChatModel,
    parts: ClientParts | GilSettings,
    *,
    provider: str,
    tenant: str,
    schema: str,
    contract: Contract | None = None,
    language: PromptLanguage = ENGLISH,
    fallback: ChatModel | None = None,
) -> ChatModel:
    """``model`` behind the parts that are on: cache → operation log → limiter (with ``fallback``) → model.

    Given settings instead of parts, the parts are made for this stack alone; make ``ClientParts`` once to share
    one cache, limiter and log between stacks (one per tenant, say).
    """
    if isinstance(parts, GilSettings):
        parts = ClientParts.from_settings(parts)
    return build_chat_stack(
        model,
        provider=provider,
        tenant=tenant,
        schema=schema,
        cache=parts.cache,
        contract=contract,
        language=language,
        log=parts.log,
        limiter=parts.limiter,
        fallback=fallback,
    )
