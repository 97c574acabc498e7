"""Fitting the learned judge from the log: a classifier per node, its novelty cut, and the rule it may serve by.

* **Rows.** At each node the classes are its children (or a leaf's options); each has a prior row, the vector of
  its ``"label — description"`` (a category's also those of the answers below it); every confirmed request whose
  answer lies under the node adds a row labelled with the child on its confirmed path; at the root, requests
  confirmed as "none of these" teach a ``none`` class. Classes are weighted by their inverse frequency, so
  feedback that arrives one category after another does not make the classifier collapse onto the first ones.
* **Classifier.** scikit-learn's multinomial ``LogisticRegression`` (``C`` = ``regularization``); only its
  coefficients are kept. scikit-learn is imported here, never on the request path.
* **Novelty.** For every confirmed request, in arrival order, the highest cosine to the confirmed requests of
  its own class that came before it (the latest ``exemplars`` of them): what "alike" looks like for requests
  that belong. Each class's cut is the ``novelty`` quantile of its values while it has ``min_support`` of them,
  else of its node's (the "none" class left out: out-of-scope requests are alike in nothing), else of its
  layer's. A request less like the confirmed requests of its predicted class than that class's cut is not
  served.
* **Targets.** A walk served by the learned judge from the root to an answer is right only if each of its steps
  is, so its precision is the product of its steps'. The root, on walks of at most ``D`` judgments, must reach
  ``precision ** (1 / D)``; a node below gets what its ancestors' measured precision leaves of the task's
  (``node_target``).
* **Categories the tree does not hold.** At the root, each of the largest confirmed categories is left out in
  turn (the model refit without its rows and prior) and its requests are scored as that refit judges them. The
  root's confidence cut and novelty cuts rise as little as keeps at most ``unseen`` of such requests served,
  each category weighted alike, keeping as many logged in-scope predictions as possible.
* **Rules**, from the logged predictions (made before their verdicts) of models of the node's current generation
  (fitted on at least a quarter of its current confirmed rows), latest ``window`` per node, a node's own
  while it has ``min_support`` of them, else its layer's (leaves and inner nodes pooled apart, since their
  thresholds differ), else the whole tree's (one model judges every node); the same for the predictions the LLM
  also judged. The novelty check is not applied to
  them: it only ever removes requests from what is served. Cuts run over the logged confidences from the
  task's threshold at the node up:
  - *proven*: the lowest cut whose Wilson 95% lower bound of precision reaches the node's target;
  - *better*: the lowest cut whose logged precision reaches the node's target (not yet proven: the estimate),
    where on the requests the LLM also judged at the node the learned judge was right significantly more often
    than the LLM (a one-sided exact sign test over the requests exactly one of the two got right, at 95%):
    waiting for proof would mean asking a judge that is worse.
  The rule with the lower cut applies (proven on a tie). A node that served before and meets neither is
  *withdrawn* until a refit restores it; one that never served is *learning*.
* **The next judge.** Where the learned judge does not serve, the description reflex or the LLM is asked; a
  judge that never settles the node with the confirmed child costs energy for nothing. From the node's own
  logged requests the next judge was asked (not the audits of served ones), latest ``window``: how many it
  settled with the confirmed child ("none of these" confirmed at the root counts as not helped: an exit gives
  the same); where the Wilson 95% upper bound of that share is below ``llm_floor``, the node is marked so
  (``report["next_judge"]``) and the request path asks it only on the audit share. A node's own count needs
  dozens of asks to fall under a floor of a few percent (74 with none right, for 5%); while the next judge has
  settled none of the node's own right, the asks of the nodes of its layer (leaves and inner nodes apart, as
  for the rules; ``pooling: layer``), then those of the whole tree, decide instead when they fall under the
  floor (it is one judge: what it settles elsewhere counts for it everywhere); a judge that helped a node is
  judged there on that node's own record only.
* **Whose verdicts are evidence.** The rules (and the coverage and left-out-category checks) read only the
  predictions whose verdicts the feedback queue did not choose by its score (its random share and unsolicited
  verdicts, ``Logged.chosen_by``): the queue asks about the requests the judge is least sure of, so precision
  read from those would be biased low. Every confirmed request is a training row whichever way it was chosen.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ParamSpec, TypeVar

import numpy as np
from numpy.typing import NDArray

from gil_core.judge.prompt import Candidate
from gil_core.judge.reflex import candidate_text
from gil_core.learned.generation_floor import fit_generation_floor
from gil_core.learned.log import LearnedLog, Logged, confirmed_path
from gil_core.learned.memory_cut import fit_memory_cut
from gil_core.learned.state import SERVING_RULES, SIGNIFICANCE, LearnedState, NodeModel, Rule
from gil_core.ontology.model import Node, Option, Tree
from gil_core.tasks import LearnedPolicy
from gil_core.wilson import wilson_interval, wilson_lower_bound

_P = ParamSpec("_P")
_R = TypeVar("_R")

__all__ = ["SIGNIFICANCE", "NodeRows", "fit_state", "node_rows", "node_target", "prior_texts"]


@dataclass(frozen=True)
class NodeRows:
    """A node's training rows from the log: the classes, and for each confirmed request under the node its row
    in the log's vectors and its class index."""

    node: Node
    layer: int
    classes: tuple[str | None, ...]
    rows: NDArray[np.int64]
    labels: NDArray[np.int64]


