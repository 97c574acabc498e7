"""Part C's lookups (``benchmarks.memory_pairs``) as plain data: a question pair, its lookup, an arm's decision.

Kept below both the benchmark and its verification arms (``_verified_arms``), which decide on these.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Pair:
    """Line ``line`` of the pairs file: ``b`` asks the same as ``a`` when ``duplicate``."""

    line: int
    a: str
    b: str
    duplicate: bool

    @property
    def key(self) -> str:
        return f"pair-{self.line}"


@dataclass(frozen=True, slots=True)
class Lookup:
    """``pair.b`` looked up in the memory of its half: the nearest remembered question and its similarity."""

    pair: Pair
    nearest: str
    similarity: float

    @property
    def right(self) -> bool:
        """Serving the nearest entry's answer is right: ``b`` asks what ``a`` asks, and the nearest entry is
        ``a`` (or a question with exactly its text)."""
        return self.pair.duplicate and self.nearest == self.pair.a


@dataclass
class Decision:
    """What an arm did on the evaluation half: ``served[i]`` for each lookup, the threshold it used (None when
    it found none), and figures of its own (e.g. the share that paid for a verification)."""

    served: list[bool]
    threshold: float | None
    note: str = ""
    extra: dict[str, str] = field(default_factory=dict)
