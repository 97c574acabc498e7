"""Concurrency: a batch process and a feedback process write the same store and the same memory at once, and
nothing is lost; and no code path of Gil forks a process that may hold LanceDB (children are exec'd or spawned).

(Two raw writers and a compactor on one store: tests/telemetry/test_durability.py.)
"""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest

from gil_core.memory import LanceDBMemory
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel, ScriptedChatModel, ScriptedOpenAIServer
from tests.flows._support import write_task_file
from tests.flows.test_batch_crash import SlowModel, stored_traces  # SlowModel answers like SupportModel, slowly
from tests.reliability._support import (
    ROOT,
    check_one_trace_per_ticket,
    every_parquet_file_reads,
    expected_verdict,
    gil_command,
    given_verdicts,
    make_tickets,
    memory_matches_history,
    resolve_tickets,
    spawn_child,
    verdicts_for,
    write_jsonl,
)
from tests.resolver._support import Script
from tests.telemetry.test_durability import reaped

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

LATER = 100  # tickets of the batch that runs while the feedback is applied (group-committed: it must last)


class SlowerModel(SlowModel):
    delay = 0.1  # 100 tickets of two calls, four in flight: about 5 s of batch for the feedback to overlap


@pytest.mark.heavy
def test_a_batch_and_a_feedback_process_on_one_store_keep_every_row(tmp_path: Path) -> None:
    with ScriptedOpenAIServer(responder=SlowerModel({}, default=Script(answers=["None of these"]))) as server:
        task_file = write_task_file(tmp_path, server.base_url)
        earlier = make_tickets(16)
        trace_ids = asyncio.run(resolve_tickets(task_file, earlier))
        verdicts = verdicts_for(trace_ids)
        verdicts_path = write_jsonl(tmp_path / "verdicts.jsonl", verdicts)
        later = make_tickets(LATER, prefix="later-", text="another question, number {index}")
        tickets = write_jsonl(tmp_path / "later.jsonl", [{"id": t.id, "text": t.text} for t in later])

        out = tmp_path / "results.jsonl"
        batch = subprocess.Popen(
            gil_command("resolve-batch", str(tickets), "--out", str(out), "-t", str(task_file), "--json"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        feedback = spawn_child("feedback", str(task_file), str(verdicts_path))
        with reaped(batch, feedback):  # type: ignore[arg-type]
            traces = tmp_path / "store" / "traces"
            started = stored_traces(traces)
            deadline = time.monotonic() + 120
            while stored_traces(traces) < started + 3:  # the batch is writing
                assert batch.poll() is None and time.monotonic() < deadline, batch.communicate()[1]
                time.sleep(0.05)
            assert feedback.stdout is not None
            assert feedback.stdout.readline() == "ready\n", feedback.communicate()[1]
            first_ack = feedback.stdout.readline().strip()
            assert batch.poll() is None, "the batch ended before the first verdict was applied"
            acknowledged = [first_ack, *feedback.stdout.read().split()]  # (communicate would skip what is buffered)
            feedback.wait(timeout=300)
            batch_out, batch_err = batch.communicate(timeout=300)
    assert (batch.returncode, feedback.returncode) == (0, 0), batch_err
    summary = json.loads(batch_out)
    assert (summary["resolved"], summary["failed"]) == (LATER, [])
    assert sorted(acknowledged) == sorted(trace_ids)

    store = TelemetryStore(tmp_path / "store")
    check_one_trace_per_ticket(store, "support", [*earlier, *later])
    assert given_verdicts(store) == {str(v["trace_id"]): expected_verdict(v) for v in verdicts}
    assert len(out.read_text(encoding="utf-8").splitlines()) == LATER
    every_parquet_file_reads(tmp_path / "store")
    memory = LanceDBMemory(tmp_path / "memory", HashEmbeddingModel())
    held = asyncio.run(memory_matches_history(Resolver(ScriptedChatModel(), store), memory, "support"))
    assert held == len(trace_ids)


# -- never LanceDB across fork -------------------------------------------------------------------------------

FORKING_CALLS = {"fork", "forkpty", "Pool", "Process", "ProcessPoolExecutor", "LocalCluster", "get_context"}


def process_starts(path: Path) -> tuple[list[tuple[int, str]], bool]:
    """Every call in ``path`` that can start a process other than by exec (line, what it calls), and whether the
    module names a safe start method ('spawn' or 'forkserver') in a string constant."""
    found = []
    safe = False
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and node.value in ("spawn", "forkserver"):
            safe = True
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in FORKING_CALLS:
                found.append((node.lineno, name))
        if isinstance(node, ast.Constant) and node.value == "distributed.LocalCluster":
            found.append((node.lineno, "LocalCluster"))
    return found, safe


def test_gil_starts_processes_only_by_exec_or_spawn_never_by_a_bare_fork() -> None:
    """LanceDB must never be used across ``fork``. Gil's guard is that it never forks: children are started with
    ``subprocess`` (fork + exec) and worker pools with the 'spawn' method. Any new process start must say how."""
    sources = sorted([*(ROOT / "gil_core").rglob("*.py"), *(ROOT / "flows").rglob("*.py")])
    unguarded = []
    for path in sources:
        starts, safe = process_starts(path)
        for line, name in starts:
            if name in {"fork", "forkpty"} or not safe:
                unguarded.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert unguarded == [], "process starts that may fork with LanceDB open: " + ", ".join(unguarded)


def test_the_fork_check_flags_a_bare_fork_and_a_pool_without_spawn(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text("import os, multiprocessing\nos.fork()\nmultiprocessing.Pool(2)\n", encoding="utf-8")
    assert process_starts(module) == ([(2, "fork"), (3, "Pool")], False)
    module.write_text("import multiprocessing\nmultiprocessing.get_context('spawn').Pool(2)\n", encoding="utf-8")
    assert process_starts(module)[1] is True
