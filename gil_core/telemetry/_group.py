"""Group commit for ``TelemetryStore`` (see the store's module doc, "Group commit"): appends queued in memory, then
written as one file per table per group, every table validated once over the group's combined rows.

``CommitGroup`` is what an open group holds (the queue, its limits, who listens for flushes); ``prepare`` turns a
taken queue into one validated frame per table, setting aside the appends whose rows the schema rejects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gil_core.errors import SchemaViolationError
from gil_core.telemetry._rows import conform
from gil_core.telemetry.schemas import KEYS, TABLES, validate_frame

__all__ = [
    "BACKLOG_GROUPS",
    "WRITE_ORDER",
    "CommitGroup",
    "FlushListener",
    "Flusher",
    "Pending",
    "Prepared",
    "QueuedAppend",
    "combined_rejection",
    "prepare",
]

WRITE_ORDER: tuple[str, ...] = (
    "calls",  # before traces: a visible trace always has its calls
    "vectors",  # and its request's vector
    "traces",
    "run_configs",
    "node_stats",
    "node_choices",
    "habit_reliability",
    "store_meta",
    "promotions",  # before promotion_rounds, which marks a round done
    "promotion_rounds",
    "reviews",
    "unlearned_verdicts",
)
"""The order in which the tables of one append (or of one group) are written."""
assert sorted(WRITE_ORDER) == sorted(TABLES)
_log = logging.getLogger("gil_core.telemetry.store")

FlushListener = Callable[[Mapping[str, pl.DataFrame]], None]
"""Called after a flush with the rows it made durable, per table (in the thread that flushed)."""

Pending = pl.DataFrame | list[dict[str, Any]]
"""What an append queues for one table: a conformed frame, or rows that ``conformable`` passed (conformed later,
all of a table's at once)."""


@dataclass(slots=True)
class QueuedAppend:
    """One ``append``/``append_many`` call waiting in a group: numbered in order, its tables, when it came."""

    number: int
    tables: dict[str, Pending]
    rows: int
    queued_at: float


BACKLOG_GROUPS = 4
"""With a flusher thread, an append waits (flushing itself) only once the rows not yet durable, queued or being
written, exceed this many groups' ``max_rows``: the bound on what a group holds in memory."""


@dataclass
class CommitGroup:
    """The open group of one store. Its fields are guarded by the store's queue lock."""

    max_rows: int
    max_delay_s: float | None
    depth: int = 0  # group_commit contexts open on it
    queue: list[QueuedAppend] = field(default_factory=list)
    rows: int = 0
    writing: int = 0  # rows a flush has taken and not yet written or put back
    failing: bool = False  # the last flush failed: the appender that fills the group flushes it itself (and hears)
    listeners: list[FlushListener] = field(default_factory=list)
    appended: int = 0

    def add(self, tables: dict[str, Pending], now: float) -> bool:
        """Queue one append; True when the group has reached ``max_rows`` and should be flushed now."""
        rows = sum(len(pending) for pending in tables.values())
        self.appended += 1
        self.queue.append(QueuedAppend(self.appended, tables, rows, now))
        self.rows += rows
        return self.rows >= self.max_rows

    def backlogged(self) -> bool:
        """Whether the rows not yet durable (queued, or taken by a flush under way) exceed the backlog bound."""
        return self.rows + self.writing > BACKLOG_GROUPS * self.max_rows

    def take(self) -> list[QueuedAppend]:
        """Everything queued, in order; the queue is left empty and its rows count as being written."""
        taken, self.queue, self.writing, self.rows = self.queue, [], self.rows, 0
        return taken

    def put_back(self, appends: Sequence[QueuedAppend]) -> None:
        """Queue again, ahead of what came since, what a failed flush did not write."""
        self.queue[:0] = appends
        self.rows += sum(append.rows for append in appends)

    def due_in(self, now: float) -> float:
        """Seconds until the oldest queued append has waited ``max_delay_s`` (that long when nothing waits)."""
        assert self.max_delay_s is not None
        if not self.queue:
            return self.max_delay_s
        return self.queue[0].queued_at + self.max_delay_s - now


@dataclass(frozen=True, slots=True)
class Prepared:
    """A taken queue made ready to write: one validated frame per table, in ``WRITE_ORDER``, and the appends
    left out because their rows do not fit (each error names the table, the append and its keys)."""

    frames: dict[str, pl.DataFrame]
    rejected: list[SchemaViolationError]


def prepare(appends: Sequence[QueuedAppend]) -> Prepared:
    """Conform each table's queued rows at once, validate each table's combined frame once, and when that fails
    find the appends at fault by halving: they are left out whole (all their tables), the rest is written.
    Every returned frame has passed ``validate_frame`` as the very frame that is returned."""
    quick = _all_at_once(appends)
    if quick is not None:
        return Prepared(quick, [])
    bad: dict[int, SchemaViolationError] = {}
    segments: dict[str, list[tuple[int, pl.DataFrame]]] = {}
    for table in WRITE_ORDER:
        pieces = [(append.number, append.tables[table]) for append in appends if table in append.tables]
        if pieces:
            segments[table] = _conformed(table, pieces, bad)
    for table, parts in segments.items():
        _find_rejected(table, [part for part in parts if part[0] not in bad], bad)
    while True:
        frames = _kept_frames(segments, bad)
        if frames is not None:
            return Prepared(frames, [bad[number] for number in sorted(bad)])


def _all_at_once(appends: Sequence[QueuedAppend]) -> dict[str, pl.DataFrame] | None:
    """The usual case: every table's queued rows conformed and validated in one go. None when any table holds a
    frame (an append typed the slow way) or fails: then ``prepare`` goes append by append."""
    frames: dict[str, pl.DataFrame] = {}
    for table in WRITE_ORDER:
        rows: list[dict[str, Any]] = []
        for append in appends:
            pending = append.tables.get(table)
            if isinstance(pending, pl.DataFrame):
                return None
            if pending is not None:
                rows += pending
        if not rows:
            continue
        try:
            frame = conform(table, rows)
            validate_frame(table, frame)
        except SchemaViolationError:
            return None
        frames[table] = frame
    return frames


def _kept_frames(
    segments: Mapping[str, Sequence[tuple[int, pl.DataFrame]]], bad: dict[int, SchemaViolationError]
) -> dict[str, pl.DataFrame] | None:
    """One frame per table of the appends not in ``bad``; None (with ``bad`` grown) if one fails validation."""
    frames: dict[str, pl.DataFrame] = {}
    for table, parts in segments.items():
        kept = [frame for number, frame in parts if number not in bad]
        if not kept:
            continue
        frame = pl.concat(kept, how="vertical") if len(kept) > 1 else kept[0]
        if len(kept) < len(parts):  # appends were left out: validate exactly what will be written
            try:
                validate_frame(table, frame)
            except SchemaViolationError as exc:  # not with row-wise checks; never write a frame unchecked
                for number, part in parts:
                    bad.setdefault(number, _rejection(table, number, part, exc))
                return None
        if not frame.is_empty():
            frames[table] = frame
    return frames


def _conformed(
    table: str, pieces: Sequence[tuple[int, Pending]], bad: dict[int, SchemaViolationError]
) -> list[tuple[int, pl.DataFrame]]:
    """Each piece as a frame of the table's dtypes; queued rows are conformed together, then sliced apart."""
    rows = [row for _, pending in pieces if isinstance(pending, list) for row in pending]
    together: pl.DataFrame | None = None
    if rows:
        try:
            together = conform(table, rows)
        except SchemaViolationError:
            together = None  # ``conformable`` said they would conform: find the piece that does not, one by one
    out: list[tuple[int, pl.DataFrame]] = []
    offset = 0
    for number, pending in pieces:
        if isinstance(pending, pl.DataFrame):
            out.append((number, pending))
            continue
        if together is not None:
            out.append((number, together.slice(offset, len(pending))))
            offset += len(pending)
            continue
        try:
            out.append((number, conform(table, pending)))
        except SchemaViolationError as exc:
            bad.setdefault(number, _rejection(table, number, None, exc))
    return out


def _find_rejected(table: str, parts: Sequence[tuple[int, pl.DataFrame]], bad: dict[int, SchemaViolationError]) -> None:
    if not parts:
        return
    frame = pl.concat([part for _, part in parts], how="vertical") if len(parts) > 1 else parts[0][1]
    try:
        validate_frame(table, frame)
        return
    except SchemaViolationError as exc:
        if len(parts) == 1:
            number, part = parts[0]
            bad.setdefault(number, _rejection(table, number, part, exc))
            return
    middle = len(parts) // 2
    _find_rejected(table, parts[:middle], bad)
    _find_rejected(table, parts[middle:], bad)


def _rejection(table: str, number: int, part: pl.DataFrame | None, exc: SchemaViolationError) -> SchemaViolationError:
    """The error of one rejected append: which append, its keys (or row count), and what the schema says."""
    what = f"append #{number} of the group"
    key = KEYS.get(table)
    if part is not None and key and part.height:
        shown = ", ".join(
            " ".join(f"{name} {value!r}" for name, value in zip(key, row, strict=True))
            for row in part.select(key).head(3).iter_rows()
        )
        what += f" ({shown}{', …' if part.height > 3 else ''})"
    elif part is not None:
        what += f" ({part.height} row{'s' if part.height != 1 else ''})"
    reason = str(exc).removeprefix(f"table {table!r}: ")
    return SchemaViolationError(f"{what} not written: {reason}", table=table)


def combined_rejection(rejected: Sequence[SchemaViolationError]) -> SchemaViolationError:
    """One error for several rejected appends, naming each."""
    reasons = "; ".join(str(error) for error in rejected)
    return SchemaViolationError(f"{len(rejected)} appends were not written: {reasons}", table=rejected[0].table)


class Flusher:
    """The background thread of a group with ``max_delay_s``: it calls ``flush`` once the oldest queued append
    has waited that long, and at once when woken by the append that filled the group (``wake``). A failed flush
    is logged and tried again after ``max_delay_s``; meanwhile the appender that fills the group flushes it
    itself and hears the error (``CommitGroup.failing``), and leaving the block flushes anyway."""

    def __init__(self, group: CommitGroup, lock: threading.Lock, flush: Callable[[], None]) -> None:
        self._group, self._lock, self._flush = group, lock, flush
        self._signal = threading.Event()  # woken (a full group) or stopped
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="gil-group-commit", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        delay = self._group.max_delay_s
        assert delay is not None
        while True:
            with self._lock:
                wait = self._group.due_in(time.monotonic())
            self._signal.wait(max(wait, 0.0))
            self._signal.clear()  # before the state is looked at: a wake after this finds its rows below
            if self._stopping:
                return
            with self._lock:
                group = self._group
                due = bool(group.queue) and (group.rows >= group.max_rows or group.due_in(time.monotonic()) <= 0)
            if not due:
                continue
            try:
                self._flush()
            except Exception as exc:
                _log.warning("group commit: a background flush failed, trying again in %.1f s: %s", delay, exc)
                self._signal.wait(delay)
                self._signal.clear()
                if self._stopping:
                    return

    def wake(self) -> None:
        """Flush now: the group has reached ``max_rows``."""
        self._signal.set()

    def stop(self) -> None:
        """Stop the thread and wait for it (and for a flush it is doing)."""
        self._stopping = True
        self._signal.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()
