"""The feedback queue: which unconfirmed answers a person should check next, because their verdicts would teach
the learned judge most; and, for every verdict, how its trace came to be asked about.

**Eligible** are a task's traces with an answer and no verdict, that keep their request (never a do-not-record
trace: it keeps no text) and that no earlier queue issued (a trace is asked about once, so each verdict has one
way of being chosen).

**Score.** Each eligible trace is judged again by the current state along the learned judge's own walk (its
request's stored vector through each node's model, from the root down to the option or "none of these" it
predicts; without a stored vector, the predictions its trace logged). Three figures in [0, 1]:

* ``uncertainty`` = 1 − the smallest margin of the walk, a step's margin being its top-1 minus its top-2
  probability (from a logged prediction, which keeps only the top-1 ``p``: 2p − 1, the least it can be);
* ``novelty``: how far the request is from anything confirmed, at the step where it is farthest: 0.5 where its
  ``near`` (highest cosine to the confirmed requests of the class it is predicted as) equals the class's
  novelty cut, rising to 1 at ``NOVELTY_SPREAD`` below it and falling to 0 at ``NOVELTY_SPREAD`` above; 1 where
  the class has no confirmed request or no cut;
* ``rule``: how close a node of the walk is to changing its rule, being proven (a learning or withdrawn node) or
  withdrawn (a serving one): 1 − |lower bound − target| / ``RULE_SPREAD`` at the node where that is largest,
  from the state's report (0 where it has none).

``score`` = the ``QueueWeights``-weighted sum (by default 0.9 × uncertainty + 0.1 × rule). A queue of ``size``
first draws ``round(size × random_share)`` traces uniformly at random from all eligible ones
(``chosen_by = "random"``), then fills the rest with the highest scores among the others (``"queue"``). Each item
records its chance of having been chosen that way: ``r / N`` for the random share (r drawn out of N eligible); for
a queue item the chance that the random draw left it out and left fewer than its queue slots' worth of
higher-scored traces (hypergeometric).

**Why the random share.** Queue-chosen verdicts are, by design, on the requests the judge is least sure of:
precision read from them would be biased low (and drift with the queue's settings). The serving rules read only
verdicts the queue did not choose (the random share and unsolicited verdicts, see ``learned.log``), while every
verdict stays a training row: the queue speeds learning, the random share keeps the rules' estimate unbiased.

Each issued queue is one Parquet file in the store's side folder ``queue/<task key>/`` (``record_queue``);
``read_chosen_by`` reads them back per trace, and ``read_waiting`` the items still without a verdict.

**A peek** (``issue_queue(peek=True)``, ``gil review queue --peek``) shows a queue without issuing it: its traces
stay eligible. It is recorded all the same, in ``queue-peeks/<task key>/``, because a verdict may follow from what
it showed: on a trace no queue issued, a verdict counts as chosen by the queue where a peek chose it by its score
(else as random where a peek drew it), so a person answering what a peek showed never carries the queue's picks
into the evidence the serving rules read.
"""

from __future__ import annotations

import math
import os
import random
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

import numpy as np
import polars as pl
from numpy.typing import NDArray

from gil_core.errors import InvalidArgumentError, LearnedStateError
from gil_core.learned.state import SERVING_RULES, LearnedState, NodeModel, task_key
from gil_core.ontology.model import Tree
from gil_core.storage import Folder
from gil_core.telemetry import TelemetryStore, utc_now

__all__ = [
    "DEFAULT_RANDOM_SHARE",
    "NOVELTY_SPREAD",
    "RULE_SPREAD",
    "ChosenBy",
    "FeedbackQueue",
    "QueueItem",
    "QueueWeights",
    "Teaching",
    "Unconfirmed",
    "choose_queue",
    "issue_queue",
    "queue_folder",
    "read_chosen_by",
    "read_unconfirmed",
    "read_waiting",
    "record_queue",
    "teaching_value",
]

ChosenBy = Literal["queue", "random", "unsolicited"]
"""How a verdict's trace was chosen: by the queue's score, by its random share, or in no issued queue."""

DEFAULT_RANDOM_SHARE = 0.3
NOVELTY_SPREAD = 0.1  # cosine: from the class's novelty cut to "far" (novelty 1) or "alike" (novelty 0)
RULE_SPREAD = 0.1  # precision: from the node's target to "nowhere near changing its rule"


