"""Fitting the learned judge from the log: a classifier per node, its novelty cut (``learned.novelty``), and the
rule it may serve by (``learned.rules``).

* **Rows.** At each node the classes are its children (or a leaf's options); each has a prior row, the vector of
  its ``"label — description"`` (a category's also those of the answers below it); every confirmed request whose
  answer lies under the node adds a row labelled with the child on its confirmed path; at the root, requests
  confirmed as "none of these" teach a ``none`` class. Classes are weighted by their inverse frequency, so
  feedback that arrives one category after another does not make the classifier collapse onto the first ones.
* **Classifier.** scikit-learn's multinomial ``LogisticRegression`` (``C`` = ``regularization``); only its
  coefficients are kept. scikit-learn is imported here, never on the request path.
* **Targets.** A walk served by the learned judge from the root to an answer is right only if each of its steps
  is, so its precision is the product of its steps'. The root, on walks of at most ``D`` judgments, must reach
  ``precision ** (1 / D)``; a node below gets what its ancestors' measured precision leaves of the task's
  (``node_target``).
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import numpy as np
from numpy.typing import NDArray

from gil_core.judge.prompt import Candidate
from gil_core.judge.reflex import candidate_text
from gil_core.learned.generation_floor import fit_generation_floor
from gil_core.learned.log import LearnedLog, confirmed_path
from gil_core.learned.memory_cut import fit_memory_cut
from gil_core.learned.novelty import Unseen, left_out_requests, novelty_cuts, prequential_nearest, with_unseen
from gil_core.learned.rules import reported_at_cuts, rule_evidence, with_next_judge, with_rule
from gil_core.learned.state import LearnedState, NodeModel
from gil_core.ontology.model import Node, Option, Tree
from gil_core.tasks import LearnedPolicy

_P = ParamSpec("_P")
_R = TypeVar("_R")

__all__ = ["NodeRows", "fit_state", "node_rows", "node_target", "prior_texts"]


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
    unseen: Unseen | None = None
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
        calibration[rows.node.id] = prequential_nearest(vectors[rows.rows], rows.labels, policy.exemplars)
        if rows.node is tree.root and k > 2:
            unseen = left_out_requests(x, y, len(prior_y), rows.classes, policy)
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
    cuts = novelty_cuts(calibration, fitted, layers, policy)
    nodes: dict[str, NodeModel] = {}
    reached: dict[str, float] = {}  # per node: the precision its step is taken to have (measured, or its target)
    for node_id, model in fitted.items():  # parents before children (the tree's depth-first order)
        ancestors = [node.id for node in tree.path_to(node_id)[:-1]]
        target = node_target(tree, node_id, policy.precision, [reached[a] for a in ancestors if a in reached])
        judged = with_rule(
            model,
            novelty_cuts=cuts[node_id],
            logged=rule_evidence(node_id, evidence, layers, fitted, policy),
            threshold=threshold(tree.node(node_id), model.layer),
            target=target,
            policy=policy,
            previous=previous.nodes.get(node_id) if previous is not None else None,
        )
        judged = with_unseen(judged, unseen if node_id == tree.root.id else None, evidence, policy)
        judged = reported_at_cuts(judged, evidence)
        nodes[node_id] = with_next_judge(judged, evidence, layers, policy)
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


def _rows_digest(log: LearnedLog, rows: NodeRows, priors: int, policy: LearnedPolicy) -> str:
    """What a node's fit depends on: its confirmed rows (trace and class), its priors and the regularisation. A
    node whose digest did not change since the last fit is not fit again (feedback refits the nodes it touched)."""
    hasher = hashlib.sha256(f"{priors}\x1f{policy.regularization}\x1f{rows.classes}".encode())
    for row, label in zip(rows.rows.tolist(), rows.labels.tolist(), strict=True):
        hasher.update(f"\x1e{log.confirmed[row].trace_id}\x1f{label}".encode())
    return hasher.hexdigest()[:32]


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
