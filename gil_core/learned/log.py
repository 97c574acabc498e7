"""What the log teaches the learned judge: the confirmed requests with their vectors, and the predictions it made
before each verdict arrived, scored against that verdict.

A request is confirmed when its trace carries a verdict whose confirmed answer (the output when correct, the
correction when wrong) is one of the tree's answers (``AnswerIndex``: an answer's text, a filled template, or a
habit trace's own option) or the contract's "none of these". A later verdict on the same trace supersedes the
earlier one (the store keeps the last row per trace), so an answer marked wrong afterwards is withdrawn, and a
correction confirms the corrected answer. Answers that name no tree answer (shadows, free text) teach nothing
here. Do-not-record traces keep no text and no vector, so they are never read.

Each confirmed request, and each prediction scored by its verdict, says how its trace was chosen for a verdict
(``chosen_by``: by the feedback queue's score, by its random share, or "unsolicited", in no issued queue; see
``learned.queue``): the serving rules read precision only from verdicts the queue did not choose.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from gil_core.habits.attribution import AnswerIndex
from gil_core.learned.generation_floor import GENERATION_MODES, Generated
from gil_core.learned.queue import ChosenBy, read_chosen_by
from gil_core.memory.guard import has_negation
from gil_core.ontology.model import Tree, version_option
from gil_core.telemetry import TelemetryStore
from gil_core.verdicts import confirmed_answer

__all__ = [
    "Confirmed",
    "LearnedLog",
    "Logged",
    "VerdictDigest",
    "confirmed_path",
    "learnable_option",
    "read_learned_log",
    "verdict_digest",
]

_LLM_DECIDERS = frozenset({"llm", "deliberate"})


@dataclass(frozen=True, slots=True)
class Confirmed:
    """A confirmed request: its trace, its place in arrival order, and the tree answer confirmed (None: none)."""

    trace_id: str
    order: int
    option: str | None
    negated: bool = False  # the request negates ("don't", "not", "안 돼"…)
    chosen_by: ChosenBy = "unsolicited"


@dataclass(frozen=True, slots=True)
class Logged:
    """One logged learned prediction at a node, with what the verdict says was right there (``truth``: the child
    on the confirmed path, None for "none of these" at the root) and whether the LLM, where it judged the same
    request at that node, was right (None when it did not judge). ``served``: the learned judge served it there
    (so an LLM judgment of it was an audit, not the next judge's word on a request the learned judge left)."""

    node_id: str
    order: int
    truth: str | None
    choice: str | None
    confidence: float
    near: float | None
    llm_right: bool | None
    rows: int = 0  # the confirmed rows of the model that made the prediction (0: unknown)
    chosen_by: ChosenBy = "unsolicited"  # how the verdict's trace was chosen (module doc)
    served: bool = False

    @property
    def right(self) -> bool:
        return self.choice == self.truth


@dataclass(frozen=True, slots=True)
class VerdictDigest:
    """Where the log stands for a task: how many verdicts, and an order-free hash of them all."""

    verdicts: int
    digest: int

    def to_json(self) -> dict[str, int]:
        return {"verdicts": self.verdicts, "digest": self.digest}

    @classmethod
    def of(cls, value: Mapping[str, int]) -> VerdictDigest:
        return cls(int(value.get("verdicts", -1)), int(value.get("digest", -1)))


@dataclass(frozen=True)
class LearnedLog:
    """The confirmed requests that have a vector (arrival order, ``vectors`` row-aligned, unit rows), the scored
    predictions, the digest of the verdicts read, and the requests that went to generation with whether their
    verdict confirmed the generated answer (``generated``, for ``learned.generation_floor``)."""

    confirmed: tuple[Confirmed, ...]
    vectors: NDArray[np.float32]
    logged: tuple[Logged, ...]
    digest: VerdictDigest
    generated: tuple[Generated, ...] = ()


def _verdicts(store: TelemetryStore, task: str) -> pl.LazyFrame:
    return store.scan("traces").filter((pl.col("task") == task) & pl.col("feedback_verdict").is_not_null())


def verdict_digest(store: TelemetryStore, task: str) -> VerdictDigest:
    """The digest of ``task``'s verdicts as the log holds them now (cheap: three columns)."""
    frame = _verdicts(store, task).select("trace_id", "feedback_verdict", "feedback_correction").collect()
    return _digest(frame)


def _digest(frame: pl.DataFrame) -> VerdictDigest:
    if frame.is_empty():
        return VerdictDigest(0, 0)
    hashed = frame.select("trace_id", "feedback_verdict", "feedback_correction").hash_rows(seed=17)
    return VerdictDigest(frame.height, int(hashed.cast(pl.UInt64).sum() % (1 << 62)))


def confirmed_path(tree: Tree, option: str | None) -> list[str]:
    """The ids from the root down to a confirmed option, both ends included; ``[root]`` for "none of these"."""
    if option is None:
        return [tree.root.id]
    owner = tree.owner(option)
    return [node.id for node in tree.path_to(owner.id)] + [option]


def read_learned_log(store: TelemetryStore, task: str, tree: Tree, *, none_text: str, embedder: str) -> LearnedLog:
    """Read ``task``'s verdicts, their requests' vectors from ``embedder``, the predictions logged in their walks
    and how each trace was chosen (see the module doc)."""
    traces = (
        _verdicts(store, task)
        .select(
            "trace_id",
            "created_at",
            "state",
            "mode",
            "output",
            "label",
            "feedback_verdict",
            "feedback_correction",
            "path",
            "answer_version",
        )
        .collect()
        .sort("created_at", maintain_order=True)
    )
    digest = _digest(traces)
    answers = AnswerIndex(tree)
    options = {option.id for option, _ in tree.options()}
    chosen = read_chosen_by(store, task)
    confirmed: list[Confirmed] = []
    logged: list[Logged] = []
    generated: list[Generated] = []
    for order, row in enumerate(traces.iter_rows(named=True)):
        if not row["state"]:  # a do-not-record trace: nothing of it is learned
            continue
        how = chosen.get(row["trace_id"], "unsolicited")
        if row["mode"] in GENERATION_MODES:
            generated.append(Generated(order, row["feedback_verdict"] == "correct", how))
        known, option = _confirmed_option(row, answers, options, none_text)
        if not known:
            continue
        confirmed.append(Confirmed(row["trace_id"], order, option, has_negation(row["state"]), how))
        logged.extend(replace(item, chosen_by=how) for item in _scored(tree, row["path"], order, option))
    with_vectors, vectors = _vectors(store, task, embedder, confirmed)
    return LearnedLog(tuple(with_vectors), vectors, tuple(logged), digest, tuple(generated))


def _confirmed_option(
    row: Mapping[str, Any], answers: AnswerIndex, options: set[str], none_text: str
) -> tuple[bool, str | None]:
    """(whether the confirmed answer is one the learned judge learns, the option it names or None for none)."""
    if row["feedback_verdict"] == "correct" and str(row["mode"]).startswith("habit/") and row["label"] in options:
        return True, row["label"]
    answer = confirmed_answer(row["feedback_verdict"], row["output"], row["feedback_correction"])
    if answer is None:
        return False, None
    known, option = learnable_option(answers, answer, none_text)
    if not known and row.get("answer_version"):  # the tree answer it confirmed, since reworded: the same option
        option = version_option(str(row["answer_version"]))
        known = option in options
    return (True, option) if known else (False, None)


def learnable_option(answers: AnswerIndex, answer: str, none_text: str) -> tuple[bool, str | None]:
    """Whether a confirmed answer is one the learned judge learns, and the option it names (None: "none of
    these"): ``none_text``, or one of the tree's answers (``AnswerIndex``: an answer's text, a filled template)."""
    if answer == none_text:
        return True, None
    option = answers.option_for(answer)
    return option is not None, option


def _scored(tree: Tree, path_json: str | None, order: int, option: str | None) -> Iterator[Logged]:
    path = confirmed_path(tree, option)
    truth_at = {node: path[index + 1] if index + 1 < len(path) else None for index, node in enumerate(path)}
    for step in json.loads(path_json or "[]"):
        note = step.get("learned")
        if not note:
            continue
        predictions = [(step.get("node"), note, step)] + [(item["node"], item, None) for item in note.get("ahead", ())]
        for node, said, judged in predictions:
            if node not in truth_at:
                continue  # the node is not on the confirmed path
            truth = truth_at[node]
            yield Logged(
                node_id=node,
                order=order,
                truth=truth,
                choice=said.get("choice"),
                confidence=float(said["p"]),
                near=said.get("near"),
                llm_right=_llm_right(judged, truth) if judged is not None else None,
                rows=int(said.get("n") or 0),
                served=judged is not None and said.get("why") == "served",
            )


def _llm_right(step: Mapping[str, Any], truth: str | None) -> bool | None:
    audit = step.get("audit")
    if audit is not None:
        return bool(audit.get("choice") == truth and (truth is not None or audit.get("none")))
    if step.get("decided_by") not in _LLM_DECIDERS:
        return None
    if truth is None:
        probs = step.get("probs") or {}
        none_prob = step.get("none_prob") or 0.0
        return step.get("outcome") != "accept" and all(none_prob >= p for p in probs.values())
    return step.get("outcome") == "accept" and step.get("chosen") == truth


def _vectors(
    store: TelemetryStore, task: str, embedder: str, confirmed: list[Confirmed]
) -> tuple[list[Confirmed], NDArray[np.float32]]:
    if not confirmed:
        return [], np.zeros((0, 0), dtype=np.float32)
    found = (
        store.scan("vectors", only={"trace_id": [item.trace_id for item in confirmed]})
        .filter((pl.col("task") == task) & (pl.col("model") == embedder))
        .select("trace_id", "dimensions", "vector")
        .collect()
    )
    if found.is_empty():
        return [], np.zeros((0, 0), dtype=np.float32)
    dimensions = int(found["dimensions"].mode().sort()[0])
    blobs = {row[0]: row[2] for row in found.iter_rows() if row[1] == dimensions and len(row[2]) == 4 * dimensions}
    kept = [item for item in confirmed if item.trace_id in blobs]
    matrix = np.frombuffer(b"".join(blobs[item.trace_id] for item in kept), dtype="<f4").reshape(len(kept), dimensions)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return kept, (matrix / np.where(norms > 0, norms, 1.0)).astype(np.float32)
