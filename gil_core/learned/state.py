"""A task's fitted learned judge: per node, a linear classifier over request vectors, the confirmed requests its
novelty check compares with, and the rule (read off the log) under which it may serve.

Serving is numpy only: a node's judgment is one small matrix-vector product and a softmax, and its novelty check
one product with at most ``exemplars`` vectors per class. Nothing here imports scikit-learn.

The state is stored as one Parquet file (arrays as little-endian bytes, the header as JSON in the file's
key-value metadata): a format that cannot run code when it is read. It names the task, the tree's SHA-256 and
the embedder it was fitted for, and the verdicts it was fitted on (``fitted_on``), so a changed tree or embedder
is never served a stale model, and a process can tell whether a refit is due. The header also holds memory's
similarity cut read from the same log (``memory``, see ``learned.memory_cut``) and, when present, whether
generation is still asked (``generation``, see ``learned.generation_floor``; a state written before it has none
and always asks).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numpy as np
import polars as pl
from numpy.typing import NDArray

from gil_core.errors import LearnedStateError
from gil_core.learned.generation_floor import GenerationFloor
from gil_core.learned.memory_cut import MemoryCut
from gil_core.storage import Folder

__all__ = [
    "FORMAT",
    "Decision",
    "LearnedState",
    "LearnedStateError",
    "NodeModel",
    "Prediction",
    "Rule",
    "read_state",
    "write_state",
]

FORMAT = 3  # 3: the header holds memory's cut
_HEADER_KEY = "gil.learned"

Rule = Literal["proven", "better", "withdrawn", "learning"]
"""How a node stands: served because its logged precision is proven at the target ("proven"), served because the
LLM judged the same requests significantly worse ("better"), no longer served because the log stopped supporting
the rule that let it serve ("withdrawn"), or never served yet ("learning")."""
SERVING_RULES: frozenset[str] = frozenset({"proven", "better"})

SIGNIFICANCE = 0.05
"""The one-sided level of the sign test behind the rule "better than the LLM" (and behind a guess)."""

Decision = Literal["served", "not_serving", "below_cut", "novel", "negated", "shadow"]
"""What became of one learned prediction: served, or why not."""

Float32 = NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Prediction:
    """The learned judge at one node: a probability per class, the winner, and how like the winner's confirmed
    requests the request is (``near``: the highest cosine; None when the class has no confirmed request)."""

    classes: tuple[str | None, ...]
    probabilities: NDArray[np.float64]
    index: int
    near: float | None

    @property
    def choice(self) -> str | None:
        """The winning class: a child's id, or None for "none of these"."""
        return self.classes[self.index]

    @property
    def confidence(self) -> float:
        return float(self.probabilities[self.index])


@dataclass(frozen=True)
class NodeModel:
    """One node's classifier (``weights`` k×d, ``bias`` k over ``classes``; a single class always wins), its
    exemplars (unit rows, ``exemplar_class`` indexing ``classes``), its novelty cut per class (NaN: never
    served), how many confirmed requests of each class negate (``negated``), and its rule with the confidence
    ``cut`` it serves from. ``report`` holds what the fit measured,
    for ``gil fit-reflex``."""

    node_id: str
    layer: int
    classes: tuple[str | None, ...]
    weights: Float32
    bias: Float32
    exemplars: Float32
    exemplar_class: NDArray[np.int32]
    novelty_cuts: NDArray[np.float64]
    negated: NDArray[np.int32]
    rule: Rule
    cut: float | None
    evidence: str
    report: Mapping[str, Any] = field(default_factory=dict)

    def predict(self, vector: Float32) -> Prediction:
        """Classify a unit request vector."""
        if len(self.classes) == 1:
            probabilities = np.ones(1, dtype=np.float64)
        else:
            logits = (self.weights @ vector + self.bias).astype(np.float64)
            logits -= logits.max()
            exp = np.exp(logits)
            probabilities = exp / exp.sum()
        index = int(np.argmax(probabilities))
        mine = self._exemplars_by_class[index]
        near = float((mine @ vector).max()) if len(mine) else None
        return Prediction(self.classes, probabilities, index, near)

    @cached_property
    def _exemplars_by_class(self) -> tuple[Float32, ...]:
        """Each class's exemplars, the rows in order (as the mask selects them): taken apart once, not per request."""
        return tuple(self.exemplars[self.exemplar_class == index] for index in range(len(self.classes)))

    def decide(self, prediction: Prediction, *, negates: bool = False) -> Decision:
        """Whether this prediction may be served: the node's rule serves, the confidence reaches the cut, the
        request is not unlike every confirmed request of the class it is predicted as, and it does not negate
        where no confirmed request of that class did (the embedder barely sees "don't")."""
        if self.rule not in SERVING_RULES or self.cut is None:
            return "not_serving"
        unlike = self.unlike(prediction, negates=negates)
        if unlike is not None:
            return unlike
        if prediction.confidence < self.cut:
            return "below_cut"
        return "served"

    def may_guess(self, prediction: Prediction, decision: Decision, *, negates: bool = False) -> bool:
        """Whether this prediction, not served (``decision``), may settle the node where the next judge did not:
        the node is below the root, only its rule or cut kept the prediction from being served (it passes the
        negation and novelty checks serving applies), the prediction names a child (a guess never answers "none
        of these"), and the log shows the LLM at this node significantly worse than the learned judge (the sign
        test of the rule "better", ``report["p_value"]``)."""
        if self.layer <= 1 or decision not in ("below_cut", "not_serving") or prediction.choice is None:
            return False
        p_value = self.report.get("p_value")
        if p_value is None or float(p_value) >= SIGNIFICANCE:
            return False
        return self.unlike(prediction, negates=negates) is None

    def unlike(self, prediction: Prediction, *, negates: bool = False) -> Decision | None:
        """ "negated" where the request negates and no confirmed request of its class did (the embedder barely
        sees "don't"), "novel" where it is less like that class's confirmed requests than its cut, else None."""
        if negates and self.negated[prediction.index] == 0:
            return "negated"
        cut = float(self.novelty_cuts[prediction.index])
        if prediction.near is None or math.isnan(cut) or prediction.near < cut:
            return "novel"
        return None

    @property
    def asks_next_judge(self) -> bool:
        """Whether the next judge is asked where this node does not serve (fit.py, "The next judge"; a state
        fitted before the rule asks it)."""
        figures = self.report.get("next_judge")
        return not isinstance(figures, Mapping) or bool(figures.get("ask", True))

    @property
    def serving(self) -> bool:
        return self.rule in SERVING_RULES and self.cut is not None


