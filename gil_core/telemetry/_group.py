"""Group commit for ``TelemetryStore``: appends queued in memory, then written as one file per table per group,
every table validated once over the group's combined rows.

``GroupCommits`` runs a store's group (its blocks, flushes and background thread); ``CommitGroup`` is what an open
group holds (the queue, its limits, who listens for flushes); ``prepare`` turns a taken queue into one validated
frame per table, setting aside the appends whose rows the schema rejects.

Inside ``with store.group_commit(max_rows=…, max_delay_s=…):`` an append is typed at once (unknown columns and wrong
types raise to the caller) and queued; returning from it does NOT mean durable. A flush takes the whole queue,
validates each table's combined rows once, and writes ONE file per table in ``WRITE_ORDER`` (the store's atomic
write, its module doc's "Append"; the flush lock keeps one group's files before the next's). It runs when
``max_rows`` rows are queued, when the oldest queued append has waited ``max_delay_s`` (both on the group's
background thread: the append that fills the group wakes it and returns), on ``flush()``, before this store object's
``read``/``scan``/``stats`` (a process always reads its own writes), and on leaving the block; each of these waits
for a flush under way, then writes what is queued. The append that fills a group flushes it itself instead when
there is no thread (``max_delay_s=None``) and after a failed flush (so the error reaches an appender, as it would
without the thread); and an append waits, writing itself, while the rows not yet durable (queued, or being written)
exceed ``BACKLOG_GROUPS`` (4) groups' ``max_rows``: a group's memory is bounded however slow the disk. Acknowledged
means flushed: ``flush()`` or leaving the block returned, or ``on_flush`` reported the rows. A SIGKILL loses what
was queued and not flushed, never leaves a partial file, and leaves a flush cut between two tables as the store's
module doc says of one request (per group here). Appends whose rows fail validation at flush time are left out whole
(every table of that append), the rest is written, and the next ``flush()`` or the block's exit raises one
``SchemaViolationError`` naming the table and each rejected append (its key values). Batches use it
(``gil_core.batch.resolve_batch``): a ticket counts as resolved once its trace is flushed, and a rerun resolves
again the tickets whose trace never was.
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
from gil_core.telemetry._rows import conform, conformable
from gil_core.telemetry.schemas import KEYS, TABLES, validate_frame

__all__ = [
    "BACKLOG_GROUPS",
    "WRITE_ORDER",
    "CommitGroup",
    "FlushListener",
    "Flusher",
    "GroupCommits",
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


class GroupCommits:
    """The group commit of one store: the open group (if any), its flusher thread, and the appends it rejected
    since they were last raised. ``write`` stores one validated frame of one table as a durable file (the store's
    own atomic write); everything else about a group is here."""

    def __init__(self, write: Callable[[str, pl.DataFrame], None]) -> None:
        self._write = write
        self._queue_lock = threading.Lock()  # the open group's queue, listeners and rejections
        self._flush_lock = threading.RLock()  # one flush at a time: files of one group precede the next group's
        self._group: CommitGroup | None = None
        self._flusher: Flusher | None = None
        self._rejected: list[SchemaViolationError] = []

    def enter(self, max_rows: int, max_delay_s: float | None, on_flush: FlushListener | None) -> CommitGroup:
        """Open a block: join the open group (its limits hold) or open one, with a flusher thread when
        ``max_delay_s`` is set."""
        with self._queue_lock:
            group = self._group
            if group is None:
                group = self._group = CommitGroup(max_rows, max_delay_s)
                if max_delay_s is not None:
                    self._flusher = Flusher(group, self._queue_lock, self.flush)
            group.depth += 1
            if on_flush is not None:
                group.listeners.append(on_flush)
        return group

    def enqueue(self, given: Mapping[str, Sequence[Mapping[str, Any]] | pl.DataFrame]) -> bool:
        """Type ``given`` and queue it in the open group; False when no group is open, or it closed meanwhile
        (the caller writes it directly)."""
        group = self._group
        if group is None:
            return False
        pending: dict[str, Pending] = {}
        for table, rows in given.items():
            if not isinstance(rows, pl.DataFrame) and conformable(table, rows):
                pending[table] = [dict(row) for row in rows]
            else:
                pending[table] = conform(table, rows)  # raises now for unknown columns and wrong types
        with self._queue_lock:
            if self._group is not group:
                return False
            full = group.add(pending, time.monotonic())
            flusher = self._flusher
            # A full group is the flusher's to write, off this thread (the event loop's, in a batch); the caller
            # writes it itself when there is no flusher, when the last flush failed (so it hears why), and when
            # the flusher is this far behind (the backlog bound: the caller waits for it, then writes the rest).
            inline = (full and (flusher is None or group.failing)) or group.backlogged()
        if inline:
            self.flush()
        elif full:
            assert flusher is not None
            flusher.wake()
        return True

    def flush(self) -> None:
        """Write everything queued (after a flush another thread is doing); put back what could not be written
        and raise. Listeners hear of what was written before the flush lock is released (it is reentrant, so a
        listener may read the store). Without an open group there is nothing to write."""
        if self._group is None:
            return
        written: dict[str, pl.DataFrame] = {}
        failure: BaseException | None = None
        with self._flush_lock:
            with self._queue_lock:
                group = self._group
                if group is None or not group.queue:
                    return
                appends = group.take()
                listeners = list(group.listeners)
            try:
                prepared = prepare(appends)
            except BaseException:
                with self._queue_lock:
                    group.put_back(appends)
                    group.writing, group.failing = 0, True
                raise
            for error in prepared.rejected:
                _log.warning("group commit: %s", error)
            try:
                for table, frame in prepared.frames.items():
                    self._write(table, frame)
                    written[table] = frame
            except BaseException as exc:  # validated frames of the tables not written yet: written by a later flush
                failure = exc
                unwritten = {table: frame for table, frame in prepared.frames.items() if table not in written}
                rows = sum(frame.height for frame in unwritten.values())
                with self._queue_lock:
                    group.put_back([QueuedAppend(0, dict(unwritten), rows, appends[0].queued_at)])
            with self._queue_lock:
                group.writing, group.failing = 0, failure is not None
                self._rejected += prepared.rejected
            if written:  # under the flush lock: once any flush returns, every earlier flush has been heard of
                for listener in listeners:
                    listener(written)
        if failure is not None:
            raise failure

    def leave(self, group: CommitGroup, on_flush: FlushListener | None, *, quiet: bool) -> None:
        """Leave a block: flush (again, if the last block leaves while rows still come in), close the group when
        this was its last block, then raise what failed or was rejected, unless ``quiet`` (the block raised: its
        own exception goes on, and a failed flush is logged)."""
        failure: BaseException | None = None
        while True:
            try:
                self.flush()
            except BaseException as exc:
                failure = exc
            with self._queue_lock:
                # (a flush under way on the flusher thread may yet fail and put its rows back: flush after it)
                if failure is None and group.depth == 1 and (group.queue or group.writing):
                    continue
                group.depth -= 1
                if on_flush is not None:
                    group.listeners.remove(on_flush)
                flusher = None
                if group.depth == 0:  # anything still queued now was never acknowledged, and is dropped
                    self._group, flusher, self._flusher = None, self._flusher, None
                    if quiet:
                        self._rejected = []  # logged when found; the block's own exception is what goes on
                break
        if flusher is not None:
            flusher.stop()
        if failure is not None and quiet:
            _log.error("group commit: the last flush of a block that raised failed: %s", failure)
        elif failure is not None:
            raise failure
        elif not quiet:
            self.raise_rejected()

    def raise_rejected(self) -> None:
        """Raise one ``SchemaViolationError`` for the appends rejected since the last call (none: nothing)."""
        with self._queue_lock:
            rejected, self._rejected = self._rejected, []
        if rejected:
            raise rejected[0] if len(rejected) == 1 else combined_rejection(rejected)
