"""Memory's similarity cut, read from the log for the task's precision (with the learned judge on).

Memory serves the confirmed answer of the nearest confirmed request when it is similar enough; the task file's
``memory_threshold`` says how similar, chosen before any verdict. Once verdicts arrive the log can say how
often that was right: for each of the latest ``window`` confirmed requests, the nearest *earlier* confirmed
request (the cosine of their stored vectors, the vectors memory compares) and whether its confirmed answer is
the same. That is what memory would have served each request before its verdict, so the precision of memory at
a cut is the share of those pairs at or above the cut that agree. The cut then follows from the log:

* **proven lower**: the lowest cut below the configured one whose Wilson 95% lower bound of precision, over at
  least ``min_support`` pairs, reaches the target: memory may serve more than the task file said;
* **raised**: where the configured cut's precision is significantly below the target (its Wilson 95% upper
  bound under it, over at least ``min_support`` pairs), the lowest cut above it whose logged precision reaches
  the target over at least ``min_support`` pairs; memory serves nothing learned from the log while no cut
  does (``off``: the learned judge and the LLM answer instead);
* otherwise the configured cut stays (``configured``): the log neither proves a lower one nor shows it wrong.

Only confirmed answers the learned judge learns (tree answers and "none of these") are read, so pairs whose
answer is a shadow or free text are not counted; and, like the learned judge's rules, precision is read only
from verdicts the feedback queue did not choose (``learned.queue``: its random share and unsolicited verdicts),
each compared with its nearest earlier confirmed request whatever chose that one. A task with
``memory_verify`` keeps its configured cuts: the verify band has its own per-entry evidence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from gil_core.memory.ports import Recall
from gil_core.wilson import wilson_lower_bound

__all__ = ["MemoryCut", "MemoryRule", "fit_memory_cut"]

MemoryRule = Literal["configured", "proven", "raised", "off"]


class _ConfirmedView(Protocol):
    @property
    def option(self) -> str | None: ...
    @property
    def chosen_by(self) -> str: ...


class _ConfirmedLog(Protocol):
    """What the cut reads of the log: ``learned.log.LearnedLog`` is one (taken as this port, not imported: the
    log reads the feedback queue, which reads the learned states, which hold a ``MemoryCut``)."""

    @property
    def confirmed(self) -> Sequence[_ConfirmedView]: ...
    @property
    def vectors(self) -> NDArray[np.float32]: ...


_BLOCK = 256


@dataclass(frozen=True, slots=True)
class MemoryCut:
    """The similarity memory serves from (``cut``; None when ``rule`` is ``off``), the configured one, and the
    pairs read: how many in all, and how many at or above the cut and how many of those agreed."""

    rule: MemoryRule
    cut: float | None
    configured: float
    pairs: int
    support: int
    right: int

    def serves(self, similarity: float) -> bool:
        return self.cut is not None and similarity >= self.cut

    def judged(self, recall: Recall, configured: float) -> Recall:
        """``recall`` judged at this cut instead of the configured one, where the log moved it from ``configured``
        (the task's memory settings now; a cut fitted for others, or left as configured, changes nothing)."""
        if self.rule == "configured" or self.configured != configured or recall.similarity is None:
            return recall
        if self.cut is None:
            return replace(recall, hit=False, refused="learned: the log shows memory below the task's precision")
        return replace(recall, threshold=self.cut, hit=recall.similarity >= self.cut)

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "cut": self.cut,
            "configured": self.configured,
            "pairs": self.pairs,
            "support": self.support,
            "right": self.right,
        }

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> MemoryCut:
        rule = value["rule"]
        if rule not in ("configured", "proven", "raised", "off"):
            raise ValueError(f"unknown memory rule {rule!r}")
        cut = value["cut"]
        return cls(
            rule=rule,
            cut=None if cut is None else float(cut),
            configured=float(value["configured"]),
            pairs=int(value["pairs"]),
            support=int(value["support"]),
            right=int(value["right"]),
        )

    def describe(self) -> str:
        """One line for ``gil fit-reflex`` and ``gil stats``."""
        shown = "off" if self.cut is None else f"{self.cut:.4f}"
        if self.rule == "configured":
            return f"memory cut {shown} (as configured; {self.pairs} logged pairs prove no other)"
        precision = f"{self.right}/{self.support}" if self.support else "no pairs"
        return f"memory cut {shown} ({self.rule} from {self.configured:.4f}; {precision} right at the cut)"


def nearest_earlier(vectors: NDArray[np.float32], latest: int) -> NDArray[np.int64]:
    """For each of the last ``latest`` rows (arrival order), the earlier row it is most similar to; -1 for the
    first row. Blocked products: ``latest`` × n × d work."""
    n = len(vectors)
    start = max(1, n - latest)
    nearest = np.full(n, -1, dtype=np.int64)
    for low in range(start, n, _BLOCK):
        high = min(n, low + _BLOCK)
        similarities = vectors[low:high] @ vectors[:high].T
        for i in range(high - low):
            row = low + i
            nearest[row] = int(np.argmax(similarities[i, :row]))
    return nearest


def fit_memory_cut(
    log: _ConfirmedLog, *, configured: float, precision: float, min_support: int, window: int
) -> MemoryCut:
    """The cut the log supports (module doc)."""
    vectors, options = log.vectors, [item.option for item in log.confirmed]
    nearest = nearest_earlier(vectors, window) if len(vectors) > 1 else np.full(len(vectors), -1, dtype=np.int64)
    fair = np.asarray([item.chosen_by != "queue" for item in log.confirmed], dtype=bool)
    rows = np.flatnonzero((nearest >= 0) & fair)  # precision from verdicts the feedback queue did not choose
    if not len(rows):
        return MemoryCut("configured", configured, configured, 0, 0, 0)
    similarity = np.einsum("ij,ij->i", vectors[rows], vectors[nearest[rows]]).astype(np.float64)
    agree = np.asarray([options[row] == options[nearest[row]] for row in rows.tolist()], dtype=bool)
    order = np.argsort(-similarity, kind="stable")
    similarity, agree = similarity[order], agree[order]
    right = np.cumsum(agree)
    support = np.arange(1, len(agree) + 1)
    # A cut is one of the logged similarities: at cut similarity[i] the pairs 0..i (and ties after them) count.
    last_of_tie = np.r_[similarity[1:] != similarity[:-1], True]

    def at(index: int, rule: MemoryRule) -> MemoryCut:
        return MemoryCut(rule, float(similarity[index]), configured, len(agree), int(support[index]), int(right[index]))

    enough = (support >= min_support) & last_of_tie
    lower = [
        i
        for i in np.flatnonzero(enough & (similarity < configured)).tolist()
        if wilson_lower_bound(int(right[i]), int(support[i])) >= precision
    ]
    if lower:
        return at(max(lower), "proven")
    at_configured = np.flatnonzero(similarity >= configured)
    if not len(at_configured):
        return MemoryCut("configured", configured, configured, len(agree), 0, 0)
    i = int(at_configured[-1])
    n, k = int(support[i]), int(right[i])
    short = n >= min_support and 1.0 - wilson_lower_bound(n - k, n) < precision  # its upper bound under the target
    if not short:
        return MemoryCut("configured", configured, configured, len(agree), n, k)
    above = np.flatnonzero(enough & (similarity > configured) & (right >= precision * support))
    return at(int(above.max()), "raised") if len(above) else MemoryCut("off", None, configured, len(agree), 0, 0)
