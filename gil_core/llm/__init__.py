"""Model ports (chat, embeddings), their OpenAI-compatible adapters, and the call recorder.

The names load on first use: importing a light submodule (``gil_core.llm.options``, ``.ports``) does not pull in
httpx and the telemetry store behind the adapters and the recorder."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gil_core._lazy import lazy_names
from gil_core.llm import ports as _ports

if TYPE_CHECKING:
    from gil_core.llm.openai_compat import OpenAICompatibleChatModel, OpenAICompatibleEmbeddingModel
    from gil_core.llm.ports import (
        ChatModel,
        Completion,
        EmbeddingModel,
        Embeddings,
        Message,
        ServerTimings,
        TokenLogprob,
        Usage,
    )
    from gil_core.llm.recorder import (
        CallRecorder,
        CallScope,
        EmbeddingRecorder,
        call_scope,
        current_trace_id,
        trace_scope,
    )

_HOMES = {
    "gil_core.llm.openai_compat": ("OpenAICompatibleChatModel", "OpenAICompatibleEmbeddingModel"),
    "gil_core.llm.ports": tuple(_ports.__all__),  # light: value objects and protocols only
    "gil_core.llm.recorder": (
        "CallRecorder",
        "CallScope",
        "EmbeddingRecorder",
        "call_scope",
        "current_trace_id",
        "trace_scope",
    ),
}
__all__ = [
    "CallRecorder",
    "CallScope",
    "ChatModel",
    "Completion",
    "EmbeddingModel",
    "EmbeddingRecorder",
    "Embeddings",
    "Message",
    "OpenAICompatibleChatModel",
    "OpenAICompatibleEmbeddingModel",
    "ServerTimings",
    "TokenLogprob",
    "Usage",
    "call_scope",
    "current_trace_id",
    "trace_scope",
]
__getattr__ = lazy_names(__name__, _HOMES, globals())