@dataclass(frozen=True)
class LearnedState:
    """Everything fitted for one task (see the module doc). ``fitted_on`` = ``{"verdicts": n, "digest": d}``
    of the verdicts read; ``memory`` is memory's cut read from the same log (None: memory is off or has a
    verify band, and keeps its configured cuts); ``name`` is the file it was read from or written to;
    ``generation`` is whether generation is still asked (``learned.generation_floor``; None: always)."""

    task: str
    tree_sha256: str
    embedder: str
    dimensions: int
    fitted_on: Mapping[str, int]
    fitted_at: str
    policy: Mapping[str, Any]
    nodes: Mapping[str, NodeModel]
    memory: MemoryCut | None = None
    name: str | None = None
    generation: GenerationFloor | None = None

    @property
    def asks_generation(self) -> bool:
        """Whether generation is asked on every request the tree leaves to it (``learned.generation_floor``)."""
        return self.generation is None or self.generation.ask

    @property
    def key(self) -> str:
        """What the state is valid for: the tree and the embedder (a file name's middle part)."""
        return state_key(self.tree_sha256, self.embedder)

    def matches(self, task: str, tree_sha256: str, embedder: str) -> bool:
        return (self.task, self.tree_sha256, self.embedder) == (task, tree_sha256, embedder)


def task_key(task: str) -> str:
    """The folder name of a task's learned states: a hash, so that no task name becomes a path."""
    return hashlib.sha256(task.encode("utf-8")).hexdigest()[:24]


def state_key(tree_sha256: str, embedder: str) -> str:
    digest = hashlib.sha256(embedder.encode("utf-8")).hexdigest()
    return f"{tree_sha256[:16]}-{digest[:12]}"


# -- storage ----------------------------------------------------------------------------------------------------


def _bytes(array: NDArray[Any], dtype: str) -> bytes:
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def _array(value: bytes, dtype: str, shape: tuple[int, ...], what: str, *, finite: bool = True) -> NDArray[Any]:
    expected = math.prod(shape) * np.dtype(dtype).itemsize
    if not isinstance(value, bytes) or len(value) != expected:
        raise LearnedStateError(f"{what}: {len(value) if isinstance(value, bytes) else '?'} bytes, not {expected}")
    array = np.frombuffer(value, dtype=dtype).reshape(shape)
    if array.dtype.kind == "f" and finite and not np.isfinite(array).all():
        raise LearnedStateError(f"{what}: holds a value that is not finite")
    return array


def write_state(folder: Folder, state: LearnedState, name: str) -> None:
    """Write ``state`` as the file ``name`` in ``folder``, atomically (the folder's whole-file write)."""
    rows = [
        {
            "node_id": model.node_id,
            "layer": model.layer,
            "classes": list(model.classes),
            "weights": _bytes(model.weights, "<f4"),
            "bias": _bytes(model.bias, "<f4"),
            "exemplars": _bytes(model.exemplars, "<f4"),
            "exemplar_class": _bytes(model.exemplar_class, "<i4"),
            "exemplar_count": len(model.exemplar_class),
            "novelty_cuts": _bytes(model.novelty_cuts, "<f8"),
            "negated": _bytes(model.negated, "<i4"),
            "rule": model.rule,
            "cut": model.cut,
            "evidence": model.evidence,
            "report": json.dumps(model.report, sort_keys=True),
        }
        for model in state.nodes.values()
    ]
    frame = pl.DataFrame(rows, schema=_SCHEMA)
    header = {
        "format": FORMAT,
        "task": state.task,
        "tree_sha256": state.tree_sha256,
        "embedder": state.embedder,
        "dimensions": state.dimensions,
        "fitted_on": dict(state.fitted_on),
        "fitted_at": state.fitted_at,
        "policy": dict(state.policy),
        "memory": state.memory.to_json() if state.memory is not None else None,
        "generation": state.generation.to_json() if state.generation is not None else None,
    }
    folder.write_parquet(name, frame, metadata={_HEADER_KEY: json.dumps(header, sort_keys=True)})


