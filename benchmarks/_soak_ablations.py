"""A diagnostic, not a benchmark: parts of the soak's worker taken out, one at a time, to see which one the RSS
growth past the accounted caches comes with (RELIABILITY.md, "Findings", the soak's RSS).

    uv run python -m benchmarks.soak --tasks 1 --rounds 6 --keep DIR --ablate no-memory-writes

``benchmarks.soak --ablate`` passes the parts to every worker (``GIL_SOAK_ABLATE``), which applies them before it
opens its runtime; such a run prints only. The samples kept in ``DIR`` say what each process held per round.

Parts:
- ``no-lookups``: memory answers every lookup with nothing (its writes go on).
- ``no-memory-writes``: memory's writes (remember, forget, change) do nothing (no table: LanceDB is never loaded).
- ``shadows-once``: the shadow index is read once per task, not again after each round's verdicts.
- ``metadata-cache=MIB``: LanceDB's metadata cache bound for memory, instead of its default.
- ``trim``: glibc's ``malloc_trim(0)`` before each sample.
- ``regions``: each sample also lists the anonymous mappings and glibc's heap resident over 64 KiB (start,
  size and resident KiB), to diff between rounds.
- ``files``: each sample also lists the resident KiB of every mapped file over 64 KiB (its mappings summed), to
  see which library's code (or which data file) the file-backed growth is.
- ``tracemalloc=N``: Python's allocations traced from the N-th sample on (10 frames); each later sample lists
  the 15 call sites whose live bytes grew most since then (``tracemalloc``'s own diff), the 25 source files
  whose allocations grew most (``traced_files``: every call site in a file summed, each block by the frame that
  allocated it), and who holds the objects traced from the hash embedder (``holders``: the containers referring
  to them, by kind, with the container's own holder for dicts and lists). Slows the worker. A block allocated
  before tracing started is not seen when it is freed, so a full cache that replaces its entries shows its new
  entries as growth: compare with the accounted parts only for what is never freed.
- ``jeprof=DIR``: under a preloaded jemalloc with its sampling profiler on (``LD_PRELOAD=libjemalloc.so.2
  MALLOC_CONF=prof:true,lg_prof_sample:16``), each sample also dumps jemalloc's heap profile to
  ``DIR/<pid>.<sample>.heap``, to diff with ``jeprof --base`` (the live native allocations that grew between two
  rounds, by native stack). Polars' and pyarrow's own allocators are not in it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from typing import Any

from benchmarks._proc_maps import mappings

PARTS = (
    "no-lookups", "no-memory-writes", "shadows-once", "metadata-cache", "trim", "regions", "files",
    "tracemalloc", "jeprof",
)  # fmt: skip
ENVIRONMENT = "GIL_SOAK_ABLATE"


def parse(text: str) -> dict[str, str]:
    """``"a,b=1"`` as ``{"a": "", "b": "1"}``; a part this module does not know is refused."""
    parts = {}
    for item in filter(None, (piece.strip() for piece in text.split(","))):
        name, _, value = item.partition("=")
        if name not in PARTS:
            raise ValueError(f"unknown part {name!r} (known: {', '.join(PARTS)})")
        parts[name] = value
    return parts


def apply(parts: Mapping[str, str], sample: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """Take ``parts`` out of this process; the sampling function to use from now on."""
    from gil_core.feedback import Feedback
    from gil_core.memory.lancedb_memory import LanceDBMemory

    if "no-lookups" in parts:

        async def miss(self: LanceDBMemory, task: str, text: str, *, threshold: float) -> None:
            return None

        LanceDBMemory.lookup = miss  # type: ignore[assignment,method-assign]
    if "no-memory-writes" in parts:

        async def nothing(self: LanceDBMemory, *arguments: Any, **options: Any) -> None:
            return None

        LanceDBMemory.remember = nothing  # type: ignore[method-assign]
        LanceDBMemory.forget = nothing  # type: ignore[method-assign]
        LanceDBMemory.change = nothing  # type: ignore[method-assign]
    if "shadows-once" in parts:
        first = Feedback.shadows
        kept: dict[str, Any] = {}

        def once(self: Feedback, task: Any) -> Any:
            if task.name not in kept:
                kept[task.name] = first(self, task)
            return kept[task.name]

        Feedback.shadows = once  # type: ignore[method-assign]
    if "metadata-cache" in parts:
        defaults = LanceDBMemory.__init__.__kwdefaults__
        assert defaults is not None, "LanceDBMemory takes its options by keyword"
        defaults["metadata_cache_bytes"] = int(parts["metadata-cache"]) * 2**20

    traced: list[Any] = []  # the first snapshot, once tracing started
    samples = 0

    def sampled() -> dict[str, Any]:
        nonlocal samples
        if "trim" in parts:
            trim_freed_pages()
        line = sample()
        if "regions" in parts:
            line["regions"] = _regions()
        if "files" in parts:
            line["files"] = _files()
        samples += 1
        if "jeprof" in parts:
            line["jeprof"] = _jeprof_dump(parts["jeprof"], samples)
        if "tracemalloc" in parts:
            line |= _traced(traced, samples, int(parts["tracemalloc"] or 3))
        return line

    return sampled


def trim_freed_pages() -> None:
    """Give the pages glibc's malloc keeps freed back to the system (``malloc_trim(0)``), so that a sample's
    anonymous memory leaves them out; nothing off glibc."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _jeprof_dump(folder: str, samples: int) -> str | None:
    """Dump jemalloc's heap profile for this sample; the file's path, or None without jemalloc's profiler."""
    import os
    from pathlib import Path

    try:
        mallctl = ctypes.CDLL(None).mallctl
    except AttributeError:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = os.path.join(folder, f"{os.getpid()}.{samples}.heap").encode()
    name = ctypes.c_char_p(path)
    failed = mallctl(b"prof.dump", None, None, ctypes.byref(name), ctypes.sizeof(name))
    return None if failed else path.decode()


