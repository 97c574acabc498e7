"""The four arms of the quality benchmark, and running one over a stream on the real local models.

Each arm is the stream's task with a few policy keys changed, under its own task name (the tenant), so memory,
stats and calls never mix between arms while all of them land in one store: the energy fit then sees every call
of the run.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks._quality_streams import Request, Stream
from gil_core.llm import ChatModel
from gil_core.maintenance import compact_store
from gil_core.runtime import Runtime, open_runtime
from gil_core.taskfile import load_task_file, with_overrides
from gil_core.tasks import TaskDefinition
from gil_core.traverse import Step

# Chosen before any run, not tuned: the reflex judge answers alone only when it is this sure (the value the
# resolver's own tests use), and memory answers above this cosine (the support demo task's value).
REFLEX_THRESHOLD = 0.9
MEMORY_THRESHOLD = 0.9


@dataclass(frozen=True, slots=True)
class Arm:
    key: str
    title: str
    policy: dict[str, Any]
    repeating: bool = False  # runs on the stream's repeating version, with feedback from the answer key


ARMS = (
    Arm("full", "(1) full generation", {"use_tree": False}),
    Arm("tree", "(2) tree + narrowed fallback", {}),
    Arm("reflex", "(3) = (2) + reflex judge", {"reflex_threshold": REFLEX_THRESHOLD}),
    Arm("memory", "(4) = (2) + memory, repeating stream", {"memory_threshold": MEMORY_THRESHOLD}, repeating=True),
)
# What every arm shares, whatever the task file says: the tree arms narrow generation to the confirmed category.
COMMON_POLICY: dict[str, Any] = {
    "use_tree": True,
    "fallback_scope": "path",
    "memory_threshold": None,
    "reflex_threshold": None,
}


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request of one arm: what came back, the walk, and how long ``resolve`` took (wall seconds)."""

    position: int
    request: Request
    output: str | None
    mode: str
    trace_id: str
    seconds: float
    failure: str | None = None
    steps: tuple[Step, ...] = ()
    similarity: float | None = None  # of the nearest memory entry (hit or not)
    recall_error: str | None = None  # why a lookup missed when it was not the similarity ("guard: ...")

    @property
    def correct(self) -> bool:
        return (self.output or "").strip() == self.request.expected


@dataclass
class ArmRun:
    """An arm's outcomes over a stream, in request order."""

    stream: str
    arm: Arm
    task: str
    outcomes: list[Outcome] = field(default_factory=list)


def arm_task(base: TaskDefinition, stream: Stream, arm: Arm) -> TaskDefinition:
    policy = replace(base.policy, **(COMMON_POLICY | arm.policy))
    return replace(base, name=f"bench-{stream.name}-{arm.key}", policy=policy)


async def run_arms(
    stream: Stream,
    requests: tuple[Request, ...],
    repeating: tuple[Request, ...],
    *,
    store: Path,
    memory: Path,
    chat: ChatModel | None = None,
    arms: tuple[Arm, ...] = ARMS,
) -> list[ArmRun]:
    """Every arm over ``requests`` (the memory arm over ``repeating``), one after the other, on the stream's task
    file with its store and memory moved under the run's folder. ``chat`` replaces the task file's chat model
    (the benchmark's own local server)."""
    task_file = load_task_file(stream.task_file)
    # open_runtime opens memory only when the file's policy has a threshold: the memory arm needs it.
    base = replace(task_file.task, policy=replace(task_file.task.policy, memory_threshold=MEMORY_THRESHOLD))
    # The request cache would answer a repeated prompt for free in some arms and not others: off, so every arm
    # pays for what it asks. Memory (arm 4) is the cache being measured.
    client = {**task_file.client, "cache_enabled": False}
    task_file = with_overrides(task_file, task=base, store=store, memory=memory, client=client)
    runs = []
    async with open_runtime(task_file, chat=chat) as runtime:
        for arm in arms:
            # A maintained store (the hourly compaction flow) rather than one file per append: reading the
            # feedback history for shadows would otherwise slow each later arm by the files earlier ones left.
            compact_store(runtime.store)
            task = arm_task(task_file.task, stream, arm)
            run = ArmRun(stream.name, arm, task.name)
            for position, request in enumerate(repeating if arm.repeating else requests):
                run.outcomes.append(await _resolve(runtime, task, request, position, feedback=arm.repeating))
            runs.append(run)
    return runs


async def _resolve(
    runtime: Runtime, task: TaskDefinition, request: Request, position: int, *, feedback: bool
) -> Outcome:
    started = time.perf_counter()
    resolution = await runtime.resolver.resolve(task, request.text)
    seconds = time.perf_counter() - started
    recall = resolution.recall
    outcome = Outcome(
        position,
        request,
        resolution.output,
        resolution.mode,
        resolution.trace_id,
        seconds,
        resolution.failure,
        tuple(resolution.path),
        recall.similarity if recall is not None else None,
        (recall.refused or recall.error) if recall is not None else None,  # why memory did not answer
    )
    if feedback:  # the answer key as the verdict, at once: memory learns as the stream goes
        correction = None if outcome.correct else request.expected
        await runtime.resolver.feedback(task, resolution.trace_id, outcome.correct, correction)
    return outcome


def runs_to_json(runs: list[ArmRun]) -> list[dict[str, Any]]:
    """Arm runs as JSON: what ``runs_from_json`` reads back, so a report can be redone without the models."""
    return [
        {
            "stream": run.stream,
            "arm": run.arm.key,
            "task": run.task,
            "outcomes": [
                {
                    "position": o.position,
                    "request": asdict(o.request),
                    "output": o.output,
                    "mode": o.mode,
                    "trace_id": o.trace_id,
                    "seconds": o.seconds,
                    "failure": o.failure,
                    "steps": [step.to_json() for step in o.steps],
                    "similarity": o.similarity,
                    "recall_error": o.recall_error,
                }
                for o in run.outcomes
            ],
        }
        for run in runs
    ]


def runs_from_json(items: list[dict[str, Any]]) -> list[ArmRun]:
    arms = {arm.key: arm for arm in ARMS}
    return [
        ArmRun(
            item["stream"],
            arms[item["arm"]],
            item["task"],
            [
                Outcome(
                    o["position"],
                    Request(**o["request"]),
                    o["output"],
                    o["mode"],
                    o["trace_id"],
                    o["seconds"],
                    o["failure"],
                    tuple(Step(**step) for step in o["steps"]),
                    o["similarity"],
                    o["recall_error"],
                )
                for o in item["outcomes"]
            ],
        )
        for item in items
    ]
