"""What the reliability tests share: batches through the real HTTP adapter, the checks every fault must pass
(exactly one trace per ticket, a reason whenever there is no output), and checks of what is on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pyarrow.parquet as pq

from gil_core.batch import Ticket, resolve_batch, ticket_trace_id
from gil_core.memory import Memory, plan_memory
from gil_core.resolver import Resolver
from gil_core.runtime import open_runtime
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("_child.py")
MODES = frozenset({"memory", "habit/answer", "habit/template", "habit/procedure", "partial", "fallback", "abstain"})
REFUND = "Refunds reach the original payment method within 5 business days of approval."


class AttemptCounter:
    """An httpx request hook: counts every attempt the adapter makes, also those refused before the server."""

    def __init__(self) -> None:
        self.count = 0

    async def __call__(self, request: httpx.Request) -> None:
        self.count += 1


def make_tickets(count: int, *, prefix: str = "t", text: str = "question number {index}") -> list[Ticket]:
    return [Ticket(f"{prefix}{index}", text.format(index=index)) for index in range(count)]


def write_jsonl(path: Path, rows: Iterable[Any]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def check_one_trace_per_ticket(store: TelemetryStore, task: str, tickets: Sequence[Ticket]) -> pl.DataFrame:
    """Exactly one trace per ticket, each with a known mode and a failure reason whenever it has no output."""
    traces = store.read("traces").filter(pl.col("task") == task)
    expected = {ticket_trace_id(task, ticket.id) for ticket in tickets}
    assert traces.height == len(tickets), f"{traces.height} traces for {len(tickets)} tickets"
    assert set(traces["trace_id"]) == expected
    for row in traces.iter_rows(named=True):
        assert row["mode"] in MODES, row
        if row["output"] is None:
            assert row["failure"], f"trace {row['trace_id']} has neither an output nor a failure reason"
    return traces


def every_parquet_file_reads(root: Path) -> int:
    """Open every final-named Parquet file under ``root`` (a torn or partial file raises); how many there are."""
    files = [path for path in root.rglob("*.parquet") if not path.name.startswith(".")]
    for path in files:
        pq.read_table(path)
    return len(files)


async def memory_matches_history(resolver: Resolver, memory: Memory, task: str) -> int:
    """Memory holds exactly what the store's feedback history confirms; returns how many entries that is."""
    planned = {entry.key: (entry.text, entry.answer) for entry in plan_memory(resolver.feedback_history(task))}
    held = {entry.key: (entry.text, entry.answer) for entry in await memory.entries(task)}
    missing = {key: planned[key] for key in planned.keys() - held.keys()}
    extra = {key: held[key] for key in held.keys() - planned.keys()}
    changed = {key: (held[key], planned[key]) for key in held.keys() & planned.keys() if held[key] != planned[key]}
    assert held == planned, f"memory lacks {missing}, holds beyond the history {extra}, differs on {changed}"
    return len(held)


def spawn_child(*args: str) -> subprocess.Popen[str]:
    """``_child.py`` in a new process; it prints ``ready`` after its imports and then works (see its doc)."""
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def gil_command(*args: str) -> list[str]:
    """The ``gil`` command line run in a child process (what the console script runs)."""
    return [sys.executable, "-m", "flows.cli", *args]


async def resolve_tickets(task_file: Path, tickets: Sequence[Ticket]) -> list[str]:
    """Resolve ``tickets`` in this process through the task file's runtime; their trace ids in ticket order."""
    loaded = load_task_file(task_file)
    async with open_runtime(loaded) as runtime:
        report = await resolve_batch(runtime.resolver, loaded.task, tickets)
    assert report.resolved == len(tickets)
    return [report.trace_ids[ticket.id] for ticket in tickets]


def verdicts_for(trace_ids: list[str]) -> list[dict[str, object]]:
    """Every other ticket confirmed; the rest corrected, each with its own answer."""
    return [
        {"trace_id": trace_id, "correct": True}
        if index % 2 == 0
        else {"trace_id": trace_id, "correct": False, "correction": f"Answer number {index}."}
        for index, trace_id in enumerate(trace_ids)
    ]


def given_verdicts(store: TelemetryStore) -> dict[str, tuple[str, str | None]]:
    rows = store.read("traces").filter(pl.col("feedback_verdict").is_not_null())
    return {
        row["trace_id"]: (row["feedback_verdict"], row["feedback_correction"]) for row in rows.iter_rows(named=True)
    }


def expected_verdict(verdict: dict[str, object]) -> tuple[str, str | None]:
    return ("correct", None) if verdict["correct"] else ("wrong", str(verdict["correction"]))
