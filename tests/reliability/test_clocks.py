"""Clocks that disagree: two real processes on one store (a folder, and ``s3://`` on moto), the second with its
store's clock an hour behind. Its verdicts must still be the latest word on their traces, a rerun must count
nothing twice, and what the store replays (memory rebuilt from the feedback history, habit counters, stats) must
agree with the live state and with the same steps done in one process whose clock is right."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gil_core.batch import ticket_trace_id
from gil_core.language import ENGLISH
from gil_core.learned import Learner
from gil_core.learned.log import read_learned_log, verdict_digest
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.maintenance import compact_store
from gil_core.memory import LexicalMemory, plan_memory
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from gil_core.testing import HashEmbeddingModel, ScriptedOpenAIServer
from tests.learned._support import learned_task
from tests.reliability._support import ROOT, memory_matches_history
from tests.resolver._support import Script, support_server, support_task, support_tree
from tests.telemetry._s3 import environment_for, new_bucket, s3_settings, serve_s3

pytestmark = pytest.mark.reliability

CHILD = Path(__file__).with_name("_clock_child.py")
TASK = "support"
LEARNED = "learned"
HOUR_S = 3600.0
REFUND_TEXT = "where is my refund?"
RESET_TEXT = "how do I reset my password?"
A3 = "Refunds for a cancelled order take ten days."
B1 = "Refunds are paid within fourteen days."
B2 = "Reset it from the app, under Settings."
PAYMENT = "We accept major credit cards, debit cards and bank transfer."

# The first process, its clock right: t3 is a memory hit on t1's confirmed answer, and its wrong verdict forgets it;
# l1 is a request of a task with the learned reflex, its answer confirmed.
FIRST: list[list[Any]] = [
    [TASK, "resolve", "t1", REFUND_TEXT],
    [TASK, "resolve", "t2", RESET_TEXT],
    [TASK, "feedback", "t1", True, None],
    [TASK, "resolve", "t3", REFUND_TEXT],
    [TASK, "feedback", "t3", False, A3],
    [TASK, "feedback", "t2", True, None],
    [LEARNED, "resolve", "l1", REFUND_TEXT],
    [LEARNED, "feedback", "l1", True, None],
]
# The second process, an hour behind, overturns the first's verdicts (t1's correction is remembered again: the
# memory hit's wrong verdict came before it), and corrects l1 to another answer of the tree, which the learned
# judge's refit must learn.
SECOND: list[list[Any]] = [
    [TASK, "feedback", "t1", False, B1],
    [TASK, "feedback", "t2", False, B2],
    [LEARNED, "feedback", "l1", False, PAYMENT],
]
EXPECTED_VERDICTS = {"t1": ("wrong", B1), "t2": ("wrong", B2), "t3": ("wrong", A3)}
EXPECTED_MEMORY = {"t1": B1, "t2": B2, "t3": A3}

s3_endpoint = pytest.fixture(scope="module")(serve_s3)


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedOpenAIServer]:
    scripts = {
        REFUND_TEXT: Script(route=["billing", "refund status"]),
        RESET_TEXT: Script(route=["account", "security", "reset password"]),
    }
    with support_server(scripts) as running:
        yield running


def run_child(
    store: str, memory: Path, server: ScriptedOpenAIServer, offset_s: float, steps: list[list[Any]], **env: str
) -> list[dict[str, Any]]:
    """The steps done by ``_clock_child.py`` in a new process, its store's clock ``offset_s`` off; its lines."""
    done = subprocess.run(
        [sys.executable, str(CHILD), store, str(memory), server.base_url, str(offset_s), json.dumps(steps)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def verdicts(store: TelemetryStore) -> dict[str, tuple[str, str | None]]:
    traces = store.read("traces").filter(pl.col("task") == TASK)
    ids = {ticket_trace_id(TASK, ticket): ticket for ticket in ("t1", "t2", "t3")}
    return {
        ids[row["trace_id"]]: (row["feedback_verdict"], row["feedback_correction"])
        for row in traces.iter_rows(named=True)
    }


def learned_confirmed(store: TelemetryStore) -> dict[str, str | None]:
    """What the learned judge's refit learns from the log: the tree answer confirmed per ticket."""
    log = read_learned_log(
        store, LEARNED, support_tree(), none_text=ENGLISH.none_of_these, embedder=HashEmbeddingModel().name
    )
    return {item.trace_id: item.option for item in log.confirmed}


async def check_learned(store: TelemetryStore, reference: TelemetryStore) -> None:
    """The refit learns the second process's correction, as in one process, and the state the second process fitted
    live was fitted on the verdicts the log holds, as a refit now is."""
    assert learned_confirmed(store) == {ticket_trace_id(LEARNED, "l1"): "payment-methods"}
    assert learned_confirmed(store) == learned_confirmed(reference)
    learner = Learner(store, HashEmbeddingModel())
    task = learned_task(LEARNED)
    live = learner.stored_state(task)
    assert live is not None
    refit = await learner.refresh(task, force=True)
    assert dict(live.fitted_on) == dict(refit.fitted_on) == verdict_digest(store, LEARNED).to_json()
    assert live.nodes.keys() == refit.nodes.keys()


def habit_counters(store: TelemetryStore) -> list[dict[str, Any]]:
    return store.read("habit_reliability").sort("scope", "item_id").to_dicts()


def stats_of(store: TelemetryStore) -> dict[str, Any]:
    """What ``gil stats`` says, less what differs between two runs of the same steps (none of the verdicts)."""
    stats = store.stats(TASK, window=2).to_json()
    return {key: stats[key] for key in ("requests", "modes", "habit_rate", "memory_rate", "deciders")}


def memory_by_ticket(entries: list[Any]) -> dict[str, str]:
    ids = {ticket_trace_id(TASK, ticket): ticket for ticket in ("t1", "t2", "t3")}
    return {ids[entry.key]: entry.answer for entry in entries}


def stamps_by_pid(store: TelemetryStore, table: str) -> dict[int, list[int]]:
    """The order stamps of a table's appended files (their names start with them), per writing process."""
    found: dict[int, list[int]] = {}
    for name in store._folder(table).names():
        stamp, pid, _ = name.split("-", 2)
        found.setdefault(int(pid), []).append(int(stamp))
    return found


async def check_skewed_run(store: TelemetryStore, reference: TelemetryStore, tmp_path: Path, server: Any) -> None:
    """The skewed two-process store against the reference one-process store, and memory against its history."""
    assert verdicts(store) == EXPECTED_VERDICTS == verdicts(reference)
    assert habit_counters(store) == habit_counters(reference)
    assert stats_of(store) == stats_of(reference)
    live = LexicalMemory(tmp_path / "memory")
    assert memory_by_ticket(await live.entries(TASK)) == EXPECTED_MEMORY
    resolver = Resolver(OpenAICompatibleChatModel(server.base_url, "scripted"), store, memory=live)
    assert await memory_matches_history(resolver, live, TASK) == 3
    assert memory_by_ticket(plan_memory(resolver.feedback_history(TASK))) == EXPECTED_MEMORY
    rebuilt = LexicalMemory(tmp_path / "rebuilt")
    rebuilder = Resolver(OpenAICompatibleChatModel(server.base_url, "scripted"), store, memory=rebuilt)
    assert await rebuilder.rebuild_memory(support_task(TASK, memory_threshold=0.95)) == 3
    assert memory_by_ticket(await rebuilt.entries(TASK)) == EXPECTED_MEMORY
    await check_learned(store, reference)


def run_both(store: str, tmp_path: Path, server: ScriptedOpenAIServer, **env: str) -> tuple[int, int]:
    """The first process's steps, then the second's (an hour behind) twice; the two pids."""
    first = run_child(store, tmp_path / "memory", server, 0.0, FIRST, **env)
    modes = [line.get("mode") for line in first if "resolved" in line]
    assert modes == ["habit/answer", "habit/answer", "memory", "habit/answer"]
    second = run_child(store, tmp_path / "memory", server, -HOUR_S, SECOND, **env)
    assert [(line["applied"], line["unchanged"]) for line in second if "feedback" in line] == [(1, 0)] * 3
    rerun = run_child(store, tmp_path / "memory", server, -HOUR_S, SECOND, **env)
    assert [(line["applied"], line["unchanged"]) for line in rerun if "feedback" in line] == [(0, 1)] * 3
    return first[-1]["pid"], second[-1]["pid"]


def reference_store(tmp_path: Path, server: ScriptedOpenAIServer) -> TelemetryStore:
    """The same steps in one process whose clock is right."""
    run_child(str(tmp_path / "reference"), tmp_path / "reference-memory", server, 0.0, FIRST + SECOND)
    return TelemetryStore(tmp_path / "reference")


@pytest.mark.heavy
async def test_a_verdict_from_a_process_an_hour_behind_is_the_latest_word_and_replays_agree(
    tmp_path: Path, server: ScriptedOpenAIServer
) -> None:
    """On a local store: the second process's verdicts supersede the first's although its clock is an hour
    behind (its files are stamped after the first's, not an hour before), a rerun applies nothing again, and
    memory, its rebuild, habit counters and stats agree with one process doing the same; after a compaction too."""
    first_pid, second_pid = run_both(str(tmp_path / "store"), tmp_path, server)
    store = TelemetryStore(tmp_path / "store")
    stamps = stamps_by_pid(store, "traces")
    assert min(stamps[second_pid]) > max(stamps[first_pid])
    assert min(stamps[second_pid]) - max(stamps[first_pid]) < HOUR_S * 1e9 / 2  # ordered after, not an hour off
    reference = reference_store(tmp_path, server)
    await check_skewed_run(store, reference, tmp_path, server)
    assert compact_store(store)["traces"] > 1
    await check_skewed_run(TelemetryStore(tmp_path / "store"), reference, tmp_path, server)


@pytest.mark.heavy
async def test_over_s3_a_verdict_from_a_process_an_hour_behind_is_the_latest_word_and_replays_agree(
    tmp_path: Path, server: ScriptedOpenAIServer, s3_endpoint: str
) -> None:
    """The same on ``s3://`` (moto): no counter in the store, only listings; replays agree after a compaction."""
    bucket = new_bucket(s3_endpoint)
    root = f"s3://{bucket}/gil"
    run_both(root, tmp_path, server, **environment_for(s3_endpoint))
    store = TelemetryStore(root, s3=s3_settings(s3_endpoint))
    reference = reference_store(tmp_path, server)
    await check_skewed_run(store, reference, tmp_path, server)
    assert compact_store(store)["traces"] > 1
    await check_skewed_run(TelemetryStore(root, s3=s3_settings(s3_endpoint)), reference, tmp_path, server)
