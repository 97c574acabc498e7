"""Judgment primitives — choose, score, ask — with validated results, over a chat model or over embeddings.

Results are value objects that cannot be built invalid: a ``Choice`` has two or more unique options, one
probability per option summing to 1 (± 1e-6), and its ``selected`` option is the modal one; a ``Score`` is a
finite value from 0 to 100 with a confidence in [0, 1]; a ``YesNo`` is yes or no with a confidence.

How the chat model's reply becomes a result (``ChatPrimitives``): one call, ``max_tokens=1``, read through the
first token's top logprobs, as the single-token judge does. The probability the model put on tokens that are no
valid answer ("off-label mass") says nothing about which answer is right, so it is spread evenly over the
answers ("folded"): a model that mostly answers off-format gets a near-uniform, low-confidence result.

* choose: the judge prompt of ``gil_core.judge`` without its "none of these" line (a choice must pick an
  option), options labelled from the letters scheme's second symbol (B, C, …; at most 25 options).
* score: a digit from 0 to 9; the score is 100 × the expected digit / 9 and the confidence is 1 − σ/4.5 (σ the
  standard deviation of the digit distribution, 4.5 its largest possible value): a reply split between far
  apart digits is unsure even when one digit is likely.
* ask: "yes" or "no" (case and surrounding white space ignored); the confidence is the winner's probability,
  a tie is "no".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np
from cachetools import LRUCache
from numpy.typing import NDArray

from gil_core.errors import BadResponseError, ConfigurationError
from gil_core.judge.distribution import read_distribution
from gil_core.judge.prompt import build_judge_messages
from gil_core.language import ENGLISH, PromptLanguage, fill
from gil_core.llm.ports import ChatModel, EmbeddingModel, Message, TokenLogprob
from gil_core.llm.recorder import call_scope
from gil_core.ontology.labels import LabelScheme
from gil_core.telemetry.records import CandidateShown

__all__ = [
    "ENGLISH_WORDING",
    "PROBABILITY_TOLERANCE",
    "ChatPrimitives",
    "Choice",
    "Chooser",
    "EmbeddingChooser",
    "InvalidJudgmentError",
    "JudgmentPrimitives",
    "PrimitiveSet",
    "PrimitiveWording",
    "Score",
    "Scorer",
    "YesNo",
    "YesNoAsker",
    "check_options",
]

PROBABILITY_TOLERANCE = 1e-6
_TOP_LOGPROBS = 20
_DIGITS = tuple(str(digit) for digit in range(10))
_LARGEST_DIGIT_SPREAD = 4.5  # the standard deviation of half the mass on 0 and half on 9


class InvalidJudgmentError(ConfigurationError):
    """A judgment result (or the options asked about) breaks its invariants; the message says which."""


def _check_unit(value: float, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise InvalidJudgmentError(f"{what} must be a number in [0, 1], got {value!r}")


def check_options(options: Sequence[str]) -> tuple[str, ...]:
    """``options`` as a tuple when there are at least two, all non-blank and unique."""
    options = tuple(options)
    if len(options) < 2:
        raise InvalidJudgmentError(f"a choice needs at least 2 options, got {len(options)}")
    if any(not isinstance(option, str) or not option.strip() for option in options):
        raise InvalidJudgmentError(f"options must be non-blank strings: {options!r}")
    if len(set(options)) != len(options):
        raise InvalidJudgmentError(f"options must be unique: {options!r}")
    return options


@dataclass(frozen=True, slots=True)
class Choice:
    """One of ``options``: the distribution over them and the modal option, ``selected``."""

    options: tuple[str, ...]
    probabilities: tuple[float, ...]
    selected: str

    def __post_init__(self) -> None:
        check_options(self.options)
        if len(self.probabilities) != len(self.options):
            raise InvalidJudgmentError(f"{len(self.probabilities)} probabilities for {len(self.options)} options")
        for probability in self.probabilities:
            _check_unit(probability, "a probability")
        if abs(math.fsum(self.probabilities) - 1.0) > PROBABILITY_TOLERANCE:
            raise InvalidJudgmentError(f"probabilities sum to {math.fsum(self.probabilities)!r}, not 1")
        if self.selected not in self.options:
            raise InvalidJudgmentError(f"selected {self.selected!r} is not an option")
        if self.probabilities[self.options.index(self.selected)] < max(self.probabilities):
            raise InvalidJudgmentError(f"selected {self.selected!r} is not the most probable option")

    @classmethod
    def of(cls, options: Sequence[str], probabilities: Sequence[float]) -> Choice:
        """The choice of the modal option, ties going to the option given first."""
        probabilities = tuple(probabilities)
        best = max(range(len(probabilities)), key=lambda index: (probabilities[index], -index), default=0)
        return cls(tuple(options), probabilities, tuple(options)[best] if options else "")

    @property
    def confidence(self) -> float:
        """The selected option's probability."""
        return self.probabilities[self.options.index(self.selected)]

    @property
    def distribution(self) -> dict[str, float]:
        return dict(zip(self.options, self.probabilities, strict=True))


