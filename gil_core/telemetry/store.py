"""``TelemetryStore``: the telemetry tables as Polars-managed Parquet under one root, one folder per table.

It is the trace sink: only it turns ``TraceRecord``/``CallRecord`` into rows, and every write is validated
against the table's pandera model (``schemas.validate_frame``) before anything touches the disk.

Durability model
----------------
* **Where.** The root is a local folder or an ``s3://bucket/prefix`` (``gil_core.storage``; endpoint, keys and
  region from ``GIL_S3_*``). Polars reads and writes both natively; pyarrow's S3 filesystem lists and deletes.
* **Append.** Each ``append`` writes ONE new Parquet file ``<ns>-<pid>-<random>.parquet`` (``ns`` is the
  order key, see below). Locally it is written under a temporary dot-name in the same folder, flushed and
  ``os.fsync``-ed, ``os.replace``-d to its final name, then the folder is ``os.fsync``-ed. On object storage it
  is one PUT of the whole object under its final name (S3 shows an object whole or not at all, and answers the
  PUT only once the object is stored). Outside a commit group, returning from ``append`` (and so from
  ``record_trace``/``record_calls``) means acknowledged: the rows survive a SIGKILL of the writer. Readers list
  final names only (``*.parquet``, never dot-names), so they never see a half-written file. Names are unique
  (pid + randomness), so two processes appending at once never collide and nothing is lost.
* **One request, several tables.** ``append_many`` (and ``record_trace``, which writes a request's calls, trace
  and walk counters through it) validates every table first, then writes one file per table in ``WRITE_ORDER``:
  ``calls`` before ``traces``, so a visible trace always has its calls, and the counters after the trace. A
  writer killed between two of those files leaves the earlier ones: calls without their trace (harmless: the
  request is resolved again), or a trace without its counters (the walk's counters undercount by one request).
* **Group commit.** Inside ``with store.group_commit(max_rows=…, max_delay_s=…):`` an append is typed at once
  (unknown columns and wrong types raise to the caller) and queued; returning from it does NOT mean durable.
  A flush takes the whole queue, validates each table's combined rows once, and writes ONE file per table in
  ``WRITE_ORDER`` (same atomic write as above; the flush lock keeps one group's files before the next's). It
  runs when ``max_rows`` rows are queued, when the oldest queued append has waited ``max_delay_s`` (both on the
  group's background thread: the append that fills the group wakes it and returns), on ``flush()``, before this
  store object's ``read``/``scan``/``stats`` (a process always reads its own writes), and on leaving the block;
  each of these waits for a flush under way, then writes what is queued. The append that fills a group flushes it
  itself instead when there is no thread (``max_delay_s=None``) and after a failed flush (so the error reaches
  an appender, as it would without the thread); and an append waits, writing itself, while the rows not yet
  durable (queued, or being written) exceed ``BACKLOG_GROUPS`` (4) groups' ``max_rows``: a group's memory is
  bounded however slow the disk. Acknowledged means flushed: ``flush()`` or leaving the block returned, or
  ``on_flush`` reported the rows. A SIGKILL loses what was queued and not flushed, never leaves a
  partial file, and leaves a flush cut between two tables as above (per group instead of per request). Appends
  whose rows fail validation at flush time are left out whole (every table of that append), the rest is
  written, and the next ``flush()`` or the block's exit raises one ``SchemaViolationError`` naming the table and
  each rejected append (its key values). Batches use it (``gil_core.batch.resolve_batch``): a ticket counts as
  resolved once its trace is flushed, and a rerun resolves again the tickets whose trace never was.
* **Supersede.** Every stored row carries an internal ``_seq`` column, its order key (``read``/``scan`` drop
  it). In a keyed table (``schemas.KEYS``: ``traces`` by ``trace_id``, ``calls`` by ``call_id``,
  ``run_configs`` by ``task``, ``store_meta`` by ``key``, …) the row with the highest ``_seq`` per key wins on
  read: recording a trace again (with its feedback) updates it. ``reviews`` is a log and keeps every row. Rows
  come in write order (``_seq``).
* **The order key** is a hybrid logical clock's stamp (``_clock.HybridClock``, one per store object): nanoseconds,
  at least the wall clock and above every stamp this object has listed (file names and compacted ranges, on
  every read, scan and compaction) or written. So a row written after its writer read another is ordered after
  it, even when the writer's clock is behind: a verdict applied by a process whose clock is an hour slow still
  supersedes the trace it read. Nothing is counted in the store (a listing is all it takes, on ``s3://`` too).
  Two writers that saw nothing of each other may stamp the same value: the row read last wins (names sort by
  stamp, then pid and randomness), the same in every reader; within one append the last row per key wins. Files
  say their key's version in their metadata (``_clock.ORDER_KEY``); files written before the clock have none,
  and their wall-clock stamps are read as they are (see ``_clock``).
* **Reading without sorting.** File names start with their ``_seq`` and an appended file's rows all carry it;
  a compacted file records the range of ``_seq`` it holds (``gil.seq_range``). When, in name order, no file
  starts below the highest ``_seq`` before it (always, unless a compaction raced a slow append), the files
  read in name order are already in write order: the reader keeps the last row per key without sorting
  (BENCHMARKS.md, "Stats over a large store"). Otherwise it sorts by ``_seq`` first; the result is the same.
* **Compaction.** ``compact(table)`` merges a folder's files into one, one compactor at a time (locally a
  ``filelock.FileLock`` on ``.compact.lock`` in the folder; on object storage a claim object, see
  ``storage.ObjectFolder.claim``: a compactor that finds another one at work does nothing and returns 0).
  The merged ``<ns>-<pid>-<random>.compacted.parquet`` keeps the winning row per key and lists the names of
  the files it replaces in its Parquet key-value metadata (``gil.replaces``). It is written atomically as
  above, THEN the sources are deleted. Readers ignore every file named by a compacted file present, so no row
  is seen twice or missed, even if the compactor dies between the write and the deletes (the next compaction
  deletes the leftovers). Files appended while a compaction runs are not in its list and stay live.
* **Reading during compaction.** ``read`` retries when a listed file vanished before it was read, or when
  a compacted file appeared while it was reading (a listing is not a snapshot: one taken during a
  compaction's write-then-delete could miss both the sources and their replacement). ``scan`` plans over
  the files present when it is called; if a compaction deletes one before ``collect()``, collect raises
  ``FileNotFoundError``: scan again.
* **Files that do not decode.** Before a file is first read by a store object its footer is checked (once: files
  never change). A file whose bytes do not decode as Parquet (truncated, empty, not Parquet), or whose footer types
  a column of the table otherwise than the table's schema (``_stored_schema``; a column a file lacks, or one the
  table does not know, is a file of an older or newer version, and fine), is *broken*: reads skip it with a
  warning naming it, and it is moved into ``<root>/quarantine/<table>/`` under its own name. A read whose pages
  fail to decode although every footer did finds the file by decoding each whole and sets it aside alike. Only
  the bytes decide: when Polars fails, the file is read whole and decoded in memory, so an I/O error, a missing
  object (a concurrent compaction: list again) or keys that may not read are raised and never move a file;
  a broken file that cannot be moved (read-only keys or file system) stays where it is, skipped. ``quarantined()``
  lists what was set aside (stats report it); ``check()`` (``gil doctor``) decodes every live file whole, and with
  ``repair`` moves the broken ones and puts back quarantined files whose columns cast to the table's types without
  loss. Writes never read old files, so they go on.
* **Errors on object storage** are ``TelemetryError``s naming the table and the location; their text passes
  through ``S3Settings.redact`` and chains no exception that could carry a key. **In a local folder** a failed
  read, listing, write or compaction (a file where a folder should be, a file that cannot be opened) is a
  ``TelemetryError`` naming the table and the store, the ``OSError`` or Polars error as its cause.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl

from gil_core.errors import ConfigurationError, GilError, SchemaViolationError, TelemetryError
from gil_core.storage import Folder, LocalFolder, ObjectFolder, S3Settings, load_s3_settings, location
from gil_core.telemetry._clock import ORDER_KEY, ORDER_KEY_VERSION, HybridClock
from gil_core.telemetry._group import (
    WRITE_ORDER,
    CommitGroup,
    Flusher,
    FlushListener,
    Pending,
    QueuedAppend,
    combined_rejection,
    prepare,
)
from gil_core.telemetry._quarantine import (
    DECODE_ERRORS,
    QUARANTINE,
    FileCheck,
    QuarantinedFile,
    StoreCheck,
    decode_problem,
    footer_rows,
    recovered,
    type_problem,
)
from gil_core.telemetry._rows import call_row, conform, conformable, trace_row
from gil_core.telemetry.records import CallRecord, TraceRecord
from gil_core.telemetry.schemas import COUNTERS, DTYPES, KEYS, TABLES, validate_frame
from gil_core.telemetry.stats import HabitTree, Stats, compute_stats

if TYPE_CHECKING:
    from gil_core.telemetry.energy import EnergyModel

__all__ = ["FileCheck", "QuarantinedFile", "StoreCheck", "TelemetryStore"]

_SEQ = "_seq"
_SUFFIX = ".parquet"
_COMPACTED_SUFFIX = ".compacted.parquet"
_REPLACES = "gil.replaces"
_SEQ_RANGE = "gil.seq_range"
_READ_ATTEMPTS = 20
_WRITTEN_IDS = 200_000  # trace ids ``traced`` keeps of the files this object wrote (~20 MB); past it, it scans
_FOOTER_CHECKS = 8  # footers read at once from an object store
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_T = TypeVar("_T")
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Listing:
    """A table folder's final-named files, sorted: live ones and ones a compaction already replaced."""

    live: tuple[str, ...]
    replaced: tuple[str, ...]
    compacted: frozenset[str]