def prior_texts(tree: Tree, item: Node | Option) -> list[str]:
    """What a class is known by before any request is confirmed: its ``"label — description"``, and for a
    category those of every answer under it."""
    texts = [candidate_text(Candidate.of(item))]
    if isinstance(item, Node):
        texts += [candidate_text(Candidate.of(option)) for option, _ in Tree(item).options()]
    return list(dict.fromkeys(texts))


def node_rows(tree: Tree, log: LearnedLog) -> list[NodeRows]:
    """Every judged node's classes and confirmed rows (see the module doc)."""
    paths = [confirmed_path(tree, item.option) for item in log.confirmed]
    result = []
    for node, layer in tree.iter_nodes():
        items: Sequence[Node | Option] = node.children or node.options
        if not items:
            continue
        classes: list[str | None] = [item.id for item in items]
        index = {item.id: position for position, item in enumerate(items)}
        rows, labels, nones = [], [], []
        for row, path in enumerate(paths):
            if node.id not in path:
                continue
            at = path.index(node.id)
            if at + 1 < len(path):
                rows.append(row)
                labels.append(index[path[at + 1]])
            elif node is tree.root:
                nones.append(row)
        if nones:
            classes.append(None)
            rows += nones
            labels += [len(classes) - 1] * len(nones)
        order = np.argsort(np.asarray(rows, dtype=np.int64), kind="stable")
        result.append(
            NodeRows(
                node,
                layer,
                tuple(classes),
                np.asarray(rows, dtype=np.int64)[order],
                np.asarray(labels, dtype=np.int64)[order],
            )
        )
    return result


