"""Model ports (chat, embeddings), their OpenAI-compatible adapters, and the call recorder."""

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