def _traced(first: list[Any], samples: int, start: int) -> dict[str, Any]:
    """Start tracing at the ``start``-th sample; after it, the call sites whose live bytes grew most since."""
    import tracemalloc

    if samples < start:
        return {}
    if not first:
        tracemalloc.start(10)
        first.append(tracemalloc.take_snapshot())
        return {}
    snapshot = tracemalloc.take_snapshot()
    growth = snapshot.compare_to(first[0], "traceback")
    by_file = snapshot.compare_to(first[0], "filename")  # every site, summed per source file
    return {
        "traced_growth": sum(stat.size_diff for stat in growth),
        "traced_files": [
            {"kib": round(stat.size_diff / 1024, 1), "count": stat.count_diff, "file": stat.traceback[0].filename}
            for stat in by_file[:25]
        ],
        "traced_top": [
            {"kib": round(stat.size_diff / 1024, 1), "count": stat.count_diff, "where": stat.traceback.format()[-6:]}
            for stat in growth[:15]
        ],
        "traced_holders": _holders("hash_embedding.py"),
    }


def _holders(source: str, *, top: int = 10) -> list[tuple[str, int]]:
    """Who refers to the objects traced as allocated in a file named ``source``: the containers' kinds (a dict
    or list named by its own first holder's kind), with how many such objects each kind holds."""
    import gc
    import tracemalloc
    from collections import Counter

    def traced_here(item: object) -> bool:
        trace = tracemalloc.get_object_traceback(item)
        return trace is not None and any(frame.filename.endswith(source) for frame in trace)

    counts: Counter[int] = Counter()
    containers: dict[int, object] = {}
    for container in gc.get_objects():
        held = sum(1 for item in gc.get_referents(container) if isinstance(item, tuple) and traced_here(item))
        if held:
            counts[id(container)] += held
            containers[id(container)] = container
    kinds: Counter[str] = Counter()
    for key, held in counts.items():
        container = containers[key]
        kind = type(container).__qualname__
        if isinstance(container, dict | list):
            owners = [owner for owner in gc.get_referrers(container) if owner is not containers]
            kind += " in " + (type(owners[0]).__module__ + "." + type(owners[0]).__qualname__ if owners else "?")
        kinds[kind] += held
    return kinds.most_common(top)


def _files() -> dict[str, int]:
    """Resident KiB per mapped file (its mappings summed), for the files over 64 KiB."""
    resident: dict[str, int] = {}
    for mapping in mappings():
        if mapping.path:
            resident[mapping.path] = resident.get(mapping.path, 0) + mapping.resident_kib
    return {path: kib for path, kib in resident.items() if kib >= 64}


def _regions() -> list[tuple[str, int, int]]:
    """(start, size KiB, resident KiB) of each anonymous mapping and of glibc's heap resident over 64 KiB."""
    return [
        (mapping.start, mapping.size_kib, mapping.resident_kib)
        for mapping in mappings()
        if mapping.kind in ("[anon]", "[heap]") and mapping.resident_kib >= 64
    ]
