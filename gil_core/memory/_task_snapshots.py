"""One memory's use of its tasks' snapshots beside a local table (``gil_core.memory._snapshots``, and the index
snapshots of ``gil_core.memory._index``): tasks answered from them until the memory connects to LanceDB, exact
rows kept after a load, and each task's memory generation advanced around every write."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gil_core.errors import MemoryUnavailableError
from gil_core.memory._index import (
    IndexedTask,
    IndexSettings,
    Snapshot,
    TaskRows,
    current_generation,
    index_stamp,
    snapshot_folder,
)
from gil_core.memory._memory_counts import MemoryStats, ProcessWrites
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

__all__ = ["TaskSnapshots"]

_LOG = logging.getLogger(__name__)


@dataclass
class _Served:
    """A task answered from its snapshot: the state, the generation it is current for, when the marker was last
    read (the clock just before) and this process's write count then."""

    state: TaskVectors | IndexedTask
    generation: str
    checked_at: float = 0.0
    writes_seen: int = -1


class TaskSnapshots:
    """The snapshots of one memory's tasks in ``root`` (``<path>/<table>.gil-index``; None for a store on object
    storage, which keeps none), as ``LanceDBMemory`` describes them. ``index`` None: no index snapshot is served.
    The memory's ``stats``, ``clock``, ``refresh_interval`` and process ``writes`` are shared with it."""

    def __init__(
        self,
        root: Path | None,
        index: IndexSettings | None,
        stats: MemoryStats,
        *,
        refresh_interval: float,
        clock: Callable[[], float],
        writes: ProcessWrites,
    ) -> None:
        self._root = root
        self._index = index
        self._stats = stats
        self._refresh_interval = refresh_interval
        self._clock = clock
        self._writes = writes
        self._unreadable: set[tuple[str, str]] = set()  # (task, snapshot generation) that failed to open here
        self._served: dict[str, _Served] = {}  # tasks answered from snapshots, until the memory connects
        self._kept: dict[str, Snapshot] = {}  # index snapshots opened while serving, reused once connected
        self._writers: list[threading.Thread] = []

    @property
    def local(self) -> bool:
        """Whether snapshots are kept (a local store)."""
        return self._root is not None

    def root(self) -> Path:
        """The folder of the tasks' snapshots and indexes."""
        assert self._root is not None, "snapshots and indexes are kept for a local store"
        return self._root

    # -- answering from snapshots, until the memory connects ------------------------------------------------

    async def serve(self, task: str) -> TaskVectors | IndexedTask | None:
        """``task`` from its snapshot: the marker read again once ``refresh_interval`` has passed since it was
        last read or this process wrote to the table; None when the marker is missing or names no snapshot that
        opens (the table answers then)."""
        assert self._root is not None, "snapshots are kept for a local store"
        served = self._served.get(task)
        started, writes = self._clock(), self._writes.count
        if served is not None and writes == served.writes_seen and started - served.checked_at < self._refresh_interval:
            return served.state
        generation = read_generation(snapshot_folder(self._root, task))
        self._stats.generation_reads += 1
        if served is None or served.generation != generation:
            self._unserve(task)
            if generation is None:
                return None
            state = await asyncio.to_thread(self._open, task, generation)
            if state is None:
                return None
            served = self._served[task] = _Served(state, generation)
        served.checked_at, served.writes_seen = started, writes
        return served.state

    def _open(self, task: str, generation: str) -> TaskVectors | IndexedTask | None:
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
                    self._stats.snapshot_opens += 1
                    return IndexedTask(snapshot, self._index)
        return open_exact(folder, task, generation)

    def _unserve(self, task: str) -> None:
        """``task`` is no longer answered from its snapshot (an index snapshot opened is kept for the table's path,
        which reuses it while it is current)."""
        served = self._served.pop(task, None)
        if served is not None and isinstance(served.state, IndexedTask):
            self._kept[task] = served.state.snapshot

    def stop_serving(self) -> None:
        """The memory connects: the table answers from now on."""
        for task in list(self._served):
            self._unserve(task)

    # -- index snapshots, once connected --------------------------------------------------------------------

    async def open_index(self, task: str, dimensions: int | None) -> Snapshot | None:
        """``task``'s current index snapshot (the one opened while serving, if still current); None when there is
        none, or it cannot be read (held here as unreadable until it is built again)."""
        folder = snapshot_folder(self.root(), task)
        current = current_generation(folder)
        snapshot = self._kept.pop(task, None)  # opened while serving: not read again
        if snapshot is not None and snapshot.generation != current:
            snapshot = None
        if snapshot is None and current is not None and (task, current) not in self._unreadable:
            snapshot = await asyncio.to_thread(Snapshot.open, folder, task=task, dimensions=dimensions)
            if snapshot is None:  # damaged, another format or width: held here until it is built again
                self._unreadable.add((task, current))
            else:
                self._stats.snapshot_opens += 1
        return snapshot

    def index_generation(self, task: str) -> str | None:
        """The generation of ``task``'s current index snapshot (None: none built)."""
        return current_generation(snapshot_folder(self.root(), task))

    def has_current(self, task: str) -> bool:
        """Whether ``task`` has a current index snapshot not known to be unreadable."""
        generation = self.index_generation(task)
        return generation is not None and (task, generation) not in self._unreadable

    # -- keeping snapshots and generations -------------------------------------------------------------------

    def settled(self, task: str) -> str | None:
        """The generation to stamp a snapshot of ``task`` read from now on with (None: none kept)."""
        return None if self._root is None else settle_generation(snapshot_folder(self._root, task))

    def keep(self, task: str, generation: str, rows: TaskRows, dimensions: int) -> None:
        """Write ``rows`` as ``task``'s exact snapshot on a thread of its own (not a daemon: a command's process
        waits for it before it exits), unless the marker has moved since or the snapshot is current already."""
        assert self._root is not None, "snapshots are kept for a local store"
        folder = snapshot_folder(self._root, task)

        def keep() -> None:
            try:
                if read_generation(folder) == generation and exact_stamp(folder) != generation:
                    write_exact(folder, task, generation, rows, dimensions)
                    self._stats.snapshot_writes += 1
            except Exception as exc:  # a snapshot not kept costs a fresh process a load from the table, no more
                _LOG.warning("memory snapshot %s not written: %s: %s", folder, type(exc).__name__, exc)

        thread = threading.Thread(target=keep, name="gil-memory-snapshot")
        self._writers = [*(alive for alive in self._writers if alive.is_alive()), thread]
        thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the exact snapshots being written; whether they are all written."""
        for thread in list(self._writers):
            thread.join(timeout)
        return not any(thread.is_alive() for thread in self._writers)

    @contextmanager
    def advancing(self, task: str) -> Iterator[None]:
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
