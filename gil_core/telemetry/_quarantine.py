"""Files of a table that do not decode, for ``TelemetryStore``: how a broken file is told apart from a failed read,
what a file set aside still says, and ``FileChecks``, which checks a store object's files and sets broken ones
aside.

Before a file is first read by a store object its footer is checked (once: files never change). A file whose bytes
do not decode as Parquet (truncated, empty, not Parquet), or whose footer types a column of the table otherwise than
the table's schema (``_files.stored_schema``; a column a file lacks, or one the table does not know, is a file of an
older or newer version, and fine), is *broken*: reads skip it with a warning naming it, and it is moved into
``<root>/quarantine/<table>/`` under its own name. A read whose pages fail to decode although every footer did finds
the file by decoding each whole and sets it aside alike. Only the bytes decide: when Polars fails, the file is read
whole and decoded in memory, so an I/O error, a missing object (a concurrent compaction: list again) or keys that
may not read are raised and never move a file; a broken file that cannot be moved (read-only keys or file system)
stays where it is, skipped. ``quarantined()`` lists what was set aside (stats report it); ``check()``
(``gil doctor``) decodes every live file whole, and with ``repair`` moves the broken ones and puts back quarantined
files whose columns cast to the table's types without loss. Writes never read old files, so they go on.

Reading and decoding are kept apart: a read that fails (an I/O error, a missing object, keys that may not read)
says nothing about the file.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeVar

import polars as pl

from gil_core.storage import Folder
from gil_core.telemetry._files import scan_files, stored_schema
from gil_core.telemetry.schemas import DTYPES, TABLES, validate_frame

__all__ = [
    "DECODE_ERRORS",
    "QUARANTINE",
    "FileCheck",
    "FileChecks",
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
_FOOTER_CHECKS = 8  # footers read at once from an object store
_T = TypeVar("_T")
_log = logging.getLogger("gil_core.telemetry.store")


class Guarded(Protocol):
    """The store's error contract around one operation on a table (``TelemetryStore._guarded``)."""

    def __call__(self, table: str, what: str, run: Callable[[], _T], /) -> _T: ...


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


