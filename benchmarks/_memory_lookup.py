"""Memory lookup at scale (part B of issue #7): the memory module and LanceDB against numpy exact brute force.

Vectors are clustered (a cluster per 100 entries, 384 dims, cosine to the own centre ~0.65) and each query is a
stored vector moved a little (cosine ~0.94 to it), as a paraphrase is to a remembered request. The baseline is
exact top-1 by float32 matrix-vector product (OpenBLAS) over the same vectors; recall@1 is agreement with it.
Arms: ``LanceDBMemory.nearest`` as shipped (its in-process float64 matrix), LanceDB's own flat search and an
index with refinement, and a proposed change to the memory module (float32 shortlist, exact float64 rescoring).
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from benchmarks._report import Row, Section, markdown_table, percentile
from gil_core.memory import CallableEmbeddingModel, LanceDBMemory
from gil_core.memory._vectors import squared_lengths, widen  # the module's exact scoring, for the proposal

__all__ = ["LookupArm", "LookupSizes", "clustered_vectors", "measure_lookup", "memory_lookup_section"]

DIMENSIONS = 384
TASK = "bench"
# The index tried above the exact range: IVF without quantisation (candidates are ranked by their own float32
# distances, so no refinement step is needed), partitions of ~4,000 vectors (the build's k-means grows with the
# square of the partition count: ~1,000 partitions at 1M took over 10 minutes here), a few probe counts, and a
# bitmap index on ``task`` so the prefilter does not scan the column (4x slower without it at 1M).
VECTORS_PER_PARTITION = 4000
SHORTLIST_MARGIN = 1e-4
INDEX_NPROBES = (4, 8, 16)
_Matrix = NDArray[np.float32]


@dataclass(frozen=True)
class LookupSizes:
    sizes: tuple[int, ...]
    queries: int  # recall is measured over this many queries
    timed_queries: int  # exact arms are timed over this many (up to 100k entries)
    slow_queries: int  # … and this many at 1M, where each takes up to a second
    flat_limit: int  # LanceDB flat search only up to this size
    index_from: int  # LanceDB index from this size


@dataclass
class LookupArm:
    """One way of looking up, at one size: per-query wall and CPU seconds, and recall@1 against numpy."""

    size: int
    name: str
    walls: list[float]
    cpus: list[float]
    recall: float
    setup_seconds: float | None = None
    note: str = ""

    @property
    def p50_ms(self) -> float:
        return percentile(self.walls, 0.5) * 1000

    @property
    def cpu_ms(self) -> float:
        return statistics.median(self.cpus) * 1000


def _unit(rows: _Matrix) -> _Matrix:
    result: _Matrix = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return result


def clustered_vectors(count: int, queries: int, *, seed: int = 0) -> tuple[_Matrix, _Matrix]:
    """``count`` unit vectors in clusters of ~100, and ``queries`` unit vectors each near a random stored one."""
    rng = np.random.default_rng(seed)
    centres = _unit(rng.standard_normal((max(count // 100, 10), DIMENSIONS), dtype=np.float32))
    vectors = np.empty((count, DIMENSIONS), dtype=np.float32)
    for start in range(0, count, 100_000):
        stop = min(count, start + 100_000)
        noise = 0.06 * rng.standard_normal((stop - start, DIMENSIONS), dtype=np.float32)
        vectors[start:stop] = _unit(centres[rng.integers(0, len(centres), stop - start)] + noise)
    sources = rng.integers(0, count, queries)
    near = _unit(vectors[sources] + 0.018 * rng.standard_normal((queries, DIMENSIONS), dtype=np.float32))
    return vectors, near


def _timed(run: Callable[[int], int], count: int) -> tuple[list[int], list[float], list[float]]:
    found, walls, cpus = [], [], []
    for index in range(count):
        wall, cpu = time.perf_counter(), time.process_time()
        found.append(run(index))
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return found, walls, cpus


async def _timed_async(run: Callable[[int], Awaitable[int]], count: int) -> tuple[list[int], list[float], list[float]]:
    found, walls, cpus = [], [], []
    for index in range(count):
        wall, cpu = time.perf_counter(), time.process_time()
        found.append(await run(index))
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return found, walls, cpus


def exact_top1(vectors: _Matrix, queries: _Matrix, block: int = 64) -> NDArray[np.int64]:
    """Each query's exact top-1 row, computed a block of queries at a time (one matrix product per block)."""
    found = [np.argmax(vectors @ queries[start : start + block].T, axis=0) for start in range(0, len(queries), block)]
    return np.concatenate(found).astype(np.int64)


def numpy_top1(vectors: _Matrix, query: _Matrix) -> int:
    """The baseline: exact top-1 by one float32 matrix-vector product."""
    return int(np.argmax(vectors @ query))


