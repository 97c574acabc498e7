"""Large tasks: lookups answered from an IVF index of the task's own vectors, kept beside the table, its
candidates rescored exactly.

A task that holds at least ``IndexSettings.threshold`` entries is not held in the process. Its rows are written,
once, into a **snapshot** beside the LanceDB table: a faiss ``IndexIVFScalarQuantizer`` (8-bit codes) over the
unit-length vectors (inner product, so its scores are approximate cosines) and an Arrow file of the rows (key,
text, answer, ``created_at`` and the raw float32 vector). A process that opens an indexed task builds nothing
and reads from the table only the rows newer than the snapshot; it reads the index file whole (searching one that
faiss memory-maps was 13× slower here) and memory-maps the rows. A lookup asks the index for ``candidates`` rows
(``nprobe`` of its lists searched) and ranks them by the exact float64 cosine of ``_vectors`` (ties: earliest
``created_at``, then key) before any threshold; the similarities are those the exact path computes for the same
rows, bit for bit.

LanceDB stays the source of truth. What the snapshot misses is held in the process: rows written after it
(the **tail**, searched exactly and merged into every answer) and its rows since deleted or replaced (**dropped**,
never returned). The tail is read from the table whenever its version moves (within the memory's refresh bound);
when the task's row count disagrees with what is held, its keys are read and compared, so deletions by another
process are honoured within the same bound. Once the tail and the dropped rows pass ``unindexed_share`` of the
snapshot (at least ``min_unindexed``), the snapshot is built again in the background.

faiss (``faiss-cpu``) rather than LanceDB's own indexes, by measurement (BENCHMARKS.md, "Speed: memory lookup"):
on 1M MiniLM embeddings no LanceDB index reached recall 0.99 within 10 ms here (IVF_HNSW_SQ 21 ms at 0.83,
IVF_FLAT 19.7 ms at 0.99), an HNSW graph over 1M rows took more than half an hour to build, and faiss's
IVF searched 1M rows in ~2 ms at 32 of 1,000 lists, built in under a minute. 8-bit codes rather than raw
float32 ones: a quarter of the file to read when a task is opened (1M rows: ~0.4 GB against 1.5 GB, which took
2–5 s to read here), at the same recall once 50 candidates are rescored exactly.

Each task has its own index (a folder named by a digest of the task, never by the name itself), so a small task
is never slowed by a large one's, and no task's lookups can reach another's rows. Snapshots are kept only for a
local store; on object storage every task is held in the process.

A snapshot's ``meta.json`` also names the task's memory generation read just before its rows were read
(``memory_generation``, see ``gil_core.memory._snapshots``): while the task's marker still holds it, the snapshot
is all of the task's rows, and a process that has not connected to LanceDB may answer from it alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gil_core.atomic import atomic_write_text, fsync_directory
from gil_core.memory._vectors import TaskVectors, exact_cosines, squared_lengths, widen
from gil_core.memory.ports import MemoryEntry

__all__ = [
    "IndexBuilder",
    "IndexSettings",
    "IndexedTask",
    "Snapshot",
    "TaskRows",
    "index_builder",
    "index_stamp",
    "rows_table",
    "snapshot_folder",
]

_LOG = logging.getLogger(__name__)
FORMAT = 1  # of a snapshot's files; another number is not read (the snapshot is built again)
_CURRENT = "current"  # the file naming a task's current snapshot (its generation folder)
_META, _INDEX, _ROWS = "meta.json", "index.faiss", "rows.arrow"
_Matrix32 = NDArray[np.float32]


@dataclass(frozen=True)
class IndexSettings:
    """How large tasks are indexed and searched (chosen by ``benchmarks/speed.py --parts memory``)."""

    threshold: int = 200_000  # entries of a task from which its lookups go to its index
    lists_per_sqrt: float = 1.0  # IVF lists: this × √rows (1,000 at 1M rows), at most rows / 39
    nprobe: int = 32  # lists searched per lookup
    candidates: int = 50  # nearest rows by the index's 8-bit cosine, rescored exactly
    train_per_list: int = 64  # k-means sample per list when training
    unindexed_share: float = 0.05  # build again once the tail and dropped rows pass this share of the snapshot
    min_unindexed: int = 10_000

    def lists(self, rows: int) -> int:
        return max(1, min(rows // 39, round(self.lists_per_sqrt * math.sqrt(rows))))


@dataclass
class TaskRows:
    """A task's rows as read from the table: a key at most once, earliest remembered first."""

    entries: list[MemoryEntry]
    vectors: _Matrix32  # len(entries) × dimensions, raw float32
    created: NDArray[np.int64]  # microseconds
    generation: str | None = None  # the task's memory generation read before the rows were (None: not kept)


