"""How a table's rows lie in its Parquet files (see the store's module doc): file names that sort in write order,
the order-key column ``_seq``, what a compacted file's metadata says, and the lazy plan that reads a listing back
as the table (the last row per key, counters summed).

**Reading without sorting.** File names start with their ``_seq`` and an appended file's rows all carry it; a
compacted file records the range of ``_seq`` it holds (``gil.seq_range``). When, in name order, no file starts
below the highest ``_seq`` before it (always, unless a compaction raced a slow append), the files read in name
order are already in write order: the reader keeps the last row per key without sorting (BENCHMARKS.md, "Stats
over a large store"). Otherwise it sorts by ``_seq`` first; the result is the same.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from gil_core.errors import TelemetryError
from gil_core.storage import Folder
from gil_core.telemetry.schemas import COUNTERS, DTYPES, KEYS

__all__ = [
    "COMPACTED_SUFFIX",
    "REPLACES",
    "SEQ",
    "SEQ_RANGE",
    "SUFFIX",
    "Compacted",
    "Listing",
    "file_name",
    "in_write_order",
    "int_pair",
    "plan",
    "scan_files",
    "stored_schema",
]

SEQ = "_seq"
SUFFIX = ".parquet"
COMPACTED_SUFFIX = ".compacted.parquet"
REPLACES = "gil.replaces"
SEQ_RANGE = "gil.seq_range"


@dataclass(frozen=True, slots=True)
class Listing:
    """A table folder's final-named files, sorted: live ones and ones a compaction already replaced."""

    live: tuple[str, ...]
    replaced: tuple[str, ...]
    compacted: frozenset[str]


@dataclass(frozen=True, slots=True)
class Compacted:
    """What a compacted file's metadata says: the files it replaces and its ``_seq`` range (None: unknown)."""

    replaces: frozenset[str]
    seq_range: tuple[int, int] | None


def file_name(seq: int, suffix: str) -> str:
    """A new file's name: its stamp first so names sort in write order; pid and randomness so concurrent writers
    never collide."""
    return f"{seq:020d}-{os.getpid()}-{secrets.token_hex(6)}{suffix}"


def stored_schema(table: str) -> dict[str, pl.DataType]:
    """The columns a stored file of ``table`` holds, typed: the table's, and the store's own order key. A file may
    lack some (written before they were added) or hold others (written by a newer version); a column typed
    otherwise makes the file one no version of the table wrote (set aside by the store's reads)."""
    return {**DTYPES[table], SEQ: pl.Int64()}


def int_pair(values: Sequence[Any] | None) -> tuple[int, int] | None:
    """A ``_seq`` range as read from JSON metadata (None stays None)."""
    return (int(values[0]), int(values[1])) if values is not None else None


def in_write_order(folder: Folder, files: Sequence[str], compacted: Mapping[str, Compacted]) -> bool:
    """Whether ``files`` (as listed) read in this order give their rows in ``_seq`` order (ties in read order);
    ``compacted`` holds what the store read of the compacted files' metadata (by source)."""
    highest: int | None = None
    for name in files:
        if name.endswith(COMPACTED_SUFFIX):
            known = compacted.get(str(folder.source(name)))  # read when the folder was listed
            span = known.seq_range if known is not None else None  # (None: forgotten since: sort instead)
        else:
            head = name.split("-", 1)[0]
            span = (int(head), int(head)) if head.isdigit() else None
        if span is None or (highest is not None and span[0] < highest):
            return False
        highest = span[1] if highest is None else max(highest, span[1])
    return True


def scan_files(table: str, folder: Folder, names: Sequence[str], *, typed: bool = True) -> pl.LazyFrame:
    """A scan of these files as the table's schema types them (``typed=False``: as their footer types them)."""
    sources: list[Any] = [folder.source(name) for name in names]
    if not typed:
        return pl.scan_parquet(sources, glob=False, storage_options=folder.storage_options)
    return pl.scan_parquet(
        sources,
        schema=stored_schema(table),
        glob=False,
        missing_columns="insert",  # files written before a column was added
        extra_columns="ignore",  # files written by a newer version
        storage_options=folder.storage_options,
    )


def plan(
    table: str,
    folder: Folder,
    files: Sequence[str],
    compacted: Mapping[str, Compacted],
    *,
    keep_seq: bool,
    only: Mapping[str, Collection[Any]] | None = None,
) -> pl.LazyFrame:
    """The table as these live files hold it, lazily: in write order, the last row per key of a keyed table,
    a counters table summed per key; ``keep_seq`` keeps the order key (a compaction writes it).

    ``only`` ({key column: values}, of a keyed table) keeps the rows whose key columns hold one of their values,
    each file filtered as it is read: the filter keeps or drops all the rows of a key together, so the last row
    per key is the same, and the rows it drops are never held (Polars does not move a filter below the sort and
    row index that take the last row per key)."""
    where = None if only is None else _key_filter(table, only)
    dtypes = DTYPES[table]
    if not files:
        return pl.LazyFrame(schema=dtypes if not keep_seq else {**dtypes, SEQ: pl.Int64})

    def scan(names: Sequence[str]) -> pl.LazyFrame:
        frame = scan_files(table, folder, names)
        return frame if where is None else frame.filter(where)

    key = KEYS.get(table)
    if not in_write_order(folder, files, compacted):
        frame = scan(files).sort(SEQ, maintain_order=True)
        if key:
            frame = _last_per_key(frame, key)
    elif key and len(files) == 1:
        frame = scan(files)  # one file holds each key once (append and compact both see to it)
    elif key and files[0].endswith(COMPACTED_SUFFIX):
        # A compacted table and the files appended since: only those can supersede a row of the big file.
        head, tail = scan(files[:1]), scan(files[1:])
        survivors = head.join(tail.select(key), on=list(key), how="anti", maintain_order="left")
        frame = pl.concat([survivors, _last_per_key(tail, key)])
    else:
        frame = scan(files)
        if key:
            frame = _last_per_key(frame, key)
    if not key and table in COUNTERS:
        frame = _sum_counters(table, frame)
    return frame if keep_seq else frame.drop(SEQ)


def _key_filter(table: str, only: Mapping[str, Collection[Any]]) -> pl.Expr:
    keys = KEYS.get(table, ())
    outside = sorted(set(only) - set(keys))
    if outside:
        raise TelemetryError(f"table {table!r}: only= takes its key columns {keys}, not {outside}")
    return pl.all_horizontal(pl.col(column).is_in(list(values)) for column, values in only.items())


def _last_per_key(frame: pl.LazyFrame, key: Sequence[str]) -> pl.LazyFrame:
    """The last row per key, in read order. Not sort + unique: a grouped max of the row index, ~0.7 s less CPU
    per million rows (BENCHMARKS.md, "Stats over a large store")."""
    row = "_row"
    return frame.with_row_index(row).filter(pl.col(row) == pl.col(row).max().over(list(key))).drop(row)


def _sum_counters(table: str, frame: pl.LazyFrame) -> pl.LazyFrame:
    """One row per key: increments summed, ``max`` columns maximised; keys in order of first write."""
    key, summed, maximised = COUNTERS[table]
    aggregations = [pl.col(name).sum() for name in summed] + [pl.col(name).max() for name in maximised]
    return (
        frame.group_by(list(key), maintain_order=True)
        .agg(*aggregations, pl.col(SEQ).min())
        .select(*DTYPES[table].names(), SEQ)
    )
