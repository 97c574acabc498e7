"""The learned judge's novelty cuts: how alike a request must be to the confirmed requests of its predicted class
to be served, and the root's cuts raised so that categories the tree does not hold are not served.

* **Novelty.** For every confirmed request, in arrival order, the highest cosine to the confirmed requests of
  its own class that came before it (the latest ``exemplars`` of them): what "alike" looks like for requests
  that belong. Each class's cut is the ``novelty`` quantile of its values while it has ``min_support`` of them,
  else of its node's (the "none" class left out: out-of-scope requests are alike in nothing), else of its
  layer's. A request less like the confirmed requests of its predicted class than that class's cut is not
  served.
* **Categories the tree does not hold.** At the root, each of the largest confirmed categories is left out in
  turn (the model refit without its rows and prior) and its requests are scored as that refit judges them. The
  root's confidence cut and novelty cuts rise as little as keeps at most ``unseen`` of such requests served,
  each category weighted alike, keeping as many logged in-scope predictions as possible.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from gil_core.learned.log import Logged
from gil_core.learned.state import NodeModel
from gil_core.tasks import LearnedPolicy

__all__ = ["Unseen", "left_out_requests", "novelty_cuts", "prequential_nearest", "with_unseen"]


def prequential_nearest(
    x: NDArray[np.float32], labels: NDArray[np.int64], keep: int
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """For each row with an earlier row of its class: its highest cosine to the latest ``keep`` of those, and
    its class."""
    values: list[float] = []
    classes: list[int] = []
    for c in np.unique(labels):
        rows = x[labels == c]
        for start in range(1, len(rows), 256):
            block = rows[start : start + 256]
            low = max(0, start - keep)
            similarities = block @ rows[low : start + len(block)].T  # block row i sits at column start - low + i
            for i in range(len(block)):
                end = start - low + i
                values.append(float(similarities[i, max(0, end - keep) : end].max()))
                classes.append(int(c))
    return np.asarray(values, dtype=np.float64), np.asarray(classes, dtype=np.int64)


def novelty_cuts(
    calibration: Mapping[str, tuple[NDArray[np.float64], NDArray[np.int64]]],
    models: Mapping[str, NodeModel],
    groups: Mapping[str, tuple[int, bool]],
    policy: LearnedPolicy,
) -> dict[str, NDArray[np.float64]]:
    """Per node, a cut per class: from the class's own calibration values while it has ``min_support`` of them,
    else from the node's (its "none" class apart: out-of-scope requests are alike in nothing), else from its
    layer's; NaN where there is nothing to calibrate on (such a class is never served)."""

    def in_scope(node_id: str) -> NDArray[np.float64]:
        values, classes = calibration[node_id]
        none = [i for i, choice in enumerate(models[node_id].classes) if choice is None]
        return values[~np.isin(classes, none)]

    pooled: dict[tuple[int, bool], list[NDArray[np.float64]]] = defaultdict(list)
    for node_id in calibration:
        pooled[groups[node_id]].append(in_scope(node_id))
    cuts: dict[str, NDArray[np.float64]] = {}
    for node_id, (values, classes) in calibration.items():
        fallback = in_scope(node_id)
        if len(fallback) < policy.min_support and policy.pooling == "layer":
            fallback = np.concatenate(pooled[groups[node_id]])
        node_cut = _lower_quantile(fallback, policy.novelty)
        per_class = np.full(len(models[node_id].classes), np.nan)
        for index in range(len(per_class)):
            own = values[classes == index]
            cut = _lower_quantile(own, policy.novelty) if len(own) >= policy.min_support else node_cut
            per_class[index] = np.nan if cut is None else cut
        cuts[node_id] = per_class
    return cuts


def _lower_quantile(values: NDArray[np.float64], share: float) -> float | None:
    """The value below which at most ``share`` of ``values`` lie (the smallest when there are few)."""
    if len(values) == 0:
        return None
    ordered = np.sort(values)
    rank = max(1, math.floor(share * (len(values) + 1)))
    return float(ordered[min(rank, len(values)) - 1])


@dataclass(frozen=True)
class Unseen:
    """Root requests of a category the model was fitted without: their winning probability and their highest
    cosine to the exemplars of the class they were predicted as (one array pair per left-out category)."""

    confidence: list[NDArray[np.float64]]
    near: list[NDArray[np.float64]]


