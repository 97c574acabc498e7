"""Memory in one LanceDB table for the whole store, searched per task by exact float64 cosine.

LanceDB is the durable store (columns ``task, key, text, answer, vector, created_at``); lookups are answered from
an in-process matrix per task, loaded from the table on first use and kept in step with every write. Before each
operation the table's version is checked (read consistency 0, ~0.25 ms locally, one listing request on object
storage): a write by another process drops the in-process matrices, which then reload — so results are exact and
current across processes.

On a local store each task also has a memory generation (a marker every Gil write advances) and a snapshot of its
rows stamped with the generation it was read at (``gil_core.memory._snapshots``): a memory that has not connected
yet answers a task whose snapshot is current from the snapshot alone, without importing LanceDB (~1.6–2.6 s of a
fresh command's start). LanceDB stays the source of truth: a stale, missing or unreadable snapshot sends the
lookup to the table, and the load that follows writes the snapshot again.

The store is a local folder or an ``s3://bucket/prefix`` string (LanceDB's own object-store support; endpoint,
keys and region from ``GIL_S3_*``, see ``gil_core.storage``). On S3, LanceDB commits a new table version with a
put-if-absent of its manifest, so concurrent writers stay safe where the server honours ``If-None-Match``.

Never fork a process after it used LanceDB (hangs, lost writes): use spawn/forkserver or separate processes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, overload
from weakref import WeakKeyDictionary

import numpy as np
from cachetools import LRUCache
from numpy.typing import NDArray

from gil_core.errors import GilError, InvalidArgumentError, MemoryUnavailableError
from gil_core.llm.ports import EmbeddingModel
from gil_core.memory._index import (
    IndexBuilder,
    IndexedTask,
    IndexSettings,
    Snapshot,
    TaskRows,
    current_generation,
    index_builder,
    index_stamp,
    snapshot_folder,
)
from gil_core.memory._rules import check_k, check_threshold, latest_per_key
from gil_core.memory._snapshots import (
    advance_generation,
    discard_generation,
    exact_stamp,
    open_exact,
    read_generation,
    settle_generation,
    write_exact,
)
from gil_core.memory._vectors import TaskVectors
from gil_core.memory.ports import MemoryEntry, Recall
from gil_core.storage import S3Settings, load_s3_settings, location

if TYPE_CHECKING:
    from lancedb import AsyncConnection, Session
    from lancedb.table import AsyncTable

__all__ = [
    "DEFAULT_REFRESH_INTERVAL",
    "METADATA_CACHE_BYTES",
    "IndexSettings",
    "LanceDBMemory",
    "MemoryStats",
    "lance_session",
]

_LOG = logging.getLogger(__name__)
_EMBED_BATCH = 128  # texts per embedding request when rebuilding; endpoints cap the batch size
_COLUMNS = ["key", "text", "answer", "vector", "created_at"]
_TAIL_LAG_US = 30_000_000  # rows stamped this long before the latest one read are read again (late commits)
_MISSING_READ = 1000  # rows an indexed task misses that are read by key; more, and the task is read whole
DEFAULT_REFRESH_INTERVAL = 0.5  # seconds: how stale another process's writes can be for a call
MAX_REFRESH_INTERVAL = 1.0
METADATA_CACHE_BYTES = 64 << 20
"""LanceDB's metadata cache (manifests, fragment and file metadata) per process. Its own default, 1 GiB, keeps the
metadata of every table version a process read: a long-lived writer filled it (the soak's ~1 GB of native growth
per process, issue 19). The latest versions' metadata is all a lookup or a write reads."""
KEEP_VERSIONS_FOR = timedelta(hours=1)  # compact_memory: table versions younger than this are kept
_Vectors = NDArray[np.float32]
_SESSIONS: dict[tuple[int, int | None], Session] = {}
_SESSIONS_LOCK = threading.Lock()


def lance_session(metadata_cache_bytes: int = METADATA_CACHE_BYTES, index_cache_bytes: int | None = None) -> Session:
    """The process's LanceDB session for these cache bounds (one per bound, shared by every connection that asks
    for it, so the bound holds for the process and not per connection). ``index_cache_bytes`` None keeps
    LanceDB's default (6 GiB), which only tasks answered from the vector index fill."""
    import lancedb

    key = (metadata_cache_bytes, index_cache_bytes)
    with _SESSIONS_LOCK:
        session = _SESSIONS.get(key)
        if session is None:
            options: dict[str, int] = {"metadata_cache_size_bytes": metadata_cache_bytes}
            if index_cache_bytes is not None:
                options["index_cache_size_bytes"] = index_cache_bytes
            session = _SESSIONS[key] = lancedb.Session(**options)
        return session


def _sql_string(value: str) -> str:
    """``value`` as a SQL string literal for a LanceDB (DataFusion) filter: quotes doubled, nothing else.

    DataFusion reads a backslash inside ``'…'`` as itself, so doubling ``'`` is the whole escape.
    """
    return "'" + value.replace("'", "''") + "'"


def _now_us() -> int:
    return time.time_ns() // 1000


class MemoryStats:
    """What an instance has done against the table, counted (tests and benchmarks read it)."""

    def __init__(self) -> None:
        self.version_checks = 0  # table versions read
        self.catch_ups = 0  # tasks brought in step with another writer's commits
        self.loads = 0  # tasks read whole from the table
        self.index_lookups = 0  # lookups answered from a task's index
        self.snapshot_opens = 0  # tasks' index snapshots opened (memory-mapped, nothing read whole)
        self.connects = 0  # connections to LanceDB opened (0: every call was answered from snapshots)
        self.snapshot_lookups = 0  # lookups answered from a snapshot, without LanceDB
        self.generation_reads = 0  # memory generation markers read to serve a snapshot
        self.snapshot_writes = 0  # exact snapshots written after a load


