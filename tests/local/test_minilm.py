"""The offline MiniLM embedder: real vectors from the int8 ONNX model the `local` extra ships."""

from __future__ import annotations

import asyncio
import math

import pytest

from gil_core.llm import EmbeddingModel
from gil_core.local import MINILM_DIMENSIONS, MiniLMEmbeddingModel

pytestmark = pytest.mark.local_model

PASSWORD = "How do I reset my password?"
PASSWORD_AGAIN = "I forgot my password, how can I change it?"
UNRELATED = "What time does the store open on Sundays?"


@pytest.fixture(scope="module")
def model() -> MiniLMEmbeddingModel:
    return MiniLMEmbeddingModel()


def cosine(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_it_is_an_embedding_model(model: MiniLMEmbeddingModel) -> None:
    assert isinstance(model, EmbeddingModel)
    assert model.name == "all-MiniLM-L6-v2-int8"


async def test_paraphrases_are_closer_than_unrelated_sentences(model: MiniLMEmbeddingModel) -> None:
    password, again, unrelated = (await model.embed([PASSWORD, PASSWORD_AGAIN, UNRELATED])).vectors
    assert cosine(password, again) > 0.6
    assert cosine(password, again) > cosine(password, unrelated) + 0.3


async def test_vectors_have_384_dimensions_and_unit_length(model: MiniLMEmbeddingModel) -> None:
    embeddings = await model.embed([PASSWORD, "", "x" * 3000])
    assert [len(vector) for vector in embeddings.vectors] == [MINILM_DIMENSIONS] * 3
    assert all(math.isclose(math.fsum(x * x for x in vector), 1.0, abs_tol=1e-5) for vector in embeddings.vectors)


async def test_the_same_text_gets_the_same_vector_whatever_its_batch(model: MiniLMEmbeddingModel) -> None:
    alone = (await model.embed([PASSWORD])).vectors[0]
    again = (await model.embed([PASSWORD])).vectors[0]
    long_text = "Please help me, my parcel was damaged and the box was open when it arrived. " * 5
    in_a_batch = (await model.embed([long_text, UNRELATED, PASSWORD, "hi"])).vectors[2]
    assert alone == again
    assert max(abs(x - y) for x, y in zip(alone, in_a_batch, strict=True)) < 1e-5


async def test_vectors_come_back_in_the_order_of_the_texts_across_batches() -> None:
    small_batches = MiniLMEmbeddingModel(batch_size=2)
    texts = [UNRELATED, "a much longer sentence about refunds, invoices and payment methods", PASSWORD, "ok", "yes"]
    together = (await small_batches.embed(texts)).vectors
    one_by_one = [(await small_batches.embed([text])).vectors[0] for text in texts]
    for joint, single in zip(together, one_by_one, strict=True):
        assert max(abs(x - y) for x, y in zip(joint, single, strict=True)) < 1e-5


async def test_usage_counts_the_word_pieces_read_up_to_the_truncation_limit(model: MiniLMEmbeddingModel) -> None:
    # [CLS] hello world [SEP] = 4; an over-long text is cut at the model's 256 positions.
    assert (await model.embed(["hello world"])).usage.prompt_tokens == 4
    assert (await model.embed(["hello world", "hello world"])).usage.prompt_tokens == 8
    assert (await model.embed(["word " * 1000])).usage.prompt_tokens == 256
    embeddings = await model.embed([PASSWORD])
    assert embeddings.model == model.name and embeddings.latency_ms > 0


async def test_no_texts_cost_nothing(model: MiniLMEmbeddingModel) -> None:
    embeddings = await model.embed([])
    assert embeddings.vectors == () and embeddings.usage.prompt_tokens == 0


async def test_inference_runs_off_the_event_loop(model: MiniLMEmbeddingModel) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await model.embed([f"sentence number {i} about an order that has not arrived yet" for i in range(300)])
    ticker.cancel()
    assert ticks > 5
