"""A LanceDB memory's large tasks (``gil_core.memory._index``): which tasks are large, their index builds asked for
and noticed once done, and an indexed task brought in step with the rows the table holds beyond its snapshot."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from gil_core.memory._index import IndexBuilder, IndexedTask, IndexSettings, ReadTask, index_builder
from gil_core.memory._memory_counts import MemoryStats
from gil_core.memory._table_rows import COLUMNS, latest_rows
from gil_core.memory._task_snapshots import TaskSnapshots
from gil_core.memory._vectors import TaskVectors
from gil_core.memory.lance_tables import task_rows

if TYPE_CHECKING:
    from lancedb.table import AsyncTable

__all__ = ["LargeTasks"]

_TAIL_LAG_US = 30_000_000  # rows stamped this long before the latest one read are read again (late commits)
_MISSING_READ = 1000  # rows an indexed task misses that are read by key; more, and the task is read whole


class LargeTasks:
    """The large tasks of one memory: ``settings`` (None: no task is large), their snapshots in ``snapshots``, the
    memory's ``stats``. ``read_task`` reads a task for its index build; ``load`` reads a task whole into the
    process, and ``store_errors`` translates LanceDB's failures, both as the memory does."""

    def __init__(
        self,
        settings: IndexSettings | None,
        snapshots: TaskSnapshots,
        stats: MemoryStats,
        *,
        read_task: ReadTask,
        load: Callable[[str, AsyncTable], Awaitable[TaskVectors]],
        store_errors: Callable[[str, str], AbstractContextManager[None]],
    ) -> None:
        self._settings = settings
        self._snapshots = snapshots
        self._stats = stats
        self._read_task = read_task
        self._load = load
        self._store_errors = store_errors
        self._builder: IndexBuilder | None = None
        self._builds_seen = 0  # the builder's finished jobs when the memory last looked at the indexes

    def is_large(self, count: int) -> bool:
        return self._settings is not None and count >= self._settings.threshold

    def builder(self) -> IndexBuilder:
        """The background builder of the table's task indexes (shared by the process's memories on the table)."""
        if self._builder is None:
            assert self._settings is not None, "the memory keeps task indexes"
            self._builder = index_builder(self._snapshots.root(), self._read_task, self._settings)
            self._builds_seen = self._builder.done  # builds that ended before this memory used them are read anyway
        return self._builder

    def builds_moved(self) -> bool:
        """Whether an index build ended since the memory last looked."""
        return self._builder is not None and self._builder.done != self._builds_seen

    def builds_done(self) -> int:
        return self._builder.done if self._builder is not None else 0

    def see_builds(self, builds: int) -> bool:
        """Note ``builds`` (``builds_done`` before a look) as seen; whether it moved since the last look."""
        if builds == self._builds_seen:
            return False
        self._builds_seen = builds
        return True

    def index_if_large(self, task: str, state: TaskVectors) -> None:
        """Ask for the task's index once a task held here has grown past the threshold."""
        if self.is_large(len(state)) and not state.index_requested:
            state.index_requested = True
            builder = self.builder()
            if not builder.failures:  # a build that failed is not tried again by this process (the reason is kept)
                builder.request(task)

    def rebuild_if_stale(self, task: str, state: IndexedTask) -> None:
        """Ask for the task's index to be built again once it misses enough rows (written by any process)."""
        if state.stale() and not state.rebuild_requested:
            state.rebuild_requested = True
            self.builder().request(task)

    async def open(self, task: str, table: AsyncTable, dimensions: int | None) -> TaskVectors | IndexedTask | None:
        """``task`` (large) from its current index snapshot, in step with the table; None when it has no snapshot
        that opens (or a newer one appeared meanwhile)."""
        assert self._settings is not None, "the memory keeps task indexes"
        snapshot = await self._snapshots.open_index(task, dimensions)
        if snapshot is None:
            return None
        return await self.in_step(task, table, IndexedTask(snapshot, self._settings))

    async def in_step(self, task: str, table: AsyncTable, state: IndexedTask) -> TaskVectors | IndexedTask | None:
        """``state`` brought in step with the table: the rows stamped after those it read (and a lag before, for
        late commits) into its tail; when the task's count then differs from what it holds, the task's keys are
        listed and compared. None when the task's index has a newer snapshot (open that); held exactly here when
        it no longer is large, or misses too much to read by key."""
        if self._snapshots.index_generation(task) != state.snapshot.generation:
            return None
        where = task_rows(task)
        since = max(state.snapshot.last_created_us, state.seen_us - _TAIL_LAG_US)
        stamp = f"arrow_cast({since}, 'Timestamp(Microsecond, Some(\"UTC\"))')"
        with self._store_errors(task, "read its new entries"):
            data = (
                await table.query().where(f"{where} AND created_at > {stamp}").select([*COLUMNS, "_rowaddr"]).to_arrow()
            )
            count = await table.count_rows(where)
        self._stats.catch_ups += 1
        rows = latest_rows(data)
        state.learn(rows.entries, rows.vectors, rows.created)
        if count != len(state):
            with self._store_errors(task, "list its entries"):
                listed = await table.query().where(where).select(["key", "created_at"]).to_arrow()
            missing = await asyncio.to_thread(state.reconcile, listed)
            if len(missing) > _MISSING_READ:
                loaded = await self._load(task, table)
                self.index_if_large(task, loaded)
                return loaded
            if missing:
                with self._store_errors(task, "read the entries its index misses"):
                    data = await table.query().where(task_rows(task, missing)).select([*COLUMNS, "_rowaddr"]).to_arrow()
                rows = latest_rows(data)
                state.learn(rows.entries, rows.vectors, rows.created)
        if not self.is_large(len(state)):
            return await self._load(task, table)
        self.rebuild_if_stale(task, state)
        return state