def snapshot_folder(root: Path, task: str) -> Path:
    """The folder of ``task``'s snapshots under ``root``: named by a digest, so no task name becomes a path."""
    return root / hashlib.sha256(task.encode("utf-8")).hexdigest()[:40]


def current_generation(folder: Path) -> str | None:
    """The generation ``folder``'s ``current`` file names, None when there is none."""
    try:
        name = (folder / _CURRENT).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if name.startswith("g-") and "/" not in name and "\\" not in name else None


def index_stamp(folder: Path) -> str | None:
    """The memory generation ``folder``'s current index snapshot was read at (its ``meta.json`` only), if any."""
    generation = current_generation(folder)
    if generation is None:
        return None
    try:
        stamp = json.loads((folder / generation / _META).read_text(encoding="utf-8")).get("memory_generation")
    except (OSError, ValueError, AttributeError):
        return None
    return stamp if isinstance(stamp, str) else None


def rows_table(rows: TaskRows, dimensions: int) -> Any:
    """``rows`` as the Arrow table a snapshot keeps: key, text, answer, ``created_at`` (µs) and the raw vector."""
    import pyarrow as pa

    flat = pa.array(np.ascontiguousarray(rows.vectors, dtype=np.float32).reshape(-1), type=pa.float32())
    return pa.table(
        {
            "key": pa.array([entry.key for entry in rows.entries], pa.large_string()),
            "text": pa.array([entry.text for entry in rows.entries], pa.large_string()),
            "answer": pa.array([entry.answer for entry in rows.entries], pa.large_string()),
            "created_at": pa.array(rows.created, pa.int64()),
            "vector": pa.FixedSizeListArray.from_arrays(flat, dimensions),
        }
    )


