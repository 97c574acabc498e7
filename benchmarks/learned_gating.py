"""What-ifs for the learned judge's gating (issue #17): the design arms' protocol replayed offline, in seconds, for
the default policy (the baseline, measured in the same run) and for variants of its keys.

    uv run --extra local python -m benchmarks.learned_gating                      # the default and a sweep
    uv run --extra local python -m benchmarks.learned_gating --variant '{"unseen": 0.02}' --streams assistant

The design arms of ``benchmarks.learned`` send each stream through the real resolver and flows with a stand-in LLM
that never answers with a label, so only what Gil learned answers right; the three streams take about six minutes
here (2026-12-06). Here the same protocol runs on the learned judge alone: requests in stream order, each embedded
once with the product's MiniLM; each answered before its verdict (prequential) by memory (the nearest confirmed
request at cosine ≥ 0.9, the task files' static threshold: memory's learned cut is left out) or else by the learned
judge's walk (``NodeModel.decide`` at every node; a step it does not serve goes to the stand-in, which does not
settle it, so the walk ends there and the request is wrong, unless the policy's ``guess`` lets the learned choice
settle it, as ``LearnedJudge`` does: below the root, ``NodeModel.may_guess``, the choice reaching the node's
threshold); every prediction of the walk is logged as the product logs it, with the stand-in's judgment (wrong) at
the first node not served and at the audited share of served ones; after each chunk of 50 every answer gets its
key's verdict and ``fit_state`` refits. Leave-one-category-out as in the design arms: the category removed from the
tree, fitted on the first 150 requests of the others, then up to 50 of its requests sent; "served as another" = the
root served them as some category. Grouped order as there too: the stream sorted by category, each category's
requests counted once 20 of its requests were confirmed, right against the same requests in the mixed order (the
worst category's difference, in points).

Figures: never-seen requests (no earlier request with the same text after lower-casing and collapsing white
space) from position 150 on: right (memory, the learned judge served, or a guess), served with no LLM judgment
(memory or every step served) and its precision, guessed walks and how many were right, and why the rest was
not served (the first refusal of the walk, by node). This replica's default row is checked
against the design arms it stands for in BENCHMARKS.md's notes; it is a tool for choosing, not a target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from benchmarks._learned_runs import normalized
from benchmarks._learned_setup import top_category
from benchmarks._report import Row, Section, add_output_options, destination, publish
from benchmarks.feedback_queue import STREAMS, Embedded, embed_stream
from gil_core.learned import Confirmed, LearnedLog, LearnedState, Logged, VerdictDigest, fit_state
from gil_core.learned.judge import audited
from gil_core.learned.log import confirmed_path
from gil_core.memory.guard import has_negation
from gil_core.ontology import Node, Tree
from gil_core.tasks import LearnedPolicy

TITLE = "Learned reflex: gating what-ifs (offline replica of the design arms)"
COMMAND = "uv run --extra local python -m benchmarks.learned_gating"
PRECISION = 0.97  # the benchmark's learned_reflex precision
CHUNK = 50
WARMUP = 150
MEMORY_CUT = 0.9
LOCO_TRAIN = 150
LOCO_SENT = 50
GROUPED_AFTER = 20
SWEEP: tuple[dict[str, Any], ...] = (
    {"regularization": 10.0},  # the default before 2026-12-06
    {"regularization": 300.0},
    {"guess": False},
    {"unseen": 1.0},
    {"unseen": 0.05},
    {"unseen": 0.02},
    {"unseen": 0.01},
    {"min_support": 100},
)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Outcome:
    """One replay: counts over the never-seen requests after WARMUP, refusals by reason, LOCO counts."""

    measured: int = 0
    served: int = 0
    served_right: int = 0
    guessed: int = 0  # walks the stand-in judged somewhere and a guess settled
    guessed_right: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    loco_sent: int = 0
    loco_served: int = 0
    loco_folds: dict[str, str] = field(default_factory=dict)
    answered: dict[int, bool] = field(default_factory=dict)  # per stream index: served and right (every request)
    grouped_worst: float | None = None  # points, the worst category grouped against mixed (None: not run)
    grouped: dict[str, tuple[int, float, float]] = field(default_factory=dict)  # category: (requests, grouped, mixed)

    @property
    def right(self) -> int:
        return self.served_right + self.guessed_right


Note = tuple[str, dict[str, Any], bool]  # node, what the learned judge said, whether the stand-in judged there


def _walk(
    state: LearnedState,
    tree: Tree,
    vector: NDArray[np.float32],
    negates: bool,
    trace: str,
    policy: LearnedPolicy,
    threshold: Callable[[Node, int], float],
) -> tuple[str | None, str, str, list[Note]]:
    """The learned judge's own walk: (answer, "served", "guessed" or the first refusal, the node of that refusal,
    notes)."""
    node_id: str = tree.root.id
    notes: list[Note] = []
    refusal: tuple[str, str] | None = None
    answer: str | None = None
    guessed = False
    while node_id in state.nodes:
        model = state.nodes[node_id]
        prediction = model.predict(vector)
        decision = model.decide(prediction, negates=negates)
        judged = refusal is None and (decision != "served" or audited(trace, node_id, policy.audit_rate))
        note = {"choice": prediction.choice, "p": prediction.confidence, "near": prediction.near}
        notes.append((node_id, {**note, "n": model.report.get("rows", 0)}, judged))
        guess = (
            refusal is None
            and policy.guess
            and model.may_guess(prediction, decision, negates=negates)
            and prediction.confidence >= threshold(tree.node(node_id), model.layer)
        )
        guessed = guessed or guess
        if refusal is None and decision != "served" and not guess:
            refusal = (decision, node_id)
        answer = prediction.choice
        if answer is None:
            if refusal is None and node_id != tree.root.id:
                refusal = ("none below the root", node_id)
            break
        if not tree.has_node(answer):
            break
        node_id = answer
    else:
        refusal = refusal or ("no model", node_id)
    if refusal is not None:
        return None, refusal[0], refusal[1], notes
    return answer, "guessed" if guessed else "served", node_id, notes


def _scored(tree: Tree, notes: list[Note], order: int, option: str | None) -> list[Logged]:
    path = confirmed_path(tree, option)
    truth_at = {node: path[i + 1] if i + 1 < len(path) else None for i, node in enumerate(path)}
    return [
        Logged(node, order, truth_at[node], note["choice"], float(note["p"]), note["near"], False if judged else None,
               int(note["n"]))
        for node, note, judged in notes
        if node in truth_at
    ]  # fmt: skip


def replay(
    data: Embedded, policy: LearnedPolicy, indices: Sequence[int], tree: Tree | None = None, sent: Sequence[int] = ()
) -> Outcome:
    """The stream's requests ``indices`` in order (see the module doc); then ``sent`` judged with no feedback."""
    tree = tree or data.task.tree
    dimensions = data.vectors.shape[1]
    confirmed: list[Confirmed] = []
    logged: list[Logged] = []
    rows: list[int] = []  # the stream index of each confirmed request, in order

    def fit(previous: LearnedState | None) -> LearnedState:
        vectors = data.vectors[rows].reshape(len(rows), dimensions).astype(np.float32)
        log = LearnedLog(tuple(confirmed), vectors, tuple(logged), VerdictDigest(len(confirmed), 0))
        return fit_state(task=data.spec.name, tree=tree, tree_sha256="0" * 64, policy=policy, log=log,
                         threshold=data.task.policy.thresholds.for_node, priors=data.priors, embedder="minilm",
                         dimensions=dimensions, previous=previous)  # fmt: skip

    state = fit(None)
    outcome = Outcome()
    seen: set[str] = set()
    for start in range(0, len(indices), CHUNK):
        chunk: list[tuple[int, int, list[Note]]] = []
        for position, index in enumerate(indices[start : start + CHUNK], start):
            text, vector = data.texts[index], data.vectors[index]
            never = normalized(text) not in seen
            seen.add(normalized(text))
            notes: list[Note] = []
            answer: str | None
            if rows and float((data.vectors[rows] @ vector).max()) >= MEMORY_CUT:
                nearest = rows[int(np.argmax(data.vectors[rows] @ vector))]
                answer, how = data.options[nearest], "served"
            else:
                answer, how, node, notes = _walk(state, tree, vector, has_negation(text), str(position), policy,
                                                 data.task.policy.thresholds.for_node)  # fmt: skip
                how = how if how in ("served", "guessed") else f"{how} at {node}"
            right = how in ("served", "guessed") and answer == data.options[index]
            outcome.answered[index] = right
            if position >= WARMUP and never:
                outcome.measured += 1
                if how == "served":
                    outcome.served += 1
                    outcome.served_right += right
                elif how == "guessed":
                    outcome.guessed += 1
                    outcome.guessed_right += right
                else:
                    outcome.refused[how] += 1
            chunk.append((position, index, notes))
        for position, index, notes in chunk:
            if data.learnable[index]:
                option = data.options[index]
                confirmed.append(Confirmed(str(position), position, option, has_negation(data.texts[index])))
                logged.extend(_scored(tree, notes, position, option))
                rows.append(index)
        state = fit(state)
    root = state.nodes[tree.root.id]
    for index in sent:
        prediction = root.predict(data.vectors[index])
        outcome.loco_sent += 1
        decided = root.decide(prediction, negates=has_negation(data.texts[index]))
        outcome.loco_served += decided == "served" and prediction.choice is not None
    return outcome


