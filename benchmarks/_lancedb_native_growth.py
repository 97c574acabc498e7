"""A diagnostic, not a benchmark: a fresh process remembering new memory entries one at a time, and glibc's bytes in
use per write once LanceDB's metadata cache is full, less what that cache grew (RELIABILITY.md, "Findings", the
soak's RSS). Prints one JSON object.

    uv run python -m benchmarks._lancedb_native_growth ROOT [WARM] [MEASURED]

ROOT is an empty folder for the table; WARM writes (300) fill the cache before MEASURED writes (600) are counted.
The metadata cache is bounded at 4 MiB here so that it is full after the warm-up.
"""

from __future__ import annotations

import asyncio
import json
import sys

from benchmarks._soak_worker import _malloc_bytes
from gil_core.memory import LanceDBMemory
from gil_core.memory.lance_tables import lance_session
from gil_core.testing import HashEmbeddingModel

CACHE_BYTES = 4 * 2**20


async def measure(root: str, warm: int, measured: int) -> dict[str, int]:
    memory = LanceDBMemory(root, HashEmbeddingModel(8), metadata_cache_bytes=CACHE_BYTES)
    session = lance_session(CACHE_BYTES)
    start = (0, 0)
    for index in range(warm + measured):
        if index == warm:
            start = (_malloc_bytes()[0] or 0, session.size_bytes)
        await memory.remember("support", f"t-{index}", f"where is parcel {index}", f"Parcel {index} is on its way.")
    in_use, cached = (_malloc_bytes()[0] or 0) - start[0], session.size_bytes - start[1]
    return {"writes": measured, "in_use": in_use, "cache": cached, "per_write": (in_use - cached) // measured}


if __name__ == "__main__":
    arguments = sys.argv[1:]
    warm = int(arguments[1]) if len(arguments) > 1 else 300
    measured = int(arguments[2]) if len(arguments) > 2 else 600
    print(json.dumps(asyncio.run(measure(arguments[0], warm, measured))))
