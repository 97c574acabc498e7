"""The script a fake answers from: the queue of scripted replies shared by the in-process model and the HTTP
server, and what a queued reply or failure becomes (the ``Completion`` or the typed error the real adapter gives)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from gil_core.errors import BadResponseError, ModelError, ModelUnavailableError, RateLimitedError
from gil_core.llm.ports import Completion, ServerTimings, TokenLogprob, Usage

__all__ = ["FailureKind", "ScriptedReply"]

FailureKind = Literal[
    "refuse", "hang", "drip", "huge", "garbage", "no_logprobs", "empty", "truncated",
    "400", "401", "404", "429", "500", "502", "503", "504",
]  # fmt: skip
"""What ``enqueue_failure`` can script; the numbers are HTTP statuses answered with an OpenAI error body.
"drip" sends a 200 and then its body one byte at a time, never finishing; "huge" a 200 whose body runs to
hundreds of MB, without a length (``ScriptedOpenAIServer``'s ``drip_seconds`` and ``huge_bytes``)."""

# "auto" timings: roughly a small model on a CPU, so energy fits over fake traffic see plausible magnitudes.
_PROMPT_MS_PER_TOKEN = 1.0
_PREDICTED_MS_PER_TOKEN = 10.0


@dataclass(frozen=True, slots=True)
class ScriptedReply:
    """One successful chat reply to script.

    ``top_logprobs`` None means "certain of its content": the content itself with logprob 0.0 (when asked).
    ``usage`` None counts words as tokens; ``timings`` "auto" derives llama.cpp-style timings from the usage.
    ``omit_logprobs`` leaves logprobs out even when asked, as servers without logprob support do.
    """

    content: str = ""
    top_logprobs: Sequence[tuple[str, float | None]] | None = None
    usage: Usage | None = None
    timings: ServerTimings | Literal["auto"] | None = "auto"
    finish_reason: str | None = "stop"
    omit_logprobs: bool = False


@dataclass(frozen=True, slots=True)
class _Failure:
    kind: FailureKind
    retry_after: float | str | None = None

    def to_error(self, endpoint: str) -> ModelError:
        """The error the HTTP adapter would raise after this failure (for the in-process fake)."""
        if self.kind == "429":
            retry_after = float(self.retry_after) if isinstance(self.retry_after, int | float) else None
            return RateLimitedError("rate limited (scripted)", endpoint=endpoint, retry_after=retry_after)
        if self.kind == "garbage":
            return BadResponseError("reply is not JSON (scripted)", endpoint=endpoint)
        if self.kind == "drip":
            return ModelUnavailableError("the reply did not finish (scripted drip)", endpoint=endpoint)
        if self.kind == "huge":
            return BadResponseError("reply is larger than the cap (scripted)", endpoint=endpoint)
        status = int(self.kind) if self.kind.isdigit() else None
        kind = BadResponseError if status is not None and status < 500 else ModelUnavailableError
        return kind(f"scripted failure {self.kind!r}", endpoint=endpoint, status=status)


@dataclass(frozen=True, slots=True)
class _RawReply:
    status: int
    body: Mapping[str, Any] | Sequence[Any] | bytes


_Item = Completion | ScriptedReply | _Failure | _RawReply


def _count_words(texts: Sequence[str]) -> int:
    return sum(len(text.split()) for text in texts)


def _realize(item: Completion | ScriptedReply, prompt: Sequence[str], asked: int, model: str) -> Completion:
    """What the real adapter would return for ``item``: alternatives only when asked, at most ``asked``."""
    if isinstance(item, ScriptedReply):
        usage = item.usage or Usage(prompt_tokens=_count_words(prompt), completion_tokens=_count_words([item.content]))
        timings = item.timings
        if timings == "auto":
            timings = ServerTimings(
                prompt_ms=_PROMPT_MS_PER_TOKEN * usage.prompt_tokens,
                predicted_ms=_PREDICTED_MS_PER_TOKEN * usage.completion_tokens,
            )
        alternatives = tuple(TokenLogprob(token, logprob) for token, logprob in item.top_logprobs or ())
        item = Completion(item.content, alternatives, usage, timings, model, item.finish_reason)
    if asked <= 0 or (item.content == "" and not item.top_logprobs):
        return replace(item, top_logprobs=())
    return replace(item, top_logprobs=(item.top_logprobs or (TokenLogprob(item.content, 0.0),))[:asked])


class _Script:
    """The queue of scripted replies shared by the in-process model and the HTTP server."""

    def __init__(self) -> None:
        self._queue: deque[_Item] = deque()
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        """How many scripted replies are still queued."""
        with self._lock:
            return len(self._queue)

    def enqueue(
        self,
        content: str | Completion | ScriptedReply = "",
        *,
        top_logprobs: Sequence[tuple[str, float | None]] | None = None,
        usage: Usage | None = None,
        timings: ServerTimings | Literal["auto"] | None = "auto",
        finish_reason: str | None = "stop",
    ) -> None:
        """Queue one reply; keywords apply when ``content`` is text (a logprob of None means −∞)."""
        if isinstance(content, str):
            content = ScriptedReply(content, top_logprobs, usage, timings, finish_reason)
        self._push(content)

    def enqueue_failure(self, kind: FailureKind, *, retry_after: float | str | None = None) -> None:
        """Queue one failure (several to test retries); ``retry_after`` (seconds, HTTP-date) is for "429"."""
        if kind not in get_args(FailureKind):
            raise ValueError(f"unknown failure {kind!r}; one of {get_args(FailureKind)}")
        if kind == "empty":
            self._push(ScriptedReply(""))
        elif kind == "truncated":
            self._push(ScriptedReply("The answer is", finish_reason="length"))
        elif kind == "no_logprobs":
            self._push(ScriptedReply("yes", omit_logprobs=True))
        else:
            self._push(_Failure(kind, retry_after))

    def _push(self, item: _Item) -> None:
        with self._lock:
            self._queue.append(item)

    def _take(self, accept: Callable[[_Item], bool]) -> _Item | None:
        with self._lock:
            if self._queue and accept(self._queue[0]):
                return self._queue.popleft()
            return None