@dataclass
class _Served:
    """A task answered from its snapshot: the state, the generation it is current for, when the marker was last
    read (the clock just before) and this process's write count then."""

    state: TaskVectors | IndexedTask
    generation: str
    checked_at: float = 0.0
    writes_seen: int = -1


class _ProcessWrites:
    """How many writes the instances of this process have made to one table: an instance that sees the count
    move looks at the table on its next call, so writes within a process are seen at once."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def bump(self) -> None:
        with self._lock:
            self.count += 1


_WRITES: dict[tuple[str, str], _ProcessWrites] = {}
_WRITES_LOCK = threading.Lock()


def _process_writes(path: str | Path, table: str) -> _ProcessWrites:
    key = (str(Path(path).resolve()) if isinstance(path, Path) else path, table)
    with _WRITES_LOCK:
        writes = _WRITES.get(key)
        if writes is None:
            writes = _WRITES[key] = _ProcessWrites()
        return writes


def _earliest_first(data: Any) -> Any:
    return data.sort_by([("created_at", "ascending"), ("key", "ascending"), ("_rowaddr", "ascending")])


def _columns_of(data: Any) -> tuple[list[MemoryEntry], _Vectors, NDArray[np.int64], NDArray[np.int64]]:
    """The entries of rows read with ``_COLUMNS`` and ``_rowaddr``, their vectors, ``created_at`` and addresses."""
    import pyarrow as pa

    keys, texts, answers = (data.column(name).to_pylist() for name in ("key", "text", "answer"))
    entries = [MemoryEntry(key=k, text=t, answer=a) for k, t, a in zip(keys, texts, answers, strict=True)]
    if not entries:
        return entries, np.zeros((0, 0), dtype=np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64)
    flat = data.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    vectors = np.asarray(flat, dtype=np.float32).reshape(len(entries), -1)
    created = data.column("created_at").cast(pa.int64()).to_numpy()
    addresses = data.column("_rowaddr").cast(pa.int64()).to_numpy()
    return entries, vectors, np.asarray(created, np.int64), np.asarray(addresses, np.int64)


def _latest_columns(data: Any) -> tuple[list[MemoryEntry], _Vectors, NDArray[np.int64], NDArray[np.int64]]:
    """``_columns_of`` the rows earliest first, a key twice (concurrent writers) keeping its latest row."""
    entries, vectors, created, addresses = _columns_of(_earliest_first(data))
    latest = {entry.key: position for position, entry in enumerate(entries)}
    if len(latest) < len(entries):
        keep = sorted(latest.values())
        entries = [entries[position] for position in keep]
        vectors, created, addresses = vectors[keep], created[keep], addresses[keep]
    return entries, vectors, created, addresses


def _latest_rows(data: Any) -> TaskRows:
    entries, vectors, created, _ = _latest_columns(data)
    return TaskRows(entries, vectors, created)


class _QueryVectors:
    """A small LRU of query vectors by (task, text), so ``remember`` right after ``lookup`` embeds nothing."""

    def __init__(self, size: int) -> None:
        self._items: LRUCache[tuple[str, str], _Vectors] = LRUCache(max(0, size))
        self._lock = threading.Lock()  # one memory may serve several event loops' threads; cachetools is not safe

    def get(self, task: str, text: str) -> _Vectors | None:
        with self._lock:
            return self._items.get((task, text))

    def put(self, task: str, text: str, vector: _Vectors) -> None:
        if self._items.maxsize == 0:
            return  # a size of 0 keeps nothing (LRUCache would raise)
        with self._lock:
            self._items[(task, text)] = vector


class LanceDBMemory:
    """``Memory`` in the LanceDB table ``table`` under ``path`` (a folder, or an ``s3://bucket/prefix`` string;
    ``s3`` overrides the ``GIL_S3_*`` settings), embedding texts with ``embedder``.

    Similarity is the exact float64 cosine of the float32 vectors as stored (the query rounded the same way), so
    a process that reopens the table computes the same bits. Insertion order is ``created_at`` (microseconds,
    strictly increasing per task within a process); ties in similarity go to the earliest. One instance is meant
    for one event loop at a time.

    Freshness: this instance's own writes are visible to its next call, and so are those of every other instance
    in the process on the same table. Another process's writes (new entries and forgotten ones alike) are seen by
    every call that starts more than ``refresh_interval`` seconds (default 0.5, at most 1) after they committed:
    the table's version is checked at most that often, and a changed version brings in only what changed for
    the tasks held. ``clock`` (monotonic seconds) is for tests.

    Large tasks: a task holding at least ``index.threshold`` entries is answered from its own IVF index (faiss),
    built in the background the first time and kept beside the table in ``<path>/<table>.gil-index``, its
    candidates rescored exactly and merged with the rows written since (``gil_core.memory._index``); the same
    freshness bound holds. ``index=None`` keeps every task in the process, and so does a store on object storage.

    Snapshots (a local store only; ``gil_core.memory._snapshots``): every write advances the task's memory
    generation, a marker beside the table, around its commit. A lookup that loads a task held here from the table
    then writes its exact rows, stamped with the generation read before the load, on a thread of its own (not on
    the lookup's path; only after a load, so a burst of writes writes no snapshot); an index snapshot is stamped
    when it is built. Until this memory first connects to LanceDB, a task whose snapshot carries the marker's
    generation is answered from that snapshot (the same answers and similarities, bit for bit) and LanceDB is not
    imported; the marker is read again once ``refresh_interval`` has passed since it was last read (at once after
    a write by this process), so another process's writes and deletions end the snapshot's answers for every call
    that starts more than that after the write returned (its marker follows its commit). A marker that moved or
    is missing, or a snapshot that cannot be read, sends the call to the table, and from then on this memory
    answers from the table as above. Any write connects (LanceDB is imported then).

    Native memory: LanceDB's caches are bounded per process (``lance_session``): metadata at
    ``metadata_cache_bytes`` (64 MiB), the vector index's at ``index_cache_bytes`` (LanceDB's default when None).
    """

    def __init__(
        self,
        path: str | Path,
        embedder: EmbeddingModel,
        *,
        table: str = "memory",
        query_cache_size: int = 256,
        s3: S3Settings | None = None,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        index: IndexSettings | None = IndexSettings(),  # noqa: B008 - frozen, shared safely
        metadata_cache_bytes: int = METADATA_CACHE_BYTES,
        index_cache_bytes: int | None = None,
    ) -> None:
        if not 0.0 <= refresh_interval <= MAX_REFRESH_INTERVAL:
            raise InvalidArgumentError(
                f"refresh_interval must be between 0 and {MAX_REFRESH_INTERVAL} s, got {refresh_interval}"
            )
        os.environ.setdefault("LANCE_LOG", "error")  # LanceDB's Rust warnings would otherwise reach stderr
        self._path, self._s3 = _located(path, s3)
        self._embedder = embedder
        self._table_name = table
        self._connection: AsyncConnection | None = None
        self._table: AsyncTable | None = None
        self._dimensions: int | None = None
        self._tasks: dict[str, TaskVectors | IndexedTask] = {}
        self._query_vectors = _QueryVectors(query_cache_size)
        self._locks: WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = WeakKeyDictionary()
        self._refresh_interval = refresh_interval
        self._clock = clock
        self._writes = _process_writes(self._path, table)
        self._version: int | None = None  # the table version last checked (None: not checked yet)
        self._checked_at: float | None = None  # the clock just before that check
        self._writes_seen = -1  # this process's write count on the table when it was made
        self._index = index if not isinstance(self._path, str) else None  # snapshots need a local folder
        self._caches = (metadata_cache_bytes, index_cache_bytes)
        self._builder: IndexBuilder | None = None
        self._builds_seen = 0  # the builder's finished jobs when this instance last looked at the indexes
        self._unreadable: set[tuple[str, str]] = set()  # (task, snapshot generation) that failed to open here
        self._root = Path(self._path) / f"{table}.gil-index" if not isinstance(self._path, str) else None
        self._served: dict[str, _Served] = {}  # tasks answered from snapshots, until this memory connects
        self._kept: dict[str, Snapshot] = {}  # index snapshots opened while serving, reused once connected
        self._snapshot_writers: list[threading.Thread] = []
        self.stats = MemoryStats()

    def __repr__(self) -> str:
        return f"LanceDBMemory({str(self._path)!r}, embedder={self._embedder.name!r}, table={self._table_name!r})"

    async def lookup(self, task: str, text: str, *, threshold: float) -> Recall | None:
        check_threshold(threshold)
        found = await self.nearest(task, text, 1)
        return Recall.from_nearest(found[0], threshold=threshold) if found else None

    async def nearest(self, task: str, text: str, k: int) -> list[MemoryEntry]:
        if check_k(k) == 0:
            return []
        state = await self._state(task)
        if not state:
            return []  # an empty task costs no embedding call
        query = self._query_vectors.get(task, text)
        if query is None:
            query = await self._query_vector(task, text)
            state = await self._state(task)  # again: a write may have landed while the embedder answered
            if not state:
                return []
        if self._connection is None and _width(state) != len(query):  # a snapshot of another width: the table says
            state = await self._state(task, snapshots=False)
            if not state:
                return []
        self._check_dimensions(task, query)
        if self._connection is None:  # nothing connected: the state is a snapshot's
            self.stats.snapshot_lookups += 1
        if isinstance(state, TaskVectors):
            return state.nearest(query, k)
        async with self._lock():  # the tail must not move under the search's thread
            found = await asyncio.to_thread(state.nearest, query, k)
        if found is None:  # a query without direction: rank the whole task exactly
            found = (await self._load(task, await self._connected_table(task))).nearest(query, k)
        self.stats.index_lookups += 1
        return found

    def index_builder(self) -> IndexBuilder:
        """The background builder of this table's task indexes (shared by the process's memories on the table)."""
        if self._builder is None:
            if self._index is None:
                raise InvalidArgumentError(f"{self!r} keeps no task index (index=None, or a store on object storage)")
            self._builder = index_builder(self._index_root(), self._read_task, self._index)
            self._builds_seen = self._builder.done  # builds that ended before this memory used them are read anyway
        return self._builder

    async def build_index(self, task: str | None = None) -> None:
        """Build the index of ``task`` (default: of every task past the threshold) now, as a task past the
        threshold would in the background, wait for it, and answer those tasks from it."""
        builder = self.index_builder()
        failed = len(builder.failures)
        table = await self._open_table(task or "", force=True)
        if table is None:
            return
        if task is None:
            import pyarrow.compute as pc

            with self._store_errors("", "count its tasks' entries"):
                tasks = (await table.query().select(["task"]).to_arrow()).column("task")
            counts = pc.value_counts(tasks).to_pylist()
            names = [str(item["values"]) for item in counts if self._large(int(item["counts"]))]
        else:
            names = [task]
        for name in names:
            builder.request(name)
        await asyncio.to_thread(builder.wait)
        if len(builder.failures) > failed:
            raise MemoryUnavailableError(f"the index build failed ({builder.failures[-1]})", task=task or "")
        self._checked_at = None  # the next call looks at the tasks' indexes again

    async def remember(self, task: str, key: str, text: str, answer: str) -> None:
        vector = await self._query_vector(task, text)
        entry = MemoryEntry(key=key, text=text, answer=answer)
        async with self._lock():
            table = await self._open_table(task, create_dimensions=len(vector))
            self._check_dimensions(task, vector)
            state = await self._task_state(task, table, force=True)
            created = max(_now_us(), state.last_created_us + 1)
            rows = self._arrow_rows(task, [entry], vector[None, :], [created])
            with self._advancing(task), self._store_errors(task, "remember an entry"):
                result = await _merge(table, rows, replace_task=None)
            if isinstance(state, TaskVectors):
                state.upsert(entry, vector, created)
                self._index_if_large(task, state)
            else:
                state.learn([entry], vector[None, :], [created])
                self._rebuild_if_stale(task, state)
            self._after_write(result.version)

    async def forget(self, task: str, key: str) -> None:
        async with self._lock():
            table = await self._open_table(task, force=True)
            if table is None:
                return
            state = await self._task_state(task, table, force=True)
            if isinstance(state, TaskVectors) and key not in state:
                return  # nothing to delete: no new table version
            with self._advancing(task), self._store_errors(task, "forget an entry"):
                result = await table.delete(f"task = {_sql_string(task)} AND key = {_sql_string(key)}")
            if isinstance(state, IndexedTask):
                state.forget(key)
                self._rebuild_if_stale(task, state)
            else:
                state.remove(key)
            self._after_write(result.version)

    async def rebuild(self, task: str, entries: Iterable[MemoryEntry]) -> None:
        planned = latest_per_key(entries)
        vectors = await self._embed_all(task, [entry.text for entry in planned])
        async with self._lock():
            if planned:
                table = await self._open_table(task, create_dimensions=vectors.shape[1])
                self._check_dimensions(task, vectors[0])
            else:
                maybe_table = await self._open_table(task, force=True)
                if maybe_table is None:
                    return  # no table and nothing to hold
                table = maybe_table
            await self._sync(task, table, force=True)
            first = _now_us()
            created = [first + offset for offset in range(len(planned))]
            rows = self._arrow_rows(task, planned, vectors, created)
            with self._advancing(task), self._store_errors(task, "replace its entries"):
                # One transaction: upsert the new entries and delete the task's others, or change nothing.
                result = await _merge(table, rows, replace_task=task)
            dimensions = self._dimensions or vectors.shape[1]
            state = TaskVectors.from_rows(planned, vectors, dimensions=dimensions, created=created)
            self._tasks[task] = state
            self._after_write(result.version)
            self._index_if_large(task, state)

    async def entries(self, task: str) -> list[MemoryEntry]:
        state = await self._state(task)
        if state is None:
            return []
        if isinstance(state, IndexedTask):  # not held here: read it
            return (await self._load(task, await self._connected_table(task))).entries()
        return state.entries()

    def wait_snapshots(self, timeout: float | None = None) -> bool:
        """Wait for the exact snapshots this memory is writing; whether they are all written (tests, benchmarks)."""
        for thread in list(self._snapshot_writers):
            thread.join(timeout)
        return not any(thread.is_alive() for thread in self._snapshot_writers)

    # -- state ---------------------------------------------------------------------------------------------

    def _lock(self) -> asyncio.Lock:
        # One lock per event loop: an asyncio.Lock is bound to the loop that first waited on it.
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        return lock

    async def _state(self, task: str, *, snapshots: bool = True) -> TaskVectors | IndexedTask | None:
        """``task``'s entries, current within the refresh bound: from its snapshot while this memory has not
        connected (``snapshots``) and the snapshot is current, else from the table; None while there is no table."""
        async with self._lock():
            if snapshots and self._connection is None and self._root is not None:
                served = await self._from_snapshot(task)
                if served is not None:
                    return served
            table = await self._open_table(task, force=not snapshots)
            return None if table is None else await self._task_state(task, table, lookup=True)

    async def _task_state(
        self, task: str, table: AsyncTable, *, force: bool = False, lookup: bool = False
    ) -> TaskVectors | IndexedTask:
        await self._sync(task, table, force=force)
        state = self._tasks.get(task)
        if state is None:
            state = self._tasks[task] = await self._open_task(task, table, lookup=lookup)
        return state

    async def _connected_table(self, task: str) -> AsyncTable:
        table = await self._open_table(task, force=True)
        assert table is not None, "a task with entries has a table"
        return table

    # -- snapshots -----------------------------------------------------------------------------------------

    async def _from_snapshot(self, task: str) -> TaskVectors | IndexedTask | None:
        """``task`` from its snapshot: the marker read again once ``refresh_interval`` has passed since it was
        last read or this process wrote to the table; None when the marker is missing or names no snapshot that
        opens (the table answers then)."""
        assert self._root is not None, "snapshots are kept for a local store"
        served = self._served.get(task)
        started, writes = self._clock(), self._writes.count
        if served is not None and writes == served.writes_seen and started - served.checked_at < self._refresh_interval:
            return served.state
        generation = read_generation(snapshot_folder(self._root, task))
        self.stats.generation_reads += 1
        if served is None or served.generation != generation:
            self._unserve(task)
            if generation is None:
                return None
            state = await asyncio.to_thread(self._open_snapshot, task, generation)
            if state is None:
                return None
            served = self._served[task] = _Served(state, generation)
        served.checked_at, served.writes_seen = started, writes
        return served.state

    def _open_snapshot(self, task: str, generation: str) -> TaskVectors | IndexedTask | None:
        """``task``'s snapshot stamped ``generation``: its index snapshot when there is one, else its exact rows."""
        assert self._root is not None, "snapshots are kept for a local store"
        folder = snapshot_folder(self._root, task)
        if self._index is not None and index_stamp(folder) == generation:
            current = current_generation(folder)
            if current is not None and (task, current) not in self._unreadable:
                snapshot = Snapshot.open(folder, task=task, dimensions=None)
                if snapshot is None:
                    self._unreadable.add((task, current))
                elif snapshot.memory_generation == generation:
                    self.stats.snapshot_opens += 1
                    return IndexedTask(snapshot, self._index)
        return open_exact(folder, task, generation)

    def _unserve(self, task: str) -> None:
        """``task`` is no longer answered from its snapshot (an index snapshot opened is kept for the table's path,
        which reuses it while it is current)."""
        served = self._served.pop(task, None)
        if served is not None and isinstance(served.state, IndexedTask):
            self._kept[task] = served.state.snapshot

    def _stop_serving(self) -> None:
        """This memory connects: the table answers from now on."""
        for task in list(self._served):
            self._unserve(task)

    def _settled(self, task: str) -> str | None:
        """The generation to stamp a snapshot of ``task`` read from now on with (None: none kept)."""
        return None if self._root is None else settle_generation(snapshot_folder(self._root, task))

    def _keep_snapshot(self, task: str, generation: str, rows: TaskRows, dimensions: int) -> None:
        """Write ``rows`` as ``task``'s exact snapshot on a thread of its own (not a daemon: a command's process
        waits for it before it exits), unless the marker has moved since or the snapshot is current already."""
        assert self._root is not None, "snapshots are kept for a local store"
        folder = snapshot_folder(self._root, task)

        def keep() -> None:
            try:
                if read_generation(folder) == generation and exact_stamp(folder) != generation:
                    write_exact(folder, task, generation, rows, dimensions)
                    self.stats.snapshot_writes += 1
            except Exception as exc:  # a snapshot not kept costs a fresh process a load from the table, no more
                _LOG.warning("memory snapshot %s not written: %s: %s", folder, type(exc).__name__, exc)

        thread = threading.Thread(target=keep, name="gil-memory-snapshot")
        self._snapshot_writers = [*(alive for alive in self._snapshot_writers if alive.is_alive()), thread]
        thread.start()

    @contextmanager
    def _advancing(self, task: str) -> Iterator[None]:
        """Around a commit to ``task``'s rows: its memory generation advanced before it and after it (also when it
        fails), so no snapshot read before the commit stays current."""
        if self._root is None:
            yield
            return
        folder = snapshot_folder(self._root, task)
        self._advance(task, folder)
        try:
            yield
        finally:
            self._advance(task, folder)

    def _advance(self, task: str, folder: Path) -> None:
        try:
            advance_generation(folder)
        except OSError as exc:
            try:
                discard_generation(folder)  # no marker: no snapshot of the task is served
            except OSError:
                reason = f"its memory generation at {str(folder)!r} cannot be advanced ({type(exc).__name__}: {exc})"
                raise MemoryUnavailableError(reason, task=task) from exc
            _LOG.warning("memory generation %s removed, it could not be advanced: %s", folder, exc)

    def _due(self, force: bool) -> bool:
        """Whether to look for other writers now: forced (a write is coming), another instance in this process
        wrote, or the last look is ``refresh_interval`` old."""
        if force or self._checked_at is None or self._writes.count != self._writes_seen:
            return True
        if self._builder is not None and self._builder.done != self._builds_seen:
            return True
        return self._clock() - self._checked_at >= self._refresh_interval

    async def _sync(self, task: str, table: AsyncTable, *, force: bool = False) -> None:
        """Bring the tasks held up to the table's latest version, if it is time to look (``task``: the one being
        served, named by errors)."""
        if not self._due(force):
            return
        started, writes = self._clock(), self._writes.count
        builds = self._builder.done if self._builder is not None else 0
        with self._store_errors(task, "read the table version"):
            version = await table.version()
        self.stats.version_checks += 1
        if version != self._version:
            for held in list(self._tasks):
                await self._catch_up(held, table)
            self._version = version
        if builds != self._builds_seen:  # an index build ended: large tasks held here move to their index
            self._builds_seen = builds
            for held, state in list(self._tasks.items()):
                if isinstance(state, TaskVectors) and self._large(len(state)) and self._has_snapshot(held):
                    del self._tasks[held]
        # Every commit before ``started`` is in ``version``: a later call sees it, or looks again.
        self._checked_at, self._writes_seen = started, writes

    async def _catch_up(self, task: str, table: AsyncTable) -> None:
        """Bring ``task``'s entries in step with the table: the rows written since it was read (their addresses
        are above its watermark), then — when the count says rows went — the deletions."""
        state = self._tasks[task]
        where = f"task = {_sql_string(task)}"
        if isinstance(state, IndexedTask):
            current = await self._indexed_in_step(task, table, state)
            if current is None:
                del self._tasks[task]  # opened again on its next use: a newer snapshot, or held here
            else:
                self._tasks[task] = current
            return
        with self._store_errors(task, "read its new entries"):
            data = await (
                table.query()
                .where(f"{where} AND _rowaddr >= {state.watermark + 1}")
                .select([*_COLUMNS, "_rowaddr"])
                .to_arrow()
            )
            count = await table.count_rows(where)
        self.stats.catch_ups += 1
        if data.num_rows > max(1024, len(state)):
            self._tasks[task] = await self._load(task, table)  # rewritten wholesale: read it again
            return
        entries, vectors, created, addresses = _columns_of(_earliest_first(data))
        for position, entry in enumerate(entries):
            state.learn(entry, vectors[position], int(created[position]), int(addresses[position]))
        if count == len(state):
            return
        with self._store_errors(task, "read which entries it holds"):
            held = await table.query().where(where).select(["_rowaddr"]).to_arrow()
        present = set(held.column("_rowaddr").to_pylist())
        for address, key in state.addresses().items():
            if address not in present:
                state.remove(key)
        if count != len(state):  # a write landed between the reads: read the task again
            self._tasks[task] = await self._load(task, table)

    def _after_write(self, version: int) -> None:
        """Our own write is in the state already; the other instances of this process look again on their next
        call. If another writer committed just before ours, we look again too (on the next call)."""
        self._writes.bump()
        if self._version is not None and version == self._version + 1:
            self._version = version
            self._writes_seen = self._writes.count
        else:
            self._checked_at = None

    def _large(self, count: int) -> bool:
        return self._index is not None and count >= self._index.threshold

    def _index_if_large(self, task: str, state: TaskVectors) -> None:
        """Ask for the task's index once a task held here has grown past the threshold."""
        if self._large(len(state)) and not state.index_requested:
            state.index_requested = True
            builder = self.index_builder()
            if not builder.failures:  # a build that failed is not tried again by this process (the reason is kept)
                builder.request(task)

    def _rebuild_if_stale(self, task: str, state: IndexedTask) -> None:
        """Ask for the task's index to be built again once it misses enough rows (written by any process)."""
        if state.stale() and not state.rebuild_requested:
            state.rebuild_requested = True
            self.index_builder().request(task)

    def _has_snapshot(self, task: str) -> bool:
        """Whether ``task`` has a current snapshot not known to be unreadable."""
        generation = current_generation(snapshot_folder(self._index_root(), task))
        return generation is not None and (task, generation) not in self._unreadable

    def _index_root(self) -> Path:
        assert self._root is not None, "snapshots and indexes are kept for a local store"
        return self._root

    async def _indexed_in_step(
        self, task: str, table: AsyncTable, state: IndexedTask
    ) -> TaskVectors | IndexedTask | None:
        """``state`` brought in step with the table: the rows stamped after those it read (and a lag before, for
        late commits) into its tail; when the task's count then differs from what it holds, the task's keys are
        listed and compared. None when the task's index has a newer snapshot (open that); held exactly here when
        it no longer is large, or misses too much to read by key."""
        folder = snapshot_folder(self._index_root(), task)
        if current_generation(folder) != state.snapshot.generation:
            return None
        where = f"task = {_sql_string(task)}"
        since = max(state.snapshot.last_created_us, state.seen_us - _TAIL_LAG_US)
        stamp = f"arrow_cast({since}, 'Timestamp(Microsecond, Some(\"UTC\"))')"
        with self._store_errors(task, "read its new entries"):
            data = (
                await table.query()
                .where(f"{where} AND created_at > {stamp}")
                .select([*_COLUMNS, "_rowaddr"])
                .to_arrow()
            )
            count = await table.count_rows(where)
        self.stats.catch_ups += 1
        rows = _latest_rows(data)
        state.learn(rows.entries, rows.vectors, rows.created)
        if count != len(state):
            with self._store_errors(task, "list its entries"):
                listed = await table.query().where(where).select(["key", "created_at"]).to_arrow()
            missing = await asyncio.to_thread(state.reconcile, listed)
            if len(missing) > _MISSING_READ:
                loaded = await self._load(task, table)
                self._index_if_large(task, loaded)
                return loaded
            if missing:
                keys = ", ".join(_sql_string(key) for key in missing)
                with self._store_errors(task, "read the entries its index misses"):
                    data = (
                        await table.query()
                        .where(f"{where} AND key IN ({keys})")
                        .select([*_COLUMNS, "_rowaddr"])
                        .to_arrow()
                    )
                rows = _latest_rows(data)
                state.learn(rows.entries, rows.vectors, rows.created)
        if not self._large(len(state)):
            return await self._load(task, table)
        self._rebuild_if_stale(task, state)
        return state

    async def _read_task(self, task: str) -> TaskRows:
        """``task``'s rows, read through a connection of its own (the index builder's thread calls it)."""
        generation = self._settled(task)  # before the rows: a write during the read leaves the snapshot stale
        connection = await self._connect()
        table = await connection.open_table(self._table_name)
        data = await table.query().where(f"task = {_sql_string(task)}").select([*_COLUMNS, "_rowaddr"]).to_arrow()
        rows = _latest_rows(data)
        rows.generation = generation
        return rows

    async def _connect(self) -> AsyncConnection:
        return await _connect(self._path, self._s3, self._caches)

    async def _open_task(self, task: str, table: AsyncTable, *, lookup: bool = False) -> TaskVectors | IndexedTask:
        """``task`` as the table holds it: answered from the vector index when it is large and the index exists
        (a large task without one asks for it and is held here meanwhile), else held in the process. Opened for
        a ``lookup``, a task held here is kept as its exact snapshot too (stamped with the generation read
        first)."""
        generation = self._settled(task) if lookup else None  # before any read of the table
        if self._index is not None:
            with self._store_errors(task, "count its entries"):
                count = await table.count_rows(f"task = {_sql_string(task)}")
            if self._large(count):
                folder = snapshot_folder(self._index_root(), task)
                current = current_generation(folder)
                snapshot = self._kept.pop(task, None)  # opened while serving: not read again
                if snapshot is not None and snapshot.generation != current:
                    snapshot = None
                if snapshot is None and current is not None and (task, current) not in self._unreadable:
                    snapshot = await asyncio.to_thread(Snapshot.open, folder, task=task, dimensions=self._dimensions)
                    if snapshot is None:  # damaged, another format or width: held here until it is built again
                        self._unreadable.add((task, current))
                    else:
                        self.stats.snapshot_opens += 1
                if snapshot is not None:
                    indexed = await self._indexed_in_step(task, table, IndexedTask(snapshot, self._index))
                    if indexed is not None:
                        return indexed
        state = await self._load(task, table, keep=generation)
        self._index_if_large(task, state)
        return state

    async def _load(self, task: str, table: AsyncTable, *, keep: str | None = None) -> TaskVectors:
        """``task`` read whole from the table; ``keep``: the generation read before, to keep the rows as the
        task's exact snapshot (in the background, unless the task is large: its index is its snapshot)."""
        dimensions = self._dimensions or 0
        with self._store_errors(task, "load its entries"):
            data = await table.query().where(f"task = {_sql_string(task)}").select([*_COLUMNS, "_rowaddr"]).to_arrow()
        self.stats.loads += 1
        if not data.num_rows:
            state = TaskVectors(dimensions)
            rows = TaskRows([], np.zeros((0, dimensions), np.float32), np.zeros(0, np.int64))
        else:
            entries, vectors, created, addresses = _latest_columns(data)
            state = TaskVectors.from_rows(entries, vectors, dimensions=dimensions, created=created, addresses=addresses)
            rows = TaskRows(entries, vectors, created)
        if keep is not None and not self._large(len(state)):
            self._keep_snapshot(task, keep, rows, dimensions)
        return state

    # -- LanceDB -------------------------------------------------------------------------------------------

    @overload
    async def _open_table(self, task: str, *, force: bool = False) -> AsyncTable | None: ...

    @overload
    async def _open_table(self, task: str, *, create_dimensions: int) -> AsyncTable: ...

    async def _open_table(
        self, task: str, *, create_dimensions: int | None = None, force: bool = False
    ) -> AsyncTable | None:
        """The table, opened once; created when missing and ``create_dimensions`` is given, else None. A missing
        table is looked for again on the same schedule as other writers' commits (``force``: now)."""
        if self._table is not None:
            return self._table
        if create_dimensions is None and not self._due(force):
            return None
        started, writes = self._clock(), self._writes.count
        import pyarrow as pa

        with self._store_errors(task, "open the table"):
            if self._connection is None:
                # Read consistency 0: every read sees other processes' commits (the version check relies on it).
                self._connection = await self._connect()
                self.stats.connects += 1
                self._stop_serving()
            if await _has_table(self._connection, self._table_name):
                table = await self._connection.open_table(self._table_name)
            elif create_dimensions is None:
                self._checked_at, self._writes_seen = started, writes
                return None
            else:
                schema = pa.schema(
                    [
                        ("task", pa.string()),
                        ("key", pa.string()),
                        ("text", pa.string()),
                        ("answer", pa.string()),
                        ("vector", pa.list_(pa.float32(), create_dimensions)),
                        ("created_at", pa.timestamp("us", tz="UTC")),
                    ]
                )
                table = await self._connection.create_table(self._table_name, schema=schema, exist_ok=True)
            self._dimensions = int((await table.schema()).field("vector").type.list_size)
        self._table = table
        return table

    def _arrow_rows(self, task: str, entries: Sequence[MemoryEntry], vectors: _Vectors, created: Sequence[int]) -> Any:
        import pyarrow as pa

        dimensions = self._dimensions or vectors.shape[1]
        flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1), type=pa.float32())
        return pa.table(
            {
                "task": pa.array([task] * len(entries), pa.string()),
                "key": pa.array([entry.key for entry in entries], pa.string()),
                "text": pa.array([entry.text for entry in entries], pa.string()),
                "answer": pa.array([entry.answer for entry in entries], pa.string()),
                "vector": pa.FixedSizeListArray.from_arrays(flat, dimensions),
                "created_at": pa.array(list(created), pa.timestamp("us", tz="UTC")),
            }
        )

    @contextmanager
    def _store_errors(self, task: str, what: str) -> Iterator[None]:
        """Translate a LanceDB failure into ``MemoryUnavailableError`` naming the task and the operation.

        On object storage the text is redacted and the library's exception is not shown as the cause (a
        server's error body can echo a key).
        """
        with _lance_errors(self._path, self._s3, task, what):
            yield

    # -- embedding -----------------------------------------------------------------------------------------

    async def _query_vector(self, task: str, text: str) -> _Vectors:
        vector = self._query_vectors.get(task, text)
        if vector is None:
            vector = (await self._embed(task, [text]))[0]
            self._query_vectors.put(task, text, vector)
        return vector

    async def _embed_all(self, task: str, texts: Sequence[str]) -> _Vectors:
        """Vectors of ``texts`` in order; each distinct text is embedded once, in batches."""
        distinct = list(dict.fromkeys(texts))
        found: dict[str, _Vectors] = {}
        for start in range(0, len(distinct), _EMBED_BATCH):
            batch = distinct[start : start + _EMBED_BATCH]
            found.update(zip(batch, await self._embed(task, batch), strict=True))
        if not texts:
            return np.zeros((0, self._dimensions or 0), dtype=np.float32)
        return np.stack([found[text] for text in texts])

    async def _embed(self, task: str, texts: Sequence[str]) -> _Vectors:
        name = self._embedder.name
        try:
            embeddings = await self._embedder.embed(texts)
        except Exception as exc:
            raise MemoryUnavailableError(f"embedder {name!r} failed ({type(exc).__name__}: {exc})", task=task) from exc
        vectors = np.asarray(embeddings.vectors, dtype=np.float64)
        if vectors.ndim != 2 or len(vectors) != len(texts) or vectors.shape[1] == 0:
            shape = "x".join(str(size) for size in vectors.shape)
            raise MemoryUnavailableError(
                f"embedder {name!r} returned {shape} numbers for {len(texts)} texts", task=task
            )
        stored = vectors.astype(np.float32)
        if not np.isfinite(stored).all():
            raise MemoryUnavailableError(
                f"embedder {name!r} returned a vector that is not finite in float32", task=task
            )
        self._check_dimensions(task, stored[0])
        return stored

    def _check_dimensions(self, task: str, vector: _Vectors) -> None:
        if self._dimensions is not None and len(vector) != self._dimensions:
            raise MemoryUnavailableError(
                f"embedder {self._embedder.name!r} returns {len(vector)}-dimensional vectors but the table "
                f"{self._table_name!r} holds {self._dimensions}-dimensional ones",
                task=task,
            )