@dataclass(frozen=True, slots=True)
class Score:
    """A finite value from 0 to 100 and how sure the judge is of it."""

    value: float
    confidence: float

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int | float) or not 0 <= self.value <= 100:
            raise InvalidJudgmentError(f"a score must be a finite number from 0 to 100, got {self.value!r}")
        _check_unit(self.confidence, "a confidence")


@dataclass(frozen=True, slots=True)
class YesNo:
    """Yes (``yes`` True) or no, and how sure the judge is of it."""

    yes: bool
    confidence: float

    def __post_init__(self) -> None:
        if not isinstance(self.yes, bool):
            raise InvalidJudgmentError(f"a verdict is yes or no (a bool), got {self.yes!r}")
        _check_unit(self.confidence, "a confidence")


@runtime_checkable
class Chooser(Protocol):
    async def choose(self, request: str, options: Sequence[str]) -> Choice:
        """Which of ``options`` fits ``request``."""
        ...


@runtime_checkable
class Scorer(Protocol):
    async def score(self, request: str, criterion: str) -> Score:
        """How well ``request`` meets ``criterion``, from 0 to 100."""
        ...


@runtime_checkable
class YesNoAsker(Protocol):
    async def ask(self, request: str, question: str) -> YesNo:
        """The answer to a yes/no ``question`` about ``request``."""
        ...


@runtime_checkable
class JudgmentPrimitives(Chooser, Scorer, YesNoAsker, Protocol):
    """All three primitives: what the router asks its reflex and its deliberate judge."""


@dataclass(frozen=True, slots=True)
class PrimitiveSet:
    """Three primitives from different judges as one, e.g. an ``EmbeddingChooser`` with a small chat model's
    score and ask."""

    chooser: Chooser
    scorer: Scorer
    asker: YesNoAsker

    async def choose(self, request: str, options: Sequence[str]) -> Choice:
        return await self.chooser.choose(request, options)

    async def score(self, request: str, criterion: str) -> Score:
        return await self.scorer.score(request, criterion)

    async def ask(self, request: str, question: str) -> YesNo:
        return await self.asker.ask(request, question)


@dataclass(frozen=True, slots=True)
class PrimitiveWording:
    """The wording of the primitives' prompts. ``language`` frames the request and words the choose prompt
    (its judge system and question); ``choice_line`` takes ``{symbol}`` and ``{label}`` (the option)."""

    language: PromptLanguage
    choice_line: str
    score_system: str
    score_question: str  # {criterion}
    ask_system: str
    ask_question: str  # {question}
    yes: str
    no: str


ENGLISH_WORDING = PrimitiveWording(
    language=ENGLISH,
    choice_line="{symbol}. {label}",
    score_system="You are a careful rater. Reply with exactly one digit and nothing else.",
    score_question=(
        "How well does the request above meet this: {criterion}\n"
        "Rate it from 0 (not at all) to 9 (completely). Reply with one digit only."
    ),
    ask_system="You answer questions about a request. Reply with exactly one word, yes or no, and nothing else.",
    ask_question="{question}\nReply with yes or no only.",
    yes="yes",
    no="no",
)


