"""The store's order key: a hybrid logical clock (``_clock.HybridClock``), so a write is ordered after every row its
writer listed whatever its wall clock says; and stores written before the clock (wall-clock stamps, no version in
their files) are read as they are, never quarantined, and carried over by a compaction."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from gil_core.telemetry import TelemetryStore
from gil_core.telemetry._clock import ORDER_KEY, ORDER_KEY_VERSION, HybridClock

HOUR_NS = 3600 * 10**9


def behind(offset_ns: int) -> HybridClock:
    return HybridClock(wall_ns=lambda: time.time_ns() - offset_ns)


def meta_row(value: str) -> dict[str, str]:
    return {"key": "k", "value": value}


def file_metadata(path: Path) -> dict[str, str]:
    metadata = pq.read_metadata(path).metadata or {}
    return {key.decode(): value.decode() for key, value in metadata.items()}


def test_stamps_never_go_back_even_when_the_wall_clock_does() -> None:
    wall = iter([5_000, 4_000, 4_000, 9_000])
    clock = HybridClock(wall_ns=lambda: next(wall))
    assert [clock.now() for _ in range(4)] == [5_000, 5_001, 5_002, 9_000]


def test_a_stamp_seen_ahead_of_the_wall_clock_is_gone_past_by_the_next_stamp() -> None:
    clock = HybridClock(wall_ns=lambda: 1_000)
    clock.observe(50_000)
    clock.observe(20_000)  # an older stamp changes nothing
    assert clock.now() == 50_001
    assert clock.now() == 50_002


def test_a_stamp_far_ahead_is_warned_of_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = behind(HOUR_NS)
    with caplog.at_level(logging.WARNING, logger="gil_core.telemetry._clock"):
        clock.observe(time.time_ns())
        clock.observe(time.time_ns() + 10**9)
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "ahead of this machine's clock" in warnings[0], warnings


def test_a_writer_an_hour_behind_supersedes_what_it_read(tmp_path: Path) -> None:
    """A store object whose clock is an hour behind reads the table, then writes: its row wins over the row it
    read, and its file's stamp is right after that row's, not an hour before."""
    TelemetryStore(tmp_path).append("store_meta", [meta_row("first")])
    late = TelemetryStore(tmp_path, clock=behind(HOUR_NS))
    assert late.read("store_meta")["value"].to_list() == ["first"]
    late.append("store_meta", [meta_row("second")])
    assert TelemetryStore(tmp_path).read("store_meta")["value"].to_list() == ["second"]
    first, second = (int(name.split("-", 1)[0]) for name in sorted(p.name for p in (tmp_path / "store_meta").iterdir()))
    assert 0 < second - first < 10**9


def test_a_writer_that_read_nothing_is_ordered_by_its_own_clock(tmp_path: Path) -> None:
    """What the clock does not promise: a writer that never listed the table is not ordered after its rows."""
    TelemetryStore(tmp_path).append("store_meta", [meta_row("first")])
    TelemetryStore(tmp_path, clock=behind(HOUR_NS)).append("store_meta", [meta_row("blind")])
    assert TelemetryStore(tmp_path).read("store_meta")["value"].to_list() == ["first"]


def test_a_file_written_after_a_compaction_s_newest_row_lists_after_the_compacted_file(tmp_path: Path) -> None:
    """The compacted file is named by the newest row it holds, not by its compactor's clock: a file appended by a
    writer that has not listed it since (as one appended while the compaction merged) lists after it, so the
    table stays in write order and a read needs no sort, even when the compactor's clock runs an hour ahead."""
    writer = TelemetryStore(tmp_path)
    writer.append("store_meta", [meta_row("old"), {"key": "other", "value": "kept"}])
    writer.append("store_meta", [meta_row("older than the merge")])
    newest = max(int(path.name.split("-")[0]) for path in (tmp_path / "store_meta").glob("*.parquet"))
    ahead = TelemetryStore(tmp_path, clock=behind(-HOUR_NS))
    assert ahead.compact("store_meta") == 2
    writer.append("store_meta", [meta_row("new")])
    names = sorted(path.name for path in (tmp_path / "store_meta").glob("*.parquet"))
    assert names[0].endswith(".compacted.parquet") and names[0].startswith(f"{newest:020d}-"), names
    reader = TelemetryStore(tmp_path)
    assert "SORT" not in reader.scan("store_meta").explain()
    assert reader.read("store_meta").rows() == [("other", "kept"), ("k", "new")]


def test_every_file_the_store_writes_names_its_order_key_version(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path)
    store.append("store_meta", [meta_row("a")])
    store.append("store_meta", [meta_row("b")])
    store.compact("store_meta")
    files = list((tmp_path / "store_meta").glob("*.parquet"))
    assert len(files) == 1 and files[0].name.endswith(".compacted.parquet")
    assert file_metadata(files[0])[ORDER_KEY] == ORDER_KEY_VERSION


def write_as_before_the_clock(tmp_path: Path, table: str, stamp: int, frame: pl.DataFrame) -> Path:
    """A file as the store wrote it before the order key had a version: wall-clock ``_seq``, no metadata."""
    path = tmp_path / table / f"{stamp:020d}-4242-0123456789ab.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.with_columns(pl.lit(stamp, pl.Int64).alias("_seq")).write_parquet(path)
    assert ORDER_KEY not in file_metadata(path)
    return path


def test_a_store_written_before_the_clock_is_read_as_it_was_and_carried_over_by_a_compaction(tmp_path: Path) -> None:
    """Old files (wall-clock stamps, no version) read as before, in their order; none is quarantined or reported
    broken; a new write supersedes them (its writer listed them); a compaction merges old and new into one file
    of the current version with the same rows."""
    now = time.time_ns()
    old = pl.DataFrame({"key": ["k", "other"], "value": ["old", "kept"]})
    write_as_before_the_clock(tmp_path, "store_meta", now - 2 * HOUR_NS, old)
    write_as_before_the_clock(tmp_path, "store_meta", now - HOUR_NS, pl.DataFrame({"key": ["k"], "value": ["newer"]}))
    store = TelemetryStore(tmp_path, clock=behind(3 * HOUR_NS))  # behind even the old files: it goes past them
    assert store.read("store_meta").sort("key").to_dicts() == [
        {"key": "k", "value": "newer"},
        {"key": "other", "value": "kept"},
    ]
    assert store.quarantined() == ()
    assert store.check().broken == ()
    store.append("store_meta", [meta_row("newest")])
    before = TelemetryStore(tmp_path).read("store_meta")
    assert before.sort("key")["value"].to_list() == ["newest", "kept"]
    assert store.compact("store_meta") == 3
    files = list((tmp_path / "store_meta").glob("*.parquet"))
    assert len(files) == 1 and file_metadata(files[0])[ORDER_KEY] == ORDER_KEY_VERSION
    assert TelemetryStore(tmp_path).read("store_meta").equals(before)
    assert TelemetryStore(tmp_path).quarantined() == ()
