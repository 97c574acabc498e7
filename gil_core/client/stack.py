"""Assembling the client decorators around one ``ChatModel`` in the order their rules need.

Outside in: cache → operation log → limiter (with its fallback) → the model. The cache is outermost so a hit
costs no tokens, waits on no limiter and is not logged as a model call; the log sits outside the limiter so a
refused or failed call is logged too, and the model it names is the one that answered. Wrap ``model`` in a
``CallRecorder`` first to price the calls that reach the provider.
"""

from __future__ import annotations

from gil_core.client.cache import CachingChatModel, RequestCache
from gil_core.client.limiter import LimitedChatModel, RateLimiter
from gil_core.client.oplog import LoggedChatModel, OperationLog
from gil_core.fallback.contracts import Contract
from gil_core.language import ENGLISH, PromptLanguage
from gil_core.llm.ports import ChatModel

__all__ = ["build_chat_stack"]


def build_chat_stack(
    model: ChatModel,
    *,
    provider: str,
    tenant: str,
    schema: str,
    cache: RequestCache | None = None,
    cache_ttl: float | None = None,
    contract: Contract | None = None,
    language: PromptLanguage = ENGLISH,
    log: OperationLog | None = None,
    limiter: RateLimiter | None = None,
    fallback: ChatModel | None = None,
) -> ChatModel:
    """``model`` wrapped in each decorator whose part is given; with none given, ``model`` itself."""
    stacked = model
    if limiter is not None or fallback is not None:
        stacked = LimitedChatModel(stacked, limiter, provider, fallback=fallback, tenant=tenant)
    if log is not None:
        stacked = LoggedChatModel(stacked, log, provider=provider, task=tenant)
    if cache is not None:
        stacked = CachingChatModel(
            stacked, cache, tenant=tenant, schema=schema, contract=contract, language=language, ttl=cache_ttl
        )
    return stacked