class Snapshot:
    """One task's snapshot, opened: the faiss index (in memory) and the Arrow rows (memory-mapped)."""

    def __init__(self, folder: Path, generation: str, meta: dict[str, Any], index: Any, rows: Any) -> None:
        self.folder = folder
        self.generation = generation
        self.count = int(meta["count"])
        self.dimensions = int(meta["dimensions"])
        self.last_created_us = int(meta["last_created_us"])
        stamp = meta.get("memory_generation")
        self.memory_generation = stamp if isinstance(stamp, str) else None
        self._index = index
        batch = rows.combine_chunks()  # written as one batch: nothing is copied
        self.keys = batch.column("key").chunk(0)
        self._texts = batch.column("text").chunk(0)
        self._answers = batch.column("answer").chunk(0)
        self.created: NDArray[np.int64] = np.asarray(batch.column("created_at").chunk(0).to_numpy(), np.int64)
        vectors = batch.column("vector").chunk(0).flatten()
        self.vectors: _Matrix32 = np.asarray(vectors.to_numpy(zero_copy_only=True), np.float32).reshape(
            self.count, self.dimensions
        )

    @classmethod
    def open(cls, folder: Path, *, task: str, dimensions: int | None) -> Snapshot | None:
        """The current snapshot in ``folder``; None when there is none, it is another format, task or width, or
        its files cannot be read (a warning says which: the caller builds it again)."""
        generation = current_generation(folder)
        if generation is None:
            return None
        place = folder / generation
        try:
            meta = json.loads((place / _META).read_text(encoding="utf-8"))
            if meta.get("format") != FORMAT or meta.get("task") != task:
                _LOG.warning("memory index %s is of another format or task: building it again", place)
                return None
            if dimensions is not None and int(meta["dimensions"]) != dimensions:
                return None
            import faiss
            import pyarrow as pa

            # Read whole: searching an index faiss memory-maps was 13× slower here (1.6 ms against 0.12 ms at 10k).
            index = faiss.read_index(str(place / _INDEX))
            rows = pa.ipc.open_file(pa.memory_map(str(place / _ROWS), "r")).read_all()
            if rows.num_rows == int(meta["count"]) == index.ntotal:
                return cls(folder, generation, meta, index, rows)
            reason = f"{rows.num_rows} rows and {index.ntotal} vectors for a count of {meta['count']}"
        except Exception as exc:  # a damaged snapshot is built again from the table, never served
            reason = f"{type(exc).__name__}: {exc}"
        _LOG.warning("memory index %s cannot be read (%s): building it again", place, reason)
        return None

    @staticmethod
    def write(folder: Path, task: str, rows: TaskRows, settings: IndexSettings) -> str:
        """Write ``rows`` as ``task``'s new snapshot in ``folder`` and make it current; its generation."""
        import faiss
        import pyarrow as pa

        count = len(rows.entries)
        dimensions = int(rows.vectors.shape[1])
        unit = np.array(rows.vectors, dtype=np.float32, copy=True, order="C")
        faiss.normalize_L2(unit)  # a zero vector stays zero: similar to nothing
        lists = settings.lists(count)
        index: Any
        if lists <= 1:
            index = faiss.IndexFlatIP(dimensions)
        else:
            index = faiss.IndexIVFScalarQuantizer(
                faiss.IndexFlatIP(dimensions),
                dimensions,
                lists,
                faiss.ScalarQuantizer.QT_8bit,
                faiss.METRIC_INNER_PRODUCT,
            )
            sample = min(count, lists * settings.train_per_list)
            chosen = np.random.default_rng(0).choice(count, sample, replace=False) if sample < count else slice(None)
            index.train(np.ascontiguousarray(unit[chosen]))
        index.add(unit)
        del unit
        generation = f"g-{uuid.uuid4().hex}"
        place = folder / generation
        place.mkdir(parents=True)
        faiss.write_index(index, str(place / _INDEX))
        table = rows_table(rows, dimensions)
        with pa.OSFile(str(place / _ROWS), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=max(1, count))
        last = int(rows.created.max()) if count else 0
        meta = {"format": FORMAT, "task": task, "count": count, "dimensions": dimensions, "lists": lists}
        meta.update(last_created_us=last, memory_generation=rows.generation)
        (place / _META).write_text(json.dumps(meta), encoding="utf-8")
        for name in (_INDEX, _ROWS, _META):
            with open(place / name, "rb") as written:
                os.fsync(written.fileno())
        fsync_directory(place)
        atomic_write_text(folder / _CURRENT, generation, encoding="ascii")
        for other in folder.iterdir():  # readers holding an older one keep their mapping (POSIX)
            if other.is_dir() and other.name != generation:
                shutil.rmtree(other, ignore_errors=True)
        return generation

    def search(self, unit: _Matrix32, wanted: int, nprobe: int) -> NDArray[np.int64]:
        """The positions of up to ``wanted`` rows nearest to ``unit`` (1 × d, unit length) by float32 cosine."""
        if hasattr(self._index, "nprobe"):
            self._index.nprobe = nprobe
        _, positions = self._index.search(unit, min(wanted, self.count))
        found: NDArray[np.int64] = positions[0]
        return found[found >= 0]

    def find(self, keys: Sequence[str]) -> dict[str, int]:
        """The position of each of ``keys`` that the snapshot holds."""
        if not keys or not self.count:
            return {}
        import pyarrow as pa
        import pyarrow.compute as pc

        wanted = pa.array(list(keys), pa.large_string())
        places = pc.index_in(self.keys, value_set=wanted)
        positions = np.flatnonzero(np.asarray(places.is_valid().to_numpy(zero_copy_only=False)))
        return {self.key(int(position)): int(position) for position in positions}

    def key(self, position: int) -> str:
        return str(self.keys[position].as_py())

    def entry(self, position: int, similarity: float) -> MemoryEntry:
        return MemoryEntry(
            self.key(position), self._texts[position].as_py(), self._answers[position].as_py(), similarity
        )