@dataclass(frozen=True, slots=True)
class _Compacted:
    """What a compacted file's metadata says: the files it replaces and its ``_seq`` range (None: unknown)."""

    replaces: frozenset[str]
    seq_range: tuple[int, int] | None


class TelemetryStore:
    """Telemetry tables under ``root`` (a folder, or an ``s3://bucket/prefix`` string), one folder each;
    implements ``TraceSink``. ``s3`` overrides the ``GIL_S3_*`` settings of an object store; ``clock`` stamps the
    order key (default: a ``HybridClock`` over this machine's clock). See the module doc.
    """

    def __init__(self, root: str | Path, *, s3: S3Settings | None = None, clock: HybridClock | None = None) -> None:
        self._location = location(root)
        self._s3: S3Settings | None = None
        if isinstance(self._location, str):
            settings = self._s3 = s3 if s3 is not None else load_s3_settings()
            bucket = self._location.removeprefix("s3://").split("/", 1)[0]
            self._filesystem = functools.cache(lambda: settings.filesystem(bucket))
        self._folders: dict[str, Folder] = {}
        self._compacted: dict[str, _Compacted] = {}  # compacted file (source) → its metadata (immutable)
        self._clock = clock if clock is not None else HybridClock()
        self._queue_lock = threading.Lock()  # the open group's queue, listeners and rejections
        self._flush_lock = threading.RLock()  # one flush at a time: files of one group precede the next group's
        self._group: CommitGroup | None = None
        self._flusher: Flusher | None = None
        self._rejected: list[SchemaViolationError] = []
        self._sound: set[str] = set()  # files whose footer was checked (or that this object wrote): immutable
        self._unusable: dict[str, str] = {}  # broken files that could not be moved (read-only keys): skipped
        # traces files this object wrote → each trace id in it → its task (see ``traced``), up to a bound of ids
        self._written_traces: dict[str, dict[str, str]] = {}
        self._written_ids = 0

    def __repr__(self) -> str:
        return f"TelemetryStore({str(self._location)!r})"

    @property
    def location(self) -> str | Path:
        """Where the store lives: a local ``Path`` or an ``s3://bucket/prefix`` string."""
        return self._location

    @property
    def root(self) -> Path:
        """The store directory. For an object store this is only its URI as a path: use ``location``."""
        return self._location if isinstance(self._location, Path) else Path(self._location)

    def tables(self) -> tuple[str, ...]:
        """Every table the store holds, in the reference's order (a table never written reads empty)."""
        return tuple(TABLES)

    # -- the sink ---------------------------------------------------------------------------------------

    def record_calls(self, calls: Sequence[CallRecord]) -> None:
        """Append one ``calls`` row per record; returning means they are durable (in a group: queued)."""
        if calls:
            self.append("calls", [call_row(call) for call in calls])

    def record_trace(
        self,
        trace: TraceRecord,
        calls: Sequence[CallRecord] = (),
        *,
        extra_rows: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    ) -> dict[str, Any]:
        """Append the trace, its calls and ``extra_rows`` (other tables' rows of the same request, e.g. its walk's
        counters) as one unit (``append_many``): the calls are written before the trace, so a visible trace
        always has its calls; returning = all durable (in a group: queued, durable once the group flushes).

        Recording a ``trace_id`` again supersedes the earlier row (that is how feedback updates a trace).
        Returns the trace's row as written (JSON columns as text), which a read would give back.
        """
        extra = dict(extra_rows or {})
        if "traces" in extra or "calls" in extra:
            raise TelemetryError("record_trace: extra_rows may not hold traces or calls; pass them as such")
        row = trace_row(trace)
        self.append_many({"calls": [call_row(call) for call in calls], "traces": [row], **extra})
        return row

    # -- generic tables -----------------------------------------------------------------------------------

    def append(self, table: str, rows: Sequence[Mapping[str, Any]] | pl.DataFrame) -> None:
        """Validate ``rows`` against ``table``'s schema and store them as one durable file.

        Unknown columns are rejected, missing nullable columns are filled with null; any violation raises
        ``SchemaViolationError`` naming the table, and nothing is written. No rows, no file. Inside
        ``group_commit`` the rows are queued instead (see there).
        """
        self.append_many({table: rows})

    def append_many(self, tables: Mapping[str, Sequence[Mapping[str, Any]] | pl.DataFrame]) -> None:
        """Append to several tables as one unit: every table is conformed and validated before any is written
        (a violation in one writes none), then each is written as one durable file, in the store's write order
        (``calls`` before ``traces``, whatever the mapping's order). Returning means all are durable.

        Inside ``group_commit`` the unit is typed at once (unknown columns and values of the wrong type raise
        here) and queued; its values are validated when the group flushes, and if any of its rows is rejected
        then, none of its tables' rows are written.
        """
        given: dict[str, Sequence[Mapping[str, Any]] | pl.DataFrame] = {}
        for table, rows in tables.items():
            self._folder(table)  # an unknown table is an error, rows or not
            if isinstance(rows, pl.DataFrame) or rows:  # a frame is validated even when empty
                given[table] = rows
        if not given:
            return
        group = self._group
        if group is not None and self._enqueue(group, given):
            return
        frames = {table: self._validated(table, rows) for table, rows in given.items()}
        for table in WRITE_ORDER:
            frame = frames.get(table)
            if frame is not None and not frame.is_empty():
                self._write(table, frame)

    # -- group commit ---------------------------------------------------------------------------------------

    @contextmanager
    def group_commit(
        self, *, max_rows: int = 1000, max_delay_s: float | None = 0.2, on_flush: FlushListener | None = None
    ) -> Iterator[TelemetryStore]:
        """Within this block, appends from any thread or task are queued, then written as one file per table
        per group: when ``max_rows`` rows are queued, when the oldest queued append has waited ``max_delay_s``
        (both by a background thread; None: never by time, and no thread: the append that reaches ``max_rows``
        writes the group), on ``flush()``, before a ``read``/``scan``/``stats`` of this store object, and on
        leaving the block. An append waits only while the rows not yet durable exceed four groups' ``max_rows``
        (``BACKLOG_GROUPS``), and after a failed flush. See the module doc.

        ``on_flush`` is called after each flush with the rows it made durable, per table, in the thread that
        flushed. A block opened while another is open joins its group (the first block's limits hold); leaving
        any block flushes, and raises ``SchemaViolationError`` for appends the group rejected.
        """
        if max_rows < 1 or (max_delay_s is not None and not max_delay_s > 0):
            raise ConfigurationError(f"group_commit: max_rows ≥ 1 and max_delay_s > 0, got {max_rows}, {max_delay_s}")
        with self._queue_lock:
            group = self._group
            if group is None:
                group = self._group = CommitGroup(max_rows, max_delay_s)
                if max_delay_s is not None:
                    self._flusher = Flusher(group, self._queue_lock, self._flush)
            group.depth += 1
            if on_flush is not None:
                group.listeners.append(on_flush)
        try:
            yield self
        except BaseException:
            self._leave(group, on_flush, quiet=True)
            raise
        self._leave(group, on_flush, quiet=False)

    def flush(self) -> None:
        """Write what an open group has queued, one file per table; return once it is durable. Raises
        ``SchemaViolationError`` naming the appends the group rejected since the last ``flush`` (their rows were
        not written; the others were). Without an open group there is nothing to write."""
        self._flush()
        self._raise_rejected()

    def _enqueue(self, group: CommitGroup, given: Mapping[str, Sequence[Mapping[str, Any]] | pl.DataFrame]) -> bool:
        """Type ``given`` and queue it in ``group``; False if the group closed meanwhile (write it directly)."""
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
            self._flush()
        elif full:
            assert flusher is not None
            flusher.wake()
        return True

    def _flush(self) -> None:
        """Write everything queued (after a flush another thread is doing); put back what could not be written
        and raise. Listeners hear of what was written before the flush lock is released (it is reentrant, so a
        listener may read the store)."""
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

    def _leave(self, group: CommitGroup, on_flush: FlushListener | None, *, quiet: bool) -> None:
        """Leave a ``group_commit`` block: flush (again, if the last block leaves while rows still come in), close
        the group when this was its last block, then raise what failed or was rejected, unless ``quiet`` (the
        block raised: its own exception goes on, and a failed flush is logged)."""
        failure: BaseException | None = None
        while True:
            try:
                self._flush()
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
            self._raise_rejected()

    def _raise_rejected(self) -> None:
        with self._queue_lock:
            rejected, self._rejected = self._rejected, []
        if rejected:
            raise rejected[0] if len(rejected) == 1 else combined_rejection(rejected)

    def read(self, table: str) -> pl.DataFrame:
        """The current rows (last write per key wins) in write order; empty, with the schema, if none. What an
        open group of this store object has queued is flushed first."""
        folder = self._folder(table)
        self._flush()
        return self._guarded(table, "read", lambda: self._read(table, folder))

    def scan(self, table: str) -> pl.LazyFrame:
        """A lazy view of ``read(table)`` over the files present now (see the module doc on compaction), after
        flushing what an open group of this store object has queued."""
        folder = self._folder(table)
        self._flush()
        return self._guarded(table, "scan", lambda: self._scan(table, folder))

    def traced(self, task: str, trace_ids: Iterable[str]) -> set[str]:
        """Which of ``trace_ids`` the store holds a trace of ``task`` for (its newest row says ``task``), after
        flushing what an open group of this object queued. When this object wrote every live file of the table
        (a long-lived batch process) that is answered from what it wrote, reading nothing; otherwise by a scan
        (``rescanning``)."""
        wanted = list(trace_ids)
        if not wanted:
            return set()
        folder = self._folder("traces")
        self._flush()
        newest = self._guarded("traces", "list", lambda: self._as_written(folder))
        if newest is not None:
            return {trace_id for trace_id in wanted if newest.get(trace_id) == task}
        found = self.rescanning(
            lambda: (
                self.scan("traces")
                .filter((pl.col("task") == task) & pl.col("trace_id").is_in(wanted))
                .select("trace_id")
                .collect()
            )
        )
        return set(found["trace_id"].to_list())

    def _as_written(self, folder: Folder) -> dict[str, str] | None:
        """Each trace id of the table → the task of its newest row, from what this object wrote; None when a live
        file is not one it wrote (or noted), or the files are not in write order (``_plan`` sorts then)."""
        live = self._list("traces", folder, checked=True).live
        written = [self._written_traces.get(str(folder.source(name))) for name in live]
        if any(ids is None for ids in written) or not self._in_write_order(folder, live):
            return None
        newest: dict[str, str] = {}
        for ids in written:  # in read order: the last row of a trace id wins, as ``_last_per_key`` has it
            assert ids is not None
            newest.update(ids)
        return newest

    def rescanning(self, read: Callable[[], _T]) -> _T:
        """``read()``, a function that scans and collects, run again while a compaction deletes a file its scan
        planned over before the collect (``FileNotFoundError``; see the module doc), up to the attempts ``read``
        makes itself; then ``TelemetryError``."""
        for _ in range(_READ_ATTEMPTS):
            try:
                return read()
            except FileNotFoundError as exc:
                _log.debug("%s went while a scan was being collected: scanning again", exc.filename or exc)
            except (OSError, pl.exceptions.PolarsError) as exc:  # a collect that failed otherwise: not a race
                raise _local_error(f"the store at {self._location}", "collect a scan", exc) from exc
        raise TelemetryError(f"the store at {self.root}: no scan survived {_READ_ATTEMPTS} concurrent compactions")

    def compact(self, table: str) -> int:
        """Merge the table's files into one; return how many files it replaced (0: nothing to do, or another
        compactor holds the table on object storage).

        Also deletes files that an earlier, interrupted compaction had already replaced, and temporary files
        of writers that died more than an hour ago.
        """
        folder = self._folder(table)
        return self._guarded(table, "compact", lambda: self._compact(table, folder))

    def stats(self, task: str, window: int, pricing: EnergyModel | None = None, tree: HabitTree | None = None) -> Stats:
        """What the log says about ``task``: accuracy per mode, habit and memory rates, cost per ``window``
        requests (chat calls repriced with ``pricing`` when given) and misroutes (with ``tree``); see
        ``telemetry.stats.compute_stats``."""
        self._flush()

        def run() -> Stats:
            try:
                return compute_stats(self, task, window=window, pricing=pricing, tree=tree)
            except DECODE_ERRORS:  # a page that does not decode although its footer did: set its file aside
                found = [self._set_aside_undecodable(t, self._folder(t)) for t in ("traces", "calls")]
                if not any(found):
                    raise
            return compute_stats(self, task, window=window, pricing=pricing, tree=tree)

        return self._guarded("traces", "compute stats", lambda: self.rescanning(run))

    # -- internals ------------------------------------------------------------------------------------------

    def side_folder(self, *parts: str) -> Folder:
        """A folder of files kept beside the tables, under ``<root>/<parts…>`` (e.g. the learned judge's fitted
        states): written and listed like a table's folder (atomic files, the same object-store settings), never
        read as a table. Each part is a plain name (letters, digits, ``_ . -``; not ``.``/``..``, not a table's
        name first), so nothing lands outside the store."""
        if (
            not parts
            or parts[0] in TABLES
            or any(not _PLAIN_NAME.fullmatch(part) or set(part) == {"."} for part in parts)
        ):
            raise TelemetryError(f"not a side folder of the store: {'/'.join(parts)!r}")
        key = "/".join(parts)
        folder = self._folders.get(key)
        if folder is None:
            if isinstance(self._location, Path):
                folder = LocalFolder(self._location.joinpath(*parts))
            else:
                assert self._s3 is not None
                folder = ObjectFolder(f"{self._location}/{key}", self._s3, self._filesystem)
            self._folders[key] = folder
        return folder

    def _folder(self, table: str) -> Folder:
        if table not in TABLES:
            raise TelemetryError(f"unknown table {table!r}; tables are {', '.join(TABLES)}")
        folder = self._folders.get(table)
        if folder is None:
            if isinstance(self._location, Path):
                folder = LocalFolder(self._location / table)
            else:
                assert self._s3 is not None
                folder = ObjectFolder(f"{self._location}/{table}", self._s3, self._filesystem)
            self._folders[table] = folder
        return folder

    def _guarded(self, table: str, what: str, run: Callable[[], _T]) -> _T:
        """``run()``; on object storage a failure becomes a ``TelemetryError`` whose text holds no key. In a local
        folder a file system or Polars failure (a file or folder in the way, a read that fails) becomes one naming
        the table and the store, the library's exception as its cause."""
        if self._s3 is None:
            try:
                return run()
            except (OSError, pl.exceptions.PolarsError) as exc:
                raise _local_error(f"table {table!r} at {self._location}", what, exc) from exc
        try:
            return run()
        except GilError:
            raise
        except Exception as exc:
            reason = self._s3.describe(exc)
        # Raised outside the handler, so no chained exception carries the library's unredacted text.
        raise TelemetryError(f"table {table!r} at {self._location}: could not {what} ({reason})")

    def _validated(self, table: str, rows: Sequence[Mapping[str, Any]] | pl.DataFrame) -> pl.DataFrame:
        frame = conform(table, rows)
        validate_frame(table, frame)
        return frame

    def _write(self, table: str, frame: pl.DataFrame) -> None:
        """Store a validated frame as one durable file (the last row per key of a keyed table)."""
        key = KEYS.get(table)
        if key and frame.height > 1:
            frame = frame.unique(subset=list(key), keep="last", maintain_order=True)
        seq = self._clock.now()
        stamped = frame.hstack([pl.Series(_SEQ, [seq] * frame.height, dtype=pl.Int64)])
        folder = self._folder(table)
        name = _file_name(seq, _SUFFIX)
        metadata = {ORDER_KEY: ORDER_KEY_VERSION}
        write = functools.partial(folder.write_parquet, name, stamped, metadata=metadata)
        if self._s3 is not None:
            self._guarded(table, "append", write)
        else:
            try:
                write()
            except OSError as exc:  # the temporary file is gone, nothing partial is left
                raise _write_error(table, folder, exc) from exc
        source = str(folder.source(name))
        self._sound.add(source)
        if table == "traces" and self._written_ids + frame.height <= _WRITTEN_IDS:
            ids = stamped.get_column("trace_id").to_list()
            self._written_traces[source] = dict(zip(ids, stamped.get_column("task").to_list(), strict=True))
            self._written_ids += len(ids)

    def _read(self, table: str, folder: Folder) -> pl.DataFrame:
        for _ in range(_READ_ATTEMPTS):
            try:
                listing = self._list(table, folder)
                try:
                    frame = self._plan(table, folder, listing.live, keep_seq=False).collect()
                except DECODE_ERRORS:
                    if self._set_aside_undecodable(table, folder, listing.live):
                        continue  # a file's pages did not decode although its footer did: it is set aside now
                    raise
                if self._list(table, folder).compacted <= listing.compacted:
                    return frame
            except FileNotFoundError as exc:  # a compaction removed a file between our listing and our read
                _log.debug("table %r: %s went while it was being read: listing again", table, exc.filename or exc)
        raise TelemetryError(f"table {table!r}: could not get a stable listing of {folder.where}")

    def _scan(self, table: str, folder: Folder) -> pl.LazyFrame:
        for _ in range(_READ_ATTEMPTS):
            try:
                return self._plan(table, folder, self._list(table, folder, checked=True).live, keep_seq=False)
            except FileNotFoundError:
                pass
        raise TelemetryError(f"table {table!r}: could not get a stable listing of {folder.where}")

    def _compact(self, table: str, folder: Folder) -> int:
        with folder.claim() as claim:
            if not claim.held:
                return 0
            listing = self._list(table, folder)
            folder.remove(listing.replaced)
            folder.remove_stale_temporary_files()
            sources = listing.live
            while True:
                if len(sources) < 2:
                    return 0
                try:
                    merged = self._plan(table, folder, sources, keep_seq=True).collect()
                    break
                except FileNotFoundError:
                    return 0  # a reader set a broken file aside meanwhile: the next compaction goes on
                except DECODE_ERRORS:
                    if not self._set_aside_undecodable(table, folder, sources):
                        raise
                sources = self._list(table, folder).live  # without the files just set aside
            if not claim.fresh():
                return 0  # too slow: another compactor may take the table over, so leave it as it is
            seq = merged.get_column(_SEQ)
            seq_range = (seq.min(), seq.max()) if merged.height and not seq.has_nulls() else None
            # Older files' wall-clock stamps are kept as they are (see ``_clock``): the merged file is version 1.
            metadata = {_REPLACES: json.dumps(sources), ORDER_KEY: ORDER_KEY_VERSION}
            if seq_range is not None:
                metadata[_SEQ_RANGE] = json.dumps(seq_range)
            name = _file_name(self._clock.now(), _COMPACTED_SUFFIX)
            folder.write_parquet(name, merged, metadata=metadata)
            self._sound.add(str(folder.source(name)))
            self._compacted[str(folder.source(name))] = _Compacted(frozenset(sources), _int_pair(seq_range))
            folder.remove(sources)
            return len(sources)

    def _list(self, table: str, folder: Folder, *, checked: bool = False) -> _Listing:
        """The folder's files, less the broken ones known (and a compacted file whose metadata does not decode:
        set aside), and the files a compacted file replaces. ``checked``: every live file's footer is checked
        first (see ``_usable``), for a scan, which its caller collects; a read or a compaction collects itself and
        finds a broken file when that fails (``_set_aside_undecodable``)."""
        sources = {name: str(folder.source(name)) for name in folder.names()}
        self._forget_gone(folder, set(sources.values()))
        names = [name for name, source in sources.items() if source not in self._unusable]
        compacted: set[str] = set()
        replaced: set[str] = set()
        for name in names:
            if name.endswith(_COMPACTED_SUFFIX) and (known := self._compacted_file(table, folder, name)) is not None:
                compacted.add(name)
                replaced |= known.replaces
        names = [name for name in names if name in compacted or not name.endswith(_COMPACTED_SUFFIX)]
        self._observe(table, folder, names)
        live = [name for name in names if name not in replaced]
        return _Listing(
            live=tuple(self._usable(table, folder, live) if checked else live),
            replaced=tuple(name for name in names if name in replaced),
            compacted=frozenset(compacted),
        )

    def _observe(self, table: str, folder: Folder, names: Sequence[str]) -> None:
        """Advance the clock past every stamp these listed files hold (see the module doc, "The order key"): a
        file's name starts with its stamp, a compacted file's metadata gives the range of the rows it holds."""
        highest = 0
        for name in names:
            if name.endswith(_COMPACTED_SUFFIX):
                known = self._compacted_file(table, folder, name)  # read again if another listing forgot it
                span = known.seq_range if known is not None else None
                if span is not None:
                    highest = max(highest, span[1])
            head = name.split("-", 1)[0]
            if head.isdigit():
                highest = max(highest, int(head))
        if highest:
            self._clock.observe(highest)

    def _forget_gone(self, folder: Folder, here: set[str]) -> None:
        """Forget what this object knows of the folder's files that are gone (a compaction deleted them): the
        footers checked, compacted files' metadata and broken files skipped are kept per file, so a long-lived
        store would hold an entry for every file it ever saw (a soak process saw ~9,000 over 50,000 requests: a
        MiB or two). Another thread may add an entry meanwhile and lose it here: it is read again when needed."""
        prefix = str(folder.source("\0"))[:-1]  # the folder's own files (``here``, as listed): the name appended
        caches = (self._sound, self._compacted, self._unusable, self._written_traces)
        known = [key for cache in caches for key in list(cache)]
        for key in {key for key in known if key.startswith(prefix)} - here:
            self._sound.discard(key)
            self._compacted.pop(key, None)
            self._unusable.pop(key, None)
            ids = self._written_traces.pop(key, None)
            if ids is not None:
                self._written_ids -= len(ids)

    def _compacted_file(self, table: str, folder: Folder, name: str) -> _Compacted | None:
        """What a compacted file's metadata says; None when it does not decode (the file is set aside then)."""
        source = folder.source(name)
        known = self._compacted.get(str(source))
        if known is None:
            try:
                metadata = pl.read_parquet_metadata(source, storage_options=folder.storage_options)
            except DECODE_ERRORS:
                problem = decode_problem(folder.read_bytes(name), _stored_schema(table), whole=False)
                if problem is None:
                    raise  # the bytes decode: the read failed, not the file
                self._set_aside(table, folder, name, problem)
                return None
            seq_range = json.loads(metadata[_SEQ_RANGE]) if _SEQ_RANGE in metadata else None
            known = _Compacted(frozenset(json.loads(metadata.get(_REPLACES, "[]"))), _int_pair(seq_range))
            self._compacted[str(source)] = known
        return known

    # -- files that do not decode -------------------------------------------------------------------------

    def _usable(self, table: str, folder: Folder, names: Sequence[str]) -> list[str]:
        """``names`` without the broken files: each file's footer is checked once per store object (files never
        change), and one that does not decode or types a column otherwise than the table is set aside. A read
        that fails is raised as it is (``FileNotFoundError``: the file went, list again)."""
        known = self._sound | self._unusable.keys()
        unchecked = [name for name in names if str(folder.source(name)) not in known]
        check = functools.partial(self._footer_problem, table, folder)
        if len(unchecked) > 1 and self._s3 is not None:  # a request each: in parallel (Polars lets go of the GIL)
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
                    self._set_aside(table, folder, name, problem)
                    continue
                self._sound.add(source)
            if source not in self._unusable:
                usable.append(name)
        return usable

    def _footer_problem(self, table: str, folder: Folder, name: str) -> str | None:
        """What the file's footer says is wrong with it as a file of ``table`` (None: nothing)."""
        expected = _stored_schema(table)
        try:
            return type_problem(self._scan_files(table, folder, [name], typed=False).collect_schema(), expected)
        except DECODE_ERRORS:
            # Polars could not read the footer; the file's own bytes say whether it is broken or the read failed
            # (a failed read raises here, and nothing is moved).
            return decode_problem(folder.read_bytes(name), expected, whole=False)

    def _set_aside_undecodable(self, table: str, folder: Folder, names: Sequence[str] | None = None) -> bool:
        """After a read of ``names`` (default: the live files) failed to decode: set aside the broken ones, found
        by their footers (cheap, and enough for all but a page that does not decode), else by decoding each file
        on its own and whole. Whether any was (if none, the failure was not a file's: raise it)."""
        names = self._list(table, folder).live if names is None else names
        usable = self._usable(table, folder, names)
        if len(usable) < len(names):
            return True
        found = False
        for name in usable:
            try:
                self._scan_files(table, folder, [name]).collect()
                continue
            except DECODE_ERRORS:
                problem = decode_problem(folder.read_bytes(name), _stored_schema(table), whole=True)
            if problem is not None:
                self._set_aside(table, folder, name, problem)
                found = True
        return found

    def _set_aside(self, table: str, folder: Folder, name: str, problem: str) -> None:
        """Move a broken file into the quarantine folder beside the table, and warn; a file that cannot be moved
        (read-only keys or file system) stays where it is, skipped by this store object's reads."""
        source = str(folder.source(name))
        self._sound.discard(source)
        target = self.side_folder(QUARANTINE, table)
        try:
            folder.move_into(name, target)
        except FileNotFoundError:
            return  # moved by another reader (or replaced by a compaction) meanwhile
        except Exception as exc:
            why = self._s3.describe(exc) if self._s3 is not None else f"{type(exc).__name__}: {exc}"
            self._unusable[source] = problem
            _log.warning(
                "table %r: %s is broken (%s): reads skip it; it could not be moved into %s (%s)",
                table, source, problem, target.where, why,
            )  # fmt: skip
            return
        _log.warning("table %r: %s is broken (%s): reads skip it; moved into %s", table, source, problem, target.where)

    def quarantined(self) -> tuple[QuarantinedFile, ...]:
        """The files set aside in the quarantine folder, with the rows their footers say they hold (None when the
        footer does not read) and what the footer says is wrong."""
        folder = self.side_folder(QUARANTINE)

        def run() -> tuple[QuarantinedFile, ...]:
            found = []
            for path in folder.walk():
                table, _, name = path.partition("/")
                if table in TABLES and name and "/" not in name:
                    found.append(self._quarantined_file(table, name))
            return tuple(found)

        return self._guarded(QUARANTINE, "list", run)

    def _quarantined_file(self, table: str, name: str) -> QuarantinedFile:
        folder = self.side_folder(QUARANTINE, table)
        data = folder.read_bytes(name)
        problem = decode_problem(data, _stored_schema(table), whole=False)
        reason = problem or "its footer and types read: a full check (gil doctor) says more"
        return QuarantinedFile(table, name, str(folder.source(name)), footer_rows(data), reason)

    def check(self, *, repair: bool = False) -> StoreCheck:
        """Decode every live file of every table whole (not only its footer) and list what quarantine holds.

        With ``repair``, the broken files found are moved into quarantine, and a quarantined file is put back
        under its own name where it can be: every page decodes, each mistyped column casts to the table's type
        and back without loss, and the rows fit the table's schema. Without it nothing is moved."""
        self._flush()
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
                    self._set_aside(table, folder, name, problem)
                    moved = str(folder.source(name)) not in self._unusable
                    note = None if moved else "it could not be moved (see the log)"
                broken.append(FileCheck(table, name, problem, moved, note))
        restored = self._restore_quarantined() if repair else ()
        return StoreCheck(checked, tuple(broken), restored, self.quarantined())

    def _whole_file_problem(self, table: str, folder: Folder, name: str) -> str | None:
        expected = _stored_schema(table)
        try:
            self._scan_files(table, folder, [name]).collect()  # a column typed otherwise fails here too
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
        quarantine = self.side_folder(QUARANTINE, item.table)
        try:
            frame, metadata = recovered(item.table, quarantine.read_bytes(item.name), _stored_schema(item.table))
        except ValueError:
            return False
        folder = self._folder(item.table)
        folder.write_parquet(item.name, frame, metadata=metadata)
        quarantine.remove([item.name])
        self._unusable.pop(str(folder.source(item.name)), None)
        self._sound.add(str(folder.source(item.name)))
        _log.warning("table %r: %s put back from quarantine", item.table, item.name)
        return True

    def _in_write_order(self, folder: Folder, files: Sequence[str]) -> bool:
        """Whether ``files`` (as listed) read in this order give their rows in ``_seq`` order (ties in read
        order)."""
        highest: int | None = None
        for name in files:
            if name.endswith(_COMPACTED_SUFFIX):
                known = self._compacted.get(str(folder.source(name)))  # read when the folder was listed
                span = known.seq_range if known is not None else None  # (None: forgotten since: sort instead)
            else:
                head = name.split("-", 1)[0]
                span = (int(head), int(head)) if head.isdigit() else None
            if span is None or (highest is not None and span[0] < highest):
                return False
            highest = span[1] if highest is None else max(highest, span[1])
        return True

    def _scan_files(self, table: str, folder: Folder, names: Sequence[str], *, typed: bool = True) -> pl.LazyFrame:
        """A scan of these files as the table's schema types them (``typed=False``: as their footer types them)."""
        sources: list[Any] = [folder.source(name) for name in names]
        if not typed:
            return pl.scan_parquet(sources, glob=False, storage_options=folder.storage_options)
        return pl.scan_parquet(
            sources,
            schema=_stored_schema(table),
            glob=False,
            missing_columns="insert",  # files written before a column was added
            extra_columns="ignore",  # files written by a newer version
            storage_options=folder.storage_options,
        )

    def _plan(self, table: str, folder: Folder, files: Sequence[str], *, keep_seq: bool) -> pl.LazyFrame:
        dtypes = DTYPES[table]
        if not files:
            return pl.LazyFrame(schema=dtypes if not keep_seq else {**dtypes, _SEQ: pl.Int64})

        def scan(names: Sequence[str]) -> pl.LazyFrame:
            return self._scan_files(table, folder, names)

        key = KEYS.get(table)
        if not self._in_write_order(folder, files):
            frame = scan(files).sort(_SEQ, maintain_order=True)
            if key:
                frame = _last_per_key(frame, key)
        elif key and len(files) == 1:
            frame = scan(files)  # one file holds each key once (append and compact both see to it)
        elif key and files[0].endswith(_COMPACTED_SUFFIX):
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
        return frame if keep_seq else frame.drop(_SEQ)


