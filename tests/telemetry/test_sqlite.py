"""SQLite interop: the export has exactly the reference's tables, columns and keys; a round trip reads back
identical tables; restricted stores, bad files and unrepresentable values are refused without partial writes.

Set ``GIL_COMPAT_FIXTURE`` to a directory to keep the compatibility fixture (store + export) these tests write.
Run this module (``uv run python -m tests.telemetry.test_sqlite``) to rewrite the committed description of the
export in ``tests/fixtures/compat/`` after a deliberate change of the layout.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gil_core.errors import ConfigurationError, TelemetryError
from gil_core.telemetry import CallRecord, TelemetryStore, TraceRecord
from gil_core.telemetry.schemas import REFERENCE_TABLES as TABLES
from gil_core.telemetry.sqlite import (
    TIMESTAMP_FORMAT,
    ExportRestrictedError,
    SqliteLayoutError,
    export_sqlite,
    import_sqlite,
)
from gil_core.testing import write_compat_fixture

# docs/reference.md, "Telemetry layout", copied by hand: the export must match it, not our schemas.
REFERENCE_LAYOUT = {
    "traces": (
        "trace_id", "created_at", "task", "state", "mode", "path", "output", "confidence", "energy",
        "feedback_verdict", "feedback_correction", "implicit_signal", "label", "explored_output", "recall", "failure",
    ),
    "calls": (
        "call_id", "trace_id", "created_at", "role", "model", "node_id", "layer", "prompt_tokens", "cached_tokens",
        "completion_tokens", "latency_ms", "gpu_prompt_ms", "gpu_predicted_ms", "content", "first_token",
        "top_logprobs", "distribution", "label_mass", "confidence", "outcome", "energy", "raw_response", "candidates",
    ),
    "run_configs": ("task", "created_at", "config"),
    "node_stats": ("scope", "node_id", "hits", "accepts", "exits", "last_used_at"),
    "node_choices": ("scope", "node_id", "chosen_id", "accepts"),
    "habit_reliability": ("scope", "item_id", "reinforced", "penalized", "missed", "explored", "disputed"),
    "store_meta": ("key", "value"),
    "promotion_rounds": ("task", "at_index"),
    "promotions": (
        "task", "at_index", "anchor", "option_id", "option", "sources", "support", "anchor_volume",
        "expected_saving", "added_cost",
    ),
    "reviews": ("task", "reviewed_at", "kind", "item_id", "decision", "note"),
}  # fmt: skip
REFERENCE_KEYS = {
    "traces": ("trace_id",),
    "calls": ("call_id",),
    "run_configs": ("task",),
    "node_stats": ("scope", "node_id"),
    "node_choices": ("scope", "node_id", "chosen_id"),
    "habit_reliability": ("scope", "item_id"),
    "store_meta": ("key",),
    "promotion_rounds": ("task", "at_index"),
    "promotions": ("task", "at_index", "option_id"),
    "reviews": (),
}
AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "compat" / "export.json"


@pytest.fixture(scope="module")
def compat(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The compatibility fixture: (store root, its export). Kept in ``GIL_COMPAT_FIXTURE`` when that is set."""
    chosen = os.environ.get("GIL_COMPAT_FIXTURE")
    directory = Path(chosen) if chosen else tmp_path_factory.mktemp("compat")
    directory.mkdir(parents=True, exist_ok=True)
    return write_compat_fixture(directory)


@pytest.fixture
def db_copy(compat: tuple[Path, Path], tmp_path: Path) -> Path:
    """A private copy of the export, for tests that alter it."""
    return Path(shutil.copyfile(compat[1], tmp_path / "copy.sqlite"))


@pytest.fixture
def empty_store(tmp_path: Path) -> TelemetryStore:
    return TelemetryStore(tmp_path / "imported")


def connect(db: Path) -> closing[sqlite3.Connection]:
    return closing(sqlite3.connect(db))


def query(db: Path, sql: str, *parameters: Any) -> list[tuple[Any, ...]]:
    with connect(db) as connection:
        return connection.execute(sql, parameters).fetchall()


def alter(db: Path, *statements: str) -> None:
    with connect(db) as connection:
        for statement in statements:
            connection.execute(statement)
        connection.commit()


def assert_store_is_empty(store: TelemetryStore) -> None:
    assert {table: store.read(table).height for table in TABLES} == dict.fromkeys(TABLES, 0)


def assert_same_tables(actual: TelemetryStore, expected: TelemetryStore) -> None:
    for table in TABLES:
        got, want = actual.read(table), expected.read(table)
        assert got.schema == want.schema, table
        assert got.equals(want), f"{table}:\n{got}\n!=\n{want}"


