"""Memory in one LanceDB table for the whole store, searched per task by exact float64 cosine.

LanceDB is the durable store (columns ``task, key, text, answer, vector, created_at``); lookups are answered from
an in-process matrix per task, loaded from the table on first use and kept in step with every write. Before each
operation the table's version is checked (read consistency 0, ~0.25 ms locally, one listing request on object
storage): a write by another process drops the in-process matrices, which then reload — so results are exact and
current across processes.

The store is a local folder or an ``s3://bucket/prefix`` string (LanceDB's own object-store support; endpoint,
keys and region from ``GIL_S3_*``, see ``gil_core.storage``). On S3, LanceDB commits a new table version with a
put-if-absent of its manifest, so concurrent writers stay safe where the server honours ``If-None-Match``.

Never fork a process after it used LanceDB (hangs, lost writes): use spawn/forkserver or separate processes.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, overload
from weakref import WeakKeyDictionary

import numpy as np
from numpy.typing import NDArray

from gil_core.errors import GilError, MemoryUnavailableError
from gil_core.llm.ports import EmbeddingModel
from gil_core.memory._rules import check_k, check_threshold, latest_per_key
from gil_core.memory._vectors import TaskVectors
from gil_core.memory.ports import MemoryEntry, Recall
from gil_core.storage import S3Settings, load_s3_settings, location

if TYPE_CHECKING:
    from lancedb import AsyncConnection
    from lancedb.table import AsyncTable

__all__ = ["LanceDBMemory"]

_EMBED_BATCH = 128  # texts per embedding request when rebuilding; endpoints cap the batch size
_Vectors = NDArray[np.float32]


def _sql_string(value: str) -> str:
    """``value`` as a SQL string literal for a LanceDB (DataFusion) filter: quotes doubled, nothing else.

    DataFusion reads a backslash inside ``'…'`` as itself, so doubling ``'`` is the whole escape.
    """
    return "'" + value.replace("'", "''") + "'"


def _now_us() -> int:
    return time.time_ns() // 1000


class _QueryVectors:
    """A small LRU of query vectors by (task, text), so ``remember`` right after ``lookup`` embeds nothing."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, str], _Vectors] = OrderedDict()

    def get(self, task: str, text: str) -> _Vectors | None:
        vector = self._items.get((task, text))
        if vector is not None:
            self._items.move_to_end((task, text))
        return vector

    def put(self, task: str, text: str, vector: _Vectors) -> None:
        self._items[(task, text)] = vector
        self._items.move_to_end((task, text))
        while len(self._items) > self._size:
            self._items.popitem(last=False)