def shortlist_top1(vectors: _Matrix, query: _Matrix, margin: float = SHORTLIST_MARGIN) -> int:
    """The proposal: float32 scores of unit rows pick every row within ``margin`` of the best (float32 rounding
    moves a 384-dim cosine by ~2e-5 at most), then the memory module's own exact float64 cosine ranks those rows
    (ties to the earliest): the module's answer, at about the cost of the float32 product."""
    scores = vectors @ query
    rows = np.flatnonzero(scores >= scores.max() - margin)
    wide, target = widen(vectors[rows]), widen(query[None, :])
    exact = np.einsum("ij,j->i", wide, target[0]) / np.sqrt(squared_lengths(wide) * squared_lengths(target)[0])
    return int(rows[int(np.argmax(exact))])


async def _write_table(path: Path, vectors: _Matrix) -> Any:
    """The memory module's table (``task, key, text, answer, vector, created_at``) holding ``vectors``."""
    import lancedb
    import pyarrow as pa

    count = len(vectors)
    keys = pa.array([f"k{i}" for i in range(count)], pa.string())
    table = pa.table(
        {
            "task": pa.array([TASK] * count, pa.string()),
            "key": keys,
            "text": keys,
            "answer": pa.array(["answer"] * count, pa.string()),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), DIMENSIONS),
            "created_at": pa.array(np.arange(count, dtype=np.int64) + 1_700_000_000_000_000, pa.timestamp("us", "UTC")),
        }
    )
    # As the memory module connects: every read sees other processes' commits (a version check each time).
    connection = await lancedb.connect_async(path, read_consistency_interval=timedelta(0))
    return await connection.create_table("memory", table)


def _key_index(key: str) -> int:
    return int(key[1:])


async def _module_arm(count: int, path: Path, queries: _Matrix, truth: NDArray[np.int64]) -> LookupArm:
    """``LanceDBMemory.nearest`` over the table at ``path``: a first pass embeds each query (kept in the
    memory's query cache) and loads the task's matrix, so the timed pass is the lookup alone."""
    texts = {f"query-{i}": queries[i] for i in range(len(queries))}
    embedder = CallableEmbeddingModel(lambda batch: np.stack([texts[text] for text in batch]), name="queries")
    memory = LanceDBMemory(path, embedder, query_cache_size=len(queries))
    started = time.perf_counter()
    await memory.nearest(TASK, "query-0", 1)
    loaded = time.perf_counter() - started
    for index in range(1, len(queries)):
        await memory.nearest(TASK, f"query-{index}", 1)

    async def lookup(index: int) -> int:
        return _key_index((await memory.nearest(TASK, f"query-{index}", 1))[0].key)

    found, walls, cpus = await _timed_async(lookup, len(queries))
    recall = float(np.mean(np.asarray(found) == truth[: len(found)]))
    name = "`LanceDBMemory.nearest` as shipped (in-process float64 matrix)"
    return LookupArm(count, name, walls, cpus, recall, loaded, f"first lookup loads the matrix in {loaded:.1f} s")