def describe(db: Path) -> list[dict[str, Any]]:
    """The file as plain data: each table's CREATE statement and its rows, each value with SQLite's type."""
    tables = []
    with connect(db) as connection:
        for name, sql in connection.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY rowid"):
            columns = [row[1] for row in connection.execute(f'PRAGMA table_info("{name}")')]
            typed = ", ".join(f'typeof("{column}"), "{column}"' for column in columns)
            rows = connection.execute(f'SELECT {typed} FROM "{name}" ORDER BY rowid').fetchall()
            pairs = [[list(row[index : index + 2]) for index in range(0, len(row), 2)] for row in rows]
            tables.append({"name": name, "sql": sql, "rows": pairs})
    return tables


def build(description: list[dict[str, Any]], db: Path) -> None:
    """Write a SQLite file from ``describe``'s data with plain SQL: a file our exporter did not write."""
    with connect(db) as connection:
        for table in description:
            connection.execute(table["sql"])
            for row in table["rows"]:
                marks = ", ".join("?" * len(row))
                connection.execute(f'INSERT INTO "{table["name"]}" VALUES ({marks})', [value for _, value in row])
        connection.commit()


# -- the layout -----------------------------------------------------------------------------------------------


def test_export_has_exactly_the_reference_tables_in_order(compat: tuple[Path, Path]) -> None:
    names = query(compat[1], "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid")
    assert [name for (name,) in names] == list(REFERENCE_LAYOUT)


def test_export_has_exactly_the_reference_columns_in_order(compat: tuple[Path, Path]) -> None:
    columns = {
        table: tuple(row[1] for row in query(compat[1], f'PRAGMA table_info("{table}")')) for table in REFERENCE_LAYOUT
    }
    assert columns == REFERENCE_LAYOUT


def test_export_primary_keys_are_the_layout_keys(compat: tuple[Path, Path]) -> None:
    keys = {}
    for table in REFERENCE_LAYOUT:
        info = query(compat[1], f'PRAGMA table_info("{table}")')  # (cid, name, type, notnull, default, pk)
        ranked = sorted((position, name) for _, name, _, _, _, position in info if position)
        keys[table] = tuple(name for _, name in ranked)
    assert keys == REFERENCE_KEYS


def test_every_table_of_the_fixture_has_rows(compat: tuple[Path, Path]) -> None:
    counts = {table: query(compat[1], f'SELECT count(*) FROM "{table}"')[0][0] for table in REFERENCE_LAYOUT}
    assert all(counts.values()), counts


def test_values_have_the_sqlite_storage_class_of_their_dtype(compat: tuple[Path, Path]) -> None:
    store = TelemetryStore(compat[0])
    expected = {pl.String: "text", pl.Datetime: "text", pl.Int64: "integer", pl.Float64: "real"}
    for table in TABLES:
        for column, dtype in store.read(table).schema.items():
            classes = {kind for (kind,) in query(compat[1], f'SELECT DISTINCT typeof("{column}") FROM "{table}"')}
            assert classes <= {expected[dtype.base_type()], "null"}, (table, column, classes)


def test_timestamps_are_utc_text_with_six_fraction_digits_and_z(compat: tuple[Path, Path]) -> None:
    written = [value for (value,) in query(compat[1], "SELECT created_at FROM calls ORDER BY rowid")]
    assert written == ["2026-11-30T09:34:04.123456Z", "2026-11-30T09:34:04.123457Z"]
    assert datetime.strptime(written[1], TIMESTAMP_FORMAT).replace(tzinfo=UTC) == datetime(
        2026, 11, 30, 9, 34, 4, 123457, tzinfo=UTC
    )


def test_json_columns_are_the_stored_text_verbatim(compat: tuple[Path, Path]) -> None:
    stored = TelemetryStore(compat[0]).read("calls").get_column("top_logprobs").to_list()
    written = [value for (value,) in query(compat[1], "SELECT top_logprobs FROM calls ORDER BY rowid")]
    assert written == stored
    assert '{"token":"Z","logprob":null}' in written[0]  # −∞ is null, never -Infinity
    (candidates,) = query(compat[1], "SELECT candidates FROM calls WHERE call_id = 'call-0001'")[0]
    assert '"label":"해당 없음"' in candidates and "\\u" not in candidates


def test_counters_are_exported_summed_one_row_per_key(compat: tuple[Path, Path]) -> None:
    assert query(compat[1], "SELECT * FROM node_stats ORDER BY rowid") == [
        ("support", "root", 2**53 + 2, 4, 1, "2026-12-01T09:34:05.123455Z"),
        ("support", "refund", 2, 2, 0, None),
    ]
    assert query(compat[1], "SELECT * FROM node_choices") == [("support", "root", "refund", 5)]


