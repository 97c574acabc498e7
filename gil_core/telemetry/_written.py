"""``WrittenTraces``, for ``TelemetryStore.traced``: the trace ids in the traces files one store object wrote.

A long-lived batch process asks, for every chunk of tickets, which of them already have a trace. When every live
file of the traces table is one this object wrote, the answer is in what it wrote, and nothing is read. Each file
is noted with every trace id in it and the task of that row, up to a bound on the ids kept (past it, files are
no longer noted and the store scans, as it does when another process wrote a live file or a compaction merged
them). A file a compaction deleted is forgotten when the store lists the table.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

__all__ = ["WRITTEN_IDS", "WrittenTraces"]

WRITTEN_IDS = 200_000  # trace ids kept (~20 MB) before files are no longer noted


class WrittenTraces:
    """Per traces file this object wrote (by source): each trace id in it → the task of its row."""

    def __init__(self, bound: int = WRITTEN_IDS) -> None:
        self._files: dict[str, dict[str, str]] = {}
        self._ids = 0
        self._bound = bound

    def note(self, source: str, rows: pl.DataFrame) -> None:
        """A file written, with its rows (``trace_id`` and ``task``, in order: the last row of an id wins); not
        noted past the bound (its columns are not even read then)."""
        if self._ids + rows.height <= self._bound:
            trace_ids, tasks = rows.get_column("trace_id").to_list(), rows.get_column("task").to_list()
            self._files[source] = dict(zip(trace_ids, tasks, strict=True))
            self._ids += rows.height

    def newest(self, sources: Sequence[str]) -> dict[str, str] | None:
        """Each trace id in the files ``sources`` (in read order) → the task of its newest row; None when one of
        them was not noted here."""
        written = [self._files.get(source) for source in sources]
        newest: dict[str, str] = {}
        for ids in written:  # in read order: the last row of a trace id wins, as the store's reads have it
            if ids is None:
                return None
            newest.update(ids)
        return newest

    def sources(self) -> list[str]:
        """The files noted."""
        return list(self._files)

    def forget(self, source: str) -> None:
        """A file gone (a compaction deleted it)."""
        ids = self._files.pop(source, None)
        if ids is not None:
            self._ids -= len(ids)