@dataclass(frozen=True, slots=True)
class QueueWeights:
    """How much each figure weighs in the score (module doc). The defaults were chosen on the feedback-queue
    benchmark's tuning runs (BENCHMARKS.md, "Feedback queue"): the margin taught the learned judge most; the
    request's distance from anything confirmed, weighed in, taught it less than the margin alone (its novelty is
    still computed and shown, and may be weighed in by a caller)."""

    uncertainty: float = 0.9
    novelty: float = 0.0
    rule: float = 0.1


@dataclass(frozen=True)
class Unconfirmed:
    """An eligible trace as it was recorded: its request, answer, stored vector (unit row; None when the request
    was not embedded for the state's embedder) and its steps' logged learned predictions (``path[].learned``)."""

    trace_id: str
    request: str
    answer: str | None
    vector: NDArray[np.float32] | None
    notes: tuple[tuple[str, Mapping[str, Any]], ...] = ()  # (node, the step's ``learned`` note)


@dataclass(frozen=True, slots=True)
class Teaching:
    """What a verdict on one trace would teach (module doc), and the figure that weighs most, in words."""

    uncertainty: float
    novelty: float
    rule: float
    score: float
    why: str


@dataclass(frozen=True, slots=True)
class QueueItem:
    """One trace of an issued queue."""

    trace_id: str
    request: str
    answer: str | None
    chosen_by: ChosenBy
    chance: float
    teaching: Teaching

    def to_json(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "request": self.request,
            "answer": self.answer,
            "chosen_by": self.chosen_by,
            "chance": self.chance,
            "score": self.teaching.score,
            "uncertainty": self.teaching.uncertainty,
            "novelty": self.teaching.novelty,
            "rule": self.teaching.rule,
            "why": self.teaching.why,
        }


@dataclass(frozen=True)
class FeedbackQueue:
    """A queue for ``task``: its items (queue-chosen by score first, then the random share), out of ``eligible``
    traces, and when it was made."""

    task: str
    queue_id: str
    issued_at: datetime
    eligible: int
    random_share: float
    items: tuple[QueueItem, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "queue_id": self.queue_id,
            "issued_at": self.issued_at.isoformat(),
            "eligible": self.eligible,
            "random_share": self.random_share,
            "items": [item.to_json() for item in self.items],
        }


# -- the score ------------------------------------------------------------------------------------------------


def teaching_value(
    candidate: Unconfirmed, state: LearnedState, tree: Tree, weights: QueueWeights = QueueWeights()
) -> Teaching:
    """The trace's figures and score (module doc)."""
    steps = _walk(candidate, state, tree)
    if not steps:
        return Teaching(1.0, 1.0, 0.0, weights.uncertainty + weights.novelty, "no learned judgment: nothing known")
    margin_node, margin = min(((node, m) for node, m, _, _ in steps), key=lambda item: item[1])
    far_node, novelty, near, cut = max(
        ((node, _novelty(near, cut), near, cut) for node, _, near, cut in steps), key=lambda item: item[1]
    )
    rule_node, rule = max(((node, _rule_closeness(state.nodes[node])) for node, *_ in steps), key=lambda i: i[1])
    uncertainty = 1.0 - margin
    parts = {
        "uncertainty": weights.uncertainty * uncertainty,
        "novelty": weights.novelty * novelty,
        "rule": weights.rule * rule,
    }
    score = sum(parts.values())
    strongest = max(parts, key=lambda name: parts[name])
    if strongest == "uncertainty":
        why = f"margin {margin:.2f} at {margin_node}"
    elif strongest == "novelty":
        why = (
            f"far from confirmed at {far_node} (near {near:.2f}, cut {cut:.2f})"
            if near is not None and cut is not None
            else f"nothing confirmed like it at {far_node}"
        )
    else:
        model = state.nodes[rule_node]
        change = "withdrawn" if model.rule in SERVING_RULES else "proven"
        lower, target = model.report.get("lower_bound"), model.report.get("target")
        why = f"{rule_node} close to being {change} (lower bound {lower:.3f}, target {target:.3f})"
    return Teaching(uncertainty, novelty, rule, score, why)


