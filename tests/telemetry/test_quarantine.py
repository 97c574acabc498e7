"""Broken files in a table's folder: reads skip them with a warning naming them and move them into quarantine
beside the table, stats count them, writes and compaction go on; only the file's own bytes decide, so a read that
fails (an I/O error, a refused key, a file a concurrent compaction removed) never moves a file. Locally and over
s3:// (moto on loopback)."""

from __future__ import annotations

import io
import logging
import random
import threading
from pathlib import Path

import polars as pl
import pytest

from gil_core.errors import TelemetryError
from gil_core.storage import S3Settings
from gil_core.telemetry import TelemetryStore
from tests.telemetry._s3 import (
    assert_no_key,
    fill,
    iam_keys,
    judge_call,
    keys_checked,
    new_bucket,
    objects,
    s3_settings,
    serve_s3,
    settings_for,
    trace,
)
from tests.telemetry._tmpfs import remount_read_only, tmpfs

BROKEN_NAME = "01796000000000000000-1-0badf11e0000.parquet"
KINDS = ("truncated", "zero bytes", "random bytes", "mistyped column", "pages that do not decode")
COUNTED = {"mistyped column", "pages that do not decode"}  # their footers still say how many rows they hold

s3_endpoint = pytest.fixture(scope="module")(serve_s3)
s3 = pytest.fixture(settings_for)


