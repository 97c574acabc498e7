"""SQLite interop: ``export_sqlite`` writes a store in the reference's SQLite layout, ``import_sqlite`` reads one back.

The layout is docs/reference.md, "Telemetry layout": the ten tables, their columns in order, a primary key per table
(``schemas.KEYS``; the counter tables are keyed by their counter key; ``reviews`` has none). Values:

* text, ids and JSON columns are ``TEXT``, copied verbatim (JSON stays as stored: compact, snake_case keys,
  non-ASCII unescaped, a −∞ logprob as ``null``);
* counts are ``INTEGER``, measures ``REAL`` (never NaN: SQLite would store NULL), booleans ``INTEGER`` 0/1;
* timestamps are ``TEXT`` in exactly one format, ``TIMESTAMP_FORMAT``: UTC, always six fraction digits and a
  ``Z`` (``2026-11-30T09:34:04.123456Z``), so they sort as text and parse back to the same microsecond;
* a null is ``NULL``.

Gil's own tables and columns (``schemas.GIL_COLUMNS``, ``schemas.GIL_TABLES``: ``vectors``, the requests'
embeddings kept for the learned judge, and ``unlearned_verdicts``) are not part of the layout: they stay in the
store; an import leaves Gil's columns null, and a store imported from SQLite relearns from the requests confirmed
after the import.

Counter tables are exported as read (one row per key, increments summed), rows in the store's read order; import
keeps the file's row order. A round trip into an empty store reads back identical frames.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from gil_core.atomic import replacing
from gil_core.errors import TelemetryError
from gil_core.telemetry.schemas import (
    COUNTERS,
    DTYPES,
    GIL_COLUMNS,
    KEYS,
    NULLABLE,
    REFERENCE_TABLES,
    validate_frame,
)
from gil_core.telemetry.store import TelemetryStore

__all__ = [
    "TIMESTAMP_FORMAT",
    "ExportReport",
    "ExportRestrictedError",
    "ImportReport",
    "SqliteLayoutError",
    "export_sqlite",
    "import_sqlite",
    "primary_key",
]

TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
"""How a timestamp is written (``strftime`` notation): ``2026-11-30T09:34:04.123456Z``, UTC, microseconds always."""

_POLARS_TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S%.6fZ"  # TIMESTAMP_FORMAT in chrono's notation
# chrono's parser takes fewer fraction digits too; the layout allows exactly six, so the shape is checked first
_TIMESTAMP_SHAPE = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$"
_EXAMPLE = "2026-11-30T09:34:04.123456Z"
_RESTRICTED_KEY = "restricted"
_RESTRICTED_VALUE = "1"


class SqliteLayoutError(TelemetryError):
    """A SQLite file (or a store being exported to one) does not fit the reference's layout.

    An unknown table or column, a value of the wrong type or format, or a value SQLite cannot hold (NaN).
    ``path`` is the SQLite file; ``table`` and ``column`` say where, when known.
    """

    def __init__(self, reason: str, *, path: Path, table: str | None = None, column: str | None = None) -> None:
        self.reason = reason
        self.path = path
        self.table = table
        self.column = column
        where = str(path)
        if table is not None:
            where += f": table {table!r}"
        if column is not None:
            where += f", column {column!r}"
        super().__init__(f"{where}: {reason}")


class ExportRestrictedError(TelemetryError):
    """The store's ``store_meta`` says ``restricted`` = ``1``: its telemetry may not leave it. ``store`` is its
    location (a folder or an ``s3://`` URI)."""

    def __init__(self, store: str | Path) -> None:
        self.store = store
        super().__init__(f"store {store}: store_meta marks it restricted (restricted=1), so it is never exported")


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What ``export_sqlite`` wrote: the file and the rows per table, in the reference's table order."""

    path: Path
    rows: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What ``import_sqlite`` read: rows per table found in the file, and the layout's tables the file lacks."""

    path: Path
    rows: Mapping[str, int]
    missing: tuple[str, ...]


def primary_key(table: str) -> tuple[str, ...]:
    """The table's primary key in the SQLite layout: its store key, its counter key, or none (``reviews``)."""
    if table in KEYS:
        return KEYS[table]
    if table in COUNTERS:
        return COUNTERS[table][0]
    return ()


# -- export -------------------------------------------------------------------------------------------------


def export_sqlite(store: TelemetryStore, out: Path) -> ExportReport:
    """Write every table of ``store`` to a new SQLite file at ``out`` (replacing one already there).

    The file is built under a temporary name beside ``out``, synced, then renamed over it: a crash or an error
    leaves ``out`` as it was, never half written. Raises ``ExportRestrictedError`` for a restricted store and
    ``SqliteLayoutError`` for a value SQLite cannot hold.
    """
    if _is_restricted(store):
        raise ExportRestrictedError(store.location)
    out = Path(out)
    with replacing(out) as temporary, _connect(temporary, out) as connection:
        connection.execute("PRAGMA journal_mode=OFF")  # a fresh private file: the rename is the commit
        connection.execute("PRAGMA synchronous=OFF")  # synced once, as a whole, before the rename
        connection.execute("BEGIN")
        rows = {table: _write_table(connection, table, store.read(table), out) for table in REFERENCE_TABLES}
        connection.execute("COMMIT")
    return ExportReport(path=out, rows=rows)


def _is_restricted(store: TelemetryStore) -> bool:
    meta = store.read("store_meta")
    flags = meta.filter(pl.col("key") == _RESTRICTED_KEY).get_column("value")
    return bool((flags == _RESTRICTED_VALUE).any())


def _write_table(connection: sqlite3.Connection, table: str, frame: pl.DataFrame, out: Path) -> int:
    connection.execute(_create_statement(table))
    dtypes = _layout(table)
    for name, dtype in dtypes.items():
        if dtype.is_float() and frame.get_column(name).is_nan().any():
            raise SqliteLayoutError("holds NaN, which SQLite stores as NULL", path=out, table=table, column=name)
    columns = [
        pl.col(name).dt.strftime(_POLARS_TIMESTAMP_FORMAT) if isinstance(dtype, pl.Datetime) else pl.col(name)
        for name, dtype in dtypes.items()
    ]
    placeholders = ", ".join("?" * len(dtypes))
    insert = f"INSERT INTO {_quote(table)} VALUES ({placeholders})"
    connection.executemany(insert, frame.select(columns).iter_rows())
    return frame.height


def _create_statement(table: str) -> str:
    definitions = [
        f"{_quote(name)} {_sqlite_type(table, name, dtype)}{'' if name in NULLABLE[table] else ' NOT NULL'}"
        for name, dtype in _layout(table).items()
    ]
    key = primary_key(table)
    if key:
        definitions.append(f"PRIMARY KEY ({', '.join(_quote(name) for name in key)})")
    return f"CREATE TABLE {_quote(table)} ({', '.join(definitions)})"


def _layout(table: str) -> pl.Schema:
    """The table's columns in the SQLite layout: the reference's (Gil's own columns stay in the store)."""
    return pl.Schema({name: dtype for name, dtype in DTYPES[table].items() if name not in GIL_COLUMNS.get(table, ())})


def _sqlite_type(table: str, column: str, dtype: pl.DataType) -> str:
    if dtype == pl.String or isinstance(dtype, pl.Datetime):
        return "TEXT"
    if dtype.is_integer() or dtype == pl.Boolean:
        return "INTEGER"
    if dtype.is_float():
        return "REAL"
    raise TelemetryError(f"table {table!r}, column {column!r}: no SQLite type for {dtype}")


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


@contextmanager
def _connect(path: Path, named: Path, *, read_only: bool = False) -> Iterator[sqlite3.Connection]:
    """A connection to ``path``; SQLite's own errors become ``TelemetryError`` naming the file (``named``)."""
    try:
        if read_only:
            connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
        else:
            connection = sqlite3.connect(path, isolation_level=None)
        with closing(connection):
            yield connection
    except sqlite3.Error as exc:
        raise TelemetryError(f"{named}: SQLite failed: {exc}") from exc


# -- import -------------------------------------------------------------------------------------------------


def import_sqlite(db: Path, store: TelemetryStore) -> ImportReport:
    """Read a SQLite file in the reference's layout into ``store``; nothing is written unless all of it fits.

    Unknown tables or columns, and values of the wrong type or format, raise ``SqliteLayoutError`` naming the
    table and column; a table the file lacks reads as empty, a nullable column it lacks as null. Every table is
    converted and validated before the first write, then appended through ``store.append`` (validated again).
    Into a non-empty store this merges as any append does: keyed rows supersede, counters add, reviews accumulate.
    """
    db = Path(db)
    if not db.is_file():
        raise TelemetryError(f"{db}: no such SQLite file")
    with _connect(db, db, read_only=True) as connection:
        present = _tables_in(connection, db)
        frames = {table: _read_table(connection, table, db) for table in REFERENCE_TABLES if table in present}
    for table, frame in frames.items():
        validate_frame(table, frame)
    for table, frame in frames.items():
        store.append(table, frame)
    return ImportReport(
        path=db,
        rows={table: frame.height for table, frame in frames.items()},
        missing=tuple(table for table in REFERENCE_TABLES if table not in present),
    )


def _tables_in(connection: sqlite3.Connection, db: Path) -> set[str]:
    query = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite!_%' ESCAPE '!'"
    names = [name for (name,) in connection.execute(query)]
    unknown = [name for name in names if name not in REFERENCE_TABLES]
    if unknown:
        known = ", ".join(REFERENCE_TABLES)
        raise SqliteLayoutError(f"unknown table (the layout's tables are {known})", path=db, table=unknown[0])
    return set(names)


def _read_table(connection: sqlite3.Connection, table: str, db: Path) -> pl.DataFrame:
    """The table's rows as a frame with the store's dtypes, in the file's row order."""
    names = [row[1] for row in connection.execute(f"PRAGMA table_info({_quote(table)})")]
    for name in names:
        if name not in _layout(table):
            known = ", ".join(_layout(table))
            raise SqliteLayoutError(f"unknown column (the layout's are {known})", path=db, table=table, column=name)
    selected = ", ".join(_quote(name) for name in names)
    try:
        rows = connection.execute(f"SELECT {selected} FROM {_quote(table)} ORDER BY rowid").fetchall()
    except sqlite3.OperationalError:  # a WITHOUT ROWID table has no insertion order: take its key order
        rows = connection.execute(f"SELECT {selected} FROM {_quote(table)}").fetchall()
    values = list(zip(*rows, strict=True)) if rows else [() for _ in names]
    series: dict[str, pl.Series] = {}
    for name, column in zip(names, values, strict=True):
        try:
            series[name] = _to_series(name, list(column), DTYPES[table][name])
        except _BadValue as bad:
            reason = f"row {bad.index + 1} holds {bad.value!r}, not {bad.expected}"
            raise SqliteLayoutError(reason, path=db, table=table, column=name) from None
    for name, dtype in DTYPES[table].items():
        if name not in series and name in NULLABLE[table]:  # a file from before the column was added
            series[name] = pl.Series(name, [None] * len(rows), dtype=dtype)
    # a missing required column stays missing: validation names it
    return pl.DataFrame([series[name] for name in DTYPES[table] if name in series])


class _BadValue(Exception):
    """A value read from SQLite that its column's dtype cannot take (internal: becomes ``SqliteLayoutError``)."""

    def __init__(self, index: int, value: object, expected: str) -> None:
        self.index = index
        self.value = value
        self.expected = expected
        super().__init__(f"row {index}: {value!r} is not {expected}")


def _to_series(name: str, values: list[object], dtype: pl.DataType) -> pl.Series:
    """Convert one column's SQLite values (text, int, float, bytes, None) to ``dtype``, or raise ``_BadValue``."""
    if isinstance(dtype, pl.Datetime):
        text = _strict_series(name, values, pl.String(), "text", lambda value: isinstance(value, str))
        shaped = text.str.contains(_TIMESTAMP_SHAPE)
        parsed = text.str.to_datetime(_POLARS_TIMESTAMP_FORMAT, time_unit="us", time_zone="UTC", strict=False)
        _reject(values, ~shaped | (parsed.is_null() & text.is_not_null()), f"a timestamp like {_EXAMPLE}")
        return parsed.cast(dtype)
    if dtype == pl.Boolean:
        integers = _strict_series(name, values, pl.Int64(), "0 or 1", _is_integer)
        _reject(values, ~integers.is_in([0, 1]), "0 or 1")
        return integers.cast(pl.Boolean)
    if dtype == pl.String:
        return _strict_series(name, values, dtype, "text", lambda value: isinstance(value, str))
    if dtype.is_integer():
        return _strict_series(name, values, dtype, "an integer", _is_integer)
    if dtype.is_float():
        return _strict_series(name, values, dtype, "a number", lambda value: _is_integer(value) or type(value) is float)
    raise TelemetryError(f"column {name!r}: no conversion from SQLite to {dtype}")


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _strict_series(
    name: str, values: list[object], dtype: pl.DataType, expected: str, accepts: Callable[[object], bool]
) -> pl.Series:
    """Build the series strictly; on failure find the first value ``accepts`` refuses (the slow path only)."""
    try:
        return pl.Series(name, values, dtype=dtype, strict=True)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        for index, value in enumerate(values):
            if value is not None and not accepts(value):
                raise _BadValue(index, value, expected) from None
        raise


def _reject(values: list[object], bad: pl.Series, expected: str) -> None:
    """Raise ``_BadValue`` for the first row where ``bad`` is true (null counts as fine: nulls are checked later)."""
    indices = bad.fill_null(False).arg_true()
    if indices.len():
        index = int(indices[0])
        raise _BadValue(index, values[index], expected)
