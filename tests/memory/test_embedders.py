"""CallableEmbeddingModel: any embedding function behind the EmbeddingModel port."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from gil_core.errors import BadResponseError, ModelUnavailableError
from gil_core.llm import EmbeddingModel, EmbeddingRecorder
from gil_core.memory import CallableEmbeddingModel
from gil_core.telemetry import EnergyModel
from tests.memory._support import ListSink


async def test_vectors_come_back_in_order_with_words_counted_off_the_event_loop() -> None:
    threads: list[int] = []

    def encode(texts: list[str]) -> np.ndarray:
        threads.append(threading.get_ident())
        return np.array([[len(text), 1.0] for text in texts], dtype=np.float32)

    model = CallableEmbeddingModel(encode, name="minilm")
    embeddings = await model.embed(["where is my refund", "hi"])
    assert isinstance(model, EmbeddingModel) and model.name == "minilm"
    assert embeddings.vectors == ((18.0, 1.0), (2.0, 1.0))
    assert (embeddings.usage.prompt_tokens, embeddings.model) == (5, "minilm")
    assert threads and threads[0] != threading.get_ident()
    assert (await model.embed([])).vectors == () and len(threads) == 1  # no texts, no call


async def test_a_failing_function_is_model_unavailable_naming_the_callable() -> None:
    def encode(texts: list[str]) -> list[list[float]]:
        raise RuntimeError("CUDA out of memory")

    with pytest.raises(ModelUnavailableError) as caught:
        await CallableEmbeddingModel(encode, name="minilm").embed(["hi"])
    assert caught.value.endpoint == "callable:minilm" and "CUDA out of memory" in str(caught.value)
    assert isinstance(caught.value.__cause__, RuntimeError)


@pytest.mark.parametrize("reply", [[[1.0, 2.0]], [1.0, 2.0], [["a", "b"], ["c", "d"]]])
async def test_a_reply_of_the_wrong_shape_is_a_bad_response(reply: object) -> None:
    model = CallableEmbeddingModel(lambda texts: reply, name="odd")  # type: ignore[arg-type,return-value]
    with pytest.raises(BadResponseError, match="callable:odd"):
        await model.embed(["one", "two"])


async def test_its_calls_are_recorded_like_any_embedding_model() -> None:
    sink = ListSink()
    model = CallableEmbeddingModel(lambda texts: [[1.0, 0.0] for _ in texts], name="local")
    await EmbeddingRecorder(model, sink=sink, energy=EnergyModel.tokens()).embed(["where is my refund"])
    (call,) = sink.calls
    assert (call.role, call.model, call.prompt_tokens) == ("embed", "local", 4)
