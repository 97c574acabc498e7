"""One process of the soak (``benchmarks.soak``): a resolver that stays open for the whole run, resolving a round
of tickets at a time through ``resolve_batch`` under its task's batch turn, giving verdicts on part of each round,
and after each round sampling its own RSS, open file handles and the bytes its memory entries and caches hold.
Or, with ``--compactor``, the process that compacts every store while the others write.

Each round prints one JSON line on stdout (what the parent reads); the tickets and verdicts it acknowledged go
to a file of its own, so the worker holds no growing list of them (that would be growth it caused itself).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import functools
import gc
import hashlib
import json
import os
import re
import sys
import tempfile
import time
import types
from collections.abc import Awaitable, Callable, Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import polars as pl

from benchmarks import _soak_ablations
from benchmarks._proc_maps import mappings
from gil_core.batch import Ticket, Verdict, resolve_batch, ticket_trace_id
from gil_core.batch_feedback import apply_verdicts
from gil_core.batch_lock import hold_batch_turn_async
from gil_core.errors import MemoryUnavailableError
from gil_core.maintenance import compact_store
from gil_core.memory import compact_memory
from gil_core.runtime import Runtime, open_runtime
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore

REFUND = "Refunds reach the original payment method within 5 business days of approval."
VERDICT_EVERY, WRONG_EVERY, REPEAT_EVERY = 5, 25, 4  # ticket i gets a verdict, a correction, repeats a text
_T = TypeVar("_T")
_SKIPPED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType, types.FrameType)


def ticket_text(task: str, round_index: int, index: int) -> str:
    """A ticket's text: new, or (every ``REPEAT_EVERY``-th from round 1 on) the text of a ticket of the round
    before that got a verdict, so that memory serves it."""
    if round_index > 0 and index % REPEAT_EVERY == REPEAT_EVERY - 1:
        return ticket_text(task, round_index - 1, (index // REPEAT_EVERY) * VERDICT_EVERY)
    digest = hashlib.sha1(f"{task}/{round_index}/{index}".encode()).hexdigest()[:10]
    return f"customer {digest} of {task} asks about refund number {round_index}-{index}"


def round_tickets(task: str, round_index: int, size: int) -> Iterator[Ticket]:
    """The round's tickets as a stream, as ``gil resolve-batch`` reads a file."""
    for index in range(size):
        yield Ticket(f"r{round_index}-{index}", ticket_text(task, round_index, index))


def round_verdicts(task: str, round_index: int, size: int) -> Iterator[Verdict]:
    for index in range(0, size, VERDICT_EVERY):
        trace_id = ticket_trace_id(task, f"r{round_index}-{index}")
        wrong = index % WRONG_EVERY == 0
        yield Verdict(trace_id, not wrong, REFUND if wrong else None)


def deep_size(roots: Iterable[object], seen: set[int]) -> int:
    """Bytes of every object reachable from ``roots`` and not in ``seen`` (which it extends): classes, modules,
    functions and code are shared by the process, not held, and are not followed."""
    total, stack = 0, [root for root in roots if id(root) not in seen]
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, _SKIPPED):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item, 0)
        stack.extend(gc.get_referents(item))
    return total


MEMORY_ENTRY_TYPES = ("TaskVectors", "IndexedTask")  # what memory holds per task in this process
MEMORY_QUERY_TYPES = ("_QueryVectors",)  # memory's cache of query vectors


def _instances(*names: str) -> list[object]:
    return [item for item in gc.get_objects() if type(item).__name__ in names]