class FileChecks:
    """What one store object knows of its files' soundness, and what it does with a broken one: each file's footer
    is checked once (files never change), a broken file is moved into the quarantine folder beside its table (or
    skipped, when it cannot be moved), and ``check`` decodes every live file whole. ``folder`` gives a table's
    folder, ``side_folder`` one beside the tables, ``guarded`` runs a store operation with the store's error
    contract, and ``describe`` words an object store's exception without its keys (None: a local folder)."""

    def __init__(
        self,
        *,
        folder: Callable[[str], Folder],
        side_folder: Callable[..., Folder],
        guarded: Guarded,
        describe: Callable[[Exception], str] | None,
    ) -> None:
        self._folder, self._side_folder, self._guarded, self._describe = folder, side_folder, guarded, describe
        self.sound: set[str] = set()  # files whose footer was checked (or that this object wrote): immutable
        self.unusable: dict[str, str] = {}  # broken files that could not be moved (read-only keys): skipped

    def usable(self, table: str, folder: Folder, names: Sequence[str]) -> list[str]:
        """``names`` without the broken files: each file's footer is checked once per store object (files never
        change), and one that does not decode or types a column otherwise than the table is set aside. A read
        that fails is raised as it is (``FileNotFoundError``: the file went, list again)."""
        known = self.sound | self.unusable.keys()
        unchecked = [name for name in names if str(folder.source(name)) not in known]
        check = functools.partial(self._footer_problem, table, folder)
        if len(unchecked) > 1 and self._describe is not None:  # a request each: in parallel (Polars lets go of the GIL)
            with ThreadPoolExecutor(max_workers=min(_FOOTER_CHECKS, len(unchecked))) as pool:
                problems = dict(zip(unchecked, pool.map(check, unchecked), strict=True))
        else:
            problems = {name: check(name) for name in unchecked}
        usable = []
        for name in names:
            source = str(folder.source(name))
            if name in problems:
                problem = problems[name]
                if problem is not None:
                    self.set_aside(table, folder, name, problem)
                    continue
                self.sound.add(source)
            if source not in self.unusable:
                usable.append(name)
        return usable

    def _footer_problem(self, table: str, folder: Folder, name: str) -> str | None:
        """What the file's footer says is wrong with it as a file of ``table`` (None: nothing)."""
        expected = stored_schema(table)
        try:
            return type_problem(scan_files(table, folder, [name], typed=False).collect_schema(), expected)
        except DECODE_ERRORS:
            # Polars could not read the footer; the file's own bytes say whether it is broken or the read failed
            # (a failed read raises here, and nothing is moved).
            return decode_problem(folder.read_bytes(name), expected, whole=False)

    def set_aside_undecodable(self, table: str, folder: Folder, names: Sequence[str]) -> bool:
        """After a read of ``names`` failed to decode: set aside the broken ones, found by their footers (cheap,
        and enough for all but a page that does not decode), else by decoding each file on its own and whole.
        Whether any was (if none, the failure was not a file's: raise it)."""
        usable = self.usable(table, folder, names)
        if len(usable) < len(names):
            return True
        found = False
        for name in usable:
            try:
                scan_files(table, folder, [name]).collect()
                continue
            except DECODE_ERRORS:
                problem = decode_problem(folder.read_bytes(name), stored_schema(table), whole=True)
            if problem is not None:
                self.set_aside(table, folder, name, problem)
                found = True
        return found

    def set_aside(self, table: str, folder: Folder, name: str, problem: str) -> None:
        """Move a broken file into the quarantine folder beside the table, and warn; a file that cannot be moved
        (read-only keys or file system) stays where it is, skipped by this store object's reads."""
        source = str(folder.source(name))
        self.sound.discard(source)
        target = self._side_folder(QUARANTINE, table)
        try:
            folder.move_into(name, target)
        except FileNotFoundError:
            return  # moved by another reader (or replaced by a compaction) meanwhile
        except Exception as exc:
            why = self._describe(exc) if self._describe is not None else f"{type(exc).__name__}: {exc}"
            self.unusable[source] = problem
            _log.warning(
                "table %r: %s is broken (%s): reads skip it; it could not be moved into %s (%s)",
                table, source, problem, target.where, why,
            )  # fmt: skip
            return
        _log.warning("table %r: %s is broken (%s): reads skip it; moved into %s", table, source, problem, target.where)

    def quarantined(self) -> tuple[QuarantinedFile, ...]:
        """The files set aside in the quarantine folder, with the rows their footers say they hold (None when the
        footer does not read) and what the footer says is wrong."""
        folder = self._side_folder(QUARANTINE)

        def run() -> tuple[QuarantinedFile, ...]:
            found = []
            for path in folder.walk():
                table, _, name = path.partition("/")
                if table in TABLES and name and "/" not in name:
                    found.append(self._quarantined_file(table, name))
            return tuple(found)

        return self._guarded(QUARANTINE, "list", run)

    def _quarantined_file(self, table: str, name: str) -> QuarantinedFile:
        folder = self._side_folder(QUARANTINE, table)
        data = folder.read_bytes(name)
        problem = decode_problem(data, stored_schema(table), whole=False)
        reason = problem or "its footer and types read: a full check (gil doctor) says more"
        return QuarantinedFile(table, name, str(folder.source(name)), footer_rows(data), reason)

    def check(self, *, repair: bool) -> StoreCheck:
        """``TelemetryStore.check``: every live file of every table decoded whole, the broken ones moved (with
        ``repair``), quarantined files put back where they can be."""
        checked = 0
        broken: list[FileCheck] = []
        for table in TABLES:
            folder = self._folder(table)
            for name in self._guarded(table, "list", folder.names):
                checked += 1
                problem = self._guarded(
                    table, "check", functools.partial(self._whole_file_problem, table, folder, name)
                )
                if problem is None:
                    continue
                moved, note = False, None
                if repair:
                    self.set_aside(table, folder, name, problem)
                    moved = str(folder.source(name)) not in self.unusable
                    note = None if moved else "it could not be moved (see the log)"
                broken.append(FileCheck(table, name, problem, moved, note))
        restored = self._restore_quarantined() if repair else ()
        return StoreCheck(checked, tuple(broken), restored, self.quarantined())

    def _whole_file_problem(self, table: str, folder: Folder, name: str) -> str | None:
        expected = stored_schema(table)
        try:
            scan_files(table, folder, [name]).collect()  # a column typed otherwise fails here too
            return None
        except FileNotFoundError:
            return None  # gone meanwhile (a compaction): nothing to check
        except DECODE_ERRORS:
            return decode_problem(folder.read_bytes(name), expected, whole=True)

    def _restore_quarantined(self) -> tuple[QuarantinedFile, ...]:
        restored = []
        for item in self.quarantined():
            if self._guarded(item.table, "restore", functools.partial(self._restore, item)):
                restored.append(item)
        return tuple(restored)

    def _restore(self, item: QuarantinedFile) -> bool:
        """Put a quarantined file back under its own name, its mistyped columns cast (see ``check``); the table's
        order key and metadata travel with it, so its rows supersede and are superseded as they were written."""
        quarantine = self._side_folder(QUARANTINE, item.table)
        try:
            frame, metadata = recovered(item.table, quarantine.read_bytes(item.name), stored_schema(item.table))
        except ValueError:
            return False
        folder = self._folder(item.table)
        folder.write_parquet(item.name, frame, metadata=metadata)
        quarantine.remove([item.name])
        self.unusable.pop(str(folder.source(item.name)), None)
        self.sound.add(str(folder.source(item.name)))
        _log.warning("table %r: %s put back from quarantine", item.table, item.name)
        return True


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:_REASON_CHARS]