def _walk(
    candidate: Unconfirmed, state: LearnedState, tree: Tree
) -> list[tuple[str, float, float | None, float | None]]:
    """Per step of the learned judge's walk: (node, margin, near, the predicted class's novelty cut)."""
    steps: list[tuple[str, float, float | None, float | None]] = []
    if candidate.vector is not None:
        node_id: str | None = tree.root.id
        while node_id is not None and node_id in state.nodes:
            model = state.nodes[node_id]
            prediction = model.predict(candidate.vector)
            ordered = np.sort(prediction.probabilities)[::-1]
            margin = float(ordered[0] - ordered[1]) if len(ordered) > 1 else 1.0
            steps.append((node_id, margin, prediction.near, _cut(model, prediction.index)))
            node_id = prediction.choice if prediction.choice is not None and tree.has_node(prediction.choice) else None
        return steps
    for node_id, note in candidate.notes:
        logged_by = state.nodes.get(node_id)
        if logged_by is None or "p" not in note:
            continue
        choice = note.get("choice")
        cut = _cut(logged_by, logged_by.classes.index(choice)) if choice in logged_by.classes else None
        steps.append((node_id, max(0.0, 2.0 * float(note["p"]) - 1.0), note.get("near"), cut))
    return steps


def _cut(model: NodeModel, index: int) -> float | None:
    cut = float(model.novelty_cuts[index])
    return None if math.isnan(cut) else cut


def _novelty(near: float | None, cut: float | None) -> float:
    if near is None or cut is None:
        return 1.0
    return min(1.0, max(0.0, 0.5 + (cut - near) / (2.0 * NOVELTY_SPREAD)))


def _rule_closeness(model: NodeModel) -> float:
    lower, target = model.report.get("lower_bound"), model.report.get("target")
    if lower is None or target is None:
        return 0.0
    return max(0.0, 1.0 - abs(float(lower) - float(target)) / RULE_SPREAD)


# -- choosing ---------------------------------------------------------------------------------------------------


def choose_queue(
    candidates: Sequence[Unconfirmed],
    state: LearnedState,
    tree: Tree,
    *,
    size: int,
    random_share: float = DEFAULT_RANDOM_SHARE,
    rng: random.Random | None = None,
    weights: QueueWeights = QueueWeights(),
) -> list[QueueItem]:
    """``size`` of ``candidates`` (all eligible): the random share drawn first, uniformly from all of them, then
    the highest scores among the rest (module doc). Queue items come first, best first."""
    if size < 1:
        raise InvalidArgumentError(f"a queue holds at least one trace, not {size}")
    if not 0.0 <= random_share <= 1.0:
        raise InvalidArgumentError(f"the random share is a share between 0 and 1, not {random_share}")
    draw = rng or random.Random(secrets.randbits(64))
    total = len(candidates)
    drawn = min(total, round(size * random_share))
    slots = min(size, total) - drawn
    taught = [teaching_value(candidate, state, tree, weights) for candidate in candidates]
    ranked = sorted(range(total), key=lambda i: -taught[i].score)  # stable: ties keep arrival order
    rank = {index: position for position, index in enumerate(ranked)}
    random_picks = set(draw.sample(range(total), drawn))
    queue_picks = [index for index in ranked if index not in random_picks][:slots]
    items = [_item(candidates[i], taught[i], "queue", _queue_chance(rank[i], total, drawn, slots)) for i in queue_picks]
    items += [_item(candidates[i], taught[i], "random", drawn / total) for i in sorted(random_picks)]
    return items


def _item(candidate: Unconfirmed, teaching: Teaching, chosen_by: ChosenBy, chance: float) -> QueueItem:
    return QueueItem(candidate.trace_id, candidate.request, candidate.answer, chosen_by, chance, teaching)


def _queue_chance(position: int, total: int, drawn: int, slots: int) -> float:
    """The chance that the trace ranked ``position`` (0: best) is queue-chosen: the random draw of ``drawn`` out
    of ``total`` left it out, and took at least ``position - slots + 1`` of the ``position`` ranked above it."""
    left_out = 1.0 - drawn / total
    need = position - slots + 1
    if need <= 0:
        return left_out
    from scipy.stats import hypergeom  # type: ignore[import-untyped]  # the queue's path only

    return left_out * float(hypergeom.sf(need - 1, total - 1, position, drawn))