def accounted_bytes(runtime: Runtime) -> dict[str, int]:
    """What the remembered entries and the documented caches hold (Python-reachable bytes, each counted once;
    LanceDB's caches as its session reports them), and everything else reachable from the runtime."""
    seen: set[int] = set()
    feedback = getattr(runtime.resolver, "_feedback", None)  # gil_core.feedback.Feedback
    sizes = {
        "memory entries": deep_size(_instances(*MEMORY_ENTRY_TYPES), seen),
        "memory query vectors": deep_size(_instances(*MEMORY_QUERY_TYPES), seen),
        "request cache": deep_size(_instances("InProcessRequestCache"), seen),
        "recent trace rows (the resolver's latest 10,000)": deep_size([getattr(feedback, "_recent", None)], seen),
        "memory evidence and shadow index": deep_size(
            [getattr(feedback, "_evidence_by_task", None), getattr(feedback, "_shadows", None)], seen
        ),
    }
    lance = sys.modules.get("gil_core.memory.lance_tables")
    if lance is not None:  # native: LanceDB's caches in the process's session, bounded (METADATA_CACHE_BYTES)
        sizes["LanceDB caches (native)"] = sum(session.size_bytes for session in lance._SESSIONS.values())
    sizes["other reachable from the runtime"] = deep_size([runtime], seen)
    return sizes


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
    )]  # fmt: skip


def _jemalloc_bytes(process: ctypes.CDLL) -> tuple[int, int] | None:
    """With jemalloc as the process's malloc (``LD_PRELOAD``, a deployment choice the soak can be run under): its
    bytes handed out and not taken back, and the resident bytes it holds beyond them; None without it."""
    try:
        mallctl = process.mallctl
    except AttributeError:
        return None
    mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p,
                        ctypes.c_size_t]  # fmt: skip
    epoch = ctypes.c_uint64(1)
    mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.sizeof(epoch))  # refresh the statistics
    values = {}
    for name in ("stats.allocated", "stats.resident"):
        value, size = ctypes.c_size_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
        if mallctl(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
            return None
        values[name] = int(value.value)
    return values["stats.allocated"], values["stats.resident"] - values["stats.allocated"]


def _malloc_bytes() -> tuple[int, int] | tuple[None, None]:
    """Bytes glibc's malloc has handed out and not taken back (all arenas, mmapped blocks included), and the free
    bytes its arenas keep (freed, not given back to the system); None off glibc. LanceDB's buffers and Python's
    objects past 512 bytes live there (smaller ones in Python's own arenas); Polars has its own allocator. Under
    a preloaded jemalloc, jemalloc's own figures (``_jemalloc_bytes``)."""
    process = ctypes.CDLL(None)
    jemalloc = _jemalloc_bytes(process)
    if jemalloc is not None:
        return jemalloc
    try:
        mallinfo2 = process.mallinfo2
    except (OSError, AttributeError):
        return None, None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd), int(info.fordblks)


_PYTHON_ALLOCATOR_LINES = {
    "arenas": re.compile(r"^\d+ arenas \* \d+ bytes/arena\s+=\s+([\d,]+)$"),
    "in_use": re.compile(r"^# bytes in allocated blocks\s+=\s+([\d,]+)$"),
}


