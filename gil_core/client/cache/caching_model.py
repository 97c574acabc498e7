"""``CachingChatModel``: a ``ChatModel`` decorator that answers a request it has seen from the request cache.

It sits outside the limiter, the operation log and the call recorder, so a cached answer costs no tokens,
waits on no limiter and is not logged as a model call. What it does per call (see ``call_options``):

* The key hashes tenant, schema, model, messages and parameters: a changed tree (schema) or prompt (messages)
  misses by itself, and two tenants never share an entry.
* Only the first attempt reads; ``bypass_cache`` neither reads nor writes; ``do_not_record`` does not write.
* A stored entry carries a SHA-256 checksum of its body bound to its key; one that fails it (or does not parse)
  is corrupt: discarded, and the model is asked.
* A stored answer is re-validated against the current contract; one that fails is discarded and the fresh
  reply replaces it.
* Refusals, truncated replies (``finish_reason == "length"``), empty replies, replies that break the
  contract, and replies without the logprobs the call asked for (a judge's reply is its logprobs) are never
  stored; a stored reply without them is discarded on read.
* The cache is an optimisation: a cache that fails is logged and counted in ``outcomes()``, never fails a call.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gil_core.client.cache.ports import RequestCache
from gil_core.client.options import CallOptions, current_call_options
from gil_core.errors import ConfigurationError
from gil_core.fallback.contracts import Contract, Violation
from gil_core.language import ENGLISH, PromptLanguage
from gil_core.llm.ports import ChatModel, Completion, Message, TokenLogprob, Usage

__all__ = ["CacheOutcomes", "CachingChatModel", "is_storable", "request_key"]

_log = logging.getLogger(__name__)

_KEY_VERSION = "gil-request-cache/1"
_PAYLOAD_FORMAT = 1
_NOT_STORED_FINISH_REASONS = frozenset({"length", "content_filter"})


def request_key(
    *,
    tenant: str,
    schema: str,
    model: str,
    messages: Sequence[Message],
    params: Mapping[str, Any],
) -> str:
    """The SHA-256 (hex) of the canonical JSON of everything that decides a reply, and of whom it is for."""
    material = {
        "version": _KEY_VERSION,
        "tenant": tenant,
        "schema": schema,
        "model": model,
        "messages": [{"role": message["role"], "content": message["content"]} for message in messages],
        "params": dict(params),
    }
    # default=repr: an exotic value in extra_body still gives a stable key rather than an error.
    text = json.dumps(material, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_storable(completion: Completion) -> bool:
    """Whether a reply may be stored: not empty, not truncated, not a refusal (``content_filter`` or an
    OpenAI ``message.refusal``)."""
    if not completion.content.strip() or completion.finish_reason in _NOT_STORED_FINISH_REASONS:
        return False
    return not _refusal_in(completion.raw)


def _refusal_in(raw: Mapping[str, Any] | None) -> bool:
    choices = raw.get("choices") if raw is not None else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    message = choices[0].get("message")
    return isinstance(message, dict) and bool(message.get("refusal"))


def _encode(key: str, completion: Completion) -> bytes:
    body = json.dumps(
        {
            "content": completion.content,
            "top_logprobs": [[item.token, item.logprob] for item in completion.top_logprobs],
            "model": completion.model,
            "finish_reason": completion.finish_reason,
        },
        ensure_ascii=False,
        sort_keys=True,
        separators=(",", ":"),
    )
    envelope = {"format": _PAYLOAD_FORMAT, "checksum": _checksum(key, body), "body": body}
    return json.dumps(envelope, ensure_ascii=False).encode("utf-8")


def _checksum(key: str, body: str) -> str:
    # Bound to the key, so a payload filed under another request's key is caught as well as a damaged one.
    return hashlib.sha256(f"{key}\n{body}".encode()).hexdigest()


def _decode(key: str, payload: bytes) -> Completion | None:
    """The stored completion, or None when the payload is corrupt in any way."""
    try:
        envelope = json.loads(payload.decode("utf-8"))
        body = envelope["body"]
        if envelope["format"] != _PAYLOAD_FORMAT or envelope["checksum"] != _checksum(key, body):
            return None
        data = json.loads(body)
        return Completion(
            content=data["content"],
            top_logprobs=tuple(TokenLogprob(token, logprob) for token, logprob in data["top_logprobs"]),
            model=data["model"],
            finish_reason=data["finish_reason"],
        )
    except (ValueError, KeyError, TypeError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None


@dataclass
class CacheOutcomes:
    """What the decorator did with its calls (counters since it was made)."""

    hits: int = 0
    misses: int = 0
    stores: int = 0
    not_stored: int = 0
    bypassed: int = 0
    discarded_corrupt: int = 0
    discarded_invalid: int = 0
    cache_errors: int = 0


class CachingChatModel:
    """A ``ChatModel`` answering repeated requests from ``cache``; see the module doc for the rules.

    ``contract`` (overridable per call with ``call_options(contract=...)``) re-validates stored answers in
    ``language``; ``ttl`` None uses the cache's default. A hit returns the stored completion with zero usage,
    no timings, no raw reply and latency 0: it cost nothing.
    """

    def __init__(
        self,
        inner: ChatModel,
        cache: RequestCache,
        *,
        tenant: str,
        schema: str,
        contract: Contract | None = None,
        language: PromptLanguage = ENGLISH,
        ttl: float | None = None,
    ) -> None:
        if not tenant.strip() or not schema.strip():
            raise ConfigurationError(f"a cache scope needs a non-blank tenant and schema ({tenant!r}, {schema!r})")
        self._inner = inner
        self._cache = cache
        self._tenant = tenant
        self._schema = schema
        self._contract = contract
        self._language = language
        self._ttl = ttl
        self._outcomes = CacheOutcomes()

    @property
    def name(self) -> str:
        return self._inner.name

    def outcomes(self) -> CacheOutcomes:
        """A copy of the counters."""
        return replace(self._outcomes)

    def key_for(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_logprobs: int = 0,
        extra_body: Mapping[str, Any] | None = None,
    ) -> str:
        """The cache key of a call with these arguments, in this decorator's tenant and schema."""
        params = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_logprobs": top_logprobs,
            "extra_body": dict(extra_body) if extra_body else None,
        }
        return request_key(
            tenant=self._tenant, schema=self._schema, model=self._inner.name, messages=messages, params=params
        )

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_logprobs: int = 0,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Completion:
        options = current_call_options()
        key: str | None = None
        if options.bypass_cache:
            self._outcomes.bypassed += 1
        else:
            key = self.key_for(
                messages,
                max_tokens=max_tokens,
                temperature=temperature,
                top_logprobs=top_logprobs,
                extra_body=extra_body,
            )
        if key is not None:
            if options.attempt == 1 and (cached := await self._read(key, options, top_logprobs)) is not None:
                self._outcomes.hits += 1
                return cached
            self._outcomes.misses += 1
        completion = await self._inner.complete(
            messages, max_tokens=max_tokens, temperature=temperature, top_logprobs=top_logprobs, extra_body=extra_body
        )
        if key is not None and not options.do_not_record:
            await self._write(key, completion, options, top_logprobs)
        return completion

    async def _read(self, key: str, options: CallOptions, top_logprobs: int) -> Completion | None:
        try:
            payload = await self._cache.get(key)
        except Exception:  # any adapter's failure: the cache must never fail a call
            self._cache_failed("read")
            return None
        if payload is None:
            return None
        stored = _decode(key, payload)
        if stored is None:
            self._outcomes.discarded_corrupt += 1
            _log.warning("request cache entry %s… is corrupt (checksum or format); discarded", key[:12])
            await self._discard(key)
            return None
        if self._violates(stored, options, top_logprobs):
            self._outcomes.discarded_invalid += 1
            await self._discard(key)
            return None
        return replace(stored, usage=Usage(), timings=None, latency_ms=0.0, raw=None)

    async def _write(self, key: str, completion: Completion, options: CallOptions, top_logprobs: int) -> None:
        if not is_storable(completion) or self._violates(completion, options, top_logprobs):
            self._outcomes.not_stored += 1
            return
        try:
            await self._cache.set(key, _encode(key, completion), self._ttl)
        except Exception:  # the reply was paid for: hand it back even when the cache cannot keep it
            self._cache_failed("write")
            return
        self._outcomes.stores += 1

    async def _discard(self, key: str) -> None:
        try:
            await self._cache.delete(key)
        except Exception:
            self._cache_failed("delete")

    def _violates(self, completion: Completion, options: CallOptions, top_logprobs: int) -> bool:
        if top_logprobs > 0 and not completion.top_logprobs:
            return True
        contract = options.contract or self._contract
        return contract is not None and isinstance(contract.validate(completion.content, self._language), Violation)

    def _cache_failed(self, operation: str) -> None:
        self._outcomes.cache_errors += 1
        _log.warning("request cache %s failed; the call goes on without the cache", operation, exc_info=True)
