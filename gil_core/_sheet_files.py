"""Sheets for a person: results and queues written as CSV (or TSV) that a spreadsheet opens, with empty ``correct``
and ``correction`` columns to fill in; filled in, a sheet is a verdicts file (``gil_core._ticket_files``).
``gil_core.batch`` re-exports ``write_sheet``.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gil_core._ticket_files import CSV_DELIMITERS
from gil_core.atomic import atomic_open
from gil_core.errors import BatchFileError

__all__ = ["write_sheet"]


def write_sheet(out: str | Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    """Write ``rows`` under ``header`` as a sheet for a person (``.csv``, or ``.tsv`` for tabs), atomically, with
    empty ``correct`` and ``correction`` columns after them: filled in, it is a verdicts file (``read_verdicts``)
    when its columns hold ``trace_id``. UTF-8 with a byte order mark, which spreadsheets read by; None an empty
    cell, a list its items joined by `` > ``, text a spreadsheet would run as a formula after an apostrophe. How
    many rows it wrote; a file that cannot be written raises ``BatchFileError`` naming it, the file as it was
    left."""
    delimiter = CSV_DELIMITERS.get(Path(out).suffix)
    if delimiter is None:
        raise BatchFileError(
            f"a sheet is written to .csv or .tsv, not {Path(out).suffix or 'no suffix'}", path=str(out)
        )
    written = 0
    try:
        with atomic_open(out) as handle:
            handle.write("\ufeff")
            sheet = csv.writer(handle, delimiter=delimiter, lineterminator="\n")
            sheet.writerow([*header, "correct", "correction"])
            for row in rows:
                sheet.writerow([*(_sheet_cell(value) for value in row), "", ""])
                written += 1
    except OSError as exc:
        raise BatchFileError(f"cannot write the sheet ({type(exc).__name__}: {exc})", path=str(out)) from exc
    return written


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _sheet_cell(value: Any) -> str:
    """A value as a sheet shows it. Text that a spreadsheet would take for a formula (a request is anyone's text:
    ``=HYPERLINK(…)`` runs when the sheet is opened) is written after an apostrophe, which shows it as text."""
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        text = " > ".join(str(item) for item in value)
    elif isinstance(value, str):
        text = value
    else:
        return str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text
