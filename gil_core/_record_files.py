"""A file's records as a stream, in bounded memory: the lines of a JSONL file, the records of a CSV file (a quoted
field may span lines), the rows of a Parquet file, each with where it stands (file:line, or the row's number). A
record past ``max_line_bytes`` is refused without being read into memory, a line that does not decode is told by
its encoding and byte, and a failure of the file itself (missing, a folder, not Parquet, an I/O error midway)
raises ``BatchFileError`` naming it. What the records must hold (a ticket, a verdict) is ``gil_core._ticket_files``'s.
"""

from __future__ import annotations

import codecs
import csv
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from gil_core.errors import BatchFileError

__all__ = [
    "CSV_DELIMITERS",
    "UTF8",
    "BadInput",
    "count_lines",
    "csv_rows",
    "json_lines",
    "line_cap",
    "parquet_rows",
    "read_through",
]

UTF8 = "utf-8"
_CHUNK = 1 << 16  # bytes read at a time while passing over the rest of a line past the cap, and while counting
_PARQUET_BATCH = 4096  # rows of a Parquet ticket file decoded at a time

CSV_DELIMITERS = {".csv": ",", ".tsv": "\t"}
"""The file suffixes read (and results written) as CSV, and their separators."""


@dataclass(frozen=True, slots=True)
class BadInput:
    """An input line or ticket that could not be used: where it was and why."""

    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


def _not_decoded(encoding: str, offset: int, where: str) -> str:
    """What a line that does not decode is told: which encoding it is not, the byte, and the fix."""
    if encoding == UTF8:
        return (
            f"not UTF-8 (byte {offset} of {where}): save the file as UTF-8 (CSV UTF-8), or name the encoding it was"
            " saved in (--encoding)"
        )
    return f"not {encoding} (byte {offset} of {where}): name the encoding the file was saved in (--encoding)"


def _first_line(raw: bytes, encoding: str) -> bytes:
    """The file's first line without a UTF-8 byte order mark; with one, a file read in another encoding is UTF-8
    (``_WrongEncoding``)."""
    if raw.startswith(codecs.BOM_UTF8):
        if encoding != UTF8:
            raise _WrongEncoding(f"the file starts with UTF-8's byte order mark: it is UTF-8, not {encoding}")
        return raw[len(codecs.BOM_UTF8) :]
    return raw


def count_lines(path: str | Path) -> int:
    """How many tickets the file can hold at most (its lines; a Parquet file's rows), read in chunks: what a
    progress bar shows as its total before the batch has read the file."""
    path = Path(path)
    with _unreadable_file(path):
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(path).metadata.num_rows)
        count, last = 0, b"\n"
        with path.open("rb") as source:
            while chunk := source.read(_CHUNK):
                count += chunk.count(b"\n")
                last = chunk[-1:]
        return count + (last != b"\n")


@contextmanager
def _unreadable_file(path: Path) -> Iterator[None]:
    """A failure to open or read ``path`` itself as an ``BatchFileError`` naming it (``_file_error``)."""
    try:
        yield
    except Exception as exc:
        error = _file_error(path, exc)
        if error is None:
            raise
        raise error from exc


