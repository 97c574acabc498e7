"""Memory's table rows as Arrow holds them: the table's schema, the rows a write commits, and the entries, vectors
and ``created_at`` stamps a read returns (earliest first, a key written twice keeping its latest row)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gil_core.memory._index import TaskRows
from gil_core.memory.ports import MemoryEntry

__all__ = ["COLUMNS", "arrow_rows", "columns_of", "earliest_first", "latest_columns", "latest_rows", "table_schema"]

COLUMNS = ["key", "text", "answer", "vector", "created_at"]  # a task's columns, as reads select them
_Vectors = NDArray[np.float32]


def table_schema(dimensions: int) -> Any:
    """The table's Arrow schema, its vectors ``dimensions`` wide."""
    import pyarrow as pa

    return pa.schema(
        [
            ("task", pa.string()),
            ("key", pa.string()),
            ("text", pa.string()),
            ("answer", pa.string()),
            ("vector", pa.list_(pa.float32(), dimensions)),
            ("created_at", pa.timestamp("us", tz="UTC")),
        ]
    )


def arrow_rows(
    task: str, entries: Sequence[MemoryEntry], vectors: _Vectors, created: Sequence[int], dimensions: int
) -> Any:
    """The rows a write of ``entries`` to ``task`` commits (``created``: their stamps, microseconds)."""
    import pyarrow as pa

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


def earliest_first(data: Any) -> Any:
    return data.sort_by([("created_at", "ascending"), ("key", "ascending"), ("_rowaddr", "ascending")])


def columns_of(data: Any) -> tuple[list[MemoryEntry], _Vectors, NDArray[np.int64], NDArray[np.int64]]:
    """The entries of rows read with ``COLUMNS`` and ``_rowaddr``, their vectors, ``created_at`` and addresses."""
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


def latest_columns(data: Any) -> tuple[list[MemoryEntry], _Vectors, NDArray[np.int64], NDArray[np.int64]]:
    """``columns_of`` the rows earliest first, a key twice (concurrent writers) keeping its latest row."""
    entries, vectors, created, addresses = columns_of(earliest_first(data))
    latest = {entry.key: position for position, entry in enumerate(entries)}
    if len(latest) < len(entries):
        keep = sorted(latest.values())
        entries = [entries[position] for position in keep]
        vectors, created, addresses = vectors[keep], created[keep], addresses[keep]
    return entries, vectors, created, addresses


def latest_rows(data: Any) -> TaskRows:
    entries, vectors, created, _ = latest_columns(data)
    return TaskRows(entries, vectors, created)