def _width(state: TaskVectors | IndexedTask) -> int:
    return state.dimensions if isinstance(state, TaskVectors) else state.snapshot.dimensions


@dataclass(frozen=True)
class MemoryCompaction:
    """What ``compact_memory`` did to a memory table."""

    fragments_removed: int  # data files merged away (one per write until a compaction)
    fragments_added: int
    versions_removed: int  # table versions older than the window, deleted with the files only they used
    bytes_removed: int


async def compact_memory(
    path: str | Path,
    *,
    table: str = "memory",
    s3: S3Settings | None = None,
    keep_versions_for: timedelta = KEEP_VERSIONS_FOR,
) -> MemoryCompaction | None:
    """Merge a memory table's small files and delete its versions older than ``keep_versions_for``; None when
    there is no table yet. A scheduler runs it (the ``compact-telemetry`` flow, hourly).

    Every write (a verdict remembered or forgotten) commits a new version with a data file of its own, and nothing
    else merges them: a soak process's table of ~1,000 entries held 2,000 data files and 2,074 versions (194 MB on
    disk, each version's manifest listing every file), and reading such a version costs memory in proportion
    (RELIABILITY.md, the soak). Safe beside readers and writers of this and other processes: a compaction commits
    like a write (instances catch up, rows moved included), and a reader holding a version older than the window
    would lose its files, which is why the window is an hour by default (an instance looks again within
    ``refresh_interval``)."""
    if keep_versions_for < timedelta(0):
        raise InvalidArgumentError(f"keep_versions_for must not be negative, got {keep_versions_for}")
    where, settings = _located(path, s3)
    with _lance_errors(where, settings, "", "compact the table"):
        connection = await _connect(where, settings, (METADATA_CACHE_BYTES, None))
        if not await _has_table(connection, table):
            return None
        opened = await connection.open_table(table)
        stats = await opened.optimize(cleanup_older_than=keep_versions_for)
    return MemoryCompaction(
        fragments_removed=int(stats.compaction.fragments_removed),
        fragments_added=int(stats.compaction.fragments_added),
        versions_removed=int(stats.prune.old_versions_removed),
        bytes_removed=int(stats.prune.bytes_removed),
    )