def _categories(data: Embedded) -> list[str | None]:
    return [top_category(data.task.tree, option) for option in data.options]


def _grouped(data: Embedded, policy: LearnedPolicy, mixed: Outcome) -> None:
    """Grouped order as the design arms measure it: the requests sorted by category (in order of first
    appearance, stable inside one), each category's requests sent once ``GROUPED_AFTER`` of its requests were
    confirmed (verdicts arrive at the end of each chunk), right against the same requests in the mixed order."""
    categories = _categories(data)
    first = list(dict.fromkeys(categories))
    order = sorted(range(len(categories)), key=lambda i: first.index(categories[i]))
    grouped = replay(data, policy, order)
    confirmed: Counter[str | None] = Counter()
    counted: dict[str | None, list[int]] = {}
    for start in range(0, len(order), CHUNK):
        chunk = order[start : start + CHUNK]
        for index in chunk:
            if confirmed[categories[index]] >= GROUPED_AFTER:
                counted.setdefault(categories[index], []).append(index)
        confirmed.update(categories[index] for index in chunk)
    worst = 0.0
    for category, indices in counted.items():
        if len(indices) < 5:
            continue
        a = sum(grouped.answered[i] for i in indices) / len(indices)
        b = sum(mixed.answered[i] for i in indices) / len(indices)
        mixed.grouped[category or "none"] = (len(indices), a, b)
        worst = min(worst, 100 * (a - b))
    mixed.grouped_worst = worst