# -- the store ----------------------------------------------------------------------------------------------------


def queue_folder(store: TelemetryStore, task: str) -> Folder:
    """Where ``task``'s issued queues are kept: the store's side folder ``queue/<task key>/``."""
    return store.side_folder("queue", task_key(task))


_SCHEMA = pl.Schema(
    {
        "queue_id": pl.String(),
        "issued_at": pl.Datetime("us", "UTC"),
        "task": pl.String(),
        "trace_id": pl.String(),
        "position": pl.Int64(),
        "chosen_by": pl.String(),
        "chance": pl.Float64(),
        "score": pl.Float64(),
        "uncertainty": pl.Float64(),
        "novelty": pl.Float64(),
        "rule": pl.Float64(),
        "why": pl.String(),
        "eligible": pl.Int64(),
        "random_share": pl.Float64(),
    }
)


def peek_folder(store: TelemetryStore, task: str) -> Folder:
    """Where ``task``'s peeks are kept (module doc): the store's side folder ``queue-peeks/<task key>/``."""
    return store.side_folder("queue-peeks", task_key(task))


def record_queue(store: TelemetryStore, queue: FeedbackQueue, *, peek: bool = False) -> None:
    """Write ``queue`` as one file of its task's queue folder (of its peeks with ``peek``), atomically."""
    rows = [
        {
            "queue_id": queue.queue_id,
            "issued_at": queue.issued_at,
            "task": queue.task,
            "trace_id": item.trace_id,
            "position": position,
            "chosen_by": item.chosen_by,
            "chance": item.chance,
            "score": item.teaching.score,
            "uncertainty": item.teaching.uncertainty,
            "novelty": item.teaching.novelty,
            "rule": item.teaching.rule,
            "why": item.teaching.why,
            "eligible": queue.eligible,
            "random_share": queue.random_share,
        }
        for position, item in enumerate(queue.items)
    ]
    folder = (peek_folder if peek else queue_folder)(store, queue.task)
    folder.write_parquet(f"{queue.queue_id}.parquet", pl.DataFrame(rows, schema=_SCHEMA))


def _issued(store: TelemetryStore, task: str) -> pl.DataFrame:
    """Every row of every queue issued for ``task``."""
    return _recorded(queue_folder(store, task), task)


def _recorded(folder: Folder, task: str) -> pl.DataFrame:
    """Every row of every queue in ``folder`` for ``task`` (files of other layouts or tasks are not read)."""
    frames = []
    for name in folder.names():
        try:
            frame = pl.read_parquet(folder.source(name), storage_options=folder.storage_options)
        except FileNotFoundError:
            continue
        if frame.schema == _SCHEMA:
            frames.append(frame.filter(pl.col("task") == task))
    return pl.concat(frames) if frames else pl.DataFrame(schema=_SCHEMA)


def read_chosen_by(store: TelemetryStore, task: str) -> dict[str, ChosenBy]:
    """Per trace that an issued queue holds, how it was chosen ("queue" or "random"), by its first issue; per trace
    no queue issued and a peek showed, "queue" where any peek chose it by its score, else "random" (module doc); a
    trace in neither is "unsolicited"."""
    issued = _issued(store, task).sort("issued_at", "queue_id", "position")
    chosen: dict[str, ChosenBy] = {}
    for trace_id, how in issued.select("trace_id", "chosen_by").iter_rows():
        chosen.setdefault(trace_id, "queue" if how == "queue" else "random")
    issued_ids = set(chosen)
    for trace_id, how in _recorded(peek_folder(store, task), task).select("trace_id", "chosen_by").iter_rows():
        if trace_id not in issued_ids:
            chosen[trace_id] = "queue" if how == "queue" or chosen.get(trace_id) == "queue" else "random"
    return chosen


