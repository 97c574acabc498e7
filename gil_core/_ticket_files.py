"""Ticket and verdict files (README, "Stable file formats") read as streams: a file of any size is read one line (or
one Parquet batch of rows, or one CSV record) at a time, and a line past ``max_line_bytes`` is refused, naming
file:line, without being read into memory (``gil_core._record_files`` reads the records). A file that cannot be read
at all (missing, a folder, not Parquet) raises ``BatchFileError`` naming it. What a record must hold to be a ticket
or a verdict is told here, a bad one as a ``BadInput`` where it stands. ``gil_core.batch`` re-exports what is public
here.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gil_core._record_files import (
    CSV_DELIMITERS,
    UTF8,
    BadInput,
    count_lines,
    csv_rows,
    json_lines,
    line_cap,
    parquet_rows,
    read_through,
)
from gil_core.errors import ConfigurationError

__all__ = [
    "CSV_DELIMITERS",
    "DEFAULT_FORMAT",
    "MAX_LINE_BYTES",
    "BadInput",
    "Ticket",
    "TicketColumns",
    "TicketFormat",
    "Verdict",
    "count_lines",
    "iter_tickets",
    "read_tickets",
    "read_verdicts",
    "text_encoding",
]

MAX_LINE_BYTES = 4 * 1024 * 1024
"""The longest line a ticket or verdict file may hold by default (4 MiB: a 1 MB ticket, even written with every
character escaped, is well inside it); a longer line is refused, naming file:line, and the rest of the file runs.
A Parquet ticket whose text is longer (in UTF-8 bytes) is refused alike."""

_SEPARATORS = '\n\r\t,;"{}[]:'  # what a file is split by as bytes: lines, CSV records and cells, JSON's syntax


@dataclass(frozen=True, slots=True)
class Ticket:
    id: str
    text: str


@dataclass(frozen=True, slots=True)
class TicketColumns:
    """Where a ticket file holds a ticket's id and text: the key of a JSONL line, the column of a Parquet file, the
    header of a CSV file. Several text columns (a subject and a body, say) make one text, the non-empty ones in
    order with a blank line between."""

    id: str = "id"
    text: tuple[str, ...] = ("text",)

    def __post_init__(self) -> None:
        names = [self.id, *self.text]
        if not self.text or any(not isinstance(name, str) or not name.strip() for name in names):
            raise ConfigurationError(f"ticket columns need an id and at least one text column, got {names!r}")
        if len(set(names)) < len(names):
            raise ConfigurationError(f"a ticket column is named twice: {names!r}")

    @property
    def names(self) -> list[str]:
        return [self.id, *self.text]

    def said(self) -> str:
        """What a ticket needs, as a bad line's message says it."""
        texts = " + ".join(json.dumps(name) for name in self.text)
        return f"{json.dumps(self.id)} (a string or a whole number) and {texts} (a string)"

    def ticket_fields(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` (by the file's own names) as ``{"id", "text"}``; the text None (which the check refuses) when no
        text column holds a string with something in it, or one holds something other than a string."""
        if len(self.text) == 1:
            return {"id": row.get(self.id), "text": row.get(self.text[0])}
        parts = [row.get(name) for name in self.text]
        texts = [part.strip() for part in parts if isinstance(part, str) and part.strip()]
        typed = all(part is None or isinstance(part, str) for part in parts)
        return {"id": row.get(self.id), "text": "\n\n".join(texts) if texts and typed else None}


DEFAULT_COLUMNS = TicketColumns()


@dataclass(frozen=True, slots=True)
class TicketFormat:
    """How a ticket file is read, as one value for every read of it a batch makes: where it holds each ticket's id
    and text (``columns``), the encoding a JSONL or CSV file was saved in (checked, and named as Python names its
    codec: ``text_encoding``), and the longest line accepted (``iter_tickets``). A bad one raises
    ``ConfigurationError`` naming it."""

    columns: TicketColumns = DEFAULT_COLUMNS
    encoding: str = UTF8
    max_line_bytes: int = MAX_LINE_BYTES

    def __post_init__(self) -> None:
        if self.max_line_bytes < 1:
            raise ConfigurationError(f"max_line_bytes must be ≥ 1, got {self.max_line_bytes}")
        object.__setattr__(self, "encoding", text_encoding(self.encoding))

    def read(self, path: str | Path) -> Iterator[Ticket | BadInput]:
        """The file's tickets and bad lines, streamed in file order (``iter_tickets``)."""
        return iter_tickets(path, max_line_bytes=self.max_line_bytes, columns=self.columns, encoding=self.encoding)


@dataclass(frozen=True, slots=True)
class Verdict:
    trace_id: str
    correct: bool
    correction: str | None = None


def iter_tickets(
    path: str | Path,
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
    columns: TicketColumns = DEFAULT_COLUMNS,
    encoding: str = UTF8,
) -> Iterator[Ticket | BadInput]:
    """The tickets of a JSONL file (one ``{"id", "text"}`` per line), a Parquet file (columns id, text) or a CSV
    file (``.csv``, or ``.tsv`` separated by tabs: a header row naming the columns id and text, other columns
    ignored, a quoted text may span lines), in file order, each bad line or row as a ``BadInput`` where it stands.
    ``columns`` names the id and text otherwise (``TicketColumns``). A JSONL or CSV file is read as UTF-8 (a byte
    order mark passed over), or in ``encoding`` (``text_encoding``: a spreadsheet's legacy export, cp949 or cp1252
    say); a line that does not decode is a bad line.

    Streamed: memory holds one line or CSV record (at most ``max_line_bytes``) or one batch of Parquet rows, and
    16 to 32 bytes per ticket for the check that no id comes twice (a 64-bit fingerprint of each id: two different
    ids of a file of a million tickets share one with a probability of about 3 in 10^8, and the second is then
    refused as a repeat, never resolved twice)."""
    path = Path(path)
    if max_line_bytes < 1:
        raise ConfigurationError(f"max_line_bytes must be ≥ 1, got {max_line_bytes}")
    encoding = text_encoding(encoding)
    seen = _Fingerprints()
    if path.suffix == ".parquet":
        if encoding != UTF8:
            raise ConfigurationError(f"{path}: Parquet's text is UTF-8 by its format; an encoding is for JSONL and CSV")
        rows = parquet_rows(path, columns.names)
    elif path.suffix in CSV_DELIMITERS:
        rows = csv_rows(path, max_line_bytes, encoding, columns.names)
    else:
        rows = json_lines(path, max_line_bytes, encoding)
    renamed = columns != DEFAULT_COLUMNS
    for where, row in read_through(path, rows):
        if isinstance(row, BadInput):
            yield row
            continue
        if renamed and isinstance(row, dict):
            row = columns.ticket_fields(row)
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("id"), str | int)
            or isinstance(row.get("id"), bool)
            or not isinstance(row.get("text"), str)
        ):
            yield BadInput(where, f"a ticket needs {columns.said()}")
            continue
        ticket = Ticket(str(row["id"]), row["text"])
        if not ticket.text.strip():
            yield BadInput(where, f"ticket {ticket.id!r} has no text")
        elif len(ticket.text) > max_line_bytes // 4 and len(ticket.text.encode()) > max_line_bytes:
            yield BadInput(where, f"ticket {ticket.id!r}: its text is longer than {line_cap(max_line_bytes)}")
        elif not seen.add(ticket.id):
            yield BadInput(where, f"ticket id {ticket.id!r} appears twice")
        else:
            yield ticket


def read_tickets(
    path: str | Path,
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
    columns: TicketColumns = DEFAULT_COLUMNS,
    encoding: str = UTF8,
) -> tuple[list[Ticket], list[BadInput]]:
    """Every ticket of the file and every bad line, as two lists (``iter_tickets`` streams them instead)."""
    tickets: list[Ticket] = []
    bad: list[BadInput] = []
    for item in iter_tickets(path, max_line_bytes=max_line_bytes, columns=columns, encoding=encoding):
        if isinstance(item, BadInput):
            bad.append(item)
        else:
            tickets.append(item)
    return tickets, bad


_YES, _NO = frozenset({"true", "yes", "y", "1", "right"}), frozenset({"false", "no", "n", "0", "wrong"})


def read_verdicts(
    path: str | Path, *, max_line_bytes: int = MAX_LINE_BYTES, encoding: str = UTF8
) -> tuple[list[Verdict], list[BadInput]]:
    """Verdicts from JSONL: ``{"trace_id", "correct": true|false, "correction"?}`` per line; or from CSV (``.csv``,
    ``.tsv``) with a header naming ``trace_id`` and ``correct`` (``correction`` optional), as a results file
    written as CSV is laid out for a person to fill in: ``correct`` is true/false, yes/no, y/n, 1/0 or
    right/wrong (any case); a row whose ``correct`` is empty is not yet judged and passed over, unless it holds a
    correction, which makes it wrong; one marked right that holds a correction is a bad line. ``encoding`` as for
    tickets (``iter_tickets``)."""
    if max_line_bytes < 1:
        raise ConfigurationError(f"max_line_bytes must be ≥ 1, got {max_line_bytes}")
    path = Path(path)
    encoding = text_encoding(encoding)
    verdicts, bad = [], []
    if path.suffix in CSV_DELIMITERS:
        rows = _csv_verdicts(csv_rows(path, max_line_bytes, encoding, ("trace_id", "correct"), ("correction",)))
    else:
        rows = json_lines(path, max_line_bytes, encoding)
    for where, row in read_through(path, rows):
        if isinstance(row, BadInput):
            bad.append(row)
        elif (
            not isinstance(row, dict)
            or not isinstance(row.get("trace_id"), str)
            or not isinstance(row.get("correct"), bool)
            or not isinstance(row.get("correction"), str | None)
        ):
            bad.append(BadInput(where, 'a verdict needs "trace_id" (string), "correct" (true/false), "correction"?'))
        else:
            verdicts.append(Verdict(row["trace_id"], row["correct"], row.get("correction")))
    return verdicts, bad


def _csv_verdicts(rows: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """CSV verdict rows as JSONL's: ``correct`` read as a truth value; a row not yet judged passed over."""
    for where, row in rows:
        if isinstance(row, BadInput):
            yield where, row
            continue
        said = (row["correct"] or "").strip().lower()
        corrected = bool((row.get("correction") or "").strip())
        if not said and corrected:
            said = "wrong"  # a correction written in: the answer was wrong
        if not said:
            continue
        if said not in _YES | _NO:
            yield where, BadInput(where, f'"correct" is {row["correct"]!r}: write true or false (or yes/no, 1/0)')
        elif said in _YES and corrected:
            yield where, BadInput(where, '"correct" says right and a correction is written: keep one of them')
        else:
            yield where, {**row, "correct": said in _YES}


def text_encoding(name: str) -> str:
    """``name`` (a Python codec name or alias: ``utf-8``, ``cp949``, ``euc-kr``, ``cp1252``, ``latin-1``, …) as the
    codec a JSONL or CSV file is decoded with, line by line. Refused, as a ``ConfigurationError`` naming it: an
    unknown name, and a codec that writes line ends, quotes or separators as other than their ASCII bytes (UTF-16,
    UTF-32), since a file is split into lines and records as bytes first."""
    try:
        codec = codecs.lookup(name).name
        ascii_compatible = _SEPARATORS.encode(codec) == _SEPARATORS.encode("ascii")
    except (LookupError, TypeError, UnicodeError):  # unknown, or a bytes-to-bytes codec (base64, hex, …)
        said = f"unknown text encoding {name!r} (a codec name such as utf-8, cp949 or cp1252)"
        raise ConfigurationError(said) from None
    if codec in (UTF8, "utf-8-sig"):
        return UTF8  # a byte order mark is passed over either way
    if not ascii_compatible:
        raise ConfigurationError(
            f"the text encoding {name!r} writes line ends and separators in more than one byte each: save the file as"
            " UTF-8"
        )
    return codec


DEFAULT_FORMAT = TicketFormat()


class _Fingerprints:
    """A set of 64-bit fingerprints of strings in one flat array (open addressing, at most half full): 16 to 32
    bytes per member (48 while it grows) instead of a Python set's ~100 for the string and its entry."""

    def __init__(self) -> None:
        self._slots = array("Q", [0]) * 1024
        self._count = 0

    def add(self, text: str) -> bool:
        """Add ``text``; False when it was there already."""
        fingerprint = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") or 1
        if not self._insert(self._slots, fingerprint):
            return False
        self._count += 1
        if 2 * self._count > len(self._slots):
            grown = array("Q", [0]) * (2 * len(self._slots))  # no bytes object of the size first
            for member in self._slots:
                if member:
                    self._insert(grown, member)
            self._slots = grown
        return True

    @staticmethod
    def _insert(slots: array[int], fingerprint: int) -> bool:
        mask = len(slots) - 1
        index = fingerprint & mask
        while (held := slots[index]) != 0:
            if held == fingerprint:
                return False
            index = (index + 1) & mask
        slots[index] = fingerprint
        return True
