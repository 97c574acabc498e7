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

__all__ = [
    "ChatModel",
    "Completion",
    "EmbeddingModel",
    "Embeddings",
    "Message",
    "OpenAICompatibleChatModel",
    "OpenAICompatibleEmbeddingModel",
    "ServerTimings",
    "TokenLogprob",
    "Usage",
]