def _one_blas_thread(fit: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fit`` run with one BLAS/OpenMP thread: a refit shares its cores with the batch that asked for it (and, on
    a busy machine, with everything else); measured at load 10 on 2 cores, 1,000 confirmed: 2.7 s with one
    thread, 11.1 s with BLAS's default of every core, its threads waiting for each other."""

    @functools.wraps(fit)
    def limited(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        from threadpoolctl import threadpool_limits  # fit path only

        with threadpool_limits(limits=1):
            return fit(*args, **kwargs)

    return limited


@_one_blas_thread
def fit_state(
    *,
    task: str,
    tree: Tree,
    tree_sha256: str,
    threshold: Callable[[Node, int], float],
    policy: LearnedPolicy,
    log: LearnedLog,
    priors: Mapping[str, NDArray[np.float32]],
    embedder: str,
    dimensions: int,
    previous: LearnedState | None,
    memory_threshold: float | None = None,
) -> LearnedState:
    """Fit every node (see the module doc). ``priors`` maps each prior text to its unit vector; ``threshold``
    is the task's confidence threshold at a node on a layer. With ``memory_threshold`` (memory on, no verify
    band) memory's cut is read from the same log (``learned.memory_cut``); whether generation is still asked, too
    (``learned.generation_floor``)."""
    from sklearn.linear_model import LogisticRegression  # type: ignore[import-untyped]  # fit path only

    vectors = log.vectors if log.vectors.size else np.zeros((0, dimensions), dtype=np.float32)
    fitted: dict[str, NodeModel] = {}
    unseen: _Unseen | None = None
    calibration: dict[str, tuple[NDArray[np.float64], NDArray[np.int64]]] = {}
    for rows in node_rows(tree, log):
        items: Sequence[Node | Option] = rows.node.children or rows.node.options
        prior_x: list[NDArray[np.float32]] = []
        prior_y: list[int] = []
        for position, item in enumerate(items):
            for text in prior_texts(tree, item):
                prior_x.append(priors[text])
                prior_y.append(position)
        x = np.vstack([np.asarray(prior_x, dtype=np.float32).reshape(-1, dimensions), vectors[rows.rows]])
        y = np.concatenate([np.asarray(prior_y, dtype=np.int64), rows.labels])
        k = len(rows.classes)
        digest = _rows_digest(log, rows, len(prior_y), policy)
        before = previous.nodes.get(rows.node.id) if previous is not None else None
        if before is not None and before.report.get("rows_digest") == digest and before.classes == rows.classes:
            weights, bias = before.weights, before.bias  # an untouched node keeps its fit
        elif k == 1:
            weights, bias = np.zeros((1, dimensions), np.float32), np.zeros(1, np.float32)
        else:
            model = LogisticRegression(C=policy.regularization, class_weight="balanced", max_iter=2000)
            model.fit(x, y)
            weights, bias = _softmax_parameters(model.coef_, model.intercept_, model.classes_, k, dimensions)
        exemplar_rows = _latest_per_class(rows.labels, k, policy.exemplars)
        calibration[rows.node.id] = _prequential_nearest(vectors[rows.rows], rows.labels, policy.exemplars)
        if rows.node is tree.root and k > 2:
            unseen = _left_out_requests(x, y, len(prior_y), rows.classes, policy)
        fitted[rows.node.id] = NodeModel(
            node_id=rows.node.id,
            layer=rows.layer,
            classes=rows.classes,
            weights=weights,
            bias=bias,
            exemplars=vectors[rows.rows[exemplar_rows]].astype(np.float32),
            exemplar_class=rows.labels[exemplar_rows].astype(np.int32),
            novelty_cuts=np.full(k, np.nan),
            negated=np.bincount(
                rows.labels[[log.confirmed[row].negated for row in rows.rows.tolist()]], minlength=k
            ).astype(np.int32),
            rule="learning",
            cut=None,
            evidence="node",
            report={"rows": len(rows.rows), "priors": len(prior_y), "classes": k, "rows_digest": digest},
        )
    evidence = [item for item in log.logged if item.chosen_by != "queue"]  # module doc, "Whose verdicts"
    layers = {model.node_id: _group(tree, model) for model in fitted.values()}
    cuts = _novelty_cuts(calibration, fitted, layers, policy)
    nodes: dict[str, NodeModel] = {}
    reached: dict[str, float] = {}  # per node: the precision its step is taken to have (measured, or its target)
    for node_id, model in fitted.items():  # parents before children (the tree's depth-first order)
        ancestors = [node.id for node in tree.path_to(node_id)[:-1]]
        target = node_target(tree, node_id, policy.precision, [reached[a] for a in ancestors if a in reached])
        judged = _with_rule(
            model,
            novelty_cuts=cuts[node_id],
            logged=_evidence(node_id, evidence, layers, fitted, policy),
            threshold=threshold(tree.node(node_id), model.layer),
            target=target,
            policy=policy,
            previous=previous.nodes.get(node_id) if previous is not None else None,
        )
        judged = _with_unseen(judged, unseen if node_id == tree.root.id else None, evidence, policy)
        nodes[node_id] = _with_next_judge(judged, evidence, layers, policy)
        measured = judged.report.get("precision")
        reached[node_id] = float(measured) if judged.serving and measured is not None else target
    return LearnedState(
        task=task,
        tree_sha256=tree_sha256,
        embedder=embedder,
        dimensions=dimensions,
        fitted_on=log.digest.to_json(),
        fitted_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        policy=policy.to_json(),
        nodes=nodes,
        memory=None
        if memory_threshold is None
        else fit_memory_cut(
            log,
            configured=memory_threshold,
            precision=policy.precision,
            min_support=policy.min_support,
            window=policy.window,
        ),
        generation=fit_generation_floor(log.generated, floor=policy.generation_floor, window=policy.window),
    )


def _with_next_judge(
    model: NodeModel,
    logged: Sequence[Logged],
    groups: Mapping[str, tuple[int, bool]],
    policy: LearnedPolicy,
) -> NodeModel:
    """Whether the next judge is still asked at this node where the learned judge does not serve (module doc,
    "The next judge"): over its latest ``window`` logged requests it was asked (not an audit of a served one),
    how many it settled with the confirmed child, and the Wilson 95% upper bound of that share; while it settled
    none of the node's own, the same over the node's layer and then over the tree (each node's latest
    ``window``), the first of them under the floor deciding."""
    asked_there = [item for item in logged if not item.served and item.llm_right is not None]
    pools = _pools(model.node_id, asked_there, groups, policy.window)
    if _settled(pools[0][1]) > 0 or policy.pooling == "node":
        pools = pools[:1]
    figures: dict[str, Any] = {"evidence": "node", "ask": True}
    for evidence, asked in pools:
        settled = _settled(asked)
        upper = wilson_interval(settled, len(asked))[1] if asked else 1.0
        if evidence == "node":
            figures |= {"asked": len(asked), "settled_right": settled, "upper_bound": upper}
        if policy.llm_floor > 0.0 and upper < policy.llm_floor:
            figures |= {"evidence": evidence, "ask": False}
            if evidence != "node":
                figures |= {"pooled_asked": len(asked), "pooled_settled_right": settled, "pooled_upper_bound": upper}
            break
    return replace(model, report={**model.report, "next_judge": figures})


def _pools(
    node_id: str, logged: Sequence[Logged], groups: Mapping[str, tuple[int, bool]], window: int
) -> list[tuple[str, list[Logged]]]:
    """The evidence a node may read, narrowest first: its own latest ``window`` logged items, its group's (each
    node's latest ``window``: its layer, leaves and inner nodes apart) and the tree's."""
    per_node: dict[str, list[Logged]] = defaultdict(list)
    for item in logged:
        per_node[item.node_id].append(item)
    latest = {node: items[-window:] for node, items in per_node.items()}
    layer = [item for node, items in latest.items() if groups.get(node) == groups[node_id] for item in items]
    return [
        ("node", latest.get(node_id, [])),
        ("layer", layer),
        ("tree", [i for items in latest.values() for i in items]),
    ]


def _settled(asked: Sequence[Logged]) -> int:
    """How many of these requests the next judge settled with the confirmed child."""
    return sum(bool(item.llm_right) and item.truth is not None for item in asked)


def _rows_digest(log: LearnedLog, rows: NodeRows, priors: int, policy: LearnedPolicy) -> str:
    """What a node's fit depends on: its confirmed rows (trace and class), its priors and the regularisation. A
    node whose digest did not change since the last fit is not fit again (feedback refits the nodes it touched)."""
    hasher = hashlib.sha256(f"{priors}\x1f{policy.regularization}\x1f{rows.classes}".encode())
    for row, label in zip(rows.rows.tolist(), rows.labels.tolist(), strict=True):
        hasher.update(f"\x1e{log.confirmed[row].trace_id}\x1f{label}".encode())
    return hasher.hexdigest()[:32]


@dataclass(frozen=True)
class _Unseen:
    """Root requests of a category the model was fitted without: their winning probability and their highest
    cosine to the exemplars of the class they were predicted as (one array pair per left-out category)."""

    confidence: list[NDArray[np.float64]]
    near: list[NDArray[np.float64]]


_UNSEEN_PER_CLASS = 100  # left-out requests scored per category (its latest): enough for a 1% share, and cheap
_UNSEEN_CATEGORIES = 12  # categories left out in turn at most (the largest): the refit stays within seconds
_UNSEEN_MINIMUM = 5  # confirmed requests a category needs to be left out


def _left_out_requests(
    x: NDArray[np.float32], y: NDArray[np.int64], priors: int, classes: Sequence[str | None], policy: LearnedPolicy
) -> _Unseen | None:
    """Leave each of the root's largest categories out in turn: refit without it (its rows and its prior), and
    score its confirmed requests as the refit judges them, as if it were a category the tree does not hold."""
    from sklearn.linear_model import LogisticRegression

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
    return _Unseen(confidence, near) if confidence else None


def _with_unseen(
    model: NodeModel, unseen: _Unseen | None, logged: Sequence[Logged], policy: LearnedPolicy
) -> NodeModel:
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


def _softmax_parameters(
    coef: NDArray[np.float64], intercept: NDArray[np.float64], seen: NDArray[np.int64], k: int, dimensions: int
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """scikit-learn's coefficients as k softmax rows (a binary fit has one row: its classes' logits differ by it)."""
    weights = np.zeros((k, dimensions), dtype=np.float64)
    bias = np.zeros(k, dtype=np.float64)
    if len(seen) == 2 and coef.shape[0] == 1:
        weights[seen[1]], bias[seen[1]] = coef[0], intercept[0]
    else:
        weights[seen], bias[seen] = coef, intercept
    if len(seen) < k:  # a class without any row can never win
        missing = np.setdiff1d(np.arange(k), seen)
        bias[missing] = -1e4
    return weights.astype(np.float32), bias.astype(np.float32)


def _latest_per_class(labels: NDArray[np.int64], k: int, keep: int) -> NDArray[np.int64]:
    """Positions of the latest ``keep`` rows of each class (rows are in arrival order)."""
    chosen = [np.flatnonzero(labels == c)[-keep:] for c in range(k)]
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def _prequential_nearest(
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


def node_target(tree: Tree, node_id: str, precision: float, above: Sequence[float]) -> float:
    """The precision a node must reach so that a walk served by the learned judge all the way down meets the
    task's. Each step is judged on the requests that reached it rightly, so a walk's precision is the product of
    its steps': what the steps above this node take (``above``: their measured precision where they serve, else
    their own target) leaves ``precision / product(above)`` for this node and the ``h`` judgments of its deepest
    walk down, shared alike: ``(precision / product(above)) ** (1 / h)``. At the root: ``precision ** (1 / D)``."""
    budget = precision / math.prod(above) if above else precision
    return float(min(1.0, budget ** (1.0 / _height(tree.node(node_id)))))


def _height(node: Node) -> int:
    """How many judgments a walk makes from ``node`` down to its deepest leaf, this node's included."""
    return 1 + max((_height(child) for child in node.children), default=0)


def _group(tree: Tree, model: NodeModel) -> tuple[int, bool]:
    """The pool a node's evidence joins while its own is thin: its layer, leaves and inner nodes apart."""
    return model.layer, tree.node(model.node_id).is_leaf


def _novelty_cuts(
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
class _Evidence:
    """What a node's rules read: logged predictions (for precision) and those the LLM judged too (for the
    comparison), each the node's own while it has ``min_support`` of them, else its layer's; and every logged
    prediction of the node's own (for coverage)."""

    rows: list[Logged]
    rows_from: str
    pairs: list[Logged]
    pairs_from: str
    own: list[Logged]


def _evidence(
    node_id: str,
    logged: Sequence[Logged],
    groups: Mapping[str, tuple[int, bool]],
    models: Mapping[str, NodeModel],
    policy: LearnedPolicy,
) -> _Evidence:
    def latest(items: list[Logged], *, last: bool = False) -> tuple[list[Logged], str] | None:
        """The node's own, else its layer's, else the tree's: the first that has ``min_support`` (the tree's
        however few when ``last``)."""
        pools = _pools(node_id, items, groups, policy.window)
        if policy.pooling == "node":
            return pools[0][1], "node"
        for name, kept in pools:
            if len(kept) >= policy.min_support:
                return kept, name
        return (pools[-1][1], "tree") if last else None

    # A prediction speaks for a node's model when a model of its generation made it: one fitted on at least a
    # quarter as many confirmed rows as the node's now (a leaf first judged from its priors alone says little
    # about the leaf it became). Only where no pool has enough of those does every prediction count.
    current = {node: int(model.report.get("rows", 0)) for node, model in models.items()}
    recent = [item for item in logged if 4 * item.rows >= current.get(item.node_id, 0)]
    rows, rows_from = latest(recent) or latest(list(logged), last=True) or ([], "tree")
    pairs, pairs_from = latest([item for item in logged if item.llm_right is not None], last=True) or ([], "tree")
    return _Evidence(rows, rows_from, pairs, pairs_from, [item for item in logged if item.node_id == node_id])


def _with_rule(
    model: NodeModel,
    *,
    novelty_cuts: NDArray[np.float64],
    logged: _Evidence,
    threshold: float,
    target: float,
    policy: LearnedPolicy,
    previous: NodeModel | None,
) -> NodeModel:
    own = logged.own
    choice = choose_rule(logged.rows, logged.pairs, threshold=threshold, target=target)
    coverage = None
    if choice.rule is not None and choice.cut is not None and own:
        index = {choice_id: position for position, choice_id in enumerate(model.classes)}
        served = [
            item.confidence >= choice.cut
            and item.near is not None
            and item.near >= novelty_cuts[index.get(item.choice, 0)]
            for item in own
        ]
        coverage = sum(served) / len(own)
    rule: Rule
    if choice.rule is not None:
        rule = choice.rule
    elif previous is not None and (previous.rule in SERVING_RULES or previous.rule == "withdrawn"):
        rule = "withdrawn"
    else:
        rule = "learning"
    report = {
        **model.report,
        "logged": len(own),
        "target": target,
        "evidence_rows": len(logged.rows),
        "pairs_from": logged.pairs_from,
        "coverage": coverage,
        "novelty_cuts": [None if math.isnan(value) else value for value in novelty_cuts],
        **choice.report(),
    }
    return replace(
        model,
        novelty_cuts=novelty_cuts,
        rule=rule,
        cut=choice.cut if choice.rule is not None else None,
        evidence=logged.rows_from,
        report=report,
    )


@dataclass(frozen=True)
class RuleChoice:
    """What the rules found on one node's evidence: the applicable rule (None: neither) with its cut, and the
    figures at that cut (or, when neither applies, at the task's threshold)."""

    rule: Rule | None
    cut: float | None
    support: int
    precision: float | None
    lower_bound: float | None
    p_value: float | None
    pairs: int
    llm_precision: float | None

    def report(self) -> dict[str, float | int | str | None]:
        return {
            "cut": self.cut,
            "support": self.support,
            "precision": self.precision,
            "lower_bound": self.lower_bound,
            "p_value": self.p_value,
            "pairs": self.pairs,
            "llm_precision": self.llm_precision,
        }


_NOTHING = RuleChoice(None, None, 0, None, None, None, 0, None)


def choose_rule(rows: Sequence[Logged], pairs: Sequence[Logged], *, threshold: float, target: float) -> RuleChoice:
    """The lowest cut (from ``threshold`` up, over the logged confidences of ``rows``) under each rule (module
    doc): precision is read on ``rows``, the comparison with the LLM on ``pairs``."""
    from scipy.stats import binom  # type: ignore[import-untyped]  # fit path only

    if not rows:
        return _NOTHING
    confidence = np.asarray([item.confidence for item in rows], dtype=np.float64)
    right = np.asarray([item.right for item in rows], dtype=bool)
    paired_right = np.asarray([item.right for item in pairs], dtype=bool)
    llm = np.asarray([bool(item.llm_right) for item in pairs], dtype=bool)
    # Over every request both judged here: is the LLM, asked at this node, measurably worse?
    wins, losses = int((paired_right & ~llm).sum()), int((~paired_right & llm).sum())
    p_value = float(binom.sf(wins - 1, wins + losses, 0.5)) if wins + losses else 1.0
    llm_precision = float(llm.mean()) if len(pairs) else None
    levels = np.unique(confidence[confidence >= threshold])
    figures: list[RuleChoice] = []
    proven_at: int | None = None
    better_at: int | None = None
    for position, cut in enumerate(levels):
        above = confidence >= cut
        n, k = int(above.sum()), int((above & right).sum())
        lower = wilson_lower_bound(k, n)
        figures.append(RuleChoice(None, float(cut), n, k / n, lower, p_value, len(pairs), llm_precision))
        if proven_at is None and lower >= target:
            proven_at = position
        if better_at is None and k / n >= target and p_value < SIGNIFICANCE:
            better_at = position
    if proven_at is None and better_at is None:
        return replace(figures[0], cut=None) if figures else _NOTHING
    if better_at is None or (proven_at is not None and proven_at <= better_at):
        assert proven_at is not None
        return replace(figures[proven_at], rule="proven")
    return replace(figures[better_at], rule="better")
