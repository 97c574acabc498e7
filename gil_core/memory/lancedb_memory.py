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
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, overload
from weakref import WeakKeyDictionary

import numpy as np
from numpy.typing import NDArray

from gil_core.errors import InvalidArgumentError, MemoryUnavailableError
from gil_core.llm.ports import EmbeddingModel
from gil_core.memory._index import IndexBuilder, IndexedTask, IndexSettings, TaskRows
from gil_core.memory._large_tasks import LargeTasks
from gil_core.memory._memory_counts import MemoryStats, process_writes
from gil_core.memory._memory_embedder import MemoryEmbedder
from gil_core.memory._rules import check_k, check_threshold, latest_per_key
from gil_core.memory._table_rows import (
    COLUMNS,
    arrow_rows,
    columns_of,
    earliest_first,
    latest_columns,
    latest_rows,
    table_schema,
)
from gil_core.memory._task_snapshots import TaskSnapshots
from gil_core.memory._vectors import TaskVectors
from gil_core.memory.lance_tables import (
    METADATA_CACHE_BYTES,
    arrow_memory_pool,
    connect_store,
    lance_errors,
    locate_store,
    merge_rows,
    open_if_there,
    task_rows,
)
from gil_core.memory.ports import MemoryChanges, MemoryEntry, Recall
from gil_core.storage import S3Settings

if TYPE_CHECKING:
    from lancedb import AsyncConnection
    from lancedb.table import AsyncTable

__all__ = ["DEFAULT_REFRESH_INTERVAL", "IndexSettings", "LanceDBMemory", "MemoryStats"]

DEFAULT_REFRESH_INTERVAL = 0.5  # seconds: how stale another process's writes can be for a call
MAX_REFRESH_INTERVAL = 1.0
_Vectors = NDArray[np.float32]