class IndexedTask:
    """A task answered from its snapshot, with what the snapshot misses held here (the module says how)."""

    def __init__(self, snapshot: Snapshot, settings: IndexSettings) -> None:
        self.snapshot = snapshot
        self.settings = settings
        self.tail = TaskVectors(snapshot.dimensions)  # rows the snapshot does not hold, exact
        self.dropped: set[str] = set()  # snapshot keys deleted or replaced since it was built
        self.seen_us = snapshot.last_created_us  # the latest ``created_at`` read into the tail
        self.rebuild_requested = False

    def __len__(self) -> int:
        return self.snapshot.count - len(self.dropped) + len(self.tail)

    @property
    def last_created_us(self) -> int:
        return max(self.seen_us, self.tail.last_created_us)

    def stale(self) -> bool:
        """Whether the snapshot misses enough to be built again."""
        missed = len(self.tail) + len(self.dropped)
        return missed >= max(self.settings.min_unindexed, self.settings.unindexed_share * self.snapshot.count)

    def learn(
        self, entries: Sequence[MemoryEntry], vectors: _Matrix32, created: Sequence[int] | NDArray[np.int64]
    ) -> None:
        """Rows read from the table (or written here) that the snapshot does not hold: into the tail; the
        snapshot's rows of their keys are dropped."""
        held = self.snapshot.find([entry.key for entry in entries])
        for position, entry in enumerate(entries):
            stamp = int(created[position])
            place = held.get(entry.key)
            if place is not None and int(self.snapshot.created[place]) == stamp:
                continue  # the snapshot's own row
            self.tail.learn(entry, vectors[position], stamp, -1)
            if place is not None and int(self.snapshot.created[place]) < stamp:
                self.dropped.add(entry.key)
            self.seen_us = max(self.seen_us, stamp)

    def forget(self, key: str) -> None:
        self.tail.remove(key)
        if key not in self.dropped and self.snapshot.find([key]):
            self.dropped.add(key)

    def reconcile(self, listed: Any) -> list[str]:
        """Bring what is held in step with the task's rows as the table lists them (an Arrow table of ``key``
        and ``created_at`` in microseconds): the snapshot's rows not listed are dropped, the tail's removed; the
        keys of listed rows held nowhere are returned (the caller reads them)."""
        import pyarrow as pa

        listed = pa.table(
            {
                "key": listed.column("key").cast(pa.large_string()),
                "created_at": listed.column("created_at").cast(pa.int64()),
            }
        )
        ours = pa.table({"key": self.snapshot.keys, "created_at": pa.array(self.snapshot.created, pa.int64())})
        gone = ours.join(listed, keys=["key", "created_at"], join_type="left anti")
        self.dropped = set(gone.column("key").to_pylist())
        tail = self.tail.entries()
        held = pa.table(
            {
                "key": pa.array([entry.key for entry in tail], pa.large_string()),
                "created_at": pa.array([self.tail.created_of(entry.key) for entry in tail], pa.int64()),
            }
        )
        for key in held.join(listed, keys=["key", "created_at"], join_type="left anti").column("key").to_pylist():
            self.tail.remove(key)
        missing = listed.join(ours, keys=["key", "created_at"], join_type="left anti")
        missing = missing.join(held, keys=["key", "created_at"], join_type="left anti")
        return [str(key) for key in missing.column("key").to_pylist()]

    def nearest(self, query: NDArray[np.floating], k: int) -> list[MemoryEntry] | None:
        """Up to ``k`` entries by exact cosine among the index's candidates and the tail; None when the query
        has no direction (the caller then ranks the task exactly)."""
        target = widen(np.reshape(query, (1, -1)))
        target_length = float(squared_lengths(target)[0])
        if target_length == 0.0:
            return None
        unit = (target / math.sqrt(target_length)).astype(np.float32)
        wanted = max(self.settings.candidates, k)
        live = self.snapshot.count - len(self.dropped)
        asked = wanted + min(len(self.dropped), 4 * wanted)
        while True:
            positions = self.snapshot.search(unit, asked, self.settings.nprobe)
            if self.dropped:
                positions = np.asarray(
                    [p for p in positions if self.snapshot.key(int(p)) not in self.dropped], np.int64
                )
            if len(positions) >= min(wanted, live) or asked >= self.snapshot.count:
                break
            asked *= 4
        ranked: list[tuple[float, int, str, MemoryEntry | int]] = []
        if len(positions):
            rows = self.snapshot.vectors[positions]
            similarities = exact_cosines(rows, squared_lengths(widen(rows)), target, target_length)
            for position, similarity in zip(positions, similarities, strict=True):
                place = int(position)
                ranked.append((-float(similarity), int(self.snapshot.created[place]), self.snapshot.key(place), place))
        for entry in self.tail.nearest(query, k):
            created = self.tail.created_of(entry.key)
            ranked.append((-(entry.similarity or 0.0), created or 0, entry.key, entry))
        ranked.sort(key=lambda item: item[:3])
        found = []
        for negative, _, _, item in ranked[:k]:
            found.append(self.snapshot.entry(item, -negative) if isinstance(item, int) else replace(item))
        return found