_UNSEEN_PER_CLASS = 100  # left-out requests scored per category (its latest): enough for a 1% share, and cheap
_UNSEEN_CATEGORIES = 12  # categories left out in turn at most (the largest): the refit stays within seconds
_UNSEEN_MINIMUM = 5  # confirmed requests a category needs to be left out


def left_out_requests(
    x: NDArray[np.float32], y: NDArray[np.int64], priors: int, classes: Sequence[str | None], policy: LearnedPolicy
) -> Unseen | None:
    """Leave each of the root's largest categories out in turn: refit without it (its rows and its prior), and
    score its confirmed requests as the refit judges them, as if it were a category the tree does not hold."""
    from sklearn.linear_model import LogisticRegression  # type: ignore[import-untyped]  # fit path only

    confirmed = np.arange(len(y)) >= priors
    counts = [(int((confirmed & (y == c)).sum()), c) for c, name in enumerate(classes) if name is not None]
    chosen = [c for count, c in sorted(counts, reverse=True) if count >= _UNSEEN_MINIMUM][:_UNSEEN_CATEGORIES]
    if len(chosen) < 2:
        return None
    confidence, near = [], []
    for left in chosen:
        keep = y != left
        if len(np.unique(y[keep])) < 2:
            continue
        # A coarser solve than the served fit's: these refits only estimate how a left-out category is judged.
        model = LogisticRegression(C=policy.regularization, class_weight="balanced", max_iter=200, tol=1e-3)
        model.fit(x[keep], y[keep])
        sent = x[confirmed & (y == left)][-_UNSEEN_PER_CLASS:]
        probabilities = model.predict_proba(sent)
        winners = model.classes_[probabilities.argmax(axis=1)]
        kept = confirmed & keep
        best = np.full(len(sent), -1.0)
        for winner in np.unique(winners):
            pool = x[kept & (y == winner)][-policy.exemplars :]
            if len(pool):
                mine = winners == winner
                best[mine] = (sent[mine] @ pool.T).max(axis=1)
        confidence.append(probabilities.max(axis=1).astype(np.float64))
        near.append(best)
    return Unseen(confidence, near) if confidence else None


def with_unseen(model: NodeModel, unseen: Unseen | None, logged: Sequence[Logged], policy: LearnedPolicy) -> NodeModel:
    """Raise the root's confidence cut and novelty cuts as little as keeps at most ``unseen`` of a left-out
    category's requests served (each category weighted alike), keeping as many of the logged in-scope
    predictions as possible."""
    if unseen is None or not model.serving or model.cut is None:
        return model
    own = [item for item in logged if item.node_id == model.node_id and item.near is not None]
    if not own:
        return model
    kept_p = np.asarray([item.confidence for item in own])
    kept_near = np.asarray([item.near for item in own], dtype=np.float64)
    levels = sorted({model.cut, *(level for level in (0.6, 0.7, 0.8, 0.9, 0.95, 0.99) if level > model.cut)})
    nears = sorted({float(v) for v in np.quantile(np.concatenate(unseen.near), np.linspace(0, 1, 41))} | {-1.0})
    best: tuple[float, float, float] | None = None  # (coverage, confidence cut, near cut)
    for level in levels:
        for floor in nears:
            served = statistics.fmean(
                float(((p >= level) & (n >= floor)).mean()) for p, n in zip(unseen.confidence, unseen.near, strict=True)
            )
            if served > policy.unseen:
                continue
            coverage = float(((kept_p >= level) & (kept_near >= floor)).mean())
            if best is None or coverage > best[0]:
                best = (coverage, level, floor)
            break  # higher near cuts only lose coverage at this level
    report = dict(model.report)
    if best is None:
        report["unseen"] = {"served": None, "note": "no cut keeps left-out categories out"}
        return replace(model, rule="withdrawn" if model.rule != "learning" else model.rule, cut=None, report=report)
    _, level, floor = best
    report["unseen"] = {"confidence_cut": level, "near_cut": floor, "left_out": len(unseen.confidence)}
    return replace(
        model,
        cut=max(model.cut, level),
        novelty_cuts=np.where(np.isnan(model.novelty_cuts), np.nan, np.maximum(model.novelty_cuts, floor)),
        report=report,
    )
