"""The store's durability promises, checked across real processes: an acknowledged write survives SIGKILL
and leaves no torn file; concurrent writers (with a compactor running) lose nothing and duplicate nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq

from gil_core.telemetry import TelemetryStore

AT = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)

CHILD = Path(__file__).with_name("_store_child.py")
PROJECT = Path(__file__).resolve().parents[2]


def spawn(*args: str) -> subprocess.Popen[str]:
    """Start ``_store_child.py``; it imports, says ``ready`` and waits for ``go`` (see ``go``)."""
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=PROJECT,
        env={**os.environ, "PYTHONPATH": str(PROJECT)},
    )


def go(*children: subprocess.Popen[str]) -> None:
    """Once every child is ready (they start in parallel), let them all run."""
    for child in children:
        assert child.stdout is not None
        first = child.stdout.readline()
        assert first == "ready\n", f"child failed to start: {first!r} {child.communicate()[1]}"
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()


@contextmanager
def reaped(*children: subprocess.Popen[str]) -> Iterator[None]:
    """Whatever happens in the test, no child outlives it."""
    try:
        yield
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.communicate(timeout=60)


def all_parquet_files_open(root: Path) -> int:
    files = sorted(root.rglob("*.parquet"))
    for path in files:
        if not path.name.startswith("."):
            pq.read_table(path)  # raises on a torn or partial file
    return len(files)


def killed_after(mode: str, root: Path, count: int) -> list[str]:
    """Run a ``_store_child.py`` writer in ``mode`` under ``root`` until it has acknowledged ``count`` trace ids,
    SIGKILL it, and return the ids it acknowledged."""
    writer = spawn(mode, str(root), "w", "1000000")
    acknowledged: list[str] = []
    with reaped(writer):
        go(writer)
        assert writer.stdout is not None
        while len(acknowledged) < count:
            line = writer.stdout.readline()
            assert line, f"writer died early: {writer.communicate()[1]}"
            acknowledged.append(line.strip())
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=60)
    assert writer.returncode == -signal.SIGKILL
    return acknowledged


def test_every_acknowledged_trace_survives_sigkill_and_no_file_is_torn(tmp_path: Path) -> None:
    root = tmp_path / "store"
    acknowledged = killed_after("traces", root, 30)  # most likely in the middle of the next record_trace

    assert all_parquet_files_open(root) >= 60
    store = TelemetryStore(root)
    traces = set(store.read("traces")["trace_id"])
    calls = set(store.read("calls")["call_id"])
    assert set(acknowledged) <= traces
    assert {f"{trace_id}/judge" for trace_id in acknowledged} <= calls
    assert store.compact("traces") >= 30  # a killed writer's leftovers do not hinder compaction
    assert set(acknowledged) <= set(store.read("traces")["trace_id"])


def test_two_writers_and_a_compactor_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    """Two child processes append 200 rows each while this process compacts and reads in a loop."""
    root = tmp_path / "store"
    writers = [spawn("reviews", str(root), prefix, "200") for prefix in ("a", "b")]
    store = TelemetryStore(root)
    merged = reads = seen = 0
    with reaped(*writers):
        go(*writers)
        while any(writer.poll() is None for writer in writers):
            merged += store.compact("reviews")
            ids = store.read("reviews")["item_id"]
            assert ids.n_unique() == len(ids), "a reader saw a row twice"
            assert len(ids) >= seen, "a reader missed rows it had seen before"
            seen = len(ids)
            reads += 1
        acknowledged = [writer.communicate(timeout=60)[0].split() for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0]
    assert merged > 0 and reads > 0  # compactions and reads really ran alongside the writers

    expected = {f"{prefix}-{index}" for prefix in ("a", "b") for index in range(200)}
    assert set(acknowledged[0]) | set(acknowledged[1]) == expected
    for reader in (store, TelemetryStore(root)):  # also a fresh reader with no cached metadata
        ids = reader.read("reviews")["item_id"]
        assert len(ids) == 400 and set(ids) == expected
    store.compact("reviews")
    ids = store.read("reviews")["item_id"]
    assert len(ids) == 400 and set(ids) == expected
    assert all_parquet_files_open(root) == 1


def test_compactors_in_two_processes_take_turns(tmp_path: Path) -> None:
    """A child compacting in a loop while this process appends and compacts too: the lock keeps it exact."""
    root = tmp_path / "store"
    stop = tmp_path / "stop"
    compactor = spawn("compact", str(root), str(stop))
    store = TelemetryStore(root)
    with reaped(compactor):
        go(compactor)
        for index in range(150):
            store.append(
                "reviews", [{"task": "t", "reviewed_at": AT, "kind": "k", "item_id": f"r{index}", "decision": "d"}]
            )
            if index % 10 == 0:
                store.compact("reviews")
                ids = store.read("reviews")["item_id"]
                assert ids.n_unique() == len(ids) == index + 1
        stop.touch()
        merged = int(compactor.communicate(timeout=60)[0].split()[-1])
    assert compactor.returncode == 0 and merged >= 0
    ids = store.read("reviews")["item_id"]
    assert sorted(ids) == sorted(f"r{index}" for index in range(150))
