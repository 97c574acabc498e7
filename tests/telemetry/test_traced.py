"""``TelemetryStore.traced``: which trace ids of a task have a trace. The store object that wrote every live file
answers from what it wrote; any other (a fresh object, or after another writer, a compaction, a quarantined
file) scans; both give the same answer, the newest row of a trace id saying its task."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from gil_core.telemetry import TelemetryStore
from gil_core.telemetry._written import WrittenTraces
from tests.telemetry.test_store import make_trace

IDS = [f"t{i}" for i in range(12)]


def answers(root: Path, writer: TelemetryStore) -> tuple[set[str], set[str], set[str], set[str]]:
    """The writer's answers and a fresh object's (which scans), for both tasks."""
    fresh = TelemetryStore(root)
    return (
        writer.traced("support", IDS),
        fresh.traced("support", IDS),
        writer.traced("other", IDS),
        fresh.traced("other", IDS),
    )


def test_the_writer_and_a_fresh_reader_agree_whatever_the_files(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = TelemetryStore(root)
    assert store.traced("support", IDS) == set()
    for i in range(4):
        store.record_trace(make_trace(f"t{i}"))
    with store.group_commit(max_rows=100, max_delay_s=None):
        for i in range(4, 8):
            store.record_trace(make_trace(f"t{i}", task="other" if i == 7 else "support"))
        assert store.traced("support", IDS) == {f"t{i}" for i in range(7)}  # what the group queued is flushed
    store.record_trace(make_trace("t2", task="other"))  # the newest row of t2 says another task
    support = {"t0", "t1", "t3", "t4", "t5", "t6"}
    assert answers(root, store) == (support, support, {"t2", "t7"}, {"t2", "t7"})

    TelemetryStore(root).record_trace(make_trace("t8"))  # a file this object did not write
    assert answers(root, store) == (support | {"t8"},) * 2 + ({"t2", "t7"},) * 2

    store.compact("traces")
    store.record_trace(make_trace("t9"))
    assert answers(root, store) == (support | {"t8", "t9"},) * 2 + ({"t2", "t7"},) * 2


def test_a_file_set_aside_is_not_counted_by_the_writer(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = TelemetryStore(root)
    store.record_trace(make_trace("t0"))
    store.record_trace(make_trace("t1"))
    first = sorted((root / "traces").glob("*.parquet"))[0]
    (root / "quarantine" / "traces").mkdir(parents=True)
    first.rename(root / "quarantine" / "traces" / first.name)  # as a reader moves a broken file
    assert answers(root, store) == ({"t1"}, {"t1"}, set(), set())


def _rows(trace_ids: list[str], tasks: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"trace_id": trace_ids, "task": tasks})


def test_what_a_writer_keeps_of_its_files_is_bounded_and_freed_when_a_file_is_gone() -> None:
    written = WrittenTraces(bound=3)
    written.note("a", _rows(["t0", "t1"], ["support", "support"]))
    written.note("b", _rows(["t1", "t2"], ["other", "support"]))  # past the bound: not noted
    assert written.newest(["a"]) == {"t0": "support", "t1": "support"}
    assert written.newest(["a", "b"]) is None  # a file not noted: the store scans
    written.forget("a")
    assert written.sources() == []
    written.note("b", _rows(["t1", "t2"], ["other", "support"]))
    written.note("c", _rows(["t1"], ["support"]))
    assert written.newest(["b", "c"]) == {"t1": "support", "t2": "support"}  # the later file's row wins