def _located(path: str | Path, s3: S3Settings | None) -> tuple[str | Path, S3Settings | None]:
    """The table folder (a local path, or an ``s3://`` URL as text) and, for a URL, its S3 settings (``s3``, or
    the environment's)."""
    where = location(path)
    return where, ((s3 if s3 is not None else load_s3_settings()) if isinstance(where, str) else None)


async def _connect(path: str | Path, s3: S3Settings | None, caches: tuple[int, int | None]) -> AsyncConnection:
    import lancedb

    return await lancedb.connect_async(
        path,
        read_consistency_interval=timedelta(0),
        storage_options=s3.lancedb_options() if s3 is not None else None,
        session=lance_session(*caches),
    )


@contextmanager
def _lance_errors(path: str | Path, s3: S3Settings | None, task: str, what: str) -> Iterator[None]:
    try:
        yield
    except GilError:
        raise
    except Exception as exc:
        if s3 is None:
            reason = f"the LanceDB store at {str(path)!r} failed to {what} ({type(exc).__name__}: {exc})"
            raise MemoryUnavailableError(reason, task=task) from exc
        reason = f"the LanceDB store at {path!r} failed to {what} ({s3.describe(exc)})"
        raise MemoryUnavailableError(reason, task=task) from None


async def _has_table(connection: AsyncConnection, name: str) -> bool:
    page_token: str | None = None
    while True:
        listing = await connection.list_tables(page_token=page_token)
        if name in listing.tables:
            return True
        page_token = listing.page_token
        if not page_token:
            return False


async def _merge(table: AsyncTable, rows: Any, *, replace_task: str | None) -> Any:
    """Upsert ``rows`` by (task, key); with ``replace_task``, also delete that task's rows not in ``rows``."""
    builder = table.merge_insert(["task", "key"]).when_matched_update_all().when_not_matched_insert_all()
    if replace_task is not None:
        builder = builder.when_not_matched_by_source_delete(f"task = {_sql_string(replace_task)}")
    # On an AsyncTable ``execute`` returns a coroutine, though it is annotated with the sync table's result.
    return await cast(Awaitable[Any], builder.execute(rows))