def test_superseded_rows_are_exported_once_as_last_written(compat: tuple[Path, Path]) -> None:
    traces = query(compat[1], "SELECT trace_id, feedback_verdict FROM traces ORDER BY rowid")
    assert traces == [("trace-0001", None), ("trace-0002", "wrong")]


def test_export_matches_the_committed_description(compat: tuple[Path, Path]) -> None:
    """A change of the file's layout or value formats shows up as a diff of tests/fixtures/compat/export.json."""
    committed = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert describe(compat[1]) == committed, "layout changed: if deliberate, run python -m tests.telemetry.test_sqlite"


def test_compat_fixture_is_the_same_on_every_run(compat: tuple[Path, Path], tmp_path: Path) -> None:
    _, again = write_compat_fixture(tmp_path)
    assert describe(again) == describe(compat[1])


def test_compat_fixture_replaces_its_own_store_but_nothing_else(tmp_path: Path) -> None:
    root, _ = write_compat_fixture(tmp_path)
    root_again, _ = write_compat_fixture(tmp_path)  # counters not doubled: the old store was replaced
    assert TelemetryStore(root_again).read("node_choices").get_column("accepts").to_list() == [5]
    (root / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"notes\.txt"):
        write_compat_fixture(tmp_path)
    assert (root / "notes.txt").read_text(encoding="utf-8") == "mine"


# -- round trips ----------------------------------------------------------------------------------------------


def test_round_trip_reads_back_identical_tables(compat: tuple[Path, Path], empty_store: TelemetryStore) -> None:
    report = import_sqlite(compat[1], empty_store)
    assert report.missing == ()
    assert report.rows == {table: TelemetryStore(compat[0]).read(table).height for table in TABLES}
    assert_same_tables(empty_store, TelemetryStore(compat[0]))


def test_round_trip_keeps_extreme_values(tmp_path: Path, empty_store: TelemetryStore) -> None:
    store = TelemetryStore(tmp_path / "extreme")
    extremes = [
        CallRecord(
            call_id="a\x00b\"'\\", trace_id="😀", created_at=datetime(1, 1, 1, tzinfo=UTC), role="probe", model="",
            prompt_tokens=2**63 - 1, latency_ms=float("inf"), gpu_prompt_ms=5e-324, energy=0.1 + 0.2,
            content="줄\n바꿈\r\n\t탭", top_logprobs=(("\x00", None),),
        ),
        CallRecord(
            call_id="late", trace_id=None, created_at=datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            role="verify", model="m", latency_ms=1.7976931348623157e308, energy=0.0,
        ),
    ]  # fmt: skip
    store.record_calls(extremes)
    report = export_sqlite(store, tmp_path / "extreme.sqlite")
    assert report.rows["calls"] == 2
    import_sqlite(report.path, empty_store)
    assert_same_tables(empty_store, store)


def test_import_keeps_the_file_row_order(db_copy: Path, empty_store: TelemetryStore) -> None:
    alter(db_copy, "CREATE TABLE r AS SELECT * FROM reviews", "DELETE FROM reviews")
    alter(db_copy, "INSERT INTO reviews SELECT * FROM r ORDER BY rowid DESC", "DROP TABLE r")
    import_sqlite(db_copy, empty_store)
    assert empty_store.read("reviews").get_column("decision").to_list() == ["accepted", "deferred"]


def test_import_into_a_non_empty_store_merges_like_appends(
    compat: tuple[Path, Path], empty_store: TelemetryStore
) -> None:
    import_sqlite(compat[1], empty_store)
    import_sqlite(compat[1], empty_store)
    assert empty_store.read("traces").equals(TelemetryStore(compat[0]).read("traces"))  # keyed: superseded
    assert empty_store.read("node_choices").get_column("accepts").to_list() == [10]  # counters: added
    assert empty_store.read("reviews").height == 4  # a log: accumulated


# -- refusals -------------------------------------------------------------------------------------------------


