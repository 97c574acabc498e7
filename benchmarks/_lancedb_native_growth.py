"""A diagnostic, not a benchmark: a fresh process remembering new memory entries one at a time, and glibc's bytes in
use per write once LanceDB's metadata cache is full, less what that cache grew (RELIABILITY.md, "Findings", the
soak's RSS); also the process's anonymous memory, read once it stops falling (``_soak_worker.settled_rss``), and
what memory's own entries hold in Python over the same writes. Prints one JSON object.

    uv run python -m benchmarks._lancedb_native_growth ROOT [WARM] [MEASURED] [--lookups] [--tag T] [--chunk N]

ROOT is a folder for the table; WARM writes (300) fill the cache before MEASURED writes (600) are counted.
The metadata cache is bounded at 4 MiB here so that it is full after the warm-up. ``--lookups`` looks each entry
up after writing it. Two processes started at once on one ROOT, with different ``--tag``s, write one table
between them, as the soak's pair does. ``--chunk N`` makes each write one ``change`` of N new entries, as a chunk
of verdicts is written (the soak's: 200), and looks up the chunk's last entry.
"""

from __future__ import annotations

import argparse
import asyncio
import json

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

CACHE_BYTES = 4 * 2**20


def _entries_bytes() -> int:
    return deep_size(_instances(*MEMORY_ENTRY_TYPES, *MEMORY_QUERY_TYPES), set())


async def measure(
    root: str, warm: int, measured: int, *, lookups: bool = False, tag: str = "t", chunk: int = 1
) -> dict[str, int]:
    memory = LanceDBMemory(root, HashEmbeddingModel(8), metadata_cache_bytes=CACHE_BYTES)
    session = lance_session(CACHE_BYTES)
    start = (0, 0, 0, 0)
    for index in range(warm + measured):
        if index == warm:
            start = (_malloc_bytes()[0] or 0, session.size_bytes, int(settled_rss()["rss_anon"]), _entries_bytes())
        changes = MemoryChanges()
        for item in range(index * chunk, (index + 1) * chunk):
            text = f"where is parcel {tag} {item}"
            changes.remember(f"{tag}-{item}", text, f"Parcel {item} is on its way.")
        await memory.change("support", changes)
        if lookups:
            await memory.lookup("support", text, threshold=0.9)
    in_use, cached = (_malloc_bytes()[0] or 0) - start[0], session.size_bytes - start[1]
    return {
        "writes": measured, "in_use": in_use, "cache": cached, "per_write": (in_use - cached) // measured,
        "anonymous": int(settled_rss()["rss_anon"]) - start[2], "entries": _entries_bytes() - start[3],
    }  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("warm", type=int, nargs="?", default=300)
    parser.add_argument("measured", type=int, nargs="?", default=600)
    parser.add_argument("--lookups", action="store_true")
    parser.add_argument("--tag", default="t")
    parser.add_argument("--chunk", type=int, default=1, help="new entries per write (one change)")
    options = parser.parse_args()
    figures = measure(
        options.root, options.warm, options.measured, lookups=options.lookups, tag=options.tag, chunk=options.chunk
    )
    print(json.dumps(asyncio.run(figures)))