def read_waiting(store: TelemetryStore, task: str) -> list[FeedbackQueue]:
    """``task``'s issued queues that still wait for a verdict, oldest first, each holding only the items whose
    traces have none yet, in the order issued, with the figures they were issued with (a queue fully answered is
    left out). Reading them issues nothing: what was asked about is shown again, not asked about anew."""
    issued = _issued(store, task).sort("issued_at", "queue_id", "position")
    if issued.is_empty():
        return []
    traces = (
        store.scan("traces", only={"trace_id": issued["trace_id"].unique().to_list()})
        .filter((pl.col("task") == task) & pl.col("feedback_verdict").is_null())
        .select("trace_id", "state", "output")
        .collect()
    )
    open_traces = {row[0]: (row[1], row[2]) for row in traces.iter_rows()}
    heads: dict[str, FeedbackQueue] = {}
    items: dict[str, list[QueueItem]] = {}
    for row in issued.iter_rows(named=True):
        if row["trace_id"] not in open_traces:
            continue
        request, answer = open_traces[row["trace_id"]]
        teaching = Teaching(row["uncertainty"], row["novelty"], row["rule"], row["score"], row["why"])
        how: ChosenBy = "queue" if row["chosen_by"] == "queue" else "random"
        if row["queue_id"] not in heads:
            heads[row["queue_id"]] = FeedbackQueue(
                task, row["queue_id"], row["issued_at"], row["eligible"], row["random_share"]
            )
        item = QueueItem(row["trace_id"], request, answer, how, row["chance"], teaching)
        items.setdefault(row["queue_id"], []).append(item)
    return [replace(head, items=tuple(items[queue_id])) for queue_id, head in heads.items()]


def read_unconfirmed(store: TelemetryStore, task: str, *, embedder: str) -> list[Unconfirmed]:
    """``task``'s eligible traces (module doc) in arrival order, with their stored vectors from ``embedder``."""
    import json

    issued = set(_issued(store, task)["trace_id"].to_list())
    traces = (
        store.scan("traces")
        .filter(
            (pl.col("task") == task)
            & pl.col("feedback_verdict").is_null()
            & (pl.col("state") != "")
            & pl.col("output").is_not_null()
        )
        .select("trace_id", "created_at", "state", "output", "path")
        .collect()
        .sort("created_at", maintain_order=True)
        .join(pl.DataFrame({"trace_id": sorted(issued)}, schema={"trace_id": pl.String()}), on="trace_id", how="anti")
    )
    vectors = (
        store.scan("vectors", only={"trace_id": traces["trace_id"].to_list()})
        .filter((pl.col("task") == task) & (pl.col("model") == embedder))
        .select("trace_id", "dimensions", "vector")
        .collect()
    )
    found = {row[0]: _unit(row[2], row[1]) for row in vectors.iter_rows() if len(row[2]) == 4 * row[1]}
    out = []
    for row in traces.iter_rows(named=True):
        notes = tuple(
            (str(step.get("node")), step["learned"]) for step in json.loads(row["path"] or "[]") if step.get("learned")
        )
        out.append(Unconfirmed(row["trace_id"], row["state"], row["output"], found.get(row["trace_id"]), notes))
    return out


def _unit(blob: bytes, dimensions: int) -> NDArray[np.float32]:
    vector = np.frombuffer(blob, dtype="<f4", count=dimensions).astype(np.float32)
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def issue_queue(
    store: TelemetryStore,
    task: str,
    tree: Tree,
    state: LearnedState,
    *,
    size: int,
    random_share: float = DEFAULT_RANDOM_SHARE,
    rng: random.Random | None = None,
    weights: QueueWeights = QueueWeights(),
    record: bool = True,
    peek: bool = False,
) -> FeedbackQueue:
    """A queue of ``task``'s eligible traces scored by ``state``, recorded as issued unless ``record`` is False
    (an empty queue is never recorded); with ``peek``, recorded as a peek instead (module doc), its traces left
    eligible."""
    if state.task != task:
        raise LearnedStateError(f"a state fitted for another task cannot rank {task!r}'s traces")
    candidates = read_unconfirmed(store, task, embedder=state.embedder)
    items = choose_queue(candidates, state, tree, size=size, random_share=random_share, rng=rng, weights=weights)
    queue_id = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(3)}"
    queue = FeedbackQueue(task, queue_id, utc_now(), len(candidates), random_share, tuple(items))
    if record and queue.items:
        record_queue(store, queue, peek=peek)
    return queue