def test_restricted_store_refuses_export_and_writes_nothing(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    store.append("store_meta", [{"key": "restricted", "value": "1"}])
    with pytest.raises(ExportRestrictedError) as raised:
        export_sqlite(store, tmp_path / "out.sqlite")
    assert raised.value.store == store.root
    assert str(store.root) in str(raised.value)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["store"]


def test_failed_export_leaves_the_previous_file_untouched(tmp_path: Path) -> None:
    """NaN is refused while writing ``calls``, after ``traces`` went into the temporary file."""
    store = TelemetryStore(tmp_path / "store")
    store.record_trace(TraceRecord(trace_id="t", created_at=AT, task="support", state="?", mode="abstain"))
    store.record_calls([CallRecord("nan", None, AT, "judge", "m", gpu_prompt_ms=float("nan"))])
    out = tmp_path / "out.sqlite"
    out.write_bytes(b"the previous export")
    with pytest.raises(SqliteLayoutError) as raised:
        export_sqlite(store, out)
    assert (raised.value.table, raised.value.column) == ("calls", "gpu_prompt_ms")
    assert out.read_bytes() == b"the previous export"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.sqlite", "store"]  # no temporary left


def test_import_refuses_an_unknown_table(db_copy: Path, empty_store: TelemetryStore) -> None:
    alter(db_copy, "CREATE TABLE embeddings (id TEXT)")
    with pytest.raises(SqliteLayoutError, match="'embeddings'") as raised:
        import_sqlite(db_copy, empty_store)
    assert raised.value.table == "embeddings"
    assert_store_is_empty(empty_store)


def test_import_refuses_an_unknown_column_and_writes_nothing(db_copy: Path, empty_store: TelemetryStore) -> None:
    alter(db_copy, "ALTER TABLE reviews ADD COLUMN reviewer TEXT")
    with pytest.raises(SqliteLayoutError, match="'reviews', column 'reviewer'") as raised:
        import_sqlite(db_copy, empty_store)
    assert (raised.value.table, raised.value.column) == ("reviews", "reviewer")
    assert_store_is_empty(empty_store)  # the tables before ``reviews`` were not written either


@pytest.mark.parametrize(
    ("table", "column", "value"),
    [
        ("traces", "created_at", "2026-11-30 09:34:04.123456Z"),
        ("traces", "created_at", "2026-11-30T09:34:04.123Z"),
        ("traces", "created_at", "2026-11-30T09:34:04.123456+00:00"),
        ("traces", "created_at", "2026-13-30T09:34:04.123456Z"),
        ("traces", "created_at", 1764495244),
        ("calls", "prompt_tokens", "many"),
        ("calls", "prompt_tokens", 1.5),
        ("calls", "latency_ms", b"\x01"),
        ("traces", "task", b"\xff"),
    ],
)
def test_import_refuses_a_value_of_the_wrong_type_or_format(
    db_copy: Path, empty_store: TelemetryStore, table: str, column: str, value: object
) -> None:
    alter(
        db_copy, f'UPDATE "{table}" SET "{column}" = {_literal(value)} WHERE rowid = (SELECT max(rowid) FROM "{table}")'
    )
    with pytest.raises(SqliteLayoutError, match="row 2 holds") as raised:
        import_sqlite(db_copy, empty_store)
    assert (raised.value.table, raised.value.column) == (table, column)
    assert_store_is_empty(empty_store)


def _literal(value: object) -> str:
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def test_import_refuses_a_file_that_is_not_sqlite(tmp_path: Path, empty_store: TelemetryStore) -> None:
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database, just bytes" * 100)
    with pytest.raises(TelemetryError, match=r"garbage\.sqlite"):
        import_sqlite(garbage, empty_store)
    with pytest.raises(TelemetryError, match="no such SQLite file"):
        import_sqlite(tmp_path / "absent.sqlite", empty_store)


def test_import_reads_an_older_file_without_later_tables_or_nullable_columns(
    db_copy: Path, empty_store: TelemetryStore
) -> None:
    alter(db_copy, "DROP TABLE reviews", "ALTER TABLE calls DROP COLUMN raw_response")
    report = import_sqlite(db_copy, empty_store)
    assert report.missing == ("reviews",)
    assert empty_store.read("reviews").is_empty()
    assert empty_store.read("calls").get_column("raw_response").to_list() == [None, None]


def test_import_reads_a_file_written_with_plain_sql(
    compat: tuple[Path, Path], tmp_path: Path, empty_store: TelemetryStore
) -> None:
    """The committed description, rebuilt by hand, imports to the fixture store: no reliance on our writer."""
    build(json.loads(GOLDEN.read_text(encoding="utf-8")), tmp_path / "plain.sqlite")
    import_sqlite(tmp_path / "plain.sqlite", empty_store)
    assert_same_tables(empty_store, TelemetryStore(compat[0]))


def write_golden() -> None:
    """Rewrite tests/fixtures/compat/export.json from today's export of the compatibility fixture."""
    with tempfile.TemporaryDirectory() as directory:
        _, db = write_compat_fixture(Path(directory))
        tables = describe(db)
    lines = []
    for table in tables:  # one row per line, so a change of format is a readable diff
        rows = ",\n".join("   " + json.dumps(row, ensure_ascii=False) for row in table["rows"])
        head = json.dumps({"name": table["name"], "sql": table["sql"]}, ensure_ascii=False)[:-1]
        lines.append(f' {head}, "rows": [\n{rows}\n ]}}')
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text("[\n" + ",\n".join(lines) + "\n]\n", encoding="utf-8")


if __name__ == "__main__":
    write_golden()
