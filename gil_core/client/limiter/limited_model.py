"""``LimitedChatModel``: a ``ChatModel`` decorator that takes a limiter turn before each call, with a fallback.

Each chat call takes one turn of the provider's bucket (embedding calls do not go through it). A transient
failure (the limiter's refusal, ``ModelUnavailableError``, ``RateLimitedError``) goes to the fallback model
when one is set; the completion's ``model`` names the model that answered. The fallback takes no turn of this
limiter: wrap it in its own ``LimitedChatModel`` to limit it too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gil_core.client.limiter.ports import RateLimiter
from gil_core.errors import ModelUnavailableError, RateLimitedError
from gil_core.llm.ports import ChatModel, Completion, Message

__all__ = ["TRANSIENT_ERRORS", "LimitedChatModel"]

_log = logging.getLogger(__name__)

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (ModelUnavailableError, RateLimitedError)
"""Errors worth sending to another model: the limiter's refusal is a ``RateLimitedError``."""


class LimitedChatModel:
    """``inner`` behind ``limiter``'s bucket for ``provider`` (and ``tenant``'s, when the limiter has one).

    ``limiter`` None keeps only the fallback behaviour (for a stack whose limiter is switched off).
    """

    def __init__(
        self,
        inner: ChatModel,
        limiter: RateLimiter | None,
        provider: str,
        *,
        fallback: ChatModel | None = None,
        tenant: str | None = None,
    ) -> None:
        self._inner = inner
        self._limiter = limiter
        self._provider = provider
        self._fallback = fallback
        self._tenant = tenant

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def provider(self) -> str:
        return self._provider

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_logprobs: int = 0,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Completion:
        async def ask(model: ChatModel) -> Completion:
            completion = await model.complete(
                messages,
                max_tokens=max_tokens,
                temperature=temperature,
                top_logprobs=top_logprobs,
                extra_body=extra_body,
            )
            return completion if completion.model else replace(completion, model=model.name)

        try:
            if self._limiter is not None:
                await self._limiter.acquire(self._provider, tenant=self._tenant)
            return await ask(self._inner)
        except TRANSIENT_ERRORS as error:
            if self._fallback is None:
                raise
            _log.info("%s failed transiently (%s); %s answers instead", self._inner.name, error, self._fallback.name)
            return await ask(self._fallback)