def python_allocator_bytes() -> dict[str, int]:
    """Python's small-object allocator (objects up to 512 bytes; larger ones are malloc's): the bytes of its
    arenas (1 MiB mappings of its own, outside malloc) and of the blocks in them handed out, from
    ``sys._debugmallocstats``, which writes to the process's standard error (captured here)."""
    with tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(captured.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        text = captured.read().decode("utf-8", "replace")
    figures: dict[str, int] = {}
    for line in text.splitlines():
        for name, pattern in _PYTHON_ALLOCATOR_LINES.items():
            found = pattern.match(line.strip())
            if found is not None and name not in figures:
                figures[name] = int(found.group(1).replace(",", ""))
    return figures


def process_sample() -> dict[str, Any]:
    """This process's resident set (bytes, anonymous and file-backed, and per kind of mapping), open file handles
    and threads, from /proc; malloc's bytes; the blocks Python's allocator holds, and its arenas' and blocks'
    bytes."""
    status = _status()
    in_use, free = _malloc_bytes()
    maps: dict[str, int] = {}  # resident bytes per kind of mapping: [heap], [anon], [stack], file (any path)
    for mapping in mappings():
        maps[mapping.kind] = maps.get(mapping.kind, 0) + mapping.resident_kib * 1024
    return {
        "rss_maps": maps,
        "py_blocks": sys.getallocatedblocks(),
        **_resident(status),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": int(status["Threads"]),
        "malloc": in_use,
        "malloc_free": free,
        "python_allocator": python_allocator_bytes(),
    }


SETTLE_POLL_S, SETTLE_QUIET_S, SETTLE_MAX_S = 0.25, 3.0, 20.0
SETTLE_FALL_BYTES = 64 * 1024
# The libraries' own idle clocks, both 10 s by default: tokio ends a blocking I/O thread idle that long (Polars'
# and LanceDB's runtimes start them per read and let them go), and jemalloc (Polars') gives back freed pages over
# that decay time. A sample taken sooner counts the threads and pages of the round just done as if they stayed.
SETTLE_AT_LEAST_S = 11.0


def _status() -> dict[str, str]:
    text = Path("/proc/self/status").read_text(encoding="utf-8")
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _resident(status: dict[str, str]) -> dict[str, int]:
    """Resident bytes in all, anonymous and file-backed."""
    return {key: int(status[name].split()[0]) * 1024 for key, name in
            (("rss", "VmRSS"), ("rss_anon", "RssAnon"), ("rss_file", "RssFile"))}  # fmt: skip


def settled_rss() -> dict[str, float]:
    """The resident set once it has stopped falling, and how long that took (``settle_s``). Allocators give freed
    pages back on their own clocks: Polars' jemalloc purges the pages a lookup freed in steps over the seconds
    after it, the first 1 to 2 s after (twelve lookups of 200 traces in a 10,000-trace table left +7.6 MiB resident
    at once and +0.5 MiB three seconds later), so a sample taken the moment a round ends counts pages already on
    their way back, and a second without a fall does not yet say they are all back. Polls every
    ``SETTLE_POLL_S`` until the RSS has fallen by less than ``SETTLE_FALL_BYTES`` over ``SETTLE_QUIET_S``, and no
    sooner than ``SETTLE_AT_LEAST_S`` (the libraries' idle clocks), for at most ``SETTLE_MAX_S``; nothing else runs
    in the process meanwhile. The threads alive then are in ``threads``."""
    started = time.monotonic()
    readings = [(started, _resident(_status()))]
    while True:
        time.sleep(SETTLE_POLL_S)
        now = time.monotonic()
        readings.append((now, _resident(_status())))
        quiet = [reading for at, reading in readings if at <= now - SETTLE_QUIET_S]
        settled = bool(quiet) and quiet[-1]["rss"] - readings[-1][1]["rss"] < SETTLE_FALL_BYTES
        if (settled and now - started >= SETTLE_AT_LEAST_S) or now - started >= SETTLE_MAX_S:
            threads = int(_status()["Threads"])
            return {**readings[-1][1], "settle_s": round(now - started, 3), "threads": threads}


async def _rerun_until_done(start: Callable[[], Awaitable[_T]], attempts: int = 5) -> tuple[_T, list[str]]:
    """Run a batch (or a feedback run) again after it crashed, as an operator or a scheduler would: both are
    idempotent. What each crash was (its type and the start of its message) is reported, not hidden."""
    crashes: list[str] = []
    while True:
        try:
            return await start(), crashes
        except Exception as exc:  # a crash of the whole batch, which the soak reports
            crashes.append(f"{type(exc).__name__}: {str(exc)[:160]}")
            if len(crashes) >= attempts:
                raise


def collect_garbage() -> dict[str, int]:
    """A full collection, and what it freed: objects, and the bytes in use of Python's small-object allocator and
    of glibc's malloc, before less after. Cyclic garbage waits for Python's collector, which runs on allocation
    counts, not on time: 1.1 to 1.6 MiB of small objects at any sample of a resolving soak process (a diagnostic
    run, 2026-12-07), more or less by chance. Collected before a sample, so it reads what the process holds."""
    before = (python_allocator_bytes().get("in_use", 0), _malloc_bytes()[0] or 0)
    objects = gc.collect()
    after = (python_allocator_bytes().get("in_use", 0), _malloc_bytes()[0] or 0)
    return {"objects": objects, "python_bytes": before[0] - after[0], "malloc_bytes": before[1] - after[1]}


def warm_read_plans() -> list[bool]:
    """Run once each plan ``TelemetryStore`` reads a keyed table by (``gil_core.telemetry._files.plan``, with the
    key filter a batch's and a verdict's reads use), over a scratch folder of three small traces files: in write
    order, a compacted file with files appended after it, and out of write order, which a compaction racing a
    slow append leaves until the next compaction. The first read of each pages in library code once per process
    (about 2 MiB of Polars' streaming engine: RELIABILITY.md, "Findings", the late code named). A soak process
    meets the last only when that race happens, at any round or never, so its warm-up runs them all. Whether each
    listing read was in write order (the plan it took: the anti-join, the sort, plain files)."""
    from gil_core.storage import LocalFolder
    from gil_core.telemetry._files import COMPACTED_SUFFIX, SEQ, SUFFIX, Compacted, file_name, in_write_order, plan
    from gil_core.telemetry.schemas import DTYPES

    dtypes = DTYPES["traces"]
    with tempfile.TemporaryDirectory(prefix="gil-soak-warm-") as scratch:
        folder = LocalFolder(Path(scratch))
        names = []
        for seq in (1, 2, 3):
            columns = [pl.Series(name, [None, None], dtype) for name, dtype in dtypes.items() if name != "trace_id"]
            frame = pl.DataFrame([pl.Series("trace_id", [f"t{seq}", "t0"]), *columns])
            name = file_name(seq, COMPACTED_SUFFIX if seq == 1 else SUFFIX)
            frame.with_columns(pl.lit(seq, pl.Int64).alias(SEQ)).write_parquet(Path(scratch) / name)
            names.append(name)
        head = {str(folder.source(names[0])): Compacted(frozenset(), (1, 1))}
        only = {"trace_id": ["t0", "t2"]}
        # The anti-join after a compacted file; the sort (the compacted file's range unknown); plain files.
        cases: list[tuple[list[str], dict[str, Compacted]]] = [(names, head), (names, {}), (names[1:], {})]
        for listed, compacted in cases:
            plan("traces", folder, listed, compacted, keep_seq=False, only=only).collect()
        return [in_write_order(folder, listed, compacted) for listed, compacted in cases]


async def soak(options: argparse.Namespace, sample: Callable[[], dict[str, Any]] = process_sample) -> None:
    loaded = load_task_file(options.task_file)
    task = loaded.task
    waits = 0

    def waiting(holder: str) -> None:
        nonlocal waits
        waits += 1

    with Path(options.acknowledged).open("a", encoding="utf-8") as acknowledged:
        async with open_runtime(loaded) as runtime:
            for round_index in range(options.rounds):
                started, waits = time.monotonic(), 0
                line: dict[str, Any] = {"round": round_index, "started_at": time.time()}
                async with hold_batch_turn_async(
                    loaded.store, task.name, wait_s=options.lock_wait, on_wait=waiting
                ) as turn:
                    line["waited_s"] = round(time.monotonic() - started, 3)
                    line["held"] = turn.held
                    if turn.held:
                        tickets = functools.partial(round_tickets, task.name, round_index, options.size)
                        resolve = functools.partial(resolve_batch, concurrency=options.concurrency)
                        report, line["crashes"] = await _rerun_until_done(
                            lambda: resolve(runtime.resolver, task, tickets())  # noqa: B023 - awaited at once
                        )
                        failed = {item.where.removeprefix("ticket ").strip("'") for item in report.failed}
                        line |= {"resolved": report.resolved, "done_before": report.skipped, "failed": len(failed)}
                        ids = [f"r{round_index}-{index}" for index in range(options.size)]
                        acknowledged.write(json.dumps({"tickets": [i for i in ids if i not in failed]}) + "\n")
                line["waits"] = waits
                resolved_at = time.monotonic()
                if options.feedback and turn.held:
                    verdicts = list(round_verdicts(task.name, round_index, options.size))
                    feedback, crashes = await _rerun_until_done(
                        lambda: apply_verdicts(runtime.resolver, task, verdicts)  # noqa: B023 - awaited at once
                    )
                    line["crashes"] = line.get("crashes", []) + crashes
                    given = [v for v in verdicts if f"trace {v.trace_id!r}" not in {f.where for f in feedback.failed}]
                    acknowledged.write(
                        json.dumps({"verdicts": [[v.trace_id, v.correct, v.correction] for v in given]}) + "\n"
                    )
                    line |= {"verdicts": feedback.applied, "verdicts_failed": len(feedback.failed)}
                acknowledged.flush()
                line |= {
                    "resolve_s": round(resolved_at - started, 3),
                    "round_s": round(time.monotonic() - started, 3),
                    "at": time.time(),
                }
                line["gc_freed"] = collect_garbage()
                line |= sample()
                line["accounted"] = accounted_bytes(runtime)
                line["settled"] = settled_rss()
                print(json.dumps(line), flush=True)


def compact_until(stores: list[str], stop: Path, interval: float) -> None:
    """Compact every store's tables, and the memory table beside it (``memory/``, as the soak's task files
    place it), every ``interval`` seconds until ``stop`` exists, keeping memory's versions of the last ``interval``
    (what the hourly compact-telemetry flow does, keeping an hour, on the soak's faster clock); one JSON line per
    pass, with its start and end (wall clock, which the soak sets beside its workers' rounds)."""
    while not stop.exists():
        started, started_at = time.monotonic(), time.time()
        merged = {store: sum(compact_store(TelemetryStore(store)).values()) for store in stores}
        memory = {store: _compact_memory_beside(Path(store), timedelta(seconds=interval)) for store in stores}
        line = {
            "merged": merged, "memory_merged": {store: done[0] for store, done in memory.items()},
            "memory_versions_removed": {store: done[1] for store, done in memory.items()},
            "pass_s": round(time.monotonic() - started, 3), "started_at": started_at, "ended_at": time.time(),
        }  # fmt: skip
        print(json.dumps(line), flush=True)
        deadline = time.monotonic() + interval
        while time.monotonic() < deadline and not stop.exists():
            time.sleep(0.2)


def _compact_memory_beside(store: Path, keep: timedelta) -> tuple[int | str, int]:
    """Data files merged (or why the compaction failed: reported, the next pass tries again) and old versions
    deleted."""
    try:
        done = asyncio.run(compact_memory(store.parent / "memory", keep_versions_for=keep))
    except MemoryUnavailableError as exc:
        return str(exc)[:300], 0
    return (0, 0) if done is None else (done.fragments_removed, done.versions_removed)


def main(arguments: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-file", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=100, help="tickets per round")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--lock-wait", type=float, default=60.0)
    parser.add_argument("--feedback", action="store_true", help="give verdicts on part of each round")
    parser.add_argument("--acknowledged", type=Path, help="file of the tickets and verdicts acknowledged")
    parser.add_argument("--compactor", nargs="*", help="compact these stores instead (until --stop exists)")
    parser.add_argument("--stop", type=Path)
    parser.add_argument("--interval", type=float, default=5.0)
    options = parser.parse_args(arguments)
    if options.compactor is not None:
        compact_until(options.compactor, options.stop, options.interval)
        return
    ablated = os.environ.get(_soak_ablations.ENVIRONMENT)  # benchmarks.soak --ablate: a diagnostic run
    sample = _soak_ablations.apply(_soak_ablations.parse(ablated), process_sample) if ablated else process_sample
    warm_read_plans()
    asyncio.run(soak(options, sample))


if __name__ == "__main__":
    main(sys.argv[1:])
