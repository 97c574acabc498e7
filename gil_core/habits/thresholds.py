"""Threshold selection from the log: replay the judged traces and pick, for each tree layer, for the leaf and for
memory, the lowest confidence at which accepting still meets a target precision.

Why this shape: a threshold is a decision about precision (``Thresholds`` has no defaults), so it should come
from verdicts, not taste. Raw precision per confidence band is noisy, so it is fitted as a non-decreasing
function of confidence (isotonic regression) and a threshold is accepted only when every band at or above it
meets the target; ``minimum_answered`` keeps a handful of lucky answers from setting it.

What counts as one answer (a pair of confidence and "was it right"), per kind:

* **layer n**: a judgment at a node with children on layer n whose winning label is a child (accepted, or exited
  for low confidence: the winner is read back from the step's ``probs``). Right when the confirmed answer (output
  if correct, correction if wrong) is an answer habit inside the winner's subtree; a correct ``habit/*`` trace
  makes every accepted step right. Unknown (skipped) when the confirmed answer is not a habit of the tree.
* **leaf**: a judgment at a node with options whose winner is a habit (not a shadow). Right when the habit's text
  is the confirmed answer; a habit that produced the trace's output is right exactly when the verdict is.
* **memory**: each judged request against the nearest entry memory held before it. Right when that entry's answer
  is the request's confirmed answer (for a memory hit: when the verdict was correct).

Judgments where "none of these" won, untrusted ones (their judge call's label mass is below the trust threshold)
and skipped or deferred steps are not answers at any threshold, so they are left out.

Memory ordering: an entry can only answer requests that came after it was confirmed. With an ``embedder`` the
replay embeds every judged request and looks each one up, by exact cosine, only among earlier requests that have
a confirmed answer (ties to the earliest), so every request is scored, hit or miss, against what memory could
have held. The log keeps no verdict time, so "confirmed before" is taken as "requested before": an upper bound
on what memory held; forgetting after a wrong hit is not replayed, as it depends on the threshold being chosen.
Without an embedder the logged recall is used, and only where its source is a request logged before the one it
answered (a recall computed against a later-confirmed entry, e.g. after a rebuild, is dropped).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import ArrayLike, NDArray

from gil_core.errors import ConfigurationError
from gil_core.judge import DEFAULT_TRUST_THRESHOLD
from gil_core.llm.ports import EmbeddingModel
from gil_core.ontology.model import OptionKind, Tree
from gil_core.tasks import TaskDefinition
from gil_core.telemetry import TelemetryStore
from gil_core.verdicts import confirmed_answer

__all__ = [
    "MemoryBands",
    "ThresholdChoice",
    "ThresholdReport",
    "choose_memory_bands",
    "choose_threshold",
    "judgment_pairs",
    "nearest_earlier",
    "select_memory_bands",
    "select_thresholds",
]

_EMBED_BATCH = 256
_BLOCK_ELEMENTS = 1 << 23  # similarities computed per block of query rows (64 MiB of float64)
_TIE = 1e-12  # a band whose fitted precision is the target up to rounding meets it


@dataclass(frozen=True, slots=True)
class ThresholdChoice:
    """The outcome for one kind. ``threshold`` is the lowest confidence meeting the target (None when none
    does); ``precision`` and ``answered`` describe the answers at or above it, or, when there is none, at the
    best threshold that keeps ``minimum_answered`` answers (all of them when fewer were counted). ``counted``
    is every answer replayed; ``precision`` is None when nothing was counted."""

    threshold: float | None
    precision: float | None
    answered: int
    counted: int


@dataclass(frozen=True, slots=True)
class ThresholdReport:
    """Per kind, the threshold chosen for ``task`` at ``target_precision``; ``layers`` by layer (root = 1)."""

    task: str
    target_precision: float
    minimum_answered: int
    layers: Mapping[int, ThresholdChoice]
    leaf: ThresholdChoice
    memory: ThresholdChoice


@dataclass(frozen=True, slots=True)
class MemoryBands:
    """The two memory thresholds of verified hits: at or above ``accept`` a hit is served as it is; from
    ``verify`` up to ``accept`` it is verified first. ``verify`` is where precision without verification
    reaches ``verify_precision``: below it hits are so often wrong that a verification is not worth paying."""

    accept: ThresholdChoice
    verify: ThresholdChoice
    accept_precision: float
    verify_precision: float


@dataclass
class _Pairs:
    confidences: list[float] = field(default_factory=list)
    rights: list[bool] = field(default_factory=list)

    def add(self, confidence: float, right: bool | None) -> None:
        if right is not None:
            self.confidences.append(confidence)
            self.rights.append(right)


# -- pure parts ---------------------------------------------------------------------------------------------


def choose_threshold(
    confidences: ArrayLike, rights: ArrayLike, *, target_precision: float, minimum_answered: int
) -> ThresholdChoice:
    """The lowest observed confidence t such that the isotonic fit of precision meets ``target_precision`` on
    every band at or above t and at least ``minimum_answered`` answers have confidence ≥ t."""
    _check_target(target_precision, minimum_answered)
    from sklearn.isotonic import IsotonicRegression  # type: ignore[import-untyped]  # heavy: import when used

    x = np.asarray(confidences, dtype=np.float64)
    y = np.asarray(rights, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ConfigurationError("confidences and rights must be two sequences of the same length")
    if len(x) == 0:
        return ThresholdChoice(threshold=None, precision=None, answered=0, counted=0)
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    levels, first = np.unique(x, return_index=True)
    answered = len(x) - first  # answers at or above each level
    right_above = np.cumsum(y[::-1])[::-1][first]
    precision = right_above / answered
    fitted = IsotonicRegression(increasing=True, y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(x, y).predict(levels)
    meets = np.logical_and.accumulate((fitted >= target_precision - _TIE)[::-1])[::-1]
    eligible = meets & (answered >= minimum_answered)
    if eligible.any():
        at = int(np.argmax(eligible))
        return ThresholdChoice(float(levels[at]), float(precision[at]), int(answered[at]), len(x))
    allowed = answered >= min(minimum_answered, len(x))
    at = int(np.argmax(np.where(allowed, precision, -1.0)))  # first maximum: the lowest such threshold
    return ThresholdChoice(None, float(precision[at]), int(answered[at]), len(x))


def choose_memory_bands(
    similarities: ArrayLike,
    rights: ArrayLike,
    *,
    accept_precision: float,
    verify_precision: float,
    minimum_answered: int,
) -> MemoryBands:
    """Both bands from one set of (similarity, right) pairs; ``verify_precision`` < ``accept_precision``."""
    if not verify_precision < accept_precision:
        raise ConfigurationError(
            f"verify_precision ({verify_precision}) must be below accept_precision ({accept_precision})"
        )
    accept = choose_threshold(
        similarities, rights, target_precision=accept_precision, minimum_answered=minimum_answered
    )
    verify = choose_threshold(
        similarities, rights, target_precision=verify_precision, minimum_answered=minimum_answered
    )
    return MemoryBands(accept, verify, accept_precision, verify_precision)


def nearest_earlier(vectors: ArrayLike, held: ArrayLike) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """For each row i, the row j < i with ``held[j]`` nearest by exact cosine (ties to the earliest) and the
    similarity; -1 and NaN where no earlier row is held. A zero vector is similar to nothing (0)."""
    rows = np.asarray(vectors, dtype=np.float64)
    kept = np.asarray(held, dtype=bool)
    count = len(rows)
    lengths = np.linalg.norm(rows, axis=1) if count else np.zeros(0)
    unit = np.divide(rows, lengths[:, None], out=np.zeros_like(rows), where=lengths[:, None] > 0)
    nearest = np.full(count, -1, dtype=np.int64)
    similarity = np.full(count, np.nan)
    block = max(1, _BLOCK_ELEMENTS // max(count, 1))
    for start in range(0, count, block):
        stop = min(start + block, count)
        scores = unit[start:stop] @ unit[:stop].T
        later = np.arange(stop)[None, :] >= np.arange(start, stop)[:, None]
        scores[later | ~kept[None, :stop]] = -np.inf
        best = np.argmax(scores, axis=1)  # the first maximum: the earliest of equals
        found = np.isfinite(scores[np.arange(stop - start), best])
        nearest[start:stop] = np.where(found, best, -1)
        similarity[start:stop] = np.where(found, np.clip(scores[np.arange(stop - start), best], -1.0, 1.0), np.nan)
    return nearest, similarity


def judgment_pairs(
    tree: Tree, traces: pl.DataFrame, untrusted: frozenset[tuple[str, str]] = frozenset()
) -> tuple[dict[int, tuple[list[float], list[bool]]], tuple[list[float], list[bool]]]:
    """(confidence, right) pairs of the tree's judgments in ``traces`` (judged rows: ``trace_id``, ``mode``,
    ``path``, ``output``, ``feedback_verdict``, ``feedback_correction``): per layer, and for the leaf.

    ``untrusted`` holds (trace id, node id) of judgments whose label mass was below the trust threshold.
    """
    homes, texts = _habit_homes(tree)
    layers: dict[int, _Pairs] = {}
    leaf = _Pairs()
    for row in traces.iter_rows(named=True):
        confirmed = _confirmed(row)
        produced = row["mode"].startswith("habit/")
        correct = row["feedback_verdict"] == "correct"
        output = (row["output"] or "").strip()
        for step in json.loads(row["path"] or "[]"):
            won = _winner(step)
            if won is None or not tree.has_node(step["node"]) or (row["trace_id"], step["node"]) in untrusted:
                continue
            winner, confidence = won
            accepted = step["outcome"] == "accept"
            if not tree.node(step["node"]).is_leaf:
                right = winner in homes[confirmed] if confirmed in homes else (True if produced and correct else None)
                layers.setdefault(int(step.get("layer") or 0), _Pairs()).add(confidence, right)
            elif tree.has_option(winner):
                text = texts.get(winner)
                if confirmed is not None and text is not None:
                    leaf.add(confidence, text == confirmed)
                elif accepted and produced:
                    leaf.add(confidence, correct)
                elif text is not None and not correct and output == text:
                    leaf.add(confidence, False)
    return {layer: (p.confidences, p.rights) for layer, p in sorted(layers.items())}, (leaf.confidences, leaf.rights)


def _winner(step: Mapping[str, Any]) -> tuple[str, float] | None:
    """The candidate a judgment picked and its probability; None when "none of these" won or nothing was
    judged. An exit keeps no choice, so its winner is read from ``probs`` (none wins ties: it is listed first)."""
    if step.get("outcome") == "accept" and step.get("chosen") is not None and step.get("p") is not None:
        return str(step["chosen"]), float(step["p"])
    probs: Mapping[str, float] = step.get("probs") or {}
    if step.get("outcome") != "exit" or not probs:
        return None
    best = max(probs, key=lambda candidate: probs[candidate])  # the first maximum: the label shown first
    if (step.get("none_prob") or 0.0) >= probs[best]:
        return None
    return best, float(probs[best])


def _confirmed(row: Mapping[str, Any]) -> str | None:
    return confirmed_answer(row["feedback_verdict"], row["output"], row["feedback_correction"])


def _habit_homes(tree: Tree) -> tuple[dict[str, set[str]], dict[str, str]]:
    """Answer text → the nodes whose subtree holds a habit with that text; answer habit id → its text."""
    homes: dict[str, set[str]] = {}
    texts: dict[str, str] = {}
    for option, owner in tree.options():
        if option.kind is OptionKind.ANSWER and option.text is not None:
            texts[option.id] = option.text.strip()
            homes.setdefault(option.text.strip(), set()).update(node.id for node in tree.path_to(owner.id))
    return homes, texts


def _check_target(target_precision: float, minimum_answered: int) -> None:
    if not 0.0 < target_precision <= 1.0:
        raise ConfigurationError(f"target_precision must lie in (0, 1], got {target_precision!r}")
    if minimum_answered < 1:
        raise ConfigurationError(f"minimum_answered must be at least 1, got {minimum_answered!r}")


# -- the replay over a store ------------------------------------------------------------------------------------


async def select_thresholds(
    store: TelemetryStore,
    task: TaskDefinition,
    *,
    target_precision: float,
    minimum_answered: int,
    embedder: EmbeddingModel | None = None,
    trust_threshold: float = DEFAULT_TRUST_THRESHOLD,
) -> ThresholdReport:
    """Replay ``task``'s judged traces in request order and choose a threshold per kind (see the module doc).

    With ``embedder`` memory is replayed by exact cosine against earlier confirmed requests; without it the
    logged recall similarities are used where they were computed against earlier requests.
    """
    _check_target(target_precision, minimum_answered)
    traces = _judged_traces(store, task)
    untrusted = (
        store.scan("calls")
        .filter((pl.col("role") == "judge") & (pl.col("label_mass") < trust_threshold))
        .select("trace_id", "node_id")
        .join(traces.lazy().select("trace_id"), on="trace_id", how="semi")
        .collect()
    )
    layers, leaf = judgment_pairs(task.tree, traces, frozenset(untrusted.iter_rows()))
    if embedder is not None:
        memory = await _replayed_memory(traces, embedder)
    else:
        memory = _logged_memory(traces)

    def choose(pairs: tuple[Sequence[float], Sequence[bool]]) -> ThresholdChoice:
        return choose_threshold(*pairs, target_precision=target_precision, minimum_answered=minimum_answered)

    return ThresholdReport(
        task=task.name,
        target_precision=target_precision,
        minimum_answered=minimum_answered,
        layers={layer: choose(pairs) for layer, pairs in layers.items()},
        leaf=choose(leaf),
        memory=choose(memory),
    )


async def select_memory_bands(
    store: TelemetryStore,
    task: TaskDefinition,
    *,
    accept_precision: float,
    verify_precision: float,
    minimum_answered: int,
    embedder: EmbeddingModel | None = None,
) -> MemoryBands:
    """``memory_accept`` and ``memory_verify`` for ``task`` from its judged traces, replayed as
    ``select_thresholds`` replays memory (by exact cosine with ``embedder``, else from the logged recalls)."""
    _check_target(accept_precision, minimum_answered)
    _check_target(verify_precision, minimum_answered)
    traces = _judged_traces(store, task)
    pairs = await _replayed_memory(traces, embedder) if embedder is not None else _logged_memory(traces)
    return choose_memory_bands(
        *pairs,
        accept_precision=accept_precision,
        verify_precision=verify_precision,
        minimum_answered=minimum_answered,
    )


def _judged_traces(store: TelemetryStore, task: TaskDefinition) -> pl.DataFrame:
    return (
        store.scan("traces")
        .filter((pl.col("task") == task.name) & pl.col("feedback_verdict").is_not_null())
        .select(
            "trace_id",
            "created_at",
            "state",
            "mode",
            "path",
            "output",
            "feedback_verdict",
            "feedback_correction",
            "recall",
        )
        .sort("created_at", maintain_order=True)
        .collect()
    )


async def _replayed_memory(traces: pl.DataFrame, embedder: EmbeddingModel) -> tuple[list[float], list[bool]]:
    """Each judged request against the nearest earlier request with a confirmed answer, by exact cosine."""
    texts = traces.get_column("state").to_list()
    vectors: list[tuple[float, ...]] = []
    for start in range(0, len(texts), _EMBED_BATCH):
        vectors.extend((await embedder.embed(texts[start : start + _EMBED_BATCH])).vectors)
    rows = list(traces.iter_rows(named=True))
    answers = [_confirmed(row) for row in rows]
    matrix = np.asarray(vectors, dtype=np.float64).reshape(len(rows), -1)
    nearest, similarity = nearest_earlier(matrix, [answer is not None for answer in answers])
    pairs = _Pairs()
    for row, source, score in zip(rows, nearest.tolist(), similarity.tolist(), strict=True):
        if source >= 0:
            pairs.add(score, _entry_right(answers[source], row))
    return pairs.confidences, pairs.rights


def _logged_memory(traces: pl.DataFrame) -> tuple[list[float], list[bool]]:
    """The logged recalls whose source entry was confirmed by a request logged before the one it answered."""
    entries = {row["trace_id"]: (row["created_at"], _confirmed(row)) for row in traces.iter_rows(named=True)}
    pairs = _Pairs()
    for row in traces.iter_rows(named=True):
        recall = json.loads(row["recall"]) if row["recall"] else {}
        source, score = recall.get("source"), recall.get("similarity")
        if source not in entries or score is None:
            continue
        created_at, answer = entries[source]
        if created_at < row["created_at"] and answer is not None:
            pairs.add(float(score), _entry_right(answer, row))
    return pairs.confidences, pairs.rights


def _entry_right(answer: str | None, row: Mapping[str, Any]) -> bool | None:
    """Whether serving a memory entry's ``answer`` for the request in ``row`` is right; None when unknown."""
    if answer is None:
        return None
    confirmed = _confirmed(row)
    if confirmed is not None:
        return answer == confirmed
    if row["feedback_verdict"] == "wrong" and answer == (row["output"] or "").strip():
        return False  # the very answer the reviewer rejected
    return None
