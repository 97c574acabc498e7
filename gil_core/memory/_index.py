"""Large tasks: lookups answered from LanceDB's vector index, its candidates rescored exactly.

A task that holds at least ``IndexSettings.threshold`` entries is not held in the process: each lookup asks
LanceDB's IVF_HNSW_FLAT index on ``vector`` (cosine, raw float32 vectors) for ``candidates`` row ids with their
float32 distances, filtered by task (after the graph when the task holds most of the table, which costs nothing;
before it otherwise, a pass over the bitmap index on ``task``), takes the rows within 4× the float32 error bound of
the k-th best by id, and ranks them by the exact float64 cosine of ``_vectors`` (ties: earliest ``created_at``,
then key) before any threshold. Rows added after the index was built are searched by LanceDB without it (exactly)
until the index is optimised; deleted rows are never returned. The index is LanceDB's own, stored with the table: a
process that opens an indexed task builds nothing.

The index covers the whole table; smaller tasks never use it (they are ranked in the process), so they are not
slowed by it. Building and optimising run on one background thread per table and process, with a connection of
their own, so no caller waits for them; until a task's index exists, its lookups stay exact in the process.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from gil_core.memory._vectors import approximation_margin, exact_cosines, squared_lengths, widen
from gil_core.memory.ports import MemoryEntry

if TYPE_CHECKING:
    from lancedb.table import AsyncTable

__all__ = ["IndexBuilder", "IndexSettings", "IndexedTask", "has_vector_index", "index_builder"]

_LOG = logging.getLogger(__name__)
VECTOR_INDEX = "vector_idx"
_TAKEN = ("key", "text", "answer", "vector", "created_at")
TASK_INDEX = "task_idx"


@dataclass(frozen=True)
class IndexSettings:
    """How large tasks are indexed and searched (chosen by ``benchmarks/speed.py --parts memory``)."""

    threshold: int = 200_000  # entries of a task from which its lookups go to the index
    rows_per_partition: int = 2_000_000  # IVF partitions of the HNSW graphs (one graph up to 3M rows)
    m: int = 16  # HNSW neighbours per node
    ef_construction: int = 150
    nprobes: int = 4  # partitions searched per lookup (all of them up to 1M entries)
    ef: int = 64  # HNSW candidates explored per partition at query time
    candidates: int = 20  # nearest rows the search returns (their float32 distances)
    distance_margin: float | None = None  # rows within this of the k-th best are rescored (None: 4× float32's bound)
    unindexed_share: float = 0.05  # optimise once more rows than this share of the indexed ones are unindexed
    min_unindexed: int = 10_000

    def partitions(self, rows: int) -> int:
        return max(1, round(rows / self.rows_per_partition))


@dataclass
class IndexedTask:
    """A task answered from the vector index: what the process knows of it without holding its rows."""

    count: int
    last_created_us: int
    settings: IndexSettings
    share: float = 1.0  # of the table's rows (the search filters after the index when it holds most of them)
    writes: int = 0  # this process's writes since the last optimisation was asked for
    count_at_optimise: int = -1  # its size when an optimisation was last asked for (-1: when it was opened)

    def __post_init__(self) -> None:
        if self.count_at_optimise < 0:
            self.count_at_optimise = self.count

    def grown(self) -> bool:
        """Whether it has grown enough since the last optimisation was asked for to ask again (the growth may
        come from any process)."""
        if self.count - self.count_at_optimise < self.settings.min_unindexed:
            return False
        self.count_at_optimise = self.count
        return True

    def __len__(self) -> int:
        return self.count

    async def nearest(
        self, table: AsyncTable, where: str, query: NDArray[np.floating], k: int
    ) -> list[MemoryEntry] | None:
        """Up to ``k`` entries by exact cosine among the index's candidates; None when the query has no direction
        (the caller then ranks the task exactly).

        The search returns row ids and float32 cosine distances only; the rows within ``distance_margin`` of the
        k-th best are then taken by id and rescored exactly. When the task holds most of the table its filter is
        applied to the nearest rows (a postfilter, asking for proportionally more); otherwise, or when that
        leaves too few, the task's rows are masked before the search (a prefilter, which costs a pass over the
        task's bitmap: ~13 ms at 1M rows here).
        """
        target = widen(np.reshape(query, (1, -1)))
        target_length = float(squared_lengths(target)[0])
        if target_length == 0.0:
            return None
        wanted = max(self.settings.candidates, k)
        candidates = None
        if self.share >= 0.5:
            candidates = await self._search(table, where, target, wanted, post=True)
            if candidates.num_rows < min(wanted, self.count):
                candidates = None  # other tasks' rows crowded the task's out: mask them first
        if candidates is None:
            candidates = await self._search(table, where, target, wanted, post=False)
        if not candidates.num_rows:
            return []
        import pyarrow as pa

        distances = candidates.column("_distance").to_numpy().astype(np.float64)
        scores = 1.0 - distances
        kth = np.sort(scores)[::-1][min(k, len(scores)) - 1]
        margin = self.settings.distance_margin or 4 * approximation_margin(target.shape[1])
        short = np.flatnonzero(scores >= kth - margin)
        ids = candidates.column("_rowid").to_numpy()[short]
        expected = {candidates.column("key")[int(position)].as_py() for position in short}
        data = await table.take_row_ids([int(row) for row in ids]).select(list(_TAKEN)).to_arrow()
        if set(data.column("key").to_pylist()) != expected:  # the rows moved in between (a compaction): ask again
            data = await self._search(table, where, target, wanted, post=False, columns=_TAKEN)
        rows = np.asarray(data.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False))
        rows = rows.astype(np.float32, copy=False).reshape(data.num_rows, -1)
        similarities = exact_cosines(rows, squared_lengths(widen(rows)), target, target_length)
        keys, texts, answers = (data.column(name).to_pylist() for name in ("key", "text", "answer"))
        created = data.column("created_at").cast(pa.int64()).to_pylist()
        order = sorted(range(len(keys)), key=lambda i: (-float(similarities[i]), created[i], keys[i]))[:k]
        return [replace(MemoryEntry(keys[i], texts[i], answers[i]), similarity=float(similarities[i])) for i in order]

    async def _search(
        self,
        table: AsyncTable,
        where: str,
        target: NDArray[np.float64],
        wanted: int,
        *,
        post: bool,
        columns: Sequence[str] = ("key", "_distance"),
    ) -> Any:
        limit = math.ceil(wanted / max(self.share, 1e-9)) if post else wanted
        search = (
            table.vector_search(target[0].astype(np.float32))
            .distance_type("cosine")
            .nprobes(self.settings.nprobes)
            .ef(max(self.settings.ef, limit))
            .limit(limit)
            .where(where)
        )
        if post:
            search = search.postfilter()
        return await search.with_row_id().select(list(columns)).to_arrow()


class IndexBuilder:
    """Builds and optimises one table's indexes on a background thread (one per table and process).

    ``builds`` and ``optimisations`` count what this process has done; ``done`` moves whenever a job ends, so
    memories in the process know to look at the table's indexes again.
    """

    def __init__(self, connect: Callable[[], Any], table: str, settings: IndexSettings) -> None:
        self._connect = connect
        self._table = table
        self._settings = settings
        self._lock = threading.Lock()
        self._wanted: set[str] = set()
        self._thread: threading.Thread | None = None
        self.builds = 0
        self.optimisations = 0
        self.done = 0
        self.failures: list[str] = []

    def request(self, job: str) -> None:
        """Ask for ``"build"`` (the vector and task indexes) or ``"optimise"`` (fold new rows into them)."""
        with self._lock:
            self._wanted.add(job)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=f"gil-index-{self._table}", daemon=True)
                self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the jobs asked so far; whether they are all done."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._wanted:
                    self._thread = None
                    return
                job = "build" if "build" in self._wanted else self._wanted.pop()
                self._wanted.discard(job)
            try:
                asyncio.run(self._job(job))
            except Exception as exc:  # a failed build leaves lookups exact; the reason is kept and logged
                self.failures.append(f"{job}: {type(exc).__name__}: {exc}")
                _LOG.warning("memory index %s failed on table %r: %s", job, self._table, exc)
            finally:
                self.done += 1

    async def _job(self, job: str) -> None:
        connection = await self._connect()
        table = await connection.open_table(self._table)
        if job == "build":
            await self._build(table)
        else:
            await self._optimise(table)

    async def _build(self, table: AsyncTable) -> None:
        from lancedb.index import Bitmap, HnswFlat

        names = {index.name for index in await table.list_indices()}
        if VECTOR_INDEX in names:  # another process built it: fold in what it misses, if that is much
            await self._optimise(table)
            return
        settings = self._settings
        rows = await table.count_rows()
        config = HnswFlat(  # raw vectors: the search's distances are float32 cosines, good for a shortlist
            distance_type="cosine",
            num_partitions=settings.partitions(rows),
            m=settings.m,
            ef_construction=settings.ef_construction,
        )
        await table.create_index("vector", config=config, name=VECTOR_INDEX)
        if TASK_INDEX not in names:
            await table.create_index("task", config=Bitmap(), name=TASK_INDEX)
        self.builds += 1

    async def _optimise(self, table: AsyncTable) -> None:
        stats = await table.index_stats(VECTOR_INDEX)
        if stats is None:
            return
        settings = self._settings
        if stats.num_unindexed_rows < max(settings.min_unindexed, settings.unindexed_share * stats.num_indexed_rows):
            return
        await table.optimize()
        self.optimisations += 1


_BUILDERS: dict[tuple[str, str], IndexBuilder] = {}
_BUILDERS_LOCK = threading.Lock()


def index_builder(path: str | Path, table: str, connect: Callable[[], Any], settings: IndexSettings) -> IndexBuilder:
    """The process's builder for ``table`` under ``path``."""
    key = (str(Path(path).resolve()) if isinstance(path, Path) else path, table)
    with _BUILDERS_LOCK:
        builder = _BUILDERS.get(key)
        if builder is None:
            builder = _BUILDERS[key] = IndexBuilder(connect, table, settings)
        return builder


async def has_vector_index(table: AsyncTable) -> bool:
    return VECTOR_INDEX in {index.name for index in await table.list_indices()}