def read_through(path: Path, rows: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """``rows``, read from ``path``, with a failure of the file itself raised as ``BatchFileError``: opening it, or
    reading on (an I/O error midway, a Parquet batch that does not decode). One handler around the whole stream: a
    consumer's own exception never enters a generator, so only the reading is caught."""
    with _unreadable_file(path):
        yield from rows


def _file_error(path: Path, exc: Exception) -> BatchFileError | None:
    """``exc`` as an ``BatchFileError`` naming ``path`` when it is the file's failure (an ``OSError``, or pyarrow's
    error for a file that is not Parquet), else None."""
    if "pyarrow" in sys.modules:  # only a Parquet file brings it in: a JSONL file's errors are OSErrors
        import pyarrow as pa

        if isinstance(exc, pa.ArrowException) and not isinstance(exc, OSError):
            return BatchFileError(f"cannot read the file ({type(exc).__name__}: {exc})", path=str(path))
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        return BatchFileError(f"cannot read the file ({type(exc).__name__}: {reason})", path=str(path))
    return None


def line_cap(max_line_bytes: int) -> str:
    return f"{max_line_bytes:,} bytes (max_line_bytes; gil resolve-batch --max-line-bytes)"


def json_lines(path: Path, max_line_bytes: int, encoding: str) -> Iterator[tuple[str, Any]]:
    # Bytes first, decoded per line: one line that does not decode is reported, and the rest still run. A line is read
    # at most one byte past the cap; the rest of a longer one is passed over in chunks, never held.
    with path.open("rb") as lines:
        number = 0
        while raw := lines.readline(max_line_bytes + 1):
            number += 1
            where = f"{path}:{number}"
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                del raw
                _skip_rest_of_line(lines)
                yield where, BadInput(where, f"the line is longer than {line_cap(max_line_bytes)}")
                continue
            try:
                line = (_first_line(raw, encoding) if number == 1 else raw).decode(encoding)
            except UnicodeDecodeError as exc:
                yield where, BadInput(where, _not_decoded(encoding, exc.start + 1, "the line"))
                continue
            except _WrongEncoding as exc:
                yield where, BadInput(where, str(exc))
                return
            if not line.strip():
                continue
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                yield where, BadInput(where, f"not JSON ({exc.msg})")
            except RecursionError:
                yield where, BadInput(where, "not JSON (nested too deeply)")


def _skip_rest_of_line(lines: BinaryIO) -> None:
    while (chunk := lines.readline(_CHUNK)) and not chunk.endswith(b"\n"):
        pass


def parquet_rows(path: Path, names: Sequence[str]) -> Iterator[tuple[str, Any]]:
    """Each row of a Parquet file as ``{name: value}`` for the columns ``names``, a batch of rows decoded at a
    time; a file without one of them is one ``BadInput`` and the end."""
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    missing = sorted(set(names) - set(source.schema_arrow.names))
    if missing:
        yield str(path), BadInput(str(path), f"missing columns {missing}")
        return
    index = 0
    for batch in source.iter_batches(batch_size=_PARQUET_BATCH, columns=list(names)):
        for row in batch.to_pylist():
            index += 1
            yield f"{path}: row {index}", row


class _RecordTooLong(Exception):
    pass


class _NotDecoded(Exception):
    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


class _WrongEncoding(Exception):
    """The file is not in the encoding it is read in at all (said in the message): nothing of it is read."""


class _BoundedLines:
    """The decoded lines of a binary file for ``csv.reader``, one record's worth at a time: a record whose lines
    come to more than ``limit`` bytes raises ``_RecordTooLong`` (the rest of an over-long line passed over, never
    held), a line that does not decode in ``encoding`` ``_NotDecoded``. ``start()`` begins a record; ``number`` is
    the last line read."""

    def __init__(self, source: BinaryIO, limit: int, encoding: str) -> None:
        self._source, self._limit, self._encoding = source, limit, encoding
        self.number, self._held = 0, 0

    def start(self) -> int:
        """Begin a record; the number of the line it starts on."""
        self._held = 0
        return self.number + 1

    def __iter__(self) -> _BoundedLines:
        return self

    def __next__(self) -> str:
        raw = self._source.readline(self._limit - self._held + 1)
        if not raw:
            raise StopIteration
        self.number += 1
        self._held += len(raw)
        if self._held > self._limit:
            if not raw.endswith(b"\n"):
                _skip_rest_of_line(self._source)
            raise _RecordTooLong
        try:
            return (_first_line(raw, self._encoding) if self.number == 1 else raw).decode(self._encoding)
        except UnicodeDecodeError as exc:
            raise _NotDecoded(exc.start + 1) from None


def csv_rows(
    path: Path, max_line_bytes: int, encoding: str, required: Sequence[str], optional: Sequence[str] = ()
) -> Iterator[tuple[str, Any]]:
    """Each record of a CSV file after its header row as ``{name: cell}`` for the ``required`` and ``optional``
    columns (an empty cell None, a blank record passed over), or a ``BadInput``; a header without a required column
    is one ``BadInput`` and the end. A ``.csv`` file whose header row holds more semicolons than commas is read as
    separated by semicolons: what spreadsheets save where a comma is the decimal mark. A header row that does not
    decode is one ``BadInput`` and the end: the file was saved in another encoding, and no row of it would read."""
    # A record (which a quoted field may carry over several lines) is held whole at most: ``_BoundedLines`` refuses
    # one past the cap. The csv module's own cap on a field (a setting of the whole process, 128 KiB by default) is
    # raised to that cap, never lowered.
    csv.field_size_limit(max(csv.field_size_limit(), max_line_bytes))
    with path.open("rb") as source:
        delimiter = CSV_DELIMITERS[path.suffix]
        if delimiter == ",":
            first = source.readline(max_line_bytes + 1)
            delimiter = ";" if first.count(b";") > first.count(b",") else ","
            source.seek(0)
        lines = _BoundedLines(source, max_line_bytes, encoding)
        records = csv.reader(lines, delimiter=delimiter, strict=False)
        header: list[str] | None = None
        while True:
            where = f"{path}:{lines.start()}"
            try:
                record = next(records)
            except StopIteration:
                return
            except _RecordTooLong:
                yield where, BadInput(where, f"the record is longer than {line_cap(max_line_bytes)}")
                continue
            except _NotDecoded as exc:
                if header is None:
                    said = _not_decoded(encoding, exc.offset, "the header row")
                    yield where, BadInput(where, f"{said}; no row of the file was read")
                    return
                yield where, BadInput(where, _not_decoded(encoding, exc.offset, "a line of the record"))
                continue
            except _WrongEncoding as exc:
                yield where, BadInput(where, str(exc))
                return
            except csv.Error as exc:
                yield where, BadInput(where, f"not CSV ({exc})")
                continue
            if header is None:
                header = [name.strip() for name in record]
                missing = [name for name in required if name not in header]
                if missing:
                    named, found = (
                        " or ".join(json.dumps(n) for n in missing),
                        ", ".join(json.dumps(n) for n in header),
                    )
                    yield where, BadInput(where, f"the header row names no column {named} (it names {found})")
                    return
                continue
            if not any(cell.strip() for cell in record):
                continue  # a blank line
            cells = dict(zip(header, record, strict=False))
            yield where, {name: cells.get(name) or None for name in (*required, *optional)}
