"""The embedder's ceiling in the learned-reflex benchmark: one flat classifier over the local embedder's vectors of
a stream, its cuts chosen in hindsight, an upper bound for the learned judge rather than a result of Gil's."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from benchmarks._learned_report import pct, share
from benchmarks._learned_runs import CHUNK, normalized
from benchmarks._learned_setup import POLICY, WARMUP, StreamSpec, top_category
from benchmarks._report import Row
from gil_core.taskfile import load_task_file

__all__ = ["GUARD_MINIMUM", "UNSEEN_TARGET", "ceiling_row", "flat_ceiling"]


async def flat_ceiling(spec: StreamSpec) -> dict[str, Any]:
    """What the embedder allows, whatever the tree and the gating: one flat scikit-learn ``LogisticRegression``
    (the learned reflex's ``C``, balanced classes) over the local embedder's vectors of the stream's requests,
    classes = the key's answers ("none" for none of these), refit after each chunk on every request before it,
    read on the never-seen requests from position WARMUP on. Reports its argmax accuracy (serving everything) and
    the largest share a single confidence cut chosen *in hindsight* serves at the target precision: an upper
    bound on what a gated judge over these vectors reaches, not a result of Gil's.

    And the same with the guard against categories the tree does not hold (``guarded``): at each chunk, every
    top category of at least ``GUARD_MINIMUM`` requests is also left out in turn (a refit without its answers)
    and its requests of the chunk scored, as leave-one-category-out sends them. A pair of cuts chosen in
    hindsight, on the winning probability and on the cosine to the nearest earlier request of the winning answer
    (the learned judge's two gates), serves as many never-seen requests right as it can while keeping the
    target precision and at most ``UNSEEN_TARGET`` of a left-out category served (averaged over categories):
    the most any gated judge of this kind serves right on these vectors while meeting that target."""
    from sklearn.linear_model import LogisticRegression  # type: ignore[import-untyped]

    from gil_core.local.minilm import MiniLMEmbeddingModel

    stream = spec.load()
    tree = load_task_file(stream.task_file).task.tree
    requests = list(stream.requests[: spec.size])
    embedded = await MiniLMEmbeddingModel().embed([request.text for request in requests])
    x = np.asarray(embedded.vectors, dtype=np.float64)
    y = np.asarray([request.option_id or "none" for request in requests])
    top = np.asarray([top_category(tree, request.option_id) or "none" for request in requests])
    guarded = [c for c in dict.fromkeys(top.tolist()) if c != "none" and int((top == c).sum()) >= GUARD_MINIMUM]
    seen: set[str] = set()
    fresh = []
    for request in requests:
        key = normalized(request.text)
        fresh.append(key not in seen)
        seen.add(key)
    confidence: list[float] = []
    near: list[float] = []
    right: list[bool] = []
    left_out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    regularization = POLICY.regularization

    def scored(model: Any, train: NDArray[np.bool_], rows: list[int]) -> tuple[NDArray[Any], list[float], list[float]]:
        probabilities = model.predict_proba(x[rows])
        winners = model.classes_[probabilities.argmax(axis=1)]
        similarity = x[rows] @ x[train].T
        nearest = [float(similarity[i, y[train] == winner].max()) for i, winner in enumerate(winners)]
        return winners, probabilities.max(axis=1).tolist(), nearest

    for start in range(WARMUP, len(requests), CHUNK):
        before = np.arange(len(requests)) < start
        if len(set(y[before])) < 2:
            continue
        model = LogisticRegression(C=regularization, class_weight="balanced", max_iter=3000).fit(x[before], y[before])
        end = min(start + CHUNK, len(requests))
        chosen = [index for index in range(start, end) if fresh[index]]
        if chosen:
            winners, p, n = scored(model, before, chosen)
            confidence += p
            near += n
            right += (winners == y[chosen]).tolist()
        for category in guarded:
            sent = [index for index in range(start, end) if top[index] == category]
            kept = before & (top != category)
            if not sent or len(set(y[kept])) < 2:
                continue
            # A coarser solve, as the learned judge's own left-out refits: it only estimates how they are judged.
            refit = LogisticRegression(C=regularization, class_weight="balanced", max_iter=300, tol=1e-3)
            _, p, n = scored(refit.fit(x[kept], y[kept]), kept, sent)
            left_out[category] += list(zip(p, n, strict=True))
    order = np.argsort(-np.asarray(confidence), kind="stable")
    running = np.cumsum(np.asarray(right)[order]) / np.arange(1, len(order) + 1)
    meets = np.flatnonzero(running >= POLICY.precision)
    return {
        "requests": len(right),
        "argmax_right": int(sum(right)),
        "servable": int(meets.max() + 1) if meets.size else 0,
        "regularization": regularization,
        **_guarded_cuts(np.asarray(confidence), np.asarray(near), np.asarray(right, dtype=bool), left_out),
    }


GUARD_MINIMUM = 20  # requests a category needs to be left out in the guarded ceiling
UNSEEN_TARGET = 0.03  # the leave-one-category-out target: at most this share served as another category


def _guarded_cuts(
    confidence: NDArray[np.float64],
    near: NDArray[np.float64],
    right: NDArray[np.bool_],
    left_out: Mapping[str, list[tuple[float, float]]],
) -> dict[str, Any]:
    """The pair of cuts (flat_ceiling's doc) that serves the most requests right at the target precision with at
    most UNSEEN_TARGET of a left-out category served, over a grid of each figure's quantiles."""
    best: tuple[int, float, float | None, float | None] = (0, 0.0, None, None)  # right, left-out share, the cuts
    if not len(right) or not left_out:
        return {"guarded_right": 0, "guarded_unseen": None, "guarded_categories": len(left_out)}
    grid = np.linspace(0.0, 0.95, 60)
    sent = [np.asarray(pairs, dtype=np.float64) for pairs in left_out.values()]
    for p_cut in np.unique(np.quantile(confidence, grid)):
        for n_cut in np.unique(np.quantile(near, grid)):
            served = (confidence >= p_cut) & (near >= n_cut)
            good = int((served & right).sum())
            if not served.any() or good < POLICY.precision * served.sum() or good <= best[0]:
                continue
            unseen = float(np.mean([((pairs[:, 0] >= p_cut) & (pairs[:, 1] >= n_cut)).mean() for pairs in sent]))
            if unseen <= UNSEEN_TARGET:
                best = (good, unseen, float(p_cut), float(n_cut))
    return {
        "guarded_right": best[0],
        "guarded_unseen": best[1],
        "guarded_categories": len(left_out),
        "guarded_cuts": [best[2], best[3]],
    }


def ceiling_row(spec: StreamSpec, ceiling: dict[str, Any]) -> Row:
    n = ceiling["requests"]
    return Row(
        f"{spec.name}: the embedder's ceiling (a flat classifier, no tree, no gating, C={ceiling['regularization']:g})",
        "",
        f"right serving everything {share(ceiling['argmax_right'], n)}; the most one cut chosen in hindsight serves "
        f"at ≥ {pct(POLICY.precision)}: {share(ceiling['servable'], n)}"
        + (
            f"; the most a pair of cuts chosen in hindsight serves right at ≥ {pct(POLICY.precision)} with at most "
            f"{pct(UNSEEN_TARGET)} of a left-out category served (each of {ceiling['guarded_categories']} categories "
            f"left out in turn at every chunk): {share(ceiling['guarded_right'], n)}"
            if ceiling.get("guarded_categories")
            else ""
        ),
    )