_SCHEMA = pl.Schema(
    {
        "node_id": pl.String(),
        "layer": pl.Int64(),
        "classes": pl.List(pl.String()),
        "weights": pl.Binary(),
        "bias": pl.Binary(),
        "exemplars": pl.Binary(),
        "exemplar_class": pl.Binary(),
        "exemplar_count": pl.Int64(),
        "novelty_cuts": pl.Binary(),
        "negated": pl.Binary(),
        "rule": pl.String(),
        "cut": pl.Float64(),
        "evidence": pl.String(),
        "report": pl.String(),
    }
)


def read_state(folder: Folder, name: str, *, task: str) -> LearnedState:
    """The state in file ``name``; ``LearnedStateError`` naming the file when it cannot be used for ``task``
    (a decode failure, another task's state, or arrays that do not fit together)."""
    source = folder.source(name)
    where = f"{folder.where}/{name}"
    try:
        metadata = pl.read_parquet_metadata(source, storage_options=folder.storage_options)
        frame = pl.read_parquet(source, storage_options=folder.storage_options)
    except FileNotFoundError:
        raise
    except Exception as exc:  # any decode failure of a corrupt file: the caller refits
        raise LearnedStateError(f"{where}: unreadable ({type(exc).__name__})") from None
    try:
        header = json.loads(metadata[_HEADER_KEY])
        if header.get("format") != FORMAT:
            raise LearnedStateError(f"format {header.get('format')!r}, not {FORMAT}")
        if header.get("task") != task:
            raise LearnedStateError("fitted for another task")  # never read across tasks (its name is not echoed)
        if frame.schema != _SCHEMA:
            raise LearnedStateError("columns differ from the state's layout")
        dimensions = int(header["dimensions"])
        nodes = {row["node_id"]: _node(row, dimensions) for row in frame.iter_rows(named=True)}
        return LearnedState(
            task=task,
            tree_sha256=str(header["tree_sha256"]),
            embedder=str(header["embedder"]),
            dimensions=dimensions,
            fitted_on={key: int(value) for key, value in dict(header["fitted_on"]).items()},
            fitted_at=str(header["fitted_at"]),
            policy=dict(header["policy"]),
            nodes=nodes,
            memory=MemoryCut.of(header["memory"]) if header.get("memory") is not None else None,
            name=name,
            generation=GenerationFloor.of(header["generation"]) if header.get("generation") is not None else None,
        )
    except LearnedStateError as exc:
        raise LearnedStateError(f"{where}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise LearnedStateError(f"{where}: malformed ({type(exc).__name__}: {exc})") from None


def _node(row: Mapping[str, Any], dimensions: int) -> NodeModel:
    classes = tuple(row["classes"])
    k, m = len(classes), int(row["exemplar_count"])
    node = row["node_id"]
    if k < 1 or m < 0:
        raise LearnedStateError(f"node {node!r}: {k} classes, {m} exemplars")
    exemplar_class = _array(row["exemplar_class"], "<i4", (m,), f"node {node!r} exemplar classes")
    if m and (exemplar_class.min() < 0 or exemplar_class.max() >= k):
        raise LearnedStateError(f"node {node!r}: an exemplar of no class")
    rule = row["rule"]
    if rule not in ("proven", "better", "withdrawn", "learning"):
        raise LearnedStateError(f"node {node!r}: unknown rule {rule!r}")
    return NodeModel(
        node_id=node,
        layer=int(row["layer"]),
        classes=classes,
        weights=_array(row["weights"], "<f4", (k, dimensions), f"node {node!r} weights").astype(np.float32),
        bias=_array(row["bias"], "<f4", (k,), f"node {node!r} bias").astype(np.float32),
        exemplars=_array(row["exemplars"], "<f4", (m, dimensions), f"node {node!r} exemplars").astype(np.float32),
        exemplar_class=exemplar_class.astype(np.int32),
        novelty_cuts=_array(row["novelty_cuts"], "<f8", (k,), f"node {node!r} novelty cuts", finite=False).astype(
            np.float64
        ),
        negated=_array(row["negated"], "<i4", (k,), f"node {node!r} negated counts").astype(np.int32),
        rule=rule,
        cut=row["cut"],
        evidence=row["evidence"],
        report=json.loads(row["report"]),
    )
