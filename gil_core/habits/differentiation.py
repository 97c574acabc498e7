"""Differentiation: signals that the tree's shape, not one habit, is wrong, for a person to restructure it.

Three signals. ``capacity``: a node close to the most candidates its label scheme can show must be split before
it can grow. ``anchored``: the walk keeps stopping at a node with children although the generated answer was
right, so its children's descriptions do not carry that request (``missed``: the answer is a habit below the
node; ``reanchor``: it is a habit elsewhere; ``orphan``: it is no habit at all). ``unserved``: requests answered
"none of these" that nobody corrected, grouped by meaning, are topics the tree has no place for.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from gil_core.errors import ConfigurationError
from gil_core.habits.costs import EvidenceTrace, read_evidence
from gil_core.habits.review_log import ReviewKind, ReviewLog
from gil_core.habits.shadows import EVIDENCE_MODES, confirmed_answer, item_id
from gil_core.llm import EmbeddingModel
from gil_core.ontology import OptionKind, Tree
from gil_core.telemetry import TelemetryStore

__all__ = [
    "AnchoredKind",
    "AnchoredSignal",
    "CapacitySignal",
    "DifferentiationPolicy",
    "DifferentiationReport",
    "UnservedGroup",
    "anchored_signals",
    "capacity_signals",
    "group_unserved",
    "prepare_differentiation_round",
    "unserved_requests",
    "unserved_signals",
]


@dataclass(frozen=True, slots=True)
class CapacitySignal:
    """A node showing ``candidates`` of the ``capacity`` its label scheme can label."""

    node: str
    candidates: int
    capacity: int

    @property
    def id(self) -> str:
        """The review item id: one per node."""
        return f"capacity-{self.node}"


def capacity_signals(tree: Tree, headroom: int, *, dismissed: Collection[str] = ()) -> list[CapacitySignal]:
    """Nodes, in file order, whose children or habits number at least their scheme's capacity − ``headroom``."""
    signals = []
    for node, _ in tree.iter_nodes():
        count = len(node.children) or len(node.options)
        signal = CapacitySignal(node.id, count, node.label_scheme.capacity)
        if count >= signal.capacity - headroom and signal.id not in dismissed:
            signals.append(signal)
    return signals


class AnchoredKind(StrEnum):
    """Where a repeated answer at a node with children lives in the tree."""

    MISSED = "missed"  # a habit below the node: the walk should have reached it
    REANCHOR = "reanchor"  # a habit outside the node's subtree: it may belong here
    ORPHAN = "orphan"  # no habit: the node lacks a child for it


@dataclass(frozen=True, slots=True)
class AnchoredSignal:
    """``support`` correct answers ``output`` given where the walk stopped at ``node``; ``target`` is the node
    holding the habit with that text (None for an orphan)."""

    kind: AnchoredKind
    node: str
    output: str
    target: str | None
    support: int
    sources: tuple[str, ...]

    @property
    def id(self) -> str:
        """The review item id: stable for the same answer at the same node."""
        return item_id("anchored", self.node, self.output)


def anchored_signals(
    tree: Tree,
    evidence: Iterable[EvidenceTrace],
    *,
    min_support: int,
    never: Collection[str] = (),
    dismissed: Collection[str] = (),
) -> list[AnchoredSignal]:
    """Correct generated answers grouped by the node with children they stopped at and their exact text.

    Groups of at least ``min_support`` are signals, sorted by kind, node id, then support (largest first);
    texts in ``never`` (the "none of these" wording) and ``dismissed`` signal ids are left out.
    """
    groups: dict[tuple[str, str], list[str]] = {}
    for trace in evidence:
        row = trace.evidence
        if row.mode not in EVIDENCE_MODES or row.verdict != "correct":
            continue
        if not tree.has_node(row.anchor) or not tree.node(row.anchor).children:
            continue
        answer = confirmed_answer(row)
        if answer is not None and answer not in never:
            groups.setdefault((row.anchor, answer), []).append(trace.trace_id)
    signals = []
    for (node, output), sources in groups.items():
        if len(sources) < min_support:
            continue
        kind, target = _home(tree, node, output)
        signal = AnchoredSignal(kind, node, output, target, len(sources), tuple(sources))
        if signal.id not in dismissed:
            signals.append(signal)
    order = list(AnchoredKind)
    signals.sort(key=lambda signal: (order.index(signal.kind), signal.node, -signal.support))
    return signals


