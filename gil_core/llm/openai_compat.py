"""Chat and embedding adapters for any OpenAI-compatible HTTP endpoint (llama.cpp, vLLM, Ollama, hosted APIs).

This is the one place that knows the wire format. Every transport or protocol failure leaves it as a typed
``ModelError`` naming the endpoint and the cause; transient failures (429 honouring ``Retry-After``,
500/502/503/504, refused connections) are retried with tenacity first: callers get a reply or one error.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import json
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity import wait_exponential_jitter as _wait_exponential_jitter

from gil_core.errors import (
    BadResponseError,
    ConfigurationError,
    ModelError,
    ModelUnavailableError,
    RateLimitedError,
)
from gil_core.llm._endpoint import Endpoint
from gil_core.llm.options import current_call_options
from gil_core.llm.ports import Completion, Embeddings, Message, ServerTimings, TokenLogprob, Usage

__all__ = ["MAX_REPLY_BYTES", "OpenAICompatibleChatModel", "OpenAICompatibleEmbeddingModel"]

_log = logging.getLogger(__name__)

_RETRIED_STATUSES = frozenset({500, 502, 503, 504})
# A connect failure means the request never reached the server, so repeating it cannot do work twice.
_RETRIED_TRANSPORT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout)
_MAX_QUOTED_BODY = 300
_MAX_ERROR_BODY = 64 * 1024  # of an error status's body: it is only quoted (300 characters of it)
# httpx's own timeouts (connect, each read) are ``timeout``: they fire first where they apply, and this bound on a
# whole attempt catches what they cannot, a reply that keeps arriving a byte at a time.
_ATTEMPT_DEADLINE_FACTOR = 1.5
MAX_REPLY_BYTES = 32 * 1024 * 1024
"""The largest reply body read by default: an embeddings reply for 1,000 texts of 1,536 dimensions is ~30 MB."""

_T = TypeVar("_T")


def _deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``: nested mappings merge key by key, any other value replaces."""
    merged = dict(base)
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            merged[key] = _deep_merge(current, value)
        else:
            merged[key] = value
    return merged


def _parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from ``Retry-After`` (delta-seconds or HTTP-date); None if absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


@functools.cache
def _default_ssl_context() -> ssl.SSLContext:
    # Loading the CA bundle costs ~30 ms; one context shared by every adapter's own client pays it once.
    return httpx.create_ssl_context()


def _is_retried(error: BaseException) -> bool:
    """Whether tenacity should try again after ``error`` (raised by one attempt)."""
    if isinstance(error, RateLimitedError):
        return True
    if isinstance(error, ModelUnavailableError):
        return error.status in _RETRIED_STATUSES or isinstance(error.__cause__, _RETRIED_TRANSPORT_ERRORS)
    return False


class _WaitRetryAfterOrBackoff:
    """Tenacity wait: the server's ``Retry-After`` when it gave one, else exponential backoff with jitter."""

    def __init__(self, max_wait: float) -> None:
        self._max_wait = max_wait
        self._backoff = _wait_exponential_jitter(multiplier=0.5, max=max_wait, jitter=0.5)

    def __call__(self, state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, RateLimitedError) and error.retry_after is not None:
            return min(error.retry_after, self._max_wait)
        return self._backoff(state)


