"""Group commit: inside ``store.group_commit()`` appends are queued and written as one file per table per group;
leaving the block, ``flush()`` and the limits write them; a process reads its own writes; rows the schema rejects
are left out whole and named, the rest is written; appends from threads and tasks at once lose nothing."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gil_core.errors import ConfigurationError, SchemaViolationError, TelemetryError
from gil_core.telemetry import TelemetryStore
from gil_core.telemetry._group import BACKLOG_GROUPS
from tests.telemetry.test_store import AT, make_call, make_trace, parquet_files, review


@pytest.fixture
def store(tmp_path: Path) -> TelemetryStore:
    return TelemetryStore(tmp_path / "store")


def on_disk(store: TelemetryStore) -> dict[str, int]:
    """Parquet files per table folder, as a fresh reader would find them."""
    return {table: len(parquet_files(store, table)) for table in store.tables() if parquet_files(store, table)}


def fresh_ids(store: TelemetryStore, table: str = "traces", column: str = "trace_id") -> list[str]:
    """What another process would read now (a new store object never flushes this one's queue)."""
    return TelemetryStore(store.root).read(table)[column].to_list()


def record(store: TelemetryStore, trace_id: str, **changes: Any) -> None:
    trace = make_trace(trace_id, **changes)
    counters = {"node_stats": [{"scope": "support", "node_id": "root", "hits": 1, "accepts": 1, "exits": 0}]}
    store.record_trace(trace, [make_call(f"{trace_id}/c")], extra_rows=counters)


def test_a_group_writes_nothing_until_it_is_left_then_one_file_per_table(store: TelemetryStore) -> None:
    with store.group_commit(max_rows=10_000, max_delay_s=None):
        for index in range(20):
            record(store, f"t{index}")
        assert on_disk(store) == {}
        assert fresh_ids(store) == []
    assert on_disk(store) == {"calls": 1, "traces": 1, "node_stats": 1}
    assert fresh_ids(store) == [f"t{index}" for index in range(20)]
    assert store.read("node_stats")["hits"].to_list() == [20]


def test_without_a_group_a_request_is_one_file_per_table_and_durable_on_return(store: TelemetryStore) -> None:
    record(store, "t1")
    assert on_disk(store) == {"calls": 1, "traces": 1, "node_stats": 1}
    assert fresh_ids(store) == ["t1"]


def test_calls_are_written_before_their_trace(store: TelemetryStore) -> None:
    """File names start with the write stamp: the calls file of a group is older than its traces file."""
    with store.group_commit(max_delay_s=None):
        record(store, "t1")
        store.append("reviews", [review("r1")])
    calls, traces = parquet_files(store, "calls")[0].name, parquet_files(store, "traces")[0].name
    assert calls < traces


def test_reads_of_the_same_store_flush_first(store: TelemetryStore) -> None:
    with store.group_commit(max_rows=10_000, max_delay_s=None):
        record(store, "t1")
        assert store.read("traces")["trace_id"].to_list() == ["t1"]
        record(store, "t2")
        assert store.scan("calls").collect()["call_id"].to_list() == ["t1/c", "t2/c"]
        record(store, "t3", mode="memory", feedback_verdict="correct")
        assert store.stats("support", window=10).requests == 3
        assert fresh_ids(store) == ["t1", "t2", "t3"]  # the reads made them durable


def test_flush_makes_everything_queued_durable_and_tells_the_listener(store: TelemetryStore) -> None:
    heard: list[dict[str, list[str]]] = []

    def listen(written: Mapping[str, pl.DataFrame]) -> None:
        heard.append({table: frame.to_series(0).to_list() for table, frame in written.items()})

    with store.group_commit(max_rows=10_000, max_delay_s=None, on_flush=listen):
        record(store, "t1")
        record(store, "t2")
        store.flush()
        assert fresh_ids(store) == ["t1", "t2"]
        record(store, "t3")
    assert heard == [
        {"calls": ["t1/c", "t2/c"], "traces": ["t1", "t2"], "node_stats": ["support", "support"]},
        {"calls": ["t3/c"], "traces": ["t3"], "node_stats": ["support"]},
    ]
    assert on_disk(store) == {"calls": 2, "traces": 2, "node_stats": 2}


def test_the_append_that_reaches_max_rows_flushes(store: TelemetryStore) -> None:
    with store.group_commit(max_rows=6, max_delay_s=None):  # a request here is 3 rows
        record(store, "t1")
        assert fresh_ids(store) == []
        record(store, "t2")
        assert fresh_ids(store) == ["t1", "t2"]
        record(store, "t3")
        assert fresh_ids(store) == ["t1", "t2"]
    assert fresh_ids(store) == ["t1", "t2", "t3"]


def test_rows_that_waited_max_delay_are_flushed_by_the_group_s_thread(store: TelemetryStore) -> None:
    flushed = threading.Event()
    with store.group_commit(max_rows=10_000, max_delay_s=0.05, on_flush=lambda written: flushed.set()):
        record(store, "t1")
        assert flushed.wait(timeout=120), "no timed flush"
        assert fresh_ids(store) == ["t1"]
    assert [thread.name for thread in threading.enumerate() if thread.name == "gil-group-commit"] == []


FLUSHER = "gil-group-commit"  # the group's background thread


def test_a_full_group_is_written_by_the_flusher_thread_not_by_the_append_that_filled_it(
    store: TelemetryStore,
) -> None:
    flushers: list[str] = []
    flushed = threading.Event()

    def listen(written: Mapping[str, pl.DataFrame]) -> None:
        flushers.append(threading.current_thread().name)
        flushed.set()

    with store.group_commit(max_rows=6, max_delay_s=3600, on_flush=listen):  # never by time here
        record(store, "t1")
        record(store, "t2")  # 6 rows: the group is full
        assert flushed.wait(timeout=120), "the full group was not flushed"
        assert fresh_ids(store) == ["t1", "t2"]
    assert flushers == [FLUSHER]


def waiting_in_a_flush(thread: threading.Thread) -> bool:
    """Whether ``thread`` is inside ``GroupCommits.flush`` (an append that writes itself, or waits to)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "flush" and frame.f_code.co_filename.endswith("_group.py"):
            return True
        frame = frame.f_back
    return False


def test_an_append_waits_only_once_the_rows_not_yet_durable_exceed_the_backlog_bound(store: TelemetryStore) -> None:
    """The flusher is held inside its first flush; another thread's appends queue until more than BACKLOG_GROUPS
    groups' rows wait, then the next one waits in a flush of its own, and writes the backlog once the flusher
    lets go."""
    gate, held = threading.Event(), threading.Event()
    heard: list[tuple[str, list[str]]] = []
    returned: list[str] = []

    def listen(written: Mapping[str, pl.DataFrame]) -> None:
        heard.append((threading.current_thread().name, written["traces"]["trace_id"].to_list()))
        if not held.is_set():
            held.set()
            assert gate.wait(timeout=120)

    def append_the_rest() -> None:
        for index in range(1, 20):
            record(store, f"t{index}")
            returned.append(f"t{index}")

    with store.group_commit(max_rows=3, max_delay_s=3600, on_flush=listen):  # a request is 3 rows
        record(store, "t0")  # fills the group: the flusher writes it, and is held
        assert held.wait(timeout=120)
        appender = threading.Thread(target=append_the_rest, name="appender")
        appender.start()
        deadline = time.monotonic() + 120
        while not waiting_in_a_flush(appender) and appender.is_alive() and time.monotonic() < deadline:
            threading.Event().wait(0.001)
        assert waiting_in_a_flush(appender) and appender.is_alive(), "the appender never waited"
        assert returned == [f"t{index}" for index in range(1, 1 + BACKLOG_GROUPS)]  # 4 groups queued, the 5th waits
        gate.set()
        appender.join()
    assert heard[0] == (FLUSHER, ["t0"])
    assert heard[1][1] == [f"t{index}" for index in range(1, 2 + BACKLOG_GROUPS)]  # the backlog, by either thread
    assert [trace_id for _, ids in heard for trace_id in ids] == [f"t{index}" for index in range(20)]
    assert fresh_ids(store) == [f"t{index}" for index in range(20)]


def test_a_failed_background_flush_reaches_the_append_that_fills_the_group_next(store: TelemetryStore) -> None:
    """The flusher's flush fails (a file stands where the traces folder goes): the next append that fills the group
    writes it itself and raises; once the obstacle is gone, nothing queued is lost."""
    store.root.mkdir(parents=True)
    (store.root / "traces").write_text("in the way")
    failed = threading.Event()
    heard: list[tuple[str, list[str]]] = []

    def listen(written: Mapping[str, pl.DataFrame]) -> None:
        heard.append((threading.current_thread().name, sorted(written)))
        failed.set()  # the first flush writes the calls, then fails on the traces

    with store.group_commit(max_rows=3, max_delay_s=3600, on_flush=listen):
        record(store, "t1")
        assert failed.wait(timeout=120)
        with pytest.raises(TelemetryError, match="could not append"):
            record(store, "t2")
        (store.root / "traces").unlink()
    assert heard[0] == (FLUSHER, ["calls"]) and heard[1] == ("MainThread", ["calls"])
    assert fresh_ids(store) == ["t1", "t2"]
    assert store.read("node_stats")["hits"].to_list() == [2]


def test_leaving_the_block_loses_nothing_the_flusher_was_writing(store: TelemetryStore) -> None:
    heard: list[str] = []
    with store.group_commit(
        max_rows=3, max_delay_s=3600, on_flush=lambda written: heard.extend(written["traces"]["trace_id"])
    ):
        for index in range(200):
            record(store, f"t{index}")
    assert heard == [f"t{index}" for index in range(200)]  # each heard once, in order
    assert fresh_ids(store) == heard
    assert [thread.name for thread in threading.enumerate() if thread.name == FLUSHER] == []


def test_a_later_row_of_the_same_key_in_the_same_group_wins(store: TelemetryStore) -> None:
    with store.group_commit(max_delay_s=None):
        record(store, "t1")
        store.record_trace(make_trace("t1", feedback_verdict="wrong", feedback_correction="no"))
    rows = store.read("traces")
    assert rows["trace_id"].to_list() == ["t1"]
    assert rows["feedback_verdict"].to_list() == ["wrong"]


def test_a_rejected_append_is_left_out_whole_named_and_the_others_are_written(store: TelemetryStore) -> None:
    """t2's trace fails a value check only seen at flush: none of t2's rows are written, t1's and t3's are."""
    with pytest.raises(SchemaViolationError) as caught, store.group_commit(max_delay_s=None):
        record(store, "t1")
        record(store, "t2", confidence=1.5)
        record(store, "t3")
    assert caught.value.table == "traces"
    assert "'t2'" in str(caught.value) and "confidence" in str(caught.value)
    assert fresh_ids(store) == ["t1", "t3"]
    assert fresh_ids(store, "calls", "call_id") == ["t1/c", "t3/c"]
    assert store.read("node_stats")["hits"].to_list() == [2]


def test_several_rejected_appends_are_each_named(store: TelemetryStore) -> None:
    with pytest.raises(SchemaViolationError) as caught, store.group_commit(max_delay_s=None):
        for index in range(40):
            record(store, f"t{index}", energy=-1.0 if index in (7, 31) else 1.0)
    assert "2 appends were not written" in str(caught.value)
    assert "'t7'" in str(caught.value) and "'t31'" in str(caught.value)
    assert len(fresh_ids(store)) == 38


def test_wrong_types_and_unknown_columns_raise_at_the_append_and_queue_nothing(store: TelemetryStore) -> None:
    with store.group_commit(max_delay_s=None):
        with pytest.raises(SchemaViolationError, match="unknown columns"):
            store.append_many({"reviews": [review("r1")], "store_meta": [{"key": "k", "value": "v", "oops": 1}]})
        with pytest.raises(SchemaViolationError, match="naive datetime"):
            store.append("reviews", [review("r2", reviewed_at=AT.replace(tzinfo=None))])
        store.append("reviews", [review("r3", note=None)])
    assert store.read("reviews")["item_id"].to_list() == ["r3"]


def test_exotic_but_valid_values_are_typed_the_slow_way_and_written(store: TelemetryStore) -> None:
    """A bool for an Int64 column is not a plain int: it is conformed at once (as outside a group) and kept."""
    with store.group_commit(max_delay_s=None):
        store.append("node_choices", [{"scope": "s", "node_id": "n", "chosen_id": "c", "accepts": True}])
        store.append(
            "node_choices", pl.DataFrame({"scope": ["s"], "node_id": ["n"], "chosen_id": ["c"], "accepts": [2]})
        )
    assert store.read("node_choices")["accepts"].to_list() == [3]


def test_outside_a_group_one_bad_table_of_an_append_writes_no_table(store: TelemetryStore) -> None:
    bad_counter = {"scope": "s", "node_id": "n", "hits": -1, "accepts": 0, "exits": 0}
    with pytest.raises(SchemaViolationError, match="node_stats"):
        store.append_many({"reviews": [review("r1")], "node_stats": [bad_counter]})
    assert on_disk(store) == {}


def test_threads_and_tasks_appending_at_once_lose_and_duplicate_nothing(store: TelemetryStore) -> None:
    async def task_appends(prefix: str) -> None:
        for index in range(30):
            store.append("reviews", [review(f"{prefix}-{index}")])
            await asyncio.sleep(0)

    def thread_appends(prefix: str) -> None:
        for index in range(60):
            store.append("reviews", [review(f"{prefix}-{index}")])
            if index % 20 == 0:
                store.read("reviews")  # reads in between flush too

    async def everything() -> None:
        await asyncio.gather(*(task_appends(f"a{n}") for n in range(4)))

    with store.group_commit(max_rows=25, max_delay_s=0.01):
        threads = [threading.Thread(target=thread_appends, args=(f"th{n}",)) for n in range(4)]
        for thread in threads:
            thread.start()
        asyncio.run(everything())
        for thread in threads:
            thread.join()
    ids = store.read("reviews")["item_id"]
    expected = {f"a{n}-{i}" for n in range(4) for i in range(30)} | {f"th{n}-{i}" for n in range(4) for i in range(60)}
    assert len(ids) == len(expected) and set(ids) == expected


def test_a_nested_block_joins_the_group_and_leaving_it_flushes(store: TelemetryStore) -> None:
    with store.group_commit(max_rows=10_000, max_delay_s=None):
        record(store, "t1")
        with store.group_commit(max_rows=1):  # joins: the outer limits hold
            record(store, "t2")
            assert fresh_ids(store) == []
        assert fresh_ids(store) == ["t1", "t2"]
        record(store, "t3")
        assert fresh_ids(store) == ["t1", "t2"]
    assert fresh_ids(store) == ["t1", "t2", "t3"]
    record(store, "t4")  # no group any more: durable at once
    assert fresh_ids(store) == ["t1", "t2", "t3", "t4"]


def test_a_failed_write_is_kept_and_written_by_the_next_flush(store: TelemetryStore) -> None:
    """The traces folder cannot be created (a file stands in its place): the calls are written, the trace is
    kept, and once the obstacle is gone the next flush writes it."""
    store.root.mkdir(parents=True)
    (store.root / "traces").write_text("in the way")
    heard: list[list[str]] = []
    with store.group_commit(max_delay_s=None, on_flush=lambda written: heard.append(sorted(written))):
        record(store, "t1")
        with pytest.raises(TelemetryError, match=r"table 'traces' at .*traces: could not append \(FileExistsError"):
            store.flush()
        assert fresh_ids(store, "calls", "call_id") == ["t1/c"]
        (store.root / "traces").unlink()
        store.flush()
    assert heard == [["calls"], ["node_stats", "traces"]]
    assert fresh_ids(store) == ["t1"]
    assert store.read("node_stats")["hits"].to_list() == [1]


def test_a_block_that_raises_still_flushes_what_it_queued(store: TelemetryStore) -> None:
    """The block's own error goes on (not a rejection found by the last flush, which was logged)."""
    with pytest.raises(KeyError), store.group_commit(max_delay_s=None):
        record(store, "t1")
        record(store, "t2", confidence=1.5)
        raise KeyError("the caller's own error goes on")
    assert fresh_ids(store) == ["t1"]
    store.flush()  # nothing left over to raise later


def test_limits_are_checked(store: TelemetryStore) -> None:
    with pytest.raises(ConfigurationError), store.group_commit(max_rows=0):
        pass
    with pytest.raises(ConfigurationError), store.group_commit(max_delay_s=0):
        pass