def _write_error(table: str, folder: Folder, exc: OSError) -> TelemetryError:
    """A failed local write as an error naming the table and folder; a full disk (or quota) says so, and what to
    do: nothing was written, no partial file is left."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        name = "ENOSPC" if exc.errno == errno.ENOSPC else "EDQUOT"
        return TelemetryError(
            f"table {table!r} at {folder.where}: no space left on the device ({name}): "
            "these rows were not written and no partial file is left; free space, then write again"
        )
    return TelemetryError(f"table {table!r} at {folder.where}: could not append ({type(exc).__name__}: {exc})")


def _local_error(where: str, what: str, exc: Exception) -> TelemetryError:
    """A failed local read, listing or compaction as an error naming ``where`` (the table and the store) and
    what it could not do; the library's text says which file."""
    return TelemetryError(f"{where}: could not {what} ({type(exc).__name__}: {exc})")


def _stored_schema(table: str) -> dict[str, pl.DataType]:
    """The columns a stored file of ``table`` holds, typed: the table's, and the store's own order key. A file may
    lack some (written before they were added) or hold others (written by a newer version); a column typed
    otherwise makes the file one no version of the table wrote (set aside, see ``_usable``)."""
    return {**DTYPES[table], _SEQ: pl.Int64()}


def _last_per_key(frame: pl.LazyFrame, key: Sequence[str]) -> pl.LazyFrame:
    """The last row per key, in read order. Not sort + unique: a grouped max of the row index, ~0.7 s less CPU
    per million rows (BENCHMARKS.md, "Stats over a large store")."""
    row = "_row"
    return frame.with_row_index(row).filter(pl.col(row) == pl.col(row).max().over(list(key))).drop(row)


def _int_pair(values: Sequence[Any] | None) -> tuple[int, int] | None:
    return (int(values[0]), int(values[1])) if values is not None else None


def _sum_counters(table: str, frame: pl.LazyFrame) -> pl.LazyFrame:
    """One row per key: increments summed, ``max`` columns maximised; keys in order of first write."""
    key, summed, maximised = COUNTERS[table]
    aggregations = [pl.col(name).sum() for name in summed] + [pl.col(name).max() for name in maximised]
    return (
        frame.group_by(list(key), maintain_order=True)
        .agg(*aggregations, pl.col(_SEQ).min())
        .select(*DTYPES[table].names(), _SEQ)
    )


# -- files ------------------------------------------------------------------------------------------------


def _file_name(seq: int, suffix: str) -> str:
    # time first so names sort in write order; pid and randomness so concurrent writers never collide
    return f"{seq:020d}-{os.getpid()}-{secrets.token_hex(6)}{suffix}"