class _OpenAICompatibleClient:
    """What both adapters share: configuration, one retried JSON POST, error translation, lifecycle.

    ``timeout`` bounds each wait (connecting, each read), and ``1.5 * timeout`` each attempt whole, from
    connecting to the last byte of the reply, so a server that drips its reply cannot keep it going; a call
    therefore ends within ``1.5 * timeout * max_attempts`` plus the retry waits (each at most
    ``max_retry_wait``). A reply body past ``max_reply_bytes`` is refused as it arrives.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_attempts: int = 4,
        max_retry_wait: float = 30.0,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        client: httpx.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, got {max_attempts}")
        if timeout <= 0 or max_retry_wait < 0:
            raise ConfigurationError(f"timeout must be > 0 and max_retry_wait >= 0 ({timeout}, {max_retry_wait})")
        if max_reply_bytes < 1:
            raise ConfigurationError(f"max_reply_bytes must be at least 1, got {max_reply_bytes}")
        self._endpoint = Endpoint.parse(base_url, api_key=api_key)
        self._model = model
        self._api_key = api_key
        self._timeout = timeout
        self._deadline = timeout * _ATTEMPT_DEADLINE_FACTOR
        self._max_attempts = max_attempts
        self._max_retry_wait = max_retry_wait
        self._max_reply_bytes = max_reply_bytes
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient(verify=_default_ssl_context())
        self._sleep = sleep

    @property
    def name(self) -> str:
        """The model name sent with each request and recorded with each call."""
        return self._model

    def __repr__(self) -> str:
        # The api key and the URL's own secrets stay out on purpose: reprs end up in logs and tracebacks.
        return f"{type(self).__name__}(base_url={self._endpoint.show('')!r}, model={self._model!r})"

    async def aclose(self) -> None:
        """Close the HTTP client if this adapter created it (a client passed in belongs to the caller)."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _post_json(self, path: str, body: Mapping[str, Any]) -> tuple[dict[str, Any], float, str]:
        """POST ``body`` to ``path`` with retries; the reply's JSON object, the last attempt's ms, and the URL as
        messages show it."""
        retrying = AsyncRetrying(
            sleep=self._sleep,
            stop=stop_after_attempt(self._max_attempts),
            wait=_WaitRetryAfterOrBackoff(self._max_retry_wait),
            retry=retry_if_exception(_is_retried),
            before_sleep=self._log_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                data, latency_ms = await self._post_once(path, body)
                return data, latency_ms, self._endpoint.show(path)
        raise AssertionError("tenacity ends with a result or reraises")  # pragma: no cover

    async def _post_once(self, path: str, body: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
        url, shown = f"{self._endpoint.base}{path}", self._endpoint.show(path)
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        auth = self._endpoint.auth or httpx.USE_CLIENT_DEFAULT
        started = time.perf_counter()
        replied: list[httpx.Response] = []  # the response once its headers are in: a deadline then cut its body
        try:
            async with (
                asyncio.timeout(self._deadline),
                self._client.stream(
                    "POST", url, json=body, headers=headers, params=self._endpoint.params, auth=auth,
                    timeout=self._timeout,
                ) as response,
            ):  # fmt: skip
                replied.append(response)
                content = await self._read_body(shown, response)
        except httpx.TimeoutException as exc:
            raise self._error(
                ModelUnavailableError, shown, f"no reply within {self._timeout:g} s ({type(exc).__name__})"
            ) from exc
        except TimeoutError as exc:
            reason = (
                f"the reply did not finish within {self._deadline:g} s (it was still arriving: the server sends "
                "too slowly)"
                if replied
                else f"no reply within {self._deadline:g} s"
            )
            raise self._error(ModelUnavailableError, shown, reason) from exc
        except httpx.TransportError as exc:
            raise self._error(
                ModelUnavailableError, shown, f"cannot reach the server ({type(exc).__name__}: {exc})"
            ) from exc
        except httpx.HTTPError as exc:
            raise self._error(BadResponseError, shown, f"unreadable reply ({type(exc).__name__}: {exc})") from exc
        latency_ms = (time.perf_counter() - started) * 1000.0
        text = content.decode(response.charset_encoding or "utf-8", errors="replace")
        try:
            response.raise_for_status()
        except httpx.HTTPStatusError as exc:
            raise self._status_error(shown, response, text) from exc
        try:
            data = json.loads(content)
        except (ValueError, RecursionError) as exc:  # json recurses once per nesting level
            raise self._error(BadResponseError, shown, f"reply is not JSON: {self._quote(text)}") from exc
        if not isinstance(data, dict):
            raise self._error(BadResponseError, shown, f"reply is JSON but not an object: {type(data).__name__}")
        return data, latency_ms

    async def _read_body(self, shown: str, response: httpx.Response) -> bytearray:
        """The body, read no further than the cap: ``max_reply_bytes`` for a reply, ``_MAX_ERROR_BODY`` for any
        other status (whose body is only quoted, so the rest is left unread)."""
        quoted_only = not response.is_success
        cap = _MAX_ERROR_BODY if quoted_only else self._max_reply_bytes
        declared = response.headers.get("Content-Length", "")
        if not quoted_only and declared.isdigit() and int(declared) > cap:
            raise self._too_large(shown, int(declared))
        content = bytearray()
        async for chunk in response.aiter_bytes():
            content += chunk
            if len(content) > cap:
                if quoted_only:
                    return content[:cap]
                raise self._too_large(shown)
        return content

    def _too_large(self, shown: str, declared: int | None = None) -> BadResponseError:
        size = f"of {declared:,} bytes " if declared is not None else ""
        reason = f"reply {size}is larger than the cap of {self._max_reply_bytes:,} bytes (max_reply_bytes)"
        return BadResponseError(reason, endpoint=shown)

    def _status_error(self, url: str, response: httpx.Response, text: str) -> ModelError:
        status = response.status_code
        said = f"server said: {self._quote(_error_message(text))}"
        if status == 429:
            retry_after = _parse_retry_after(response.headers.get("Retry-After"))
            return RateLimitedError(self._redact(f"rate limited; {said}"), endpoint=url, retry_after=retry_after)
        if status >= 500:
            return self._error(ModelUnavailableError, url, f"server error; {said}", status=status)
        return self._error(BadResponseError, url, f"request rejected; {said}", status=status)

    def _error(self, kind: type[ModelError], url: str, reason: str, *, status: int | None = None) -> ModelError:
        return kind(self._redact(reason), endpoint=url, status=status)

    def _redact(self, text: str) -> str:
        # Servers and proxies sometimes echo request headers or the URL into error bodies; the api key and the
        # URL's secrets must not travel on, whole or in part.
        return self._endpoint.redact(text)

    def _quote(self, text: str) -> str:
        """The start of a reply body for an error message, redacted before it is cut (a cut first could leave
        half a key); withheld for a do-not-record call, since a server may quote the request back (error
        messages end up in traces, logs and result files)."""
        if current_call_options().do_not_record:
            return f"({len(text)} characters, not quoted: the call is not to be recorded)"
        return repr(self._redact(text)[:_MAX_QUOTED_BODY])

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        _log.debug("attempt %d failed (%s); retrying in %.2f s", state.attempt_number, error, wait)


def _error_message(text: str) -> str:
    """The server's own error message when it sent the OpenAI error shape, else the whole body."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return text
    if isinstance(data, dict):
        error = data.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(message, str):
            return message
    return text


class _ReplyReader:
    """Typed access into a reply; any shape the protocol does not promise becomes ``BadResponseError``."""

    def __init__(self, url: str) -> None:
        self._url = url

    def fail(self, reason: str) -> BadResponseError:
        return BadResponseError(reason, endpoint=self._url)

    def get(self, container: Mapping[str, Any], key: str, kind: type[_T], where: str) -> _T:
        value = container.get(key)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            shown = type(value).__name__ if key in container else "missing"
            raise self.fail(f"reply field {where}.{key} should be {kind.__name__}, got {shown}")
        return value

    def optional(self, container: Mapping[str, Any], key: str, kind: type[_T], where: str) -> _T | None:
        return None if container.get(key) is None else self.get(container, key, kind, where)

    def number(self, container: Mapping[str, Any], key: str, where: str) -> float:
        value = container.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise self.fail(f"reply field {where}.{key} should be a number, got {type(value).__name__}")

    def usage(self, data: Mapping[str, Any]) -> Usage:
        usage = self.optional(data, "usage", dict, "reply")
        if usage is None:
            return Usage()
        details = self.optional(usage, "prompt_tokens_details", dict, "usage") or {}
        return Usage(
            prompt_tokens=self.optional(usage, "prompt_tokens", int, "usage") or 0,
            completion_tokens=self.optional(usage, "completion_tokens", int, "usage") or 0,
            cached_tokens=self.optional(details, "cached_tokens", int, "usage.prompt_tokens_details") or 0,
        )

    def timings(self, data: Mapping[str, Any]) -> ServerTimings | None:
        timings = self.optional(data, "timings", dict, "reply")
        if timings is None or "prompt_ms" not in timings or "predicted_ms" not in timings:
            return None
        return ServerTimings(
            prompt_ms=self.number(timings, "prompt_ms", "timings"),
            predicted_ms=self.number(timings, "predicted_ms", "timings"),
        )

    def first_token_alternatives(self, choice: Mapping[str, Any], content: str, asked: int) -> tuple[TokenLogprob, ...]:
        logprobs = self.optional(choice, "logprobs", dict, "choices[0]")
        tokens = self.optional(logprobs, "content", list, "choices[0].logprobs") if logprobs else None
        if not tokens:
            # A reply that generated no token has no first token to describe; anything else lacks logprobs.
            if asked > 0 and not (tokens is not None and content == ""):
                raise self.fail(f"no logprobs in the reply although top_logprobs={asked} was asked")
            return ()
        first = tokens[0]
        if not isinstance(first, dict):
            raise self.fail("reply field choices[0].logprobs.content[0] should be an object")
        where = "choices[0].logprobs.content[0].top_logprobs"
        alternatives: list[TokenLogprob] = []
        for entry in self.get(first, "top_logprobs", list, "choices[0].logprobs.content[0]"):
            if not isinstance(entry, dict):
                raise self.fail(f"reply field {where} should hold objects")
            token = self.get(entry, "token", str, where)
            logprob = None if entry.get("logprob") is None else self.number(entry, "logprob", where)
            alternatives.append(TokenLogprob(token=token, logprob=logprob))
        return tuple(alternatives)


class OpenAICompatibleChatModel(_OpenAICompatibleClient):
    """``ChatModel`` over ``POST {base_url}/chat/completions``."""

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_logprobs: int = 0,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Completion:
        """Complete ``messages``; ``extra_body`` is deep-merged over the fields set here (it wins).

        ``latency_ms`` is the round trip of the attempt that produced the reply, without earlier attempts or
        retry waits, so it lines up with the server's ``timings``.
        """
        body: dict[str, Any] = {
            "model": self._model,
            "messages": [dict(message) for message in messages],
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        if top_logprobs > 0:
            body |= {"logprobs": True, "top_logprobs": top_logprobs}
        if extra_body:
            body = _deep_merge(body, extra_body)
        # What the server was finally asked for decides whether logprobs must come back.
        asked = body.get("top_logprobs") if body.get("logprobs") is True else 0
        asked = asked if isinstance(asked, int) else 0
        data, latency_ms, url = await self._post_json("/chat/completions", body)
        read = _ReplyReader(url)
        choices = read.get(data, "choices", list, "reply")
        if not choices or not isinstance(choices[0], dict):
            raise read.fail("reply field reply.choices should hold at least one object")
        choice: dict[str, Any] = choices[0]
        message = read.get(choice, "message", dict, "choices[0]")
        content = read.optional(message, "content", str, "choices[0].message") or ""
        return Completion(
            content=content,
            top_logprobs=read.first_token_alternatives(choice, content, asked),
            usage=read.usage(data),
            timings=read.timings(data),
            model=read.optional(data, "model", str, "reply") or self._model,
            finish_reason=read.optional(choice, "finish_reason", str, "choices[0]"),
            latency_ms=latency_ms,
            raw=data,
        )


class OpenAICompatibleEmbeddingModel(_OpenAICompatibleClient):
    """``EmbeddingModel`` over ``POST {base_url}/embeddings``."""

    async def embed(self, texts: Sequence[str]) -> Embeddings:
        """Vectors in the order of ``texts`` (the reply is sorted by ``index``); no request for no texts."""
        if not texts:
            return Embeddings(vectors=(), model=self._model)
        data, latency_ms, url = await self._post_json("/embeddings", {"model": self._model, "input": list(texts)})
        read = _ReplyReader(url)
        by_index: dict[int, tuple[float, ...]] = {}
        for item in read.get(data, "data", list, "reply"):
            if not isinstance(item, dict):
                raise read.fail("reply field reply.data should hold objects")
            vector = read.get(item, "embedding", list, "data[]")
            if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in vector):
                raise read.fail("reply field data[].embedding should hold numbers")
            by_index[read.get(item, "index", int, "data[]")] = tuple(float(x) for x in vector)
        if sorted(by_index) != list(range(len(texts))):
            raise read.fail(f"reply has indexes {sorted(by_index)} for {len(texts)} texts")
        return Embeddings(
            vectors=tuple(by_index[i] for i in range(len(texts))),
            usage=read.usage(data),
            model=read.optional(data, "model", str, "reply") or self._model,
            latency_ms=latency_ms,
        )