def _home(tree: Tree, node: str, text: str) -> tuple[AnchoredKind, str | None]:
    """Where the habit answering ``text`` lives: below ``node`` if any such habit does, else anywhere."""
    owners = [owner.id for option, owner in tree.options() if option.kind is OptionKind.ANSWER and option.text == text]
    below = [owner for owner in owners if any(step.id == node for step in tree.path_to(owner))]
    if below:
        return AnchoredKind.MISSED, below[0]
    if owners:
        return AnchoredKind.REANCHOR, owners[0]
    return AnchoredKind.ORPHAN, None


@dataclass(frozen=True, slots=True)
class UnservedGroup:
    """Requests alike in meaning that the tree could not serve, in request order."""

    requests: tuple[str, ...]
    sources: tuple[str, ...]

    @property
    def support(self) -> int:
        return len(self.requests)


def unserved_requests(evidence: Iterable[EvidenceTrace], *, none_text: str) -> list[EvidenceTrace]:
    """Generated answers that were "none of these" and that nobody corrected (a correction shows the request
    had an answer after all)."""
    return [
        trace
        for trace in evidence
        if trace.evidence.mode in EVIDENCE_MODES
        and (trace.evidence.output or "").strip() == none_text
        and not (trace.evidence.correction or "").strip()
    ]


def group_unserved(
    traces: Sequence[EvidenceTrace], vectors: Sequence[Sequence[float]], *, threshold: float, min_support: int
) -> list[UnservedGroup]:
    """Join requests whose unit-normalised vectors have cosine ≥ ``threshold`` (transitively: single linkage);
    groups of at least ``min_support``, largest first (ties: earliest request first)."""
    if len(traces) != len(vectors):
        raise ConfigurationError(f"{len(traces)} unserved requests but {len(vectors)} vectors")
    if not traces:
        return []
    matrix = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    unit = np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)
    parent = list(range(len(traces)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    for first, second in zip(*np.nonzero(np.triu(unit @ unit.T >= threshold, k=1)), strict=True):
        parent[root(int(second))] = root(int(first))
    members: dict[int, list[int]] = {}
    for index in range(len(traces)):
        members.setdefault(root(index), []).append(index)
    groups = [
        UnservedGroup(
            requests=tuple(traces[index].evidence.state for index in indices),
            sources=tuple(traces[index].trace_id for index in indices),
        )
        for indices in sorted(members.values(), key=lambda indices: (-len(indices), indices[0]))
        if len(indices) >= min_support
    ]
    return groups


async def unserved_signals(
    evidence: Iterable[EvidenceTrace],
    embedder: EmbeddingModel,
    *,
    none_text: str,
    threshold: float,
    min_support: int,
) -> list[UnservedGroup]:
    """``group_unserved`` over the unserved requests, embedded in one call."""
    traces = unserved_requests(evidence, none_text=none_text)
    if not traces:
        return []
    embeddings = await embedder.embed([trace.evidence.state for trace in traces])
    return group_unserved(traces, embeddings.vectors, threshold=threshold, min_support=min_support)


@dataclass(frozen=True, slots=True)
class DifferentiationPolicy:
    """``headroom``: how close to capacity a node is flagged; ``min_support``: repeats an anchored answer needs;
    ``similarity`` and ``unserved_min_support``: how unserved requests are joined, and how many make a topic."""

    headroom: int
    min_support: int
    similarity: float
    unserved_min_support: int


@dataclass(frozen=True, slots=True)
class DifferentiationReport:
    """The three signals of one round, for a person to weigh (nothing here changes the tree)."""

    capacity: list[CapacitySignal] = field(default_factory=list)
    anchored: list[AnchoredSignal] = field(default_factory=list)
    unserved: list[UnservedGroup] = field(default_factory=list)


async def prepare_differentiation_round(
    store: TelemetryStore,
    task: str,
    tree: Tree,
    policy: DifferentiationPolicy,
    *,
    none_text: str,
    embedder: EmbeddingModel,
) -> DifferentiationReport:
    """All three signals from the task's whole log.

    Capacity and anchored signals a reviewer dismissed (latest decision: rejected) stay dismissed, as their ids
    are stable. Unserved groups are always shown: their members change with every request that joins them.
    """
    dismissed = ReviewLog(store).rejected(task, ReviewKind.DIFFERENTIATION)
    evidence = read_evidence(store, task)
    return DifferentiationReport(
        capacity=capacity_signals(tree, policy.headroom, dismissed=dismissed),
        anchored=anchored_signals(
            tree, evidence, min_support=policy.min_support, never=(none_text,), dismissed=dismissed
        ),
        unserved=await unserved_signals(
            evidence,
            embedder,
            none_text=none_text,
            threshold=policy.similarity,
            min_support=policy.unserved_min_support,
        ),
    )