def measure(data: Embedded, policy: LearnedPolicy, *, loco: bool, grouped: bool = False) -> Outcome:
    outcome = replay(data, policy, list(range(len(data.texts))))
    if grouped:
        _grouped(data, policy, outcome)
    if not loco:
        return outcome
    categories = _categories(data)
    root = data.task.tree.root
    for child in root.children:
        left_out = [i for i, category in enumerate(categories) if category == child.id][:LOCO_SENT]
        if len(left_out) < 10:
            continue
        others = [i for i, category in enumerate(categories) if category != child.id][:LOCO_TRAIN]
        tree = Tree(replace(root, children=tuple(c for c in root.children if c.id != child.id)))
        fold = replay(data, policy, others, tree, left_out)
        outcome.loco_sent += fold.loco_sent
        outcome.loco_served += fold.loco_served
        outcome.loco_folds[child.id] = f"{fold.loco_served}/{fold.loco_sent}"
    return outcome


def _share(k: int, n: int) -> str:
    return f"{100 * k / n:.1f}% ({k}/{n})" if n else "—"


def section(results: dict[str, list[tuple[str, Outcome]]], command: str) -> Section:
    rows = []
    for stream, outcomes in results.items():
        baseline = outcomes[0][1]
        for label, outcome in outcomes:
            delta = 100 * (outcome.right / outcome.measured - baseline.right / baseline.measured)
            refused = ", ".join(f"{reason} {count}" for reason, count in outcome.refused.most_common(4))
            loco = _share(outcome.loco_served, outcome.loco_sent) if outcome.loco_sent else "not run"
            grouped = "not run" if outcome.grouped_worst is None else f"{outcome.grouped_worst:+.1f} points"
            rows.append(
                Row(
                    f"{stream}: {label}",
                    "",
                    f"right {_share(outcome.right, outcome.measured)}"
                    + ("" if outcome is baseline else f" ({delta:+.1f} points)")
                    + f"; served {_share(outcome.served, outcome.measured)} at precision "
                    f"{_share(outcome.served_right, outcome.served)}; "
                    f"guessed {_share(outcome.guessed, outcome.measured)}, "
                    f"right {_share(outcome.guessed_right, outcome.guessed)}; "
                    f"left-out category served as another {loco}; "
                    f"grouped order, worst category against mixed: {grouped}; "
                    f"not served, first refusal: {refused or 'none'}",
                )
            )
    lead = (
        "The design arms' protocol replayed on the learned judge alone (the module doc of "
        "`benchmarks/learned_gating.py`): memory at the static cut 0.9, the stand-in LLM always wrong, feedback on "
        f"every answer after each chunk of {CHUNK}. Never-seen requests from position {WARMUP} on. The first row of "
        f"each stream is the default policy (`learned_reflex: {{precision: {PRECISION}}}`), the baseline of the rows "
        "below it, each of which changes the keys it names."
    )
    return Section(TITLE, command, lead, rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_output_options(parser)
    parser.add_argument("--streams", default="assistant,home", help="of: home, assistant, support")
    parser.add_argument("--variant", action="append", help="learned_reflex keys as JSON (repeatable)")
    parser.add_argument("--no-loco", action="store_true", help="leave leave-one-category-out out")
    parser.add_argument("--no-grouped", action="store_true", help="leave grouped order out")
    options = parser.parse_args(argv)
    variants: list[dict[str, Any]] = [json.loads(text) for text in options.variant] if options.variant else list(SWEEP)
    if options.quick:
        variants = variants[:1]
    from gil_core.local import MiniLMEmbeddingModel

    embedder = MiniLMEmbeddingModel()
    names = [name.strip() for name in options.streams.split(",") if name.strip()]
    results: dict[str, list[tuple[str, Outcome]]] = {}
    for spec in [spec for spec in STREAMS if spec.name in names]:
        if options.quick:
            spec = replace(spec, size=min(spec.size, 300))
        data = asyncio.run(embed_stream(spec, embedder))
        results[spec.name] = []
        for keys in [{}, *variants]:
            label = "default" if not keys else ", ".join(f"{key} {value}" for key, value in keys.items())
            policy = LearnedPolicy(precision=PRECISION, **keys)
            outcome = measure(data, policy, loco=not options.no_loco, grouped=not options.no_grouped)
            _log(f"{spec.name} / {label}: right {outcome.right}/{outcome.measured}, loco {outcome.loco_folds}")
            results[spec.name].append((label, outcome))
    command = COMMAND + (" " + " ".join(argv) if argv else "")
    publish([section(results, command)], destination(options))


if __name__ == "__main__":
    main(sys.argv[1:])
