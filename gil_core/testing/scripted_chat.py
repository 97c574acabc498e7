"""``ScriptedChatModel``: an in-process ``ChatModel`` answering from a script the way the HTTP adapter would
(logprobs only when asked, typed errors on failure), recording every call it received."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gil_core.errors import BadResponseError, ModelUnavailableError
from gil_core.llm.ports import Completion, Message
from gil_core.testing._script import ScriptedReply, _Failure, _RawReply, _realize, _Script

__all__ = ["ScriptedCall", "ScriptedChatModel"]


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    """One call a ``ScriptedChatModel`` received."""

    messages: tuple[Message, ...]
    kwargs: Mapping[str, Any]


class ScriptedChatModel(_Script):
    """In-process ``ChatModel`` answering from a script, then from ``responder(messages, **kwargs)`` if given: a
    ``Completion``, or a ``ScriptedReply`` (made into one as a queued reply is).

    Failures queued with ``enqueue_failure`` raise the typed error the HTTP adapter raises after its retries.
    """

    def __init__(
        self, *, name: str = "scripted", responder: Callable[..., Completion | ScriptedReply] | None = None
    ) -> None:
        super().__init__()
        self._name = name
        self._responder = responder
        self.history: list[ScriptedCall] = []

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
        """The next scripted reply; ``ModelUnavailableError`` once the script ran out, without a responder."""
        kwargs = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_logprobs": top_logprobs,
            "extra_body": extra_body,
        }
        self.history.append(ScriptedCall(tuple(messages), kwargs))
        endpoint = f"scripted://{self._name}"
        item = self._take(lambda _: True)
        if item is None and self._responder is not None:
            item = self._responder(messages, **kwargs)
        if item is None:
            raise ModelUnavailableError("the script ran out: nothing queued and no responder", endpoint=endpoint)
        if isinstance(item, _Failure):
            raise item.to_error(endpoint)
        if isinstance(item, _RawReply):  # pragma: no cover - only the server queues raw replies
            raise TypeError("raw HTTP replies belong to ScriptedOpenAIServer")
        if isinstance(item, ScriptedReply) and item.omit_logprobs and top_logprobs > 0:
            raise BadResponseError(
                f"no logprobs in the reply although top_logprobs={top_logprobs} was asked", endpoint=endpoint
            )
        return _realize(item, [message["content"] for message in messages], top_logprobs, self._name)