ReadTask = Callable[[str], Coroutine[Any, Any, TaskRows]]


class IndexBuilder:
    """Builds tasks' snapshots on a background thread (one per table and process), reading each task through
    ``read`` (its own connection), so no caller waits for a build.

    ``builds`` counts the snapshots this process has written; ``done`` moves whenever a job ends, so memories in
    the process know to look at their tasks' snapshots again; ``failures`` keeps each failed build's reason.
    """

    def __init__(self, root: Path, read: ReadTask, settings: IndexSettings) -> None:
        self.root = root
        self._read = read
        self._settings = settings
        self._lock = threading.Lock()
        self._wanted: list[str] = []
        self._thread: threading.Thread | None = None
        self.builds = 0
        self.done = 0
        self.failures: list[str] = []

    def request(self, task: str) -> None:
        """Ask for ``task``'s snapshot to be (re)built from the table."""
        with self._lock:
            if task not in self._wanted:
                self._wanted.append(task)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="gil-memory-index", daemon=True)
                self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the builds asked so far; whether they are all done."""
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
                task = self._wanted.pop(0)
            try:
                rows = asyncio.run(self._read(task))
                folder = snapshot_folder(self.root, task)
                if rows.entries and not _covers(folder, task, rows):
                    Snapshot.write(folder, task, rows, self._settings)
                    self.builds += 1
            except Exception as exc:  # a failed build leaves the task's lookups exact; the reason is kept and logged
                digest = snapshot_folder(self.root, task).name
                self.failures.append(f"task {digest}: {type(exc).__name__}: {exc}")
                _LOG.warning("memory index build failed for task %s under %s: %s", digest, self.root, exc)
            finally:
                self.done += 1


def _covers(folder: Path, task: str, rows: TaskRows) -> bool:
    """Whether ``folder``'s current snapshot opens and already holds ``rows`` (the same count and latest stamp:
    asked for twice, or built by another process meanwhile)."""
    snapshot = Snapshot.open(folder, task=task, dimensions=int(rows.vectors.shape[1]))
    return (
        snapshot is not None
        and snapshot.count == len(rows.entries)
        and snapshot.last_created_us == int(rows.created.max())
    )


_BUILDERS: dict[str, IndexBuilder] = {}
_BUILDERS_LOCK = threading.Lock()


def index_builder(root: Path, read: ReadTask, settings: IndexSettings) -> IndexBuilder:
    """The process's builder for the snapshots under ``root`` (one table's)."""
    key = str(root.resolve())
    with _BUILDERS_LOCK:
        builder = _BUILDERS.get(key)
        if builder is None:
            builder = _BUILDERS[key] = IndexBuilder(root, read, settings)
        return builder
