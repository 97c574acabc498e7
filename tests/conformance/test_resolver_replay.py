"""Replays resolver.json: two runs of 200 requests (without and with memory) through the real resolver.

The reference recorded each request's judgments, the model's fallback outputs in call order, the verdict and,
in the memory run, the embedding of each request and which memory calls failed. We feed exactly those in and
compare modes, outputs, steps, recall, and the final node and habit statistics.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gil_core.fallback import TreeAnswerContract
from gil_core.language import KOREAN
from gil_core.memory import CallableEmbeddingModel, LanceDBMemory, Memory, MemoryChanges, MemoryEntry, Recall
from gil_core.ontology import TreeLintWarning, parse_tree
from gil_core.resolver import Judging, Resolver
from gil_core.tasks import TaskDefinition, TaskPolicy
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedChatModel
from gil_core.traverse import Thresholds
from tests.conformance._fixtures import load_json, report
from tests.conformance._recorded import RecordedJudge

SIMILARITY_TOLERANCE = 1e-6  # the fixture writes similarities with 6 decimals


class FaultyMemory:
    """Memory that fails the way the reference's run failed: ConnectionError on the marked call."""

    def __init__(self, inner: Memory) -> None:
        self.inner = inner
        self.fail: str | None = None

    def _check(self, call: str) -> None:
        if self.fail == call:
            raise ConnectionError("memory unavailable")

    async def lookup(self, task: str, text: str, *, threshold: float) -> Recall | None:
        self._check("lookup")
        return await self.inner.lookup(task, text, threshold=threshold)

    async def nearest(self, task: str, text: str, k: int) -> list[MemoryEntry]:
        return await self.inner.nearest(task, text, k)

    async def remember(self, task: str, key: str, text: str, answer: str) -> None:
        self._check("remember")
        await self.inner.remember(task, key, text, answer)

    async def forget(self, task: str, key: str) -> None:
        await self.inner.forget(task, key)

    async def change(self, task: str, changes: MemoryChanges) -> None:
        if changes.entries:
            self._check("remember")
        await self.inner.change(task, changes)

    async def rebuild(self, task: str, entries: Iterable[MemoryEntry]) -> None:
        await self.inner.rebuild(task, entries)

    async def entries(self, task: str) -> list[MemoryEntry]:
        return await self.inner.entries(task)


def quiet_tree(text: str, source: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        return parse_tree(text, source=source)


def close(a: float | None, b: float | None, tolerance: float) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=0.0, abs_tol=tolerance)


def compare_case(case: Mapping[str, Any], resolution: Any) -> list[str]:
    """Every way the resolution differs from the recorded case."""
    problems = []
    if resolution.mode != case["mode"]:
        problems.append(f"mode {resolution.mode} != {case['mode']}")
    if resolution.output != case["output"]:
        problems.append(f"output {resolution.output!r} != {case['output']!r}")
    steps = [(s.node, s.chosen, s.outcome) for s in resolution.path]
    if steps != [(s["node"], s["chosen"], s["outcome"]) for s in case["steps"]]:
        problems.append(f"steps {steps} != {case['steps']}")
    elif not all(close(s.none_prob, e["none_prob"], 1e-9) for s, e in zip(resolution.path, case["steps"], strict=True)):
        problems.append("none_prob differs")
    if case["retired_steps"]:
        problems.append("retired steps are not replayed")
    expected_recall = case.get("recall")
    got_recall = resolution.recall.to_json() if resolution.recall is not None else None
    if (expected_recall is None) != (got_recall is None):
        problems.append(f"recall {got_recall} != {expected_recall}")
    elif expected_recall is not None and got_recall is not None:
        plain = {k: v for k, v in got_recall.items() if k != "similarity"}
        if plain != {k: v for k, v in expected_recall.items() if k != "similarity"} or not close(
            got_recall.get("similarity"), expected_recall.get("similarity"), SIMILARITY_TOLERANCE
        ):
            problems.append(f"recall {got_recall} != {expected_recall}")
    return problems


def final_stats(store: TelemetryStore, task: str) -> dict[str, list[dict[str, Any]]]:
    def rows(table: str, key: Sequence[str], columns: Sequence[str]) -> list[dict[str, Any]]:
        frame = store.read(table).filter(store.read(table)["scope"] == task)
        return sorted(
            ({name: row[name] for name in (*key, *columns)} for row in frame.iter_rows(named=True)),
            key=lambda row: tuple(row[name] for name in key),
        )

    return {
        "node_stats": rows("node_stats", ["node_id"], ["hits", "accepts", "exits"]),
        "node_choices": rows("node_choices", ["node_id", "chosen_id"], ["accepts"]),
        "habit_reliability": rows(
            "habit_reliability", ["item_id"], ["reinforced", "penalized", "missed", "explored", "disputed"]
        ),
    }


@pytest.mark.parametrize("run_index", [0, 1])
async def test_every_recorded_request_resolves_the_same_way(run_index: int, tmp_path: Path) -> None:
    run = load_json("resolver.json")["runs"][run_index]
    tree = quiet_tree(run["tree"], "resolver.json tree")
    contract = TreeAnswerContract(quiet_tree(run["contract_tree"], "resolver.json contract_tree"))
    policy = TaskPolicy(
        thresholds=Thresholds(per_layer=tuple(run["per_layer"]), leaf=run["leaf"]),
        fallback_scope=run["fallback_scope"],
        memory_threshold=run.get("memory_threshold"),
        fallback_max_attempts=run["fallback_max_attempts"],
        slot_max_attempts=run["slot_max_attempts"],
        show_shadows=False,  # the reference ran without shadows: its judgments show none
    )
    task = TaskDefinition(run["task"], contract, tree, policy, KOREAN)
    store = TelemetryStore(tmp_path / "store")
    vectors: dict[str, list[float]] = run.get("vectors", {})
    memory = FaultyMemory(
        LanceDBMemory(
            tmp_path / "memory",
            CallableEmbeddingModel(lambda texts: [vectors[text] for text in texts], name="recorded-vectors"),
        )
    )
    chat, judge = ScriptedChatModel(), RecordedJudge()
    resolver = Resolver(chat, store, memory=memory, judging=Judging(judge=judge))

    mismatches = []
    for case in run["cases"]:
        for output in case["fallback_outputs"]:
            chat.enqueue(output)
        judge.judgments = case["judgments"]
        memory.fail = case.get("memory_fails")
        resolution = await resolver.resolve(task, case["state"], trace_id=case["trace_id"])
        problems = compare_case(case, resolution)
        if chat.pending:
            problems.append(f"{chat.pending} recorded model outputs were not asked for")
            while chat.pending:
                await chat.complete([], max_tokens=1)
        if problems:
            mismatches.append((case["trace_id"], problems))
        await resolver.feedback(task, case["trace_id"], case["verdict"] == "correct", case["correction"])

    total = len(run["cases"])
    report(f"resolver.json run {run_index}", total - len(mismatches), total, "requests (mode, output, steps, recall)")
    assert not mismatches, mismatches[:3]
    assert final_stats(store, task.name) == {
        "node_stats": sorted(run["stats"]["node_stats"], key=lambda r: r["node_id"]),
        "node_choices": sorted(run["stats"]["node_choices"], key=lambda r: (r["node_id"], r["chosen_id"])),
        "habit_reliability": sorted(run["stats"]["habit_reliability"], key=lambda r: r["item_id"]),
    }
