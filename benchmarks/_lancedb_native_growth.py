"""A diagnostic, not a benchmark: a fresh process remembering new memory entries one at a time, and glibc's bytes in
use per write once LanceDB's metadata cache is full, less what that cache grew (RELIABILITY.md, "Findings", the
soak's RSS); also the process's anonymous memory, read once it stops falling (``_soak_worker.settled_rss``), and
what memory's own entries hold in Python over the same writes. Prints one JSON object.

    uv run python -m benchmarks._lancedb_native_growth ROOT [WARM] [MEASURED] [--lookups] [--tag T] [--chunk N]
        [--pause S] [--reads-only] [--trim]

ROOT is a folder for the table; WARM writes (300) fill the cache before MEASURED writes (600) are counted.
The metadata cache is bounded at 4 MiB here so that it is full after the warm-up. ``--lookups`` looks each entry
up after writing it. Two processes started at once on one ROOT, with different ``--tag``s, write one table
between them, as the soak's pair does. ``--chunk N`` makes each write one ``change`` of N new entries, as a chunk
of verdicts is written (the soak's: 200), and looks up the chunk's last entry. ``--pause S`` waits S seconds
after each write. ``--reads-only`` makes a process that writes nothing but its first entry: started beside a
writer on the same ROOT, it looks an entry up every 50 ms, so that it catches up with the writer's versions (at
most every ``refresh_interval``), and counts WARM catch-ups before MEASURED ones; give the writer enough writes
(and a pause) to outlast it. ``--trim`` calls glibc's ``malloc_trim(0)`` before both samples, so that the freed
pages glibc keeps are left out of the anonymous memory at both ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING

from benchmarks._soak_ablations import trim_freed_pages
from benchmarks._soak_worker import (
    MEMORY_ENTRY_TYPES,
    MEMORY_QUERY_TYPES,
    _instances,
    _malloc_bytes,
    deep_size,
    settled_rss,
)
from gil_core.memory import LanceDBMemory, MemoryChanges
from gil_core.memory.lance_tables import lance_session
from gil_core.testing import HashEmbeddingModel

if TYPE_CHECKING:
    from lancedb import Session

CACHE_BYTES = 4 * 2**20


def _entries_bytes() -> int:
    return deep_size(_instances(*MEMORY_ENTRY_TYPES, *MEMORY_QUERY_TYPES), set())


def _opened(root: str) -> tuple[LanceDBMemory, Session]:
    return LanceDBMemory(root, HashEmbeddingModel(8), metadata_cache_bytes=CACHE_BYTES), lance_session(CACHE_BYTES)


def _sample(session: Session, trim: bool) -> tuple[int, int, int, int]:
    if trim:
        trim_freed_pages()
    return (_malloc_bytes()[0] or 0, session.size_bytes, int(settled_rss()["rss_anon"]), _entries_bytes())


def _figures(start: tuple[int, int, int, int], end: tuple[int, int, int, int], count: int) -> dict[str, int]:
    in_use, cached = end[0] - start[0], end[1] - start[1]
    return {
        "in_use": in_use, "cache": cached, "per_write": (in_use - cached) // count, "anonymous": end[2] - start[2],
        "entries": end[3] - start[3],
    }  # fmt: skip


async def measure(
    root: str,
    warm: int,
    measured: int,
    *,
    lookups: bool = False,
    tag: str = "t",
    chunk: int = 1,
    pause: float = 0.0,
    trim: bool = False,
) -> dict[str, int]:
    memory, session = _opened(root)
    start = (0, 0, 0, 0)
    for index in range(warm + measured):
        if index == warm:
            start = _sample(session, trim)
        changes = MemoryChanges()
        for item in range(index * chunk, (index + 1) * chunk):
            text = f"where is parcel {tag} {item}"
            changes.remember(f"{tag}-{item}", text, f"Parcel {item} is on its way.")
        await memory.change("support", changes)
        if lookups:
            await memory.lookup("support", text, threshold=0.9)
        await asyncio.sleep(pause)
    return {"writes": measured, **_figures(start, _sample(session, trim), measured)}


async def read_only(root: str, warm: int, measured: int, *, trim: bool = False) -> dict[str, int]:
    """A process that only reads the table another process writes: its growth over ``measured`` catch-ups
    (``per_write`` is per catch-up here)."""
    memory, session = _opened(root)
    changes = MemoryChanges()
    changes.remember("reader-0", "where is the reader's parcel", "On its way.")
    await memory.change("support", changes)  # the table exists, and this process holds the task
    start, looked = None, 0
    while memory.stats.catch_ups < warm + measured:
        if start is None and memory.stats.catch_ups >= warm:
            start = _sample(session, trim)
        await memory.lookup("support", f"where is parcel {looked}", threshold=0.9)
        looked += 1
        await asyncio.sleep(0.05)
    end = _sample(session, trim)
    return {"catch_ups": measured, "lookups": looked, **_figures(start or end, end, measured)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("warm", type=int, nargs="?", default=300)
    parser.add_argument("measured", type=int, nargs="?", default=600)
    parser.add_argument("--lookups", action="store_true")
    parser.add_argument("--tag", default="t")
    parser.add_argument("--chunk", type=int, default=1, help="new entries per write (one change)")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds to wait after each write")
    parser.add_argument("--reads-only", action="store_true", help="write nothing; count catch-ups instead")
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) before both samples")
    options = parser.parse_args()
    if options.reads_only:
        figures = read_only(options.root, options.warm, options.measured, trim=options.trim)
    else:
        figures = measure(
            options.root, options.warm, options.measured, lookups=options.lookups, tag=options.tag,
            chunk=options.chunk, pause=options.pause, trim=options.trim,
        )  # fmt: skip
    print(json.dumps(asyncio.run(figures)))
