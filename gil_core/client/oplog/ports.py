"""The operation log port: one entry per model call (success or not), its statistics, and recall."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

__all__ = ["INPUT_PREVIEW_CHARS", "OperationEntry", "OperationLog", "OperationStats", "RecalledOperation"]

INPUT_PREVIEW_CHARS = 2_000


@dataclass(frozen=True, slots=True)
class OperationEntry:
    """One model call as the operation log keeps it.

    ``input_preview`` is the first ``INPUT_PREVIEW_CHARS`` characters of the messages; ``output`` the full
    reply (empty when the call failed, with ``error`` saying why). ``attempts`` is the caller's attempt
    number (``call_options(attempt=...)``). ``duration_ms`` is the wall time of the call as the log saw it
    (limiter waits and a fallback included). ``embedding`` is set when the log embeds entries and that worked.
    ``task`` is the task (tenant) the call was made for; None on entries written before the log kept it, or by a
    ``LoggedChatModel`` given no task: a read for a task never returns them.
    """

    entry_id: str
    created_at: datetime
    intent: str | None
    input_preview: str
    output: str
    target_type: str | None
    success: bool
    attempts: int
    provider: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration_ms: float = 0.0
    tags: tuple[str, ...] = ()
    error: str | None = None
    embedding: tuple[float, ...] | None = None
    task: str | None = None


@dataclass(frozen=True, slots=True)
class OperationStats:
    """The log at a glance; ``success_rate`` is None for an empty log."""

    entries: int
    successes: int
    success_rate: float | None
    prompt_tokens: int
    completion_tokens: int
    oldest: datetime | None
    newest: datetime | None

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class RecalledOperation:
    """An entry found by ``recall``, its score, and how it was scored."""

    entry: OperationEntry
    score: float
    method: Literal["words", "embedding"]


@runtime_checkable
class OperationLog(Protocol):
    """Where ``LoggedChatModel`` writes its entries."""

    async def record(self, entry: OperationEntry) -> None:
        """Keep ``entry`` (embedding it first when the log embeds)."""
        ...

    def entries(self, task: str | None = None) -> Sequence[OperationEntry]:
        """Every entry kept, oldest first; with ``task``, only that task's (the name compared whole)."""
        ...

    def stats(self, task: str | None = None) -> OperationStats:
        """Entries, success rate, tokens, oldest and newest (of ``task``'s entries only, when given)."""
        ...

    async def recall(self, query: str, k: int = 5, *, task: str | None = None) -> list[RecalledOperation]:
        """The ``k`` entries most like ``query``, best first (see the adapters for how alike is measured); with
        ``task``, among that task's entries only."""
        ...