def _now_us() -> int:
    return time.time_ns() // 1000


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

    Snapshots (a local store only; ``gil_core.memory._task_snapshots``): every write advances the task's memory
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

    Native memory: LanceDB's caches are bounded per process (``lance_tables.lance_session``): metadata at
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
        arrow_memory_pool()  # before this process's first pyarrow import, which snapshots or LanceDB make
        self._path, self._s3 = locate_store(path, s3)
        self._embedder = embedder
        self._table_name = table
        self._connection: AsyncConnection | None = None
        self._table: AsyncTable | None = None
        self._dimensions: int | None = None
        self._tasks: dict[str, TaskVectors | IndexedTask] = {}
        self._embedding = MemoryEmbedder(embedder, query_cache_size, table=table, dimensions=lambda: self._dimensions)
        self._locks: WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = WeakKeyDictionary()
        self._refresh_interval = refresh_interval
        self._clock = clock
        self._writes = process_writes(self._path, table)
        self._version: int | None = None  # the table version last checked (None: not checked yet)
        self._checked_at: float | None = None  # the clock just before that check
        self._writes_seen = -1  # this process's write count on the table when it was made
        self._index = index if not isinstance(self._path, str) else None  # snapshots need a local folder
        self._caches = (metadata_cache_bytes, index_cache_bytes)
        self.stats = MemoryStats()
        root = Path(self._path) / f"{table}.gil-index" if not isinstance(self._path, str) else None
        self._snapshots = TaskSnapshots(
            root, self._index, self.stats, refresh_interval=refresh_interval, clock=clock, writes=self._writes
        )
        self._large_tasks = LargeTasks(
            self._index,
            self._snapshots,
            self.stats,
            read_task=self._read_task,
            load=self._load,
            store_errors=self._store_errors,
        )

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
        query = self._embedding.cached(task, text)
        if query is None:
            query = await self._embedding.query_vector(task, text)
            state = await self._state(task)  # again: a write may have landed while the embedder answered
            if not state:
                return []
        if self._connection is None and _width(state) != len(query):  # a snapshot of another width: the table says
            state = await self._state(task, snapshots=False)
            if not state:
                return []
        self._embedding.check_dimensions(task, query)
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
        if self._index is None:
            raise InvalidArgumentError(f"{self!r} keeps no task index (index=None, or a store on object storage)")
        return self._large_tasks.builder()

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
            names = [str(item["values"]) for item in counts if self._large_tasks.is_large(int(item["counts"]))]
        else:
            names = [task]
        for name in names:
            builder.request(name)
        await asyncio.to_thread(builder.wait)
        if len(builder.failures) > failed:
            raise MemoryUnavailableError(f"the index build failed ({builder.failures[-1]})", task=task or "")
        self._checked_at = None  # the next call looks at the tasks' indexes again

    async def remember(self, task: str, key: str, text: str, answer: str) -> None:
        await self.change(task, MemoryChanges().remember(key, text, answer))

    async def forget(self, task: str, key: str) -> None:
        await self.change(task, MemoryChanges().forget(key))

    async def change(self, task: str, changes: MemoryChanges) -> None:
        """One table version for all of ``changes`` (a merge that upserts the entries and deletes the forgotten
        keys), or none when nothing held changes."""
        entries = changes.entries
        vectors = await self._embedding.vectors(task, [entry.text for entry in entries])
        async with self._lock():
            table = await self._table_to_write(task, vectors)
            if table is None:
                return  # no table: nothing to forget
            state = await self._task_state(task, table, force=True)
            forgotten = [key for key in changes.forgotten if isinstance(state, IndexedTask) or key in state]
            if not entries and not forgotten:
                return  # nothing to delete: no new table version
            first = max(_now_us(), state.last_created_us + 1)
            created = [first + offset for offset in range(len(entries))]
            with self._snapshots.advancing(task), self._store_errors(task, "change its entries"):
                if entries:
                    rows = arrow_rows(task, entries, vectors, created, self._dimensions or vectors.shape[1])
                    result = await merge_rows(table, rows, delete=task_rows(task, forgotten) if forgotten else None)
                else:
                    result = await table.delete(task_rows(task, forgotten))
            for key in forgotten:
                if isinstance(state, IndexedTask):
                    state.forget(key)
                else:
                    state.remove(key)
            if isinstance(state, IndexedTask):
                if entries:
                    state.learn(entries, vectors, created)
                self._large_tasks.rebuild_if_stale(task, state)
            else:
                for position, entry in enumerate(entries):
                    state.upsert(entry, vectors[position], created[position])
                self._large_tasks.index_if_large(task, state)
            self._after_write(result.version)

    async def rebuild(self, task: str, entries: Iterable[MemoryEntry]) -> None:
        planned = latest_per_key(entries)
        vectors = await self._embedding.embed_all(task, [entry.text for entry in planned])
        async with self._lock():
            table = await self._table_to_write(task, vectors)
            if table is None:
                return  # no table and nothing to hold
            await self._sync(task, table, force=True)
            first = _now_us()
            created = [first + offset for offset in range(len(planned))]
            dimensions = self._dimensions or vectors.shape[1]
            rows = arrow_rows(task, planned, vectors, created, dimensions)
            with self._snapshots.advancing(task), self._store_errors(task, "replace its entries"):
                # One transaction: upsert the new entries and delete the task's others, or change nothing.
                result = await merge_rows(table, rows, delete=task_rows(task))
            state = TaskVectors.from_rows(planned, vectors, dimensions=dimensions, created=created)
            self._tasks[task] = state
            self._after_write(result.version)
            self._large_tasks.index_if_large(task, state)

    async def _table_to_write(self, task: str, vectors: _Vectors) -> AsyncTable | None:
        """The table a write of ``vectors`` goes to: created for them when missing, their width checked; with no
        vectors, the table when there is one (None: nothing to change). Under the lock."""
        if not len(vectors):
            return await self._open_table(task, force=True)
        table = await self._open_table(task, create_dimensions=vectors.shape[1])
        self._embedding.check_dimensions(task, vectors[0])
        return table

    async def entries(self, task: str) -> list[MemoryEntry]:
        state = await self._state(task)
        if state is None:
            return []
        if isinstance(state, IndexedTask):  # not held here: read it
            return (await self._load(task, await self._connected_table(task))).entries()
        return state.entries()

    def wait_snapshots(self, timeout: float | None = None) -> bool:
        """Wait for the exact snapshots this memory is writing; whether they are all written (tests, benchmarks)."""
        return self._snapshots.wait(timeout)

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
            if snapshots and self._connection is None and self._snapshots.local:
                served = await self._snapshots.serve(task)
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

    def _due(self, force: bool) -> bool:
        """Whether to look for other writers now: forced (a write is coming), another instance in this process
        wrote, or the last look is ``refresh_interval`` old."""
        if force or self._checked_at is None or self._writes.count != self._writes_seen:
            return True
        if self._large_tasks.builds_moved():
            return True
        return self._clock() - self._checked_at >= self._refresh_interval

    async def _sync(self, task: str, table: AsyncTable, *, force: bool = False) -> None:
        """Bring the tasks held up to the table's latest version, if it is time to look (``task``: the one being
        served, named by errors)."""
        if not self._due(force):
            return
        started, writes = self._clock(), self._writes.count
        builds = self._large_tasks.builds_done()
        with self._store_errors(task, "read the table version"):
            version = await table.version()
        self.stats.version_checks += 1
        if version != self._version:
            for held in list(self._tasks):
                await self._catch_up(held, table)
            self._version = version
        if self._large_tasks.see_builds(builds):  # an index build ended: large tasks held here move to their index
            for held, state in list(self._tasks.items()):
                large = isinstance(state, TaskVectors) and self._large_tasks.is_large(len(state))
                if large and self._snapshots.has_current(held):
                    del self._tasks[held]
        # Every commit before ``started`` is in ``version``: a later call sees it, or looks again.
        self._checked_at, self._writes_seen = started, writes

    async def _catch_up(self, task: str, table: AsyncTable) -> None:
        """Bring ``task``'s entries in step with the table: the rows written since it was read (their addresses
        are above its watermark), then — when the count says rows went — the deletions."""
        state = self._tasks[task]
        where = task_rows(task)
        if isinstance(state, IndexedTask):
            current = await self._large_tasks.in_step(task, table, state)
            if current is None:
                del self._tasks[task]  # opened again on its next use: a newer snapshot, or held here
            else:
                self._tasks[task] = current
            return
        with self._store_errors(task, "read its new entries"):
            data = await (
                table.query()
                .where(f"{where} AND _rowaddr >= {state.watermark + 1}")
                .select([*COLUMNS, "_rowaddr"])
                .to_arrow()
            )
            count = await table.count_rows(where)
        self.stats.catch_ups += 1
        if data.num_rows > max(1024, len(state)):
            self._tasks[task] = await self._load(task, table)  # rewritten wholesale: read it again
            return
        entries, vectors, created, addresses = columns_of(earliest_first(data))
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

    async def _read_task(self, task: str) -> TaskRows:
        """``task``'s rows, read through a connection of its own (the index builder's thread calls it)."""
        generation = self._snapshots.settled(task)  # before the rows: a write during the read leaves the snapshot stale
        connection = await self._connect()
        table = await connection.open_table(self._table_name)
        data = await table.query().where(task_rows(task)).select([*COLUMNS, "_rowaddr"]).to_arrow()
        rows = latest_rows(data)
        rows.generation = generation
        return rows

    async def _connect(self) -> AsyncConnection:
        return await connect_store(self._path, self._s3, self._caches)

    async def _open_task(self, task: str, table: AsyncTable, *, lookup: bool = False) -> TaskVectors | IndexedTask:
        """``task`` as the table holds it: answered from the vector index when it is large and the index exists
        (a large task without one asks for it and is held here meanwhile), else held in the process. Opened for
        a ``lookup``, a task held here is kept as its exact snapshot too (stamped with the generation read
        first)."""
        generation = self._snapshots.settled(task) if lookup else None  # before any read of the table
        if self._index is not None:
            with self._store_errors(task, "count its entries"):
                count = await table.count_rows(task_rows(task))
            if self._large_tasks.is_large(count):
                indexed = await self._large_tasks.open(task, table, self._dimensions)
                if indexed is not None:
                    return indexed
        state = await self._load(task, table, keep=generation)
        self._large_tasks.index_if_large(task, state)
        return state

    async def _load(self, task: str, table: AsyncTable, *, keep: str | None = None) -> TaskVectors:
        """``task`` read whole from the table; ``keep``: the generation read before, to keep the rows as the
        task's exact snapshot (in the background, unless the task is large: its index is its snapshot)."""
        dimensions = self._dimensions or 0
        with self._store_errors(task, "load its entries"):
            data = await table.query().where(task_rows(task)).select([*COLUMNS, "_rowaddr"]).to_arrow()
        self.stats.loads += 1
        if not data.num_rows:
            state = TaskVectors(dimensions)
            rows = TaskRows([], np.zeros((0, dimensions), np.float32), np.zeros(0, np.int64))
        else:
            entries, vectors, created, addresses = latest_columns(data)
            state = TaskVectors.from_rows(entries, vectors, dimensions=dimensions, created=created, addresses=addresses)
            rows = TaskRows(entries, vectors, created)
        if keep is not None and not self._large_tasks.is_large(len(state)):
            self._snapshots.keep(task, keep, rows, dimensions)
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
        with self._store_errors(task, "open the table"):
            if self._connection is None:
                # Read consistency 0: every read sees other processes' commits (the version check relies on it).
                self._connection = await self._connect()
                self.stats.connects += 1
                self._snapshots.stop_serving()
            table = await open_if_there(self._connection, self._table_name)
            if table is None:
                if create_dimensions is None:
                    self._checked_at, self._writes_seen = started, writes
                    return None
                schema = table_schema(create_dimensions)  # exist_ok: another process may be creating it too
                table = await self._connection.create_table(self._table_name, schema=schema, exist_ok=True)
            self._dimensions = int((await table.schema()).field("vector").type.list_size)
        self._table = table
        return table

    @contextmanager
    def _store_errors(self, task: str, what: str) -> Iterator[None]:
        """A LanceDB failure as ``MemoryUnavailableError`` naming the task and the operation (``lance_errors``)."""
        with lance_errors(self._path, self._s3, task, what):
            yield


def _width(state: TaskVectors | IndexedTask) -> int:
    return state.dimensions if isinstance(state, TaskVectors) else state.snapshot.dimensions