async def measure_size(count: int, sizes: LookupSizes, root: Path) -> list[LookupArm]:
    """Every arm at ``count`` entries."""
    from lancedb.index import Bitmap, IvfFlat
    from threadpoolctl import threadpool_limits

    vectors, queries = clustered_vectors(count, sizes.queries, seed=count)
    truth = exact_top1(vectors, queries)
    timed = min(len(queries), sizes.slow_queries if count >= 1_000_000 else sizes.timed_queries)

    def recall(found: Sequence[int]) -> float:
        return float(np.mean(np.asarray(found) == truth[: len(found)]))

    found, walls, cpus = _timed(lambda i: numpy_top1(vectors, queries[i]), timed)
    default = LookupArm(count, "numpy exact, float32, default BLAS threads", walls, cpus, recall(found))
    with threadpool_limits(1):  # on a loaded machine one BLAS thread can beat two that wait for each other
        found, walls, cpus = _timed(lambda i: numpy_top1(vectors, queries[i]), timed)
    single = LookupArm(count, "numpy exact, float32, 1 BLAS thread", walls, cpus, recall(found))
    # The baseline is the faster of the two: a ratio against a slowed-down baseline would flatter us.
    baseline, other = sorted((default, single), key=lambda arm: arm.p50_ms)
    baseline.name += " (baseline)"
    arms = [baseline, other]

    with threadpool_limits(1 if baseline is single else None):  # the proposal uses BLAS as the baseline does
        found, walls, cpus = _timed(lambda i: shortlist_top1(vectors, queries[i]), timed)
    arms.append(LookupArm(count, "proposal: float32 shortlist + exact float64 rescoring", walls, cpus, recall(found)))

    started = time.perf_counter()
    table = await _write_table(root / f"memory-{count}", vectors)
    written = time.perf_counter() - started

    module = await _module_arm(count, root / f"memory-{count}", queries[:timed], truth)
    module.note = f"table written in {written:.1f} s; " + module.note
    arms.append(module)
    gc.collect()

    async def version_check(index: int) -> int:
        return int(await table.version())

    _, walls, cpus = await _timed_async(version_check, timed)
    arms.append(
        LookupArm(count, "… of which: LanceDB `table.version()` (the module's check per lookup)", walls, cpus, math.nan)
    )

    async def lancedb_search(index: int, nprobes: int | None = None) -> int:
        query = table.vector_search(queries[index]).distance_type("cosine").where(f"task = '{TASK}'").limit(1)
        if nprobes is not None:
            query = query.nprobes(nprobes)
        result = await query.select(["key", "_distance"]).to_arrow()
        return _key_index(result.column("key")[0].as_py())

    if count <= sizes.flat_limit:
        found, walls, cpus = await _timed_async(lancedb_search, min(timed, 50))
        arms.append(LookupArm(count, "LanceDB flat search, task prefilter", walls, cpus, recall(found)))
    if count >= sizes.index_from:
        partitions = max(16, round(count / VECTORS_PER_PARTITION))
        started = time.perf_counter()
        await table.create_index("vector", config=IvfFlat(distance_type="cosine", num_partitions=partitions))
        await table.create_index("task", config=Bitmap())
        built = time.perf_counter() - started
        for nprobes in INDEX_NPROBES:

            async def indexed(index: int, nprobes: int = nprobes) -> int:
                return await lancedb_search(index, nprobes)

            found, walls, cpus = await _timed_async(indexed, len(queries))
            name = f"LanceDB IVF_FLAT ({partitions} partitions, nprobes {nprobes}) + bitmap on task"
            note = f"indexes built in {built:.0f} s" if nprobes == INDEX_NPROBES[0] else ""
            arms.append(LookupArm(count, name, walls, cpus, recall(found), built, note))
    return arms


async def measure_lookup(sizes: LookupSizes) -> list[LookupArm]:
    os.environ.setdefault("LANCE_LOG", "error")
    arms: list[LookupArm] = []
    with tempfile.TemporaryDirectory(prefix="gil-bench-lookup-") as root:
        for count in sizes.sizes:
            arms.extend(await measure_size(count, sizes, Path(root)))
            gc.collect()
    return arms


def memory_lookup_section(arms: Sequence[LookupArm], command: str) -> Section:
    by_size: dict[int, list[LookupArm]] = {}
    for arm in arms:
        by_size.setdefault(arm.size, []).append(arm)
    rows: list[Row] = []
    for size, group in by_size.items():
        baseline, module = group[0], next(a for a in group if a.name.startswith("`LanceDBMemory"))
        ratio = module.p50_ms / baseline.p50_ms
        if size == 100_000:
            rows.append(
                Row(
                    "100k: memory module p50 / numpy exact p50",
                    "≤ 1.5×",
                    f"{ratio:.1f}× ({module.p50_ms:.1f} vs {baseline.p50_ms:.1f} ms; CPU "
                    f"{module.cpu_ms / baseline.cpu_ms:.1f}×)",
                    ratio <= 1.5,
                )
            )
            rows.append(Row("100k: memory module recall@1", "= 1.0", f"{module.recall:.3f}", module.recall == 1.0))
        if size == 1_000_000:
            best = min((a for a in group if a.recall >= 0.99 and a is not baseline), key=lambda a: a.p50_ms)
            rows.append(
                Row(
                    "1M: fastest lookup with recall ≥ 0.99, p50",
                    "≤ 10 ms",
                    f"{best.p50_ms:.1f} ms ({best.name}, recall {best.recall:.3f})",
                    best.p50_ms <= 10.0,
                )
            )
            rows.append(
                Row(
                    "1M: memory module as shipped, p50",
                    "≤ 10 ms",
                    f"{module.p50_ms:.0f} ms (recall {module.recall:.3f})",
                    module.p50_ms <= 10.0,
                )
            )
    table = markdown_table(
        ["entries", "arm", "p50 ms", "CPU ms", "× numpy (p50)", "recall@1", "setup"],
        [
            [
                f"{arm.size:,}",
                arm.name,
                f"{arm.p50_ms:.2f}",
                f"{arm.cpu_ms:.2f}",
                f"{arm.p50_ms / by_size[arm.size][0].p50_ms:.1f}",
                "—" if math.isnan(arm.recall) else f"{arm.recall:.3f}",
                arm.note,
            ]
            for arm in arms
        ],
        align="rlrrrrl",
    )
    lead = (
        "Top-1 lookup over clustered unit vectors (384 dims; a cluster per 100 entries; each query a stored "
        "vector moved to cosine ~0.94 of it). Baseline: numpy exact brute force (float32 matrix-vector product, "
        "OpenBLAS) over the same vectors in the same run; recall@1 is agreement with it. The memory module is "
        "timed through `LanceDBMemory.nearest` on a table written in its own schema, after a first pass that "
        "embedded each query (so only the lookup is timed: version check + exact float64 scoring). CPU ms is "
        "this process's CPU time per query (all threads), less disturbed by the machine's other load."
    )
    return Section("Speed: memory lookup (part B)", command, lead, rows, _findings(by_size), extra_tables=[table])


