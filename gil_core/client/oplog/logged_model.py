"""``LoggedChatModel``: a ``ChatModel`` decorator that writes one operation log entry per call.

Success or failure, each call through it becomes one entry (a failed call is logged, then its error is raised
again). ``call_options(do_not_record=True)`` keeps a call out entirely; ``intent``, ``target_type``, ``tags``
and ``attempt`` come from ``call_options`` too. An error while recording is logged as a warning and never
fails the call: the log is a record of the work, not part of it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from gil_core.client.oplog.ports import INPUT_PREVIEW_CHARS, OperationEntry, OperationLog
from gil_core.client.options import CallOptions, current_call_options
from gil_core.llm.ports import ChatModel, Completion, Message
from gil_core.telemetry.records import utc_now

__all__ = ["LoggedChatModel", "input_preview"]

_log = logging.getLogger(__name__)


def input_preview(messages: Sequence[Message]) -> str:
    """The messages as ``role: content`` paragraphs, cut to the first ``INPUT_PREVIEW_CHARS`` characters."""
    return "\n\n".join(f"{message['role']}: {message['content']}" for message in messages)[:INPUT_PREVIEW_CHARS]


class LoggedChatModel:
    """``inner`` with every call written to ``log``, attributed to ``provider`` and made for ``task`` (the
    tenant: each entry carries it, so a read for one task never returns another's calls); ``target_type`` and
    ``tags`` are the defaults for calls whose ``call_options`` name none (options' tags are added to these)."""

    def __init__(
        self,
        inner: ChatModel,
        log: OperationLog,
        *,
        provider: str,
        task: str | None = None,
        target_type: str | None = None,
        tags: Sequence[str] = (),
    ) -> None:
        self._inner = inner
        self._log = log
        self._provider = provider
        self._task = task
        self._target_type = target_type
        self._tags = tuple(tags)

    @property
    def name(self) -> str:
        return self._inner.name

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
        call = self._inner.complete(
            messages, max_tokens=max_tokens, temperature=temperature, top_logprobs=top_logprobs, extra_body=extra_body
        )
        if options.do_not_record:
            return await call
        created_at = utc_now()
        started = time.perf_counter()
        try:
            completion = await call
        except Exception as error:
            await self._record(options, messages, created_at, started, None, error)
            raise
        await self._record(options, messages, created_at, started, completion, None)
        return completion

    async def _record(
        self,
        options: CallOptions,
        messages: Sequence[Message],
        created_at: datetime,
        started: float,
        completion: Completion | None,
        error: Exception | None,
    ) -> None:
        usage = completion.usage if completion is not None else None
        entry = OperationEntry(
            entry_id=uuid.uuid4().hex,
            created_at=created_at,
            intent=options.intent,
            input_preview=input_preview(messages),
            output=completion.content if completion is not None else "",
            target_type=options.target_type or self._target_type,
            success=completion is not None,
            attempts=options.attempt,
            provider=self._provider,
            model=(completion.model if completion is not None else "") or self._inner.name,
            prompt_tokens=usage.prompt_tokens if usage is not None else 0,
            completion_tokens=usage.completion_tokens if usage is not None else 0,
            duration_ms=(time.perf_counter() - started) * 1000.0,
            tags=(*self._tags, *(tag for tag in options.tags if tag not in self._tags)),
            error=f"{type(error).__name__}: {error}" if error is not None else None,
            task=self._task,
        )
        try:
            await self._log.record(entry)
        except Exception:  # any log's failure: the call's own outcome must stand
            _log.warning("operation log: recording a call failed; the call goes on", exc_info=True)