def broken(kind: str, good: bytes) -> bytes:
    """A broken copy of the Parquet file ``good`` (a traces file)."""
    if kind == "truncated":
        return good[: len(good) // 2]
    if kind == "zero bytes":
        return b""
    if kind == "random bytes":
        return random.Random(7).randbytes(len(good))
    if kind == "pages that do not decode":  # the footer is whole; the first page header is not
        return good[:4] + b"\xff" * 16 + good[20:]
    assert kind == "mistyped column"  # energy as text: no version of the traces table typed it so
    buffer = io.BytesIO()
    pl.read_parquet(good).with_columns(pl.col("energy").cast(pl.String)).write_parquet(buffer)
    return buffer.getvalue()


def a_traces_file(root: Path) -> bytes:
    return next(path for path in sorted((root / "traces").iterdir()) if path.suffix == ".parquet").read_bytes()


def filled_with_a_broken_file(root: Path, kind: str) -> tuple[pl.DataFrame, bytes]:
    """A store at ``root`` holding ``fill``'s rows and a broken traces file: what its traces read as, and the
    broken file's bytes."""
    fill(TelemetryStore(root))
    before = TelemetryStore(root).read("traces")
    bad = broken(kind, a_traces_file(root))
    (root / "traces" / BROKEN_NAME).write_bytes(bad)
    return before, bad


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "gil_core.telemetry.store"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_broken_file_is_skipped_named_moved_into_quarantine_and_counted_and_writes_go_on(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "store"
    before, bad = filled_with_a_broken_file(root, kind)
    store = TelemetryStore(root)  # a fresh reader: nothing known about the files yet
    with caplog.at_level(logging.WARNING, logger="gil_core.telemetry.store"):
        assert store.read("traces").equals(before)
    [warning] = warnings_of(caplog)
    assert str(root / "traces" / BROKEN_NAME) in warning and str(root / "quarantine" / "traces") in warning
    assert not (root / "traces" / BROKEN_NAME).exists()
    assert (root / "quarantine" / "traces" / BROKEN_NAME).read_bytes() == bad

    stats = TelemetryStore(root).stats("support", 4)
    assert stats.requests == 6 and stats.quarantined_files == 1
    counted = kind in COUNTED
    assert (stats.quarantined_rows, stats.quarantined_uncounted) == ((1, 0) if counted else (0, 1))
    assert "quarantined: 1 broken files" in stats.render()
    [listed] = store.quarantined()
    assert (listed.table, listed.name, listed.rows) == ("traces", BROKEN_NAME, 1 if counted else None)

    store.record_trace(trace(9))  # writes go on, and so does compaction
    assert store.compact("traces") > 1
    assert TelemetryStore(root).read("traces").height == 7


def test_a_broken_file_is_skipped_by_scans_stats_and_compaction_too(tmp_path: Path) -> None:
    root = tmp_path / "store"
    before, _ = filled_with_a_broken_file(root, "truncated")
    assert TelemetryStore(root).scan("traces").collect().equals(before)
    assert not (root / "traces" / BROKEN_NAME).exists()

    pages = "01796000000000000001-1-0badf11e0001.parquet"  # found only when a page is decoded
    (root / "traces" / pages).write_bytes(broken("pages that do not decode", a_traces_file(root)))
    assert TelemetryStore(root).stats("support", 4).quarantined_files == 2
    (root / "calls" / BROKEN_NAME).write_bytes(broken("zero bytes", a_traces_file(root)))
    store = TelemetryStore(root)
    assert store.compact("calls") == 6 and store.read("calls").height == 6
    assert sorted(item.table for item in store.quarantined()) == ["calls", "traces", "traces"]


def test_files_of_older_and_newer_versions_of_a_table_are_read_never_quarantined(tmp_path: Path) -> None:
    """A file that lacks a column added later was written before it; one with a column the table does not know
    was written by a newer version. Neither is broken."""
    root = tmp_path / "store"
    store = TelemetryStore(root)
    store.record_trace(trace(1))
    good = pl.read_parquet(a_traces_file(root))
    older = good.drop("decider").with_columns(pl.lit("t-old").alias("trace_id"))
    newer = good.with_columns(pl.lit("t-new").alias("trace_id"), pl.lit(3).alias("a_later_column"))
    older.write_parquet(root / "traces" / "01796000000000000002-1-000000000002.parquet")
    newer.write_parquet(root / "traces" / "01796000000000000003-1-000000000003.parquet")
    read = TelemetryStore(root).read("traces")
    assert sorted(read["trace_id"]) == ["t-new", "t-old", "t1"] and "a_later_column" not in read.columns
    assert read.filter(pl.col("trace_id") == "t-old")["decider"].to_list() == [None]
    assert TelemetryStore(root).quarantined() == () and not (root / "quarantine").exists()


def test_a_read_that_fails_is_raised_and_moves_no_file(tmp_path: Path) -> None:
    """The file cannot be opened (a symbolic link to itself: ELOOP): the read failed, which says nothing about the
    file's bytes. Reads, scans and compaction raise it, as a ``TelemetryError`` naming the table whose cause is
    the ``OSError``; nothing is moved."""
    root = tmp_path / "store"
    fill(TelemetryStore(root))
    looping = root / "traces" / BROKEN_NAME
    looping.symlink_to(looping)
    store = TelemetryStore(root)
    for attempt in (
        lambda: store.read("traces"),
        lambda: store.scan("traces").collect(),
        lambda: store.compact("traces"),
    ):
        with pytest.raises(TelemetryError, match=r"table 'traces'.*Too many levels of symbolic links") as caught:
            attempt()
        assert isinstance(caught.value.__cause__, OSError)
    assert looping.is_symlink() and not (root / "quarantine").exists()


def test_on_a_read_only_file_system_a_broken_file_is_skipped_and_left_where_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with tmpfs(tmp_path / "mnt") as mounted:
        root = mounted / "store"
        before, _ = filled_with_a_broken_file(root, "truncated")
        remount_read_only(mounted)
        with caplog.at_level(logging.WARNING, logger="gil_core.telemetry.store"):
            store = TelemetryStore(root)
            assert store.read("traces").equals(before) and store.read("traces").equals(before)
        assert (root / "traces" / BROKEN_NAME).exists() and not (root / "quarantine").exists()
    [warning] = warnings_of(caplog)  # once per store object: it remembers the file it could not move
    assert str(root / "traces" / BROKEN_NAME) in warning and "could not be moved" in warning
    assert "Read-only file system" in warning


class RaceCounter(logging.Handler):
    """Counts the store's "went while it was being read" notes: a listed file a compaction deleted before the
    read got to it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.races = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.races += "went while it was being read" in record.getMessage()


def read_while_compacting(writer: TelemetryStore, reader: TelemetryStore, *, races: int, most_rounds: int) -> int:
    """A writer thread appends three traces and compacts, round after round, until the reader thread (reading all
    the while) has met ``races`` files deleted under it, or ``most_rounds`` rounds. Every read holds at least what
    was acknowledged before it began. Returns the traces written."""
    counter = RaceCounter()
    logger = logging.getLogger("gil_core.telemetry.store")
    logger.addHandler(counter)
    level, logger.level = logger.level, logging.DEBUG
    acknowledged, done = [0], threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(most_rounds):
                for _ in range(3):
                    writer.record_trace(trace(acknowledged[0]), [judge_call(acknowledged[0])])
                    acknowledged[0] += 1
                writer.compact("traces")
                if counter.races >= races:
                    break
        except BaseException as exc:
            failures.append(exc)
        finally:
            done.set()

    def read() -> None:
        try:
            while not done.is_set():
                floor = acknowledged[0]
                assert reader.read("traces").height >= floor
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    finally:
        logger.removeHandler(counter)
        logger.level = level
    assert not failures, failures
    assert counter.races >= 1, f"no read met a file a compaction deleted in {most_rounds} rounds"
    return acknowledged[0]


def test_files_a_concurrent_compaction_removes_are_never_quarantined(tmp_path: Path) -> None:
    root = tmp_path / "store"
    written = read_while_compacting(TelemetryStore(root), TelemetryStore(root), races=3, most_rounds=300)
    assert TelemetryStore(root).read("traces").height == written
    assert not (root / "quarantine").exists()


# -- over s3:// -------------------------------------------------------------------------------------------


def put_object(settings: S3Settings, bucket: str, key: str, data: bytes) -> None:
    with settings.filesystem(bucket).open_output_stream(f"{bucket}/{key}") as stream:
        stream.write(data)


def get_object(settings: S3Settings, bucket: str, key: str) -> bytes:
    with settings.filesystem(bucket).open_input_stream(f"{bucket}/{key}") as stream:
        data: bytes = stream.read()
    return data


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    return new_bucket(s3_endpoint)


@pytest.mark.s3
def test_over_s3_broken_objects_are_moved_into_quarantine_beside_their_table(
    s3: S3Settings, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = f"s3://{bucket}/store"
    fill(TelemetryStore(root, s3=s3))
    before = TelemetryStore(root, s3=s3).read("traces")
    good = get_object(s3, bucket, f"store/{next(n for n in objects(s3, bucket, 'store') if n.startswith('traces/'))}")
    second = "01796000000000000001-1-0badf11e0001.parquet"
    put_object(s3, bucket, f"store/traces/{BROKEN_NAME}", broken("truncated", good))
    put_object(s3, bucket, f"store/traces/{second}", broken("mistyped column", good))
    store = TelemetryStore(root, s3=s3)
    with caplog.at_level(logging.WARNING, logger="gil_core.telemetry.store"):
        assert store.read("traces").equals(before)
    assert len(warnings_of(caplog)) == 2 and f"{root}/traces/{BROKEN_NAME}" in " ".join(warnings_of(caplog))
    listed = objects(s3, bucket, "store")
    assert {f"quarantine/traces/{BROKEN_NAME}", f"quarantine/traces/{second}"} <= set(listed)
    assert f"traces/{BROKEN_NAME}" not in listed and f"traces/{second}" not in listed
    stats = TelemetryStore(root, s3=s3).stats("support", 4)
    assert (stats.quarantined_files, stats.quarantined_rows, stats.quarantined_uncounted) == (2, 1, 1)
    store.record_trace(trace(9))
    assert TelemetryStore(root, s3=s3).read("traces").height == 7


@pytest.mark.s3
def test_over_s3_read_only_keys_skip_a_broken_object_and_move_nothing(
    s3_endpoint: str, s3: S3Settings, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = f"s3://{bucket}/store"
    fill(TelemetryStore(root, s3=s3))
    good = get_object(s3, bucket, f"store/{next(n for n in objects(s3, bucket, 'store') if n.startswith('traces/'))}")
    put_object(s3, bucket, f"store/traces/{BROKEN_NAME}", broken("random bytes", good))
    before = objects(s3, bucket, "store")
    reader = s3_settings(s3_endpoint, **iam_keys(s3_endpoint, "reader", ["s3:GetObject", "s3:ListBucket"]))
    with keys_checked(), caplog.at_level(logging.WARNING, logger="gil_core.telemetry.store"):
        assert TelemetryStore(root, s3=reader).read("traces").height == 6
    [warning] = warnings_of(caplog)
    assert f"{root}/traces/{BROKEN_NAME}" in warning and "could not be moved" in warning and "Access Denied" in warning
    assert_no_key(warning, *(value.get_secret_value() for value in (reader.access_key_id, reader.secret_access_key)))
    assert objects(s3, bucket, "store") == before  # nothing moved, nothing copied


@pytest.mark.s3
def test_over_s3_a_read_the_keys_may_not_make_is_an_error_and_moves_nothing(
    s3_endpoint: str, s3: S3Settings, bucket: str
) -> None:
    root = f"s3://{bucket}/store"
    fill(TelemetryStore(root, s3=s3))
    before = objects(s3, bucket, "store")
    lister = s3_settings(s3_endpoint, **iam_keys(s3_endpoint, "lister", ["s3:ListBucket"]))
    with keys_checked(), pytest.raises(TelemetryError) as raised:
        TelemetryStore(root, s3=lister).read("traces")
    assert f"table 'traces' at {root}" in str(raised.value) and "Access Denied" in str(raised.value)
    assert objects(s3, bucket, "store") == before


@pytest.mark.s3
def test_over_s3_objects_a_concurrent_compaction_deletes_are_never_quarantined(s3: S3Settings, bucket: str) -> None:
    root = f"s3://{bucket}/store"
    writer, reader = TelemetryStore(root, s3=s3), TelemetryStore(root, s3=s3)
    written = read_while_compacting(writer, reader, races=1, most_rounds=60)
    assert TelemetryStore(root, s3=s3).read("traces").height == written
    assert not any(name.startswith("quarantine/") for name in objects(s3, bucket, "store"))


def test_the_broken_copies_are_broken(tmp_path: Path) -> None:
    """The test's own fixture: each kind of broken file fails to decode, or types a column otherwise."""
    root = tmp_path / "store"
    TelemetryStore(root).record_trace(trace(1))
    good = a_traces_file(root)
    for kind in KINDS:
        data = broken(kind, good)
        if kind == "mistyped column":
            assert pl.read_parquet_schema(data)["energy"] == pl.String
        else:
            with pytest.raises(pl.exceptions.ComputeError):
                pl.read_parquet(data)
