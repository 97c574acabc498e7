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
* **Group commit**: ``_group`` (appends queued, one file per table per group, acknowledged once flushed).
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
* **Reading without sorting**: ``_files`` (rows come back in write order without a sort when the names say so).
* **Compaction.** ``compact(table)`` merges a folder's files into one, one compactor at a time (locally a
  ``filelock.FileLock`` on ``.compact.lock`` in the folder; on object storage a claim object, see
  ``storage.ObjectFolder.claim``: a compactor that finds another one at work does nothing and returns 0).
  The merged ``<ns>-<pid>-<random>.compacted.parquet`` (``ns``: its newest row's order key, so files appended
  meanwhile, which stay live, list after it and reads stay in write order) keeps the winning row per key and
  lists the files it replaces in its Parquet metadata (``gil.replaces``). It is written atomically as above, THEN
  the sources are deleted. Readers ignore every file a present compacted file names, so no row is seen twice or
  missed, even if the compactor dies between the write and the deletes (the next compaction deletes those).
* **Reading during compaction.** ``read`` retries when a listed file vanished before it was read, or when
  a compacted file appeared while it was reading (a listing is not a snapshot: one taken during a
  compaction's write-then-delete could miss both the sources and their replacement). ``scan`` plans over
  the files present when it is called; if a compaction deletes one before ``collect()``, collect raises
  ``FileNotFoundError``: scan again.
* **Files that do not decode** are set aside in ``<root>/quarantine/<table>/``: ``_quarantine``'s module doc.
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
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl

from gil_core.errors import ConfigurationError, GilError, TelemetryError
from gil_core.storage import Folder, LocalFolder, ObjectFolder, S3Settings, load_s3_settings, location
from gil_core.telemetry._clock import ORDER_KEY, ORDER_KEY_VERSION, HybridClock
from gil_core.telemetry._files import (
    COMPACTED_SUFFIX,
    REPLACES,
    SEQ,
    SEQ_RANGE,
    SUFFIX,
    Compacted,
    Listing,
    file_name,
    in_write_order,
    int_pair,
    plan,
    stored_schema,
)
from gil_core.telemetry._group import WRITE_ORDER, FlushListener, GroupCommits
from gil_core.telemetry._quarantine import (
    DECODE_ERRORS,
    FileCheck,
    FileChecks,
    QuarantinedFile,
    StoreCheck,
    decode_problem,
)
from gil_core.telemetry._rows import call_row, conform, trace_row
from gil_core.telemetry._written import WrittenTraces
from gil_core.telemetry.records import CallRecord, TraceRecord
from gil_core.telemetry.schemas import KEYS, TABLES, validate_frame
from gil_core.telemetry.stats import HabitTree, Stats, compute_stats

if TYPE_CHECKING:
    from gil_core.telemetry.energy import EnergyModel

__all__ = ["FileCheck", "QuarantinedFile", "StoreCheck", "TelemetryStore"]

_READ_ATTEMPTS = 20
# Files this object writes to a table without listing it before it lists the table's names once, to forget those a
# compaction deleted (a batch process writes ``calls`` on every group commit and never reads it).
_WRITES_BEFORE_FORGETTING = 200
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_T = TypeVar("_T")
_log = logging.getLogger(__name__)


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
        self._compacted: dict[str, Compacted] = {}  # compacted file (source) → its metadata (immutable)
        self._clock = clock if clock is not None else HybridClock()
        self._commits = GroupCommits(self._write)
        self._checks = FileChecks(
            folder=self._folder,
            side_folder=self.side_folder,
            guarded=self._guarded,
            describe=self._s3.describe if self._s3 is not None else None,
        )
        self._written = WrittenTraces()  # the trace ids of the traces files this object wrote (``traced``)
        self._unlisted_writes: dict[str, int] = {}  # per table: files written since this object last listed it

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
        if self._commits.enqueue(given):
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
        group = self._commits.enter(max_rows, max_delay_s, on_flush)
        try:
            yield self
        except BaseException:
            self._commits.leave(group, on_flush, quiet=True)
            raise
        self._commits.leave(group, on_flush, quiet=False)

    def flush(self) -> None:
        """Write what an open group has queued, one file per table; return once it is durable. Raises
        ``SchemaViolationError`` naming the appends the group rejected since the last ``flush`` (their rows were
        not written; the others were). Without an open group there is nothing to write."""
        self._commits.flush()
        self._commits.raise_rejected()

    def read(self, table: str) -> pl.DataFrame:
        """The current rows (last write per key wins) in write order; empty, with the schema, if none. What an
        open group of this store object has queued is flushed first."""
        folder = self._folder(table)
        self._commits.flush()
        return self._guarded(table, "read", lambda: self._read(table, folder))

    def scan(self, table: str, *, only: Mapping[str, Collection[Any]] | None = None) -> pl.LazyFrame:
        """A lazy view of ``read(table)`` over the files present now (see the module doc on compaction), after
        flushing what an open group of this store object has queued. ``only`` ({key column: values}): those keys'
        rows, each file filtered as it is read, so a lookup of a few keys holds only their rows (``plan``)."""
        folder = self._folder(table)
        self._commits.flush()
        return self._guarded(table, "scan", lambda: self._scan(table, folder, only))

    def traced(self, task: str, trace_ids: Iterable[str]) -> set[str]:
        """Which of ``trace_ids`` the store holds a trace of ``task`` for (its newest row says ``task``), after
        flushing what an open group of this object queued. When this object wrote every live file of the table
        (a long-lived batch process) that is answered from what it wrote, reading nothing; otherwise by a scan
        (``rescanning``)."""
        wanted = list(trace_ids)
        if not wanted:
            return set()
        folder = self._folder("traces")
        self._commits.flush()
        newest = self._guarded("traces", "list", lambda: self._as_written(folder))
        if newest is not None:
            return {trace_id for trace_id in wanted if newest.get(trace_id) == task}
        found = self.rescanning(
            lambda: (
                self.scan("traces", only={"trace_id": wanted})
                .filter(pl.col("task") == task)
                .select("trace_id")
                .collect()
            )
        )
        return set(found["trace_id"].to_list())

    def _as_written(self, folder: Folder) -> dict[str, str] | None:
        """Each trace id of the table → the task of its newest row, from what this object wrote; None when a live
        file is not one it wrote (or noted), or the files are not in write order (``_plan`` sorts then)."""
        live = self._list("traces", folder, checked=True).live
        if not in_write_order(folder, live, self._compacted):
            return None
        return self._written.newest([str(folder.source(name)) for name in live])

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
        self._commits.flush()

        def run() -> Stats:
            try:
                return compute_stats(self, task, window=window, pricing=pricing, tree=tree)
            except DECODE_ERRORS:  # a page that does not decode although its footer did: set its file aside
                found = [self._set_aside_undecodable(table) for table in ("traces", "calls")]
                if not any(found):
                    raise
            return compute_stats(self, task, window=window, pricing=pricing, tree=tree)

        return self._guarded("traces", "compute stats", lambda: self.rescanning(run))

    def _set_aside_undecodable(self, table: str) -> bool:
        """After a read of ``table`` failed to decode: set aside its broken live files (``FileChecks``); whether any
        was."""
        folder = self._folder(table)
        return self._checks.set_aside_undecodable(table, folder, self._list(table, folder).live)

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
        return self._folder_at(*parts)

    def _folder(self, table: str) -> Folder:
        if table not in TABLES:
            raise TelemetryError(f"unknown table {table!r}; tables are {', '.join(TABLES)}")
        return self._folder_at(table)

    def _folder_at(self, *parts: str) -> Folder:
        """The folder ``<root>/<parts…>``, made once per store object (names checked by the callers)."""
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
        stamped = frame.hstack([pl.Series(SEQ, [seq] * frame.height, dtype=pl.Int64)])
        folder = self._folder(table)
        name = file_name(seq, SUFFIX)
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
        self._checks.sound.add(source)
        self._unlisted_writes[table] = self._unlisted_writes.get(table, 0) + 1
        if self._unlisted_writes[table] >= _WRITES_BEFORE_FORGETTING:  # a listing forgets the files gone
            self._unlisted_writes[table] = 0
            with suppress(TelemetryError):  # housekeeping: a listing that fails waits for the next time
                self._guarded(table, "list", lambda: self._list(table, folder))
        if table == "traces":
            self._written.note(source, frame)

    def _read(self, table: str, folder: Folder) -> pl.DataFrame:
        for _ in range(_READ_ATTEMPTS):
            try:
                listing = self._list(table, folder)
                try:
                    frame = plan(table, folder, listing.live, self._compacted, keep_seq=False).collect()
                except DECODE_ERRORS:
                    if self._checks.set_aside_undecodable(table, folder, listing.live):
                        continue  # a file's pages did not decode although its footer did: it is set aside now
                    raise
                if self._list(table, folder).compacted <= listing.compacted:
                    return frame
            except FileNotFoundError as exc:  # a compaction removed a file between our listing and our read
                _log.debug("table %r: %s went while it was being read: listing again", table, exc.filename or exc)
        raise TelemetryError(f"table {table!r}: could not get a stable listing of {folder.where}")

    def _scan(self, table: str, folder: Folder, only: Mapping[str, Collection[Any]] | None = None) -> pl.LazyFrame:
        for _ in range(_READ_ATTEMPTS):
            try:
                live = self._list(table, folder, checked=True).live
                return plan(table, folder, live, self._compacted, keep_seq=False, only=only)
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
                    merged = plan(table, folder, sources, self._compacted, keep_seq=True).collect()
                    break
                except FileNotFoundError:
                    return 0  # a reader set a broken file aside meanwhile: the next compaction goes on
                except DECODE_ERRORS:
                    if not self._checks.set_aside_undecodable(table, folder, sources):
                        raise
                sources = self._list(table, folder).live  # without the files just set aside
            if not claim.fresh():
                return 0  # too slow: another compactor may take the table over, so leave it as it is
            seq = merged.get_column(SEQ)
            span = int_pair([seq.min(), seq.max()]) if merged.height and not seq.has_nulls() else None
            # Older files' wall-clock stamps are kept as they are (see ``_clock``): the merged file is version 1.
            metadata = {REPLACES: json.dumps(sources), ORDER_KEY: ORDER_KEY_VERSION}
            if span is not None:
                metadata[SEQ_RANGE] = json.dumps(span)
            # Named by its newest row (module doc, "Compaction"), so the files appended while it merged list after it.
            name = file_name(span[1] if span is not None else self._clock.now(), COMPACTED_SUFFIX)
            folder.write_parquet(name, merged, metadata=metadata)
            self._checks.sound.add(str(folder.source(name)))
            self._compacted[str(folder.source(name))] = Compacted(frozenset(sources), span)
            folder.remove(sources)
            return len(sources)

    def _list(self, table: str, folder: Folder, *, checked: bool = False) -> Listing:
        """The folder's files, less the broken ones known (and a compacted file whose metadata does not decode:
        set aside), and the files a compacted file replaces. ``checked``: every live file's footer is checked
        first (see ``FileChecks.usable``), for a scan, which its caller collects; a read or a compaction collects
        itself and finds a broken file when that fails (``FileChecks.set_aside_undecodable``)."""
        sources = {name: str(folder.source(name)) for name in folder.names()}
        self._unlisted_writes[table] = 0
        self._forget_gone(folder, set(sources.values()))
        names = [name for name, source in sources.items() if source not in self._checks.unusable]
        compacted: set[str] = set()
        replaced: set[str] = set()
        for name in names:
            if name.endswith(COMPACTED_SUFFIX) and (known := self._compacted_file(table, folder, name)) is not None:
                compacted.add(name)
                replaced |= known.replaces
        names = [name for name in names if name in compacted or not name.endswith(COMPACTED_SUFFIX)]
        self._observe(table, folder, names)
        live = [name for name in names if name not in replaced]
        return Listing(
            live=tuple(self._checks.usable(table, folder, live) if checked else live),
            replaced=tuple(name for name in names if name in replaced),
            compacted=frozenset(compacted),
        )

    def _observe(self, table: str, folder: Folder, names: Sequence[str]) -> None:
        """Advance the clock past every stamp these listed files hold (see the module doc, "The order key"): a
        file's name starts with its stamp, a compacted file's metadata gives the range of the rows it holds."""
        highest = 0
        for name in names:
            if name.endswith(COMPACTED_SUFFIX):
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
        caches = (self._checks.sound, self._compacted, self._checks.unusable)
        known = [key for cache in caches for key in list(cache)] + self._written.sources()
        for key in {key for key in known if key.startswith(prefix)} - here:
            self._checks.sound.discard(key)
            self._compacted.pop(key, None)
            self._checks.unusable.pop(key, None)
            self._written.forget(key)

    def _compacted_file(self, table: str, folder: Folder, name: str) -> Compacted | None:
        """What a compacted file's metadata says; None when it does not decode (the file is set aside then)."""
        source = folder.source(name)
        known = self._compacted.get(str(source))
        if known is None:
            try:
                metadata = pl.read_parquet_metadata(source, storage_options=folder.storage_options)
            except DECODE_ERRORS:
                problem = decode_problem(folder.read_bytes(name), stored_schema(table), whole=False)
                if problem is None:
                    raise  # the bytes decode: the read failed, not the file
                self._checks.set_aside(table, folder, name, problem)
                return None
            seq_range = json.loads(metadata[SEQ_RANGE]) if SEQ_RANGE in metadata else None
            known = Compacted(frozenset(json.loads(metadata.get(REPLACES, "[]"))), int_pair(seq_range))
            self._compacted[str(source)] = known
        return known

    # -- files that do not decode -------------------------------------------------------------------------

    def quarantined(self) -> tuple[QuarantinedFile, ...]:
        """The files set aside in the quarantine folder, with the rows their footers say they hold (None when the
        footer does not read) and what the footer says is wrong."""
        return self._checks.quarantined()

    def check(self, *, repair: bool = False) -> StoreCheck:
        """Decode every live file of every table whole (not only its footer) and list what quarantine holds.

        With ``repair``, the broken files found are moved into quarantine, and a quarantined file is put back
        under its own name where it can be: every page decodes, each mistyped column casts to the table's type
        and back without loss, and the rows fit the table's schema. Without it nothing is moved."""
        self._commits.flush()
        return self._checks.check(repair=repair)


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