class LanceDBMemory:
    """``Memory`` in the LanceDB table ``table`` under ``path`` (a folder, or an ``s3://bucket/prefix`` string;
    ``s3`` overrides the ``GIL_S3_*`` settings), embedding texts with ``embedder``.

    Similarity is the exact float64 cosine of the float32 vectors as stored (the query rounded the same way), so
    a process that reopens the table computes the same bits. Insertion order is ``created_at`` (microseconds,
    strictly increasing per task within a process); ties in similarity go to the earliest. One instance is meant
    for one event loop at a time.
    """

    def __init__(
        self,
        path: str | Path,
        embedder: EmbeddingModel,
        *,
        table: str = "memory",
        query_cache_size: int = 256,
        s3: S3Settings | None = None,
    ) -> None:
        os.environ.setdefault("LANCE_LOG", "error")  # LanceDB's Rust warnings would otherwise reach stderr
        self._path = location(path)
        self._s3 = (s3 if s3 is not None else load_s3_settings()) if isinstance(self._path, str) else None
        self._embedder = embedder
        self._table_name = table
        self._connection: AsyncConnection | None = None
        self._table: AsyncTable | None = None
        self._dimensions: int | None = None
        self._version: int | None = None  # the table version the in-process matrices reflect
        self._tasks: dict[str, TaskVectors] = {}
        self._query_vectors = _QueryVectors(query_cache_size)
        self._locks: WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = WeakKeyDictionary()

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
        self._check_dimensions(task, query)
        return state.nearest(query, k)

    async def remember(self, task: str, key: str, text: str, answer: str) -> None:
        vector = await self._query_vector(task, text)
        entry = MemoryEntry(key=key, text=text, answer=answer)
        async with self._lock():
            table = await self._open_table(task, create_dimensions=len(vector))
            self._check_dimensions(task, vector)
            state = await self._fresh_state(task, table)
            created = max(_now_us(), state.last_created_us + 1)
            rows = self._arrow_rows(task, [entry], vector[None, :], [created])
            with self._store_errors(task, "remember an entry"):
                result = await _merge(table, rows, replace_task=None)
            self._after_write(result.version, lambda: state.upsert(entry, vector, created))

    async def forget(self, task: str, key: str) -> None:
        async with self._lock():
            table = await self._open_table(task)
            if table is None:
                return
            state = await self._fresh_state(task, table)
            if key not in state:
                return  # nothing to delete: no new table version
            with self._store_errors(task, "forget an entry"):
                result = await table.delete(f"task = {_sql_string(task)} AND key = {_sql_string(key)}")
            self._after_write(result.version, lambda: state.remove(key))

    async def rebuild(self, task: str, entries: Iterable[MemoryEntry]) -> None:
        planned = latest_per_key(entries)
        vectors = await self._embed_all(task, [entry.text for entry in planned])
        async with self._lock():
            if planned:
                table = await self._open_table(task, create_dimensions=vectors.shape[1])
                self._check_dimensions(task, vectors[0])
            else:
                maybe_table = await self._open_table(task)
                if maybe_table is None:
                    return  # no table and nothing to hold
                table = maybe_table
            first = _now_us()
            created = [first + offset for offset in range(len(planned))]
            rows = self._arrow_rows(task, planned, vectors, created)
            with self._store_errors(task, "replace its entries"):
                # One transaction: upsert the new entries and delete the task's others, or change nothing.
                result = await _merge(table, rows, replace_task=task)
            dimensions = self._dimensions or vectors.shape[1]
            state = TaskVectors.from_rows(
                planned, vectors, dimensions=dimensions, last_created_us=created[-1] if created else 0
            )

            def install() -> None:
                self._tasks[task] = state

            self._after_write(result.version, install)

    async def entries(self, task: str) -> list[MemoryEntry]:
        state = await self._state(task)
        return state.entries() if state is not None else []

    # -- state ---------------------------------------------------------------------------------------------

    def _lock(self) -> asyncio.Lock:
        # One lock per event loop: an asyncio.Lock is bound to the loop that first waited on it.
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        return lock

    async def _state(self, task: str) -> TaskVectors | None:
        """``task``'s entries as of the table's latest version; None while there is no table."""
        async with self._lock():
            table = await self._open_table(task)
            return None if table is None else await self._fresh_state(task, table)

    async def _fresh_state(self, task: str, table: AsyncTable) -> TaskVectors:
        with self._store_errors(task, "read the table version"):
            version = await table.version()
        if version != self._version:
            self._tasks.clear()
            self._version = version
        state = self._tasks.get(task)
        if state is None:
            state = self._tasks[task] = await self._load(task, table)
        return state

    def _after_write(self, version: int, apply: Callable[[], object]) -> None:
        """Bring the in-process state to ``version`` after our own write, or drop it if another writer
        committed in between (then it reloads on next use)."""
        if self._version is not None and version == self._version + 1:
            apply()
            self._version = version
        else:
            self._tasks.clear()
            self._version = None

    async def _load(self, task: str, table: AsyncTable) -> TaskVectors:
        import pyarrow as pa

        dimensions = self._dimensions or 0
        with self._store_errors(task, "load its entries"):
            data = await (
                table.query()
                .where(f"task = {_sql_string(task)}")
                .select(["key", "text", "answer", "vector", "created_at"])
                .to_arrow()
            )
        data = data.sort_by([("created_at", "ascending"), ("key", "ascending")])
        keys, texts, answers = (data.column(name).to_pylist() for name in ("key", "text", "answer"))
        entries = [MemoryEntry(key=k, text=t, answer=a) for k, t, a in zip(keys, texts, answers, strict=True)]
        if not entries:
            return TaskVectors(dimensions)
        vectors = data.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        created = data.column("created_at").cast(pa.int64()).to_pylist()
        return TaskVectors.from_rows(entries, vectors, dimensions=dimensions, last_created_us=max(created))

    # -- LanceDB -------------------------------------------------------------------------------------------

    @overload
    async def _open_table(self, task: str) -> AsyncTable | None: ...

    @overload
    async def _open_table(self, task: str, *, create_dimensions: int) -> AsyncTable: ...

    async def _open_table(self, task: str, *, create_dimensions: int | None = None) -> AsyncTable | None:
        """The table, opened once; created when missing and ``create_dimensions`` is given, else None."""
        if self._table is not None:
            return self._table
        import lancedb
        import pyarrow as pa

        with self._store_errors(task, "open the table"):
            if self._connection is None:
                # Read consistency 0: every read sees other processes' commits (the version check relies on it).
                self._connection = await lancedb.connect_async(
                    self._path,
                    read_consistency_interval=timedelta(0),
                    storage_options=self._s3.lancedb_options() if self._s3 is not None else None,
                )
            if await _has_table(self._connection, self._table_name):
                table = await self._connection.open_table(self._table_name)
            elif create_dimensions is None:
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
        try:
            yield
        except GilError:
            raise
        except Exception as exc:
            if self._s3 is None:
                reason = f"the LanceDB store at {str(self._path)!r} failed to {what} ({type(exc).__name__}: {exc})"
                raise MemoryUnavailableError(reason, task=task) from exc
            reason = f"the LanceDB store at {self._path!r} failed to {what} ({self._s3.describe(exc)})"
            raise MemoryUnavailableError(reason, task=task) from None

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
