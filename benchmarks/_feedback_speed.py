"""Speed of applying verdicts (part B): a verdicts file through ``apply_verdicts`` with memory on LanceDB, a chunk
at a time (the default: one append of the trace rows and one memory write per chunk) against one verdict at a time
(``chunk=1``: an append and a LanceDB table version per verdict, as every verdict was applied before chunks), each
on its own copy of the same store, the arms alternated."""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks._report import Row, Section, support_tree
from gil_core.batch import Ticket, Verdict, resolve_batch, ticket_trace_id
from gil_core.batch_feedback import VERDICT_CHUNK, apply_verdicts
from gil_core.fallback import TreeAnswerContract
from gil_core.language import ENGLISH
from gil_core.memory import LanceDBMemory
from gil_core.resolver import Resolver
from gil_core.tasks import TaskDefinition, TaskPolicy
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel, ScriptedChatModel, ScriptedReply
from gil_core.traverse import Thresholds

__all__ = ["FeedbackFigures", "feedback_section", "measure_feedback"]

SECTION = "Speed: applying verdicts (part B)"
CORRECTION_EVERY = 5  # every fifth verdict says wrong and gives the right answer
ARMS = {"one verdict at a time (`chunk=1`)": 1, f"a chunk at a time (default, {VERDICT_CHUNK:,})": VERDICT_CHUNK}


@dataclass
class FeedbackFigures:
    verdicts: int
    runs: int
    seconds: dict[str, list[float]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)  # memory table versions one run added
    trace_files: dict[str, int] = field(default_factory=dict)  # files one run added to the traces table
    entries: dict[str, int] = field(default_factory=dict)  # what memory held afterwards


def _task() -> TaskDefinition:
    tree = support_tree()
    policy = TaskPolicy(thresholds=Thresholds(per_layer=(0.5,), leaf=0.5), memory_threshold=0.95)
    return TaskDefinition("bench", TreeAnswerContract(tree), tree, policy, ENGLISH)


def _open(root: Path) -> tuple[Resolver, LanceDBMemory]:
    memory = LanceDBMemory(root / "memory", HashEmbeddingModel(384))
    chat = ScriptedChatModel(responder=lambda *_, **__: ScriptedReply("B"))
    return Resolver(chat, TelemetryStore(root / "store"), memory=memory), memory


def _count(folder: Path, pattern: str) -> int:
    return sum(1 for _ in folder.rglob(pattern)) if folder.exists() else 0


async def measure_feedback(verdicts: int, runs: int, root: Path) -> FeedbackFigures:
    task = _task()
    prepared = root / "prepared"
    resolver, _ = _open(prepared)
    tickets = [Ticket(f"t{index}", f"customer {index} asks where parcel {index} is") for index in range(verdicts)]
    await resolve_batch(resolver, task, tickets)
    given = [
        Verdict(ticket_trace_id(task.name, ticket.id), index % CORRECTION_EVERY != 0, "It left the depot today.")
        for index, ticket in enumerate(tickets)
    ]
    figures = FeedbackFigures(verdicts, runs)
    for run in range(runs):
        for name, chunk in ARMS.items():
            copy = root / f"run-{run}-{chunk}"
            shutil.copytree(prepared, copy)
            resolver, memory = _open(copy)
            versions, files = _count(copy / "memory", "*.manifest"), _count(copy / "store" / "traces", "*.parquet")
            started = time.perf_counter()
            report = await apply_verdicts(resolver, task, given, chunk=chunk)
            figures.seconds.setdefault(name, []).append(time.perf_counter() - started)
            assert report.applied == verdicts and not report.failed and not report.not_learned, report.to_json()
            figures.versions[name] = _count(copy / "memory", "*.manifest") - versions
            figures.trace_files[name] = _count(copy / "store" / "traces", "*.parquet") - files
            figures.entries[name] = len(await memory.entries(task.name))
            shutil.rmtree(copy)
    return figures


def feedback_section(figures: FeedbackFigures, command: str) -> Section:
    (alone, chunked) = ARMS
    medians = {name: statistics.median(seconds) for name, seconds in figures.seconds.items()}
    rows = []
    for name in ARMS:
        spread = ", ".join(f"{seconds:.2f}" for seconds in figures.seconds[name])
        rows.append(
            Row(
                f"{figures.verdicts:,} verdicts, {name}",
                "—" if name == alone else "(reported)",
                f"{figures.verdicts / medians[name]:,.0f} verdicts/s (median of {figures.runs} runs: {spread} s); "
                f"memory table versions added {figures.versions[name]:,}, trace files added "
                f"{figures.trace_files[name]:,}, entries held afterwards {figures.entries[name]:,}",
            )
        )
    ratio = medians[alone] / medians[chunked]
    rows.append(Row("a chunk at a time against one at a time", "(reported)", f"{ratio:.1f}× as fast"))
    lead = (
        f"A store of {figures.verdicts:,} resolved tickets (the support tree, `ScriptedChatModel` sure of its first "
        "label, memory on LanceDB with the 384-dimensional hash embedder), then one verdict on each ticket (every "
        f"{CORRECTION_EVERY}th wrong with a correction) through `apply_verdicts`, each arm on its own copy of the "
        "store, the arms alternated. One verdict at a time is what every verdict cost before verdicts were applied "
        "in chunks: an append to the traces table and a LanceDB table version each."
    )
    return Section(SECTION, command, lead, rows)


if __name__ == "__main__":  # a quick look: python -m benchmarks._feedback_speed
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        print(feedback_section(asyncio.run(measure_feedback(200, 1, Path(folder))), "(scratch)").render())
