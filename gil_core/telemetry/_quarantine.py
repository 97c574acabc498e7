"""Files of a table that do not decode, for ``TelemetryStore`` (see its module doc, "Files that do not decode"):
how a broken file is told apart from a failed read, and what a file set aside still says.

A file is broken only on its own bytes' word: they do not decode as Parquet, or their footer types a column of the
table otherwise than the table's schema does (a column the file lacks is a file written before it was added, and a
column the table does not know one written by a newer version: both are fine). Reading and decoding are kept
apart: a read that fails (an I/O error, a missing object, keys that may not read) says nothing about the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import polars as pl

from gil_core.telemetry.schemas import DTYPES, validate_frame

__all__ = [
    "DECODE_ERRORS",
    "QUARANTINE",
    "FileCheck",
    "QuarantinedFile",
    "StoreCheck",
    "decode_problem",
    "footer_rows",
    "recovered",
    "type_problem",
]

QUARANTINE = "quarantine"
"""The side folder beside the tables that holds the files set aside, one folder per table."""

DECODE_ERRORS: tuple[type[BaseException], ...] = (pl.exceptions.PolarsError, pl.exceptions.PanicException)
"""What Polars raises when it cannot decode a file, and for much else: only a look at the bytes decides."""

_REASON_CHARS = 200


@dataclass(frozen=True, slots=True)
class QuarantinedFile:
    """A file set aside: its table, its name, where it is now, how many rows its footer says it holds (None when
    the footer does not read) and what is wrong with it as far as the footer tells."""

    table: str
    name: str
    where: str
    rows: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class FileCheck:
    """A live file found broken by a full check: why, and whether it was moved into quarantine (``note`` says
    why not, when it could not be)."""

    table: str
    name: str
    reason: str
    moved: bool
    note: str | None = None


@dataclass(frozen=True, slots=True)
class StoreCheck:
    """What ``TelemetryStore.check`` found: the live files it decoded whole, the broken ones, the files put back
    from quarantine (repaired), and what quarantine holds afterwards."""

    files: int
    broken: tuple[FileCheck, ...]
    restored: tuple[QuarantinedFile, ...]
    quarantined: tuple[QuarantinedFile, ...]


def type_problem(found: Mapping[str, pl.DataType], expected: Mapping[str, pl.DataType]) -> str | None:
    """Which columns a file types otherwise than the table does (None: none)."""
    wrong = [
        f"{name!r} is {found[name]}, not {dtype}" for name, dtype in expected.items() if found.get(name, dtype) != dtype
    ]
    return "column " + "; column ".join(wrong) if wrong else None


def decode_problem(data: bytes, expected: Mapping[str, pl.DataType], *, whole: bool) -> str | None:
    """Why ``data`` is no file of the table, None when it is one: the footer (with ``whole``, every page as well)
    does not decode, or a column's type is not the table's. No I/O happens here: any failure is the bytes'."""
    try:
        found = pl.read_parquet_schema(data)
        if whole:
            pl.read_parquet(data)
    except (Exception, pl.exceptions.PanicException) as exc:
        return f"not Parquet that decodes: {_first_line(exc)}"
    return type_problem(found, expected)


def footer_rows(data: bytes) -> int | None:
    """The rows the footer of ``data`` says the file holds; None when the footer does not decode."""
    try:
        return int(pl.scan_parquet(data).select(pl.len()).collect().item())
    except (Exception, pl.exceptions.PanicException):
        return None


def recovered(table: str, data: bytes, expected: Mapping[str, pl.DataType]) -> tuple[pl.DataFrame, dict[str, str]]:
    """The rows of a quarantined file as the table types them, with its Parquet key-value metadata: every page
    decodes, each mistyped column casts to the table's type and back to the same values, and the table's columns
    pass its schema. Raises ``ValueError`` saying why not."""
    try:
        frame = pl.read_parquet(data)
        metadata = pl.read_parquet_metadata(data)
    except (Exception, pl.exceptions.PanicException) as exc:
        raise ValueError(f"not Parquet that decodes: {_first_line(exc)}") from None
    casts = []
    for name, dtype in expected.items():
        if name not in frame.columns or frame.schema[name] == dtype:
            continue
        column = frame.get_column(name)
        try:
            cast = column.cast(dtype, strict=True)
            lossless = cast.cast(column.dtype, strict=True).equals(column, check_names=True)
        except (Exception, pl.exceptions.PanicException):
            lossless = False
        if not lossless:
            raise ValueError(f"column {name!r} is {column.dtype}: it does not cast to {dtype} without loss")
        casts.append(cast)
    frame = frame.with_columns(casts)
    known = [name for name in DTYPES[table].names() if name in frame.columns]
    table_rows = frame.select(known)
    missing = [pl.lit(None, dtype).alias(name) for name, dtype in DTYPES[table].items() if name not in frame.columns]
    try:
        validate_frame(table, table_rows.with_columns(missing).select(DTYPES[table].names()))
    except Exception as exc:
        raise ValueError(f"its rows do not fit the table ({_first_line(exc)})") from None
    return frame, metadata


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:_REASON_CHARS]
