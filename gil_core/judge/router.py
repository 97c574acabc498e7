"""The judgment router: a cheap reflex first, a deliberate judge only when the reflex is unsure, and a scoped
memory of what was served in front of both.

Per request, in order (docs/reference.md, "The judgment router"):

1. Memory: a stored answer for the same scope {tenant, schema}, primitive and subject (options, criterion or
   question) is re-validated (rebuilt as its value object, its options checked) and served, route ``cache``.
   One that fails re-validation is forgotten. A memory that fails to look up counts as a miss
   (``Routed.lookup_error``).
2. Reflex: served, route ``reflex``, when its confidence reaches the primitive's threshold.
3. Deliberate: asked ONCE when the reflex's confidence is strictly below the threshold (or the reflex failed
   with a ``ModelError``), and served whatever its confidence, route ``deliberate``.

What is served from the reflex or the deliberate judge is stored; a store that fails does not fail the
judgment: its error is returned beside the answer (``Routed.cache_error``).

``InProcessJudgmentMemory`` is a semantic memory: an exact match (same request text) first, then the most
similar stored request of the same scope, primitive and subject whose cosine reaches ``similarity_threshold``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

from cachetools import Cache, LRUCache

from gil_core.errors import ConfigurationError, ModelError
from gil_core.judge.escalation import reflex_serves
from gil_core.judge.primitives import (
    Choice,
    InvalidJudgmentError,
    JudgmentPrimitives,
    Score,
    YesNo,
    _cosines,
    check_options,
)
from gil_core.llm.ports import EmbeddingModel

__all__ = [
    "InProcessJudgmentMemory",
    "JudgmentKey",
    "JudgmentMemory",
    "JudgmentRouter",
    "JudgmentScope",
    "Primitive",
    "Route",
    "Routed",
    "RouterThresholds",
]

Primitive = Literal["choose", "score", "ask"]
Route = Literal["cache", "reflex", "deliberate"]
T = TypeVar("T", Choice, Score, YesNo)


@dataclass(frozen=True, slots=True)
class JudgmentScope:
    """Whose judgments these are: a tenant and a schema (e.g. a task and its tree's version), both non-blank.
    Nothing is ever served across scopes."""

    tenant: str
    schema: str

    def __post_init__(self) -> None:
        if not self.tenant.strip() or not self.schema.strip():
            raise ConfigurationError(f"a judgment scope needs a non-blank tenant and schema ({self})")


@dataclass(frozen=True, slots=True)
class RouterThresholds:
    """Per primitive, the reflex confidence from which the reflex's answer is served. No defaults: where to
    trust the reflex is a decision about precision."""

    choose: float
    score: float
    ask: float

    def __post_init__(self) -> None:
        for name in ("choose", "score", "ask"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ConfigurationError(f"RouterThresholds.{name} must be a number in [0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class JudgmentKey:
    """What a judgment is about: scope, primitive, request, and subject (options, or criterion, or question)."""

    scope: JudgmentScope
    primitive: Primitive
    request: str
    subject: tuple[str, ...]

    @property
    def group(self) -> tuple[str, str, str, tuple[str, ...]]:
        """Everything but the request: a semantic match never leaves its group."""
        return (self.scope.tenant, self.scope.schema, self.primitive, self.subject)

    def digest(self) -> str:
        """SHA-256 (hex) of the key's canonical JSON: the exact-match key."""
        material = [self.scope.tenant, self.scope.schema, self.primitive, self.request, list(self.subject)]
        return hashlib.sha256(json.dumps(material, ensure_ascii=False).encode("utf-8")).hexdigest()


@runtime_checkable
class JudgmentMemory(Protocol):
    """Served judgments as JSON-ready payloads; the router re-validates what it reads."""

    async def lookup(self, key: JudgmentKey) -> Mapping[str, Any] | None:
        """The payload stored for ``key`` (or, in a semantic memory, for a request like it), or None."""
        ...

    async def store(self, key: JudgmentKey, payload: Mapping[str, Any]) -> None:
        """Keep ``payload`` for ``key``, replacing what was there."""
        ...

    async def forget(self, key: JudgmentKey) -> None:
        """Drop what ``lookup(key)`` would return (no-op when nothing)."""
        ...


@dataclass
class _Stored:
    key: JudgmentKey
    payload: Mapping[str, Any]
    vector: tuple[float, ...] | None
    used: int  # when it was last stored or served: of equally similar entries, the latest used answers


class InProcessJudgmentMemory:
    """``JudgmentMemory`` in this process, at most ``capacity`` entries (least recently used out first).

    Without ``embedder`` it matches exactly; with one, a miss falls back to the stored request of the same
    group whose cosine with the request is highest and at least ``similarity_threshold``.
    """

    def __init__(
        self,
        *,
        embedder: EmbeddingModel | None = None,
        similarity_threshold: float = 0.95,
        capacity: int = 10_000,
    ) -> None:
        if not (math.isfinite(similarity_threshold) and -1.0 <= similarity_threshold <= 1.0) or capacity < 1:
            raise ConfigurationError(
                f"similarity_threshold must be in [-1, 1] and capacity >= 1 ({similarity_threshold}, {capacity})"
            )
        self._embedder = embedder
        self._threshold = similarity_threshold
        self._entries: LRUCache[str, _Stored] = LRUCache(capacity)
        self._uses = itertools.count()
        self._lock = threading.Lock()  # cachetools caches are not thread-safe: one lock guards every access

    async def lookup(self, key: JudgmentKey) -> Mapping[str, Any] | None:
        digest = await self._find(key)
        if digest is None:
            return None
        with self._lock:
            stored = self._entries.get(digest)
            if stored is None:  # dropped by another task meanwhile
                return None
            stored.used = next(self._uses)
            return stored.payload

    async def store(self, key: JudgmentKey, payload: Mapping[str, Any]) -> None:
        vector = await self._embed(key.request) if self._embedder is not None else None
        with self._lock:
            digest = key.digest()
            self._entries[digest] = _Stored(key, dict(payload), vector, next(self._uses))

    async def forget(self, key: JudgmentKey) -> None:
        """Drops the entry a lookup of ``key`` would return now."""
        digest = await self._find(key)
        if digest is not None:
            with self._lock:
                self._entries.pop(digest, None)

    def __len__(self) -> int:
        return len(self._entries)

    async def _find(self, key: JudgmentKey) -> str | None:
        """The digest of the entry that answers ``key``: its own, else the most similar of its group."""
        digest = key.digest()
        with self._lock:
            if digest in self._entries:
                return digest
            group = []
            for held in self._entries:
                stored = Cache.__getitem__(self._entries, held)  # a look, not a use: LRUCache's [] would reorder
                if stored.key.group == key.group and stored.vector:
                    group.append((held, stored.vector, stored.used))
        if self._embedder is None or not group:
            return None
        similarities = _cosines(await self._embed(key.request), [vector for _, vector, _ in group if vector])
        best = max(range(len(group)), key=lambda index: (similarities[index], group[index][2]))
        return group[best][0] if similarities[best] >= self._threshold else None

    async def _embed(self, text: str) -> tuple[float, ...]:
        assert self._embedder is not None
        (vector,) = (await self._embedder.embed([text])).vectors
        return tuple(vector)


@dataclass(frozen=True, slots=True)
class Routed(Generic[T]):
    """A served judgment: the value, the route it came by, the reflex's unserved answer when the deliberate
    judge was asked, and what went wrong around it without failing it."""

    value: T
    route: Route
    reflex: T | None = None
    reflex_error: ModelError | None = None
    lookup_error: Exception | None = None
    cache_error: Exception | None = None

    @property
    def confidence(self) -> float:
        return self.value.confidence


@dataclass(frozen=True, slots=True)
class _Codec(Generic[T]):
    encode: Callable[[T], dict[str, Any]]
    decode: Callable[[Mapping[str, Any], JudgmentKey], T]


def _decode_choice(payload: Mapping[str, Any], key: JudgmentKey) -> Choice:
    choice = Choice(tuple(payload["options"]), tuple(payload["probabilities"]), payload["selected"])
    if choice.options != key.subject:
        raise InvalidJudgmentError(f"stored options {choice.options!r} are not the options asked about")
    return choice


_CHOICE: _Codec[Choice] = _Codec(
    lambda c: {"options": list(c.options), "probabilities": list(c.probabilities), "selected": c.selected},
    _decode_choice,
)
_SCORE: _Codec[Score] = _Codec(
    lambda s: {"value": s.value, "confidence": s.confidence},
    lambda payload, _: Score(payload["value"], payload["confidence"]),
)
_VERDICT: _Codec[YesNo] = _Codec(
    lambda v: {"yes": v.yes, "confidence": v.confidence},
    lambda payload, _: YesNo(payload["yes"], payload["confidence"]),
)


@dataclass(frozen=True, slots=True)
class JudgmentRouter:
    """Routes choose / score / ask through memory, reflex and deliberate judge; see the module doc."""

    scope: JudgmentScope
    reflex: JudgmentPrimitives
    deliberate: JudgmentPrimitives
    thresholds: RouterThresholds
    memory: JudgmentMemory | None = None

    async def choose(self, request: str, options: Sequence[str]) -> Routed[Choice]:
        options = check_options(options)
        key = JudgmentKey(self.scope, "choose", request, options)
        return await self._route(
            key,
            _CHOICE,
            self.thresholds.choose,
            lambda: self.reflex.choose(request, options),
            lambda: self.deliberate.choose(request, options),
        )

    async def score(self, request: str, criterion: str) -> Routed[Score]:
        key = JudgmentKey(self.scope, "score", request, (criterion,))
        return await self._route(
            key,
            _SCORE,
            self.thresholds.score,
            lambda: self.reflex.score(request, criterion),
            lambda: self.deliberate.score(request, criterion),
        )

    async def ask(self, request: str, question: str) -> Routed[YesNo]:
        key = JudgmentKey(self.scope, "ask", request, (question,))
        return await self._route(
            key,
            _VERDICT,
            self.thresholds.ask,
            lambda: self.reflex.ask(request, question),
            lambda: self.deliberate.ask(request, question),
        )

    async def _route(
        self,
        key: JudgmentKey,
        codec: _Codec[T],
        threshold: float,
        ask_reflex: Callable[[], Awaitable[T]],
        ask_deliberate: Callable[[], Awaitable[T]],
    ) -> Routed[T]:
        cached, lookup_error = await self._recall(key, codec)
        if cached is not None:
            return Routed(cached, "cache", lookup_error=lookup_error)
        reflex: T | None = None
        reflex_error: ModelError | None = None
        try:
            reflex = await ask_reflex()
        except ModelError as error:  # the reflex is an optimisation: when it cannot answer, deliberate
            reflex_error = error
        route: Route = "reflex"
        if reflex is not None and reflex_serves(reflex.confidence, threshold):
            served = reflex
        else:
            served, route = await ask_deliberate(), "deliberate"
        cache_error = await self._remember(key, codec.encode(served))
        return Routed(
            served,
            route,
            reflex=reflex if route == "deliberate" else None,
            reflex_error=reflex_error,
            lookup_error=lookup_error,
            cache_error=cache_error,
        )

    async def _recall(self, key: JudgmentKey, codec: _Codec[T]) -> tuple[T | None, Exception | None]:
        if self.memory is None:
            return None, None
        try:
            payload = await self.memory.lookup(key)
            if payload is None:
                return None, None
        except Exception as error:  # any memory's failure is a miss, reported beside the answer
            return None, error
        try:
            return codec.decode(payload, key), None
        except (InvalidJudgmentError, KeyError, TypeError, ValueError):
            pass  # stored under an older rule or damaged: forget it and judge afresh
        try:
            await self.memory.forget(key)
        except Exception as error:
            return None, error
        return None, None

    async def _remember(self, key: JudgmentKey, payload: dict[str, Any]) -> Exception | None:
        if self.memory is None:
            return None
        try:
            await self.memory.store(key, payload)
        except Exception as error:  # the judgment was paid for: serve it, and say the store failed
            return error
        return None