def _findings(by_size: dict[int, list[LookupArm]]) -> list[str]:
    """What the figures say about the memory module, with the exact change they support."""
    notes = []
    for size, group in by_size.items():
        baseline = group[0]
        module = next(a for a in group if a.name.startswith("`LanceDBMemory"))
        proposal = next(a for a in group if a.name.startswith("proposal"))
        if size == 100_000:
            ratio, proposed = module.p50_ms / baseline.p50_ms, proposal.p50_ms / baseline.p50_ms
            verdict = "meets" if ratio <= 1.5 else "**misses**"
            notes.append(
                f"At 100k the module {verdict} 1.5× numpy ({ratio:.1f}×). It scores every row in float64 with "
                "`np.einsum` (twice the bytes of float32, no BLAS) after a table-version check per lookup. The "
                f"proposal row ({proposed:.1f}× numpy, recall {proposal.recall:.3f}) is the recommended change "
                "to `gil_core/memory/_vectors.py`: keep each task's rows as float32 scaled to unit length "
                "(what the table holds, halving the matrix), rank them with one float32 matrix-vector product, "
                f"and compute the exact float64 cosine (today's formula, ties to the earliest) only for the rows "
                f"within {SHORTLIST_MARGIN:g} of the best float32 score; float32 rounding moves a 384-dim cosine "
                "by ~2e-5 at most, so the winner and its similarity are the same as today's."
            )
        if size == 1_000_000:
            indexed = [a for a in group if a.name.startswith("LanceDB IVF") and a.recall >= 0.99]
            best = min(indexed, key=lambda a: a.p50_ms) if indexed else None
            exact_ms = min(baseline.p50_ms, proposal.p50_ms)
            if best is None:
                notes.append(
                    f"At 1M no index setting tried reached recall 0.99; exact search costs {exact_ms:.0f} ms p50."
                )
                continue
            verdict = "meets" if best.p50_ms <= 10.0 else "**misses**"
            notes.append(
                f"At 1M exact search costs {exact_ms:.0f} ms p50 even as one float32 product, so an index is needed: "
                f"{best.name} {verdict} 10 ms ({best.p50_ms:.1f} ms p50, {best.cpu_ms:.1f} ms CPU, recall "
                f"{best.recall:.3f}; {best.note or 'indexes built as above'}). Recommended for "
                "`gil_core/memory/lancedb_memory.py` above ~100k entries of a task: answer lookups from LanceDB "
                "with `IvfFlat(distance_type='cosine', num_partitions=round(rows / 4000))` on `vector` and "
                "`Bitmap()` on `task`, query `.where(task = …)` (prefilter) `.nprobes(N)` with N the smallest "
                "probe count measured here at recall ≥ 0.99, `limit(10)`, then the exact float64 cosine of those "
                "candidates before any threshold (IVF_FLAT keeps the vectors, so `refine_factor` is not needed); "
                "rebuild the index (`optimize`) as rows are added, since newer rows are searched by brute force."
                + _miss_cause(best)
            )
    return notes


def _miss_cause(best: LookupArm) -> str:
    """Why the fastest accurate index misses 10 ms: its own CPU work, or the machine's load on top of it."""
    if best.p50_ms <= 10.0:
        return ""
    if best.cpu_ms > 10.0:
        return (
            f" Measured cause of the miss: the index settings affordable here — {best.cpu_ms:.1f} ms of CPU per "
            f"query (wall {best.p50_ms:.1f} ms at this load), as the probed partitions hold ~{VECTORS_PER_PARTITION:,}"
            " vectors each; more, smaller partitions cut that work, but the index build (k-means) grows with the "
            "square of their number, and fewer probes lose recall (see the rows above)."
        )
    return (
        f" Measured cause of the miss: the machine's load — {best.cpu_ms:.1f} ms of CPU per query, "
        f"{best.p50_ms:.1f} ms of wall time."
    )
