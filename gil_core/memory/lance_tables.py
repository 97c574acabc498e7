"""The LanceDB side of memory's table: the process's bounded LanceDB session, connecting to a local or ``s3://``
store, LanceDB's failures translated, upserts by (task, key), and compaction (``compact_memory``).

Never fork a process after it used LanceDB (hangs, lost writes): use spawn/forkserver or separate processes.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from gil_core.errors import GilError, InvalidArgumentError, MemoryUnavailableError
from gil_core.storage import S3Settings, load_s3_settings, location

if TYPE_CHECKING:
    from lancedb import AsyncConnection, Session
    from lancedb.table import AsyncTable

__all__ = [
    "ARROW_MEMORY_POOL",
    "KEEP_VERSIONS_FOR",
    "METADATA_CACHE_BYTES",
    "MemoryCompaction",
    "arrow_memory_pool",
    "compact_memory",
    "connect_store",
    "lance_errors",
    "lance_session",
    "locate_store",
    "merge_rows",
    "open_if_there",
    "sql_string",
    "task_rows",
]

METADATA_CACHE_BYTES = 64 << 20
"""LanceDB's metadata cache (manifests, fragment and file metadata) per process. Its own default, 1 GiB, keeps the
metadata of every table version a process read: a long-lived writer filled it (the soak's ~1 GB of native growth
per process, issue 19). The latest versions' metadata is all a lookup or a write reads."""
ARROW_MEMORY_POOL = "system"
"""The allocator of pyarrow's buffers in a process that opens memory (``ARROW_DEFAULT_MEMORY_POOL``), unless the
operator chose one. pyarrow's own default, mimalloc, kept growing in the soak's long-lived processes (about 5 MiB
more per process on average over six rounds than with the system allocator, and no faster: RELIABILITY.md,
"Findings")."""
KEEP_VERSIONS_FOR = timedelta(hours=1)  # compact_memory: table versions younger than this are kept
_SESSIONS: dict[tuple[int, int | None], Session] = {}
_SESSIONS_LOCK = threading.Lock()


def arrow_memory_pool() -> None:
    """Make ``ARROW_MEMORY_POOL`` pyarrow's default allocator in this process, unless ``ARROW_DEFAULT_MEMORY_POOL``
    is set (the operator's choice stands). pyarrow reads that variable once, when it is first imported; if it was
    imported before, its Python functions are pointed at that pool instead (``pyarrow.set_memory_pool``), and
    what its C++ code allocates by itself stays with the pool it chose."""
    if "ARROW_DEFAULT_MEMORY_POOL" in os.environ:
        return
    if "pyarrow" not in sys.modules:
        os.environ["ARROW_DEFAULT_MEMORY_POOL"] = ARROW_MEMORY_POOL
        return
    import pyarrow as pa

    pa.set_memory_pool(getattr(pa, f"{ARROW_MEMORY_POOL}_memory_pool")())


def lance_session(metadata_cache_bytes: int = METADATA_CACHE_BYTES, index_cache_bytes: int | None = None) -> Session:
    """The process's LanceDB session for these cache bounds (one per bound, shared by every connection that asks
    for it, so the bound holds for the process and not per connection). ``index_cache_bytes`` None keeps
    LanceDB's default (6 GiB), which only tasks answered from the vector index fill."""
    arrow_memory_pool()
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


def task_rows(task: str, keys: Sequence[str] | None = None) -> str:
    """The filter of ``task``'s rows (of those of ``keys`` when given)."""
    condition = f"task = {sql_string(task)}"
    if keys is None:
        return condition
    return f"{condition} AND key IN ({', '.join(map(sql_string, keys))})" if keys else "false"


def sql_string(value: str) -> str:
    """``value`` as a SQL string literal for a LanceDB (DataFusion) filter: quotes doubled, nothing else.

    DataFusion reads a backslash inside ``'…'`` as itself, so doubling ``'`` is the whole escape.
    """
    return "'" + value.replace("'", "''") + "'"


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
    where, settings = locate_store(path, s3)
    with lance_errors(where, settings, "", "compact the table"):
        connection = await connect_store(where, settings, (METADATA_CACHE_BYTES, None))
        opened = await open_if_there(connection, table)
        if opened is None:
            return None
        stats = await opened.optimize(cleanup_older_than=keep_versions_for)
    return MemoryCompaction(
        fragments_removed=int(stats.compaction.fragments_removed),
        fragments_added=int(stats.compaction.fragments_added),
        versions_removed=int(stats.prune.old_versions_removed),
        bytes_removed=int(stats.prune.bytes_removed),
    )


def locate_store(path: str | Path, s3: S3Settings | None) -> tuple[str | Path, S3Settings | None]:
    """The table folder (a local path, or an ``s3://`` URL as text) and, for a URL, its S3 settings (``s3``, or
    the environment's)."""
    where = location(path)
    return where, ((s3 if s3 is not None else load_s3_settings()) if isinstance(where, str) else None)


async def connect_store(path: str | Path, s3: S3Settings | None, caches: tuple[int, int | None]) -> AsyncConnection:
    """A connection to the store at ``path`` through the session bounded by ``caches`` (metadata, index bytes)."""
    import lancedb

    return await lancedb.connect_async(
        path,
        read_consistency_interval=timedelta(0),
        storage_options=s3.lancedb_options() if s3 is not None else None,
        session=lance_session(*caches),
    )


@contextmanager
def lance_errors(path: str | Path, s3: S3Settings | None, task: str, what: str) -> Iterator[None]:
    """Translate a LanceDB failure into ``MemoryUnavailableError`` naming the task and the operation.

    On object storage the text is redacted and the library's exception is not shown as the cause (a server's
    error body can echo a key).
    """
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


async def open_if_there(connection: AsyncConnection, name: str) -> AsyncTable | None:
    """The table ``name``, or None when there is none yet. A table another process is still creating is listed
    (its folder is there) before its first version is, and opening it then says it was not found: that is no
    table yet too, not a failure (two processes writing a fresh memory at once met it)."""
    page_token: str | None = None
    while True:
        listing = await connection.list_tables(page_token=page_token)
        if name in listing.tables:
            break
        page_token = listing.page_token
        if not page_token:
            return None
    try:
        return await connection.open_table(name)
    except ValueError as exc:
        if f"Table '{name}' was not found" in str(exc):  # LanceDB's own words for it, which it matches too
            return None
        raise


async def merge_rows(table: AsyncTable, rows: Any, *, delete: str | None) -> Any:
    """Upsert ``rows`` by (task, key) in one table version; with ``delete`` (a filter), also delete the rows it
    matches that are not in ``rows``."""
    builder = table.merge_insert(["task", "key"]).when_matched_update_all().when_not_matched_insert_all()
    if delete is not None:
        builder = builder.when_not_matched_by_source_delete(delete)
    # On an AsyncTable ``execute`` returns a coroutine, though it is annotated with the sync table's result.
    return await cast(Awaitable[Any], builder.execute(rows))