def _fold(masses: Sequence[float]) -> list[float]:
    """Masses (summing to at most 1) plus an even share of the rest each, renormalised against rounding."""
    total = math.fsum(masses)
    if total > 1.0:  # more than all of it cannot be: renormalise instead of folding
        folded = [mass / total for mass in masses]
    else:
        folded = [mass + (1.0 - total) / len(masses) for mass in masses]
    norm = math.fsum(folded)
    return [value / norm for value in folded]


def _masses(top_logprobs: Sequence[TokenLogprob], answers: Sequence[str]) -> list[float]:
    """The probability on each answer among the first token's alternatives, case and white space ignored."""
    index = {answer.casefold(): position for position, answer in enumerate(answers)}
    masses = [0.0] * len(answers)
    for alternative in top_logprobs:
        position = index.get(alternative.token.strip().casefold())
        if position is not None and alternative.logprob is not None:
            masses[position] += math.exp(alternative.logprob)
    return masses


class ChatPrimitives:
    """Choose, score and ask over one chat model, one single-token call each (see the module doc).

    Calls are made in a ``call_scope("judge")`` annotated with the distribution read, so a ``CallRecorder``
    below records what each call decided.
    """

    def __init__(
        self,
        model: ChatModel,
        wording: PrimitiveWording = ENGLISH_WORDING,
        *,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        self._model = model
        self._wording = wording
        self._extra_body = extra_body
        self._choose_language = replace(wording.language, judge_choice=wording.choice_line)

    async def choose(self, request: str, options: Sequence[str]) -> Choice:
        options = check_options(options)
        scheme = LabelScheme.LETTERS
        if len(options) > scheme.capacity:
            raise InvalidJudgmentError(f"{len(options)} options exceed the {scheme.capacity} labels of one prompt")
        # No "none of these" line: the options take the symbols after the scheme's none symbol.
        symbols = scheme.symbols[1 : len(options) + 1]
        shown = tuple(CandidateShown(option, symbol, option) for option, symbol in zip(options, symbols, strict=True))

        def read(top_logprobs: Sequence[TokenLogprob]) -> list[float]:
            reading = read_distribution(top_logprobs, shown, trust_threshold=0.0)
            return _fold([reading.probs[option] * reading.label_mass for option in options])

        messages = build_judge_messages(self._choose_language, request, shown)
        return Choice.of(options, await self._ask_one_token(messages, options, read))

    async def score(self, request: str, criterion: str) -> Score:
        question = fill(self._wording.score_question, {"criterion": criterion})
        probabilities = await self._ask_for(self._wording.score_system, request, question, _DIGITS)
        mean = math.fsum(digit * p for digit, p in enumerate(probabilities))
        spread = math.sqrt(math.fsum(p * (digit - mean) ** 2 for digit, p in enumerate(probabilities)))
        value = min(100.0, max(0.0, 100.0 * mean / 9))
        return Score(value, min(1.0, max(0.0, 1.0 - spread / _LARGEST_DIGIT_SPREAD)))

    async def ask(self, request: str, question: str) -> YesNo:
        asked = fill(self._wording.ask_question, {"question": question})
        answers = (self._wording.yes, self._wording.no)
        p_yes, p_no = await self._ask_for(self._wording.ask_system, request, asked, answers)
        return YesNo(p_yes > p_no, max(p_yes, p_no))

    async def _ask_for(self, system: str, request: str, question: str, answers: Sequence[str]) -> list[float]:
        """The folded distribution over ``answers`` of a one-token reply to ``system`` + request + question."""
        language = self._wording.language
        messages: list[Message] = [
            {"role": "system", "content": system},
            {"role": "user", "content": language.with_input(request) + language.section_separator + question},
        ]
        return await self._ask_one_token(messages, answers, lambda top: _fold(_masses(top, answers)))

    async def _ask_one_token(
        self,
        messages: Sequence[Message],
        answers: Sequence[str],
        read: Callable[[Sequence[TokenLogprob]], list[float]],
    ) -> list[float]:
        """One call; ``read`` turns the first token's alternatives into one probability per answer, which
        also annotates the recorded call."""
        with call_scope("judge") as scope:
            completion = await self._model.complete(
                messages, max_tokens=1, temperature=0.0, top_logprobs=_TOP_LOGPROBS, extra_body=self._extra_body
            )
            probabilities = read(completion.top_logprobs)
            scope.annotate(
                distribution=dict(zip(answers, probabilities, strict=True)),
                confidence=max(probabilities),
                outcome="accept",
            )
        return probabilities


def _cosines(query: Sequence[float], rows: Sequence[Sequence[float]]) -> NDArray[np.float64]:
    """The cosine of ``query`` with each row; 0 where either vector is zero."""
    vector = np.asarray(query, dtype=np.float64)
    matrix = np.asarray(rows, dtype=np.float64).reshape(len(rows), -1)
    if matrix.shape[1] != vector.shape[0]:
        raise BadResponseError("the embedder returned vectors of different lengths", endpoint="embedding")
    norms = np.linalg.norm(matrix, axis=1) * np.linalg.norm(vector)
    dots = matrix @ vector
    cosines: NDArray[np.float64] = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
    return cosines


def _softmax(logits: NDArray[np.float64]) -> list[float]:
    weights = np.exp(logits - logits.max())
    return [float(weight) for weight in weights / weights.sum()]


class _TextVectors:
    """An embedder with the vectors of fixed texts (options, candidates) kept, least recently used out first:
    a judgment embeds its request, and only the texts it has not seen."""

    def __init__(self, embedder: EmbeddingModel, capacity: int = 4_096) -> None:
        self._embedder = embedder
        self._known: LRUCache[str, tuple[float, ...]] = LRUCache(capacity)

    async def embed(self, request: str, texts: Sequence[str]) -> tuple[tuple[float, ...], list[tuple[float, ...]]]:
        """The request's vector and each text's vector, in one embedding call."""
        missing = [text for text in dict.fromkeys(texts) if text not in self._known]
        embeddings = await self._embedder.embed([request, *missing])
        if len(embeddings.vectors) != 1 + len(missing):
            raise BadResponseError(
                f"{len(embeddings.vectors)} vectors for {1 + len(missing)} texts", endpoint=self._embedder.name
            )
        fresh = dict(zip(missing, embeddings.vectors[1:], strict=True))
        for text, vector in fresh.items():
            self._known[text] = vector
        return embeddings.vectors[0], [fresh.get(text) or self._known[text] for text in texts]


class EmbeddingChooser:
    """``Chooser`` by embeddings: the cosine of the request with each option's text, through a softmax at
    ``temperature`` (lower is sharper), is the distribution. ``descriptions`` gives an option a richer text
    to be compared by than its name. Option vectors are kept, so a repeated option set costs one short call."""

    def __init__(
        self,
        embedder: EmbeddingModel,
        *,
        temperature: float = 0.05,
        descriptions: Mapping[str, str] | None = None,
    ) -> None:
        if not (math.isfinite(temperature) and temperature > 0):
            raise ConfigurationError(f"temperature must be a positive number, got {temperature!r}")
        self._vectors = _TextVectors(embedder)
        self._temperature = temperature
        self._descriptions = dict(descriptions or {})

    async def choose(self, request: str, options: Sequence[str]) -> Choice:
        options = check_options(options)
        texts = [self._descriptions.get(option, option) for option in options]
        with call_scope("embed") as scope:
            query, rows = await self._vectors.embed(request, texts)
            probabilities = _softmax(_cosines(query, rows) / self._temperature)
            choice = Choice.of(options, probabilities)
            scope.annotate(distribution=choice.distribution, confidence=choice.confidence, outcome="accept")
        return choice
