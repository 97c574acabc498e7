"""A child process for test_durability: writes to, or compacts, a TelemetryStore in another process.

    _store_child.py traces  ROOT PREFIX COUNT  record traces (a call each), print each acknowledged id
    _store_child.py group   ROOT PREFIX COUNT  the same inside a commit group: print each id once a flush wrote it
    _store_child.py reviews ROOT PREFIX COUNT  append one review row at a time, print each acknowledged id
    _store_child.py compact ROOT STOP_FILE     compact "reviews" until STOP_FILE exists, print the count
    _store_child.py batch   ROOT COUNT         resolve_batch over COUNT tickets (group commit, an in-process
                                               model); print "done N" at each progress report

Each child prints "ready" once its imports are done, then waits for one line on stdin before it starts, so the
parent can start several children at the same moment.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from gil_core.telemetry import CallRecord, TelemetryStore, TraceRecord, utc_now


def _wait_for_go() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def record_trace(store: TelemetryStore, trace_id: str) -> None:
    call = CallRecord(call_id=f"{trace_id}/judge", trace_id=trace_id, created_at=utc_now(), role="judge", model="m")
    trace = TraceRecord(trace_id=trace_id, created_at=utc_now(), task="t", state="s", mode="fallback")
    store.record_trace(trace, [call])


def record_traces(store: TelemetryStore, prefix: str, count: int) -> None:
    for index in range(count):
        record_trace(store, f"{prefix}-{index}")
        print(f"{prefix}-{index}", flush=True)  # only after record_trace returned: acknowledged


def record_in_group(store: TelemetryStore, prefix: str, count: int) -> None:
    """Flushes come from the appends (every 5 traces) and from the group's thread (after 5 ms)."""

    def written(frames: Mapping[str, pl.DataFrame]) -> None:
        if "traces" in frames:
            print("\n".join(frames["traces"]["trace_id"]), flush=True)  # only once flushed: acknowledged

    with store.group_commit(max_rows=10, max_delay_s=0.005, on_flush=written):
        for index in range(count):
            record_trace(store, f"{prefix}-{index}")


def resolve_tickets(store: TelemetryStore, count: int) -> None:
    from gil_core.batch import Ticket, resolve_batch
    from gil_core.resolver import Resolver
    from gil_core.testing import ScriptedChatModel, ScriptedReply
    from tests.resolver._support import support_task

    resolver = Resolver(ScriptedChatModel(responder=lambda messages, **_: ScriptedReply("B")), store)
    tickets = [Ticket(f"t{index}", f"ticket {index}: where is my parcel?") for index in range(count)]
    progress = lambda done, total: print(f"done {done}", flush=True)  # noqa: E731
    asyncio.run(
        resolve_batch(resolver, support_task(memory_threshold=None), tickets, progress=progress, commit_rows=60)
    )


def append_reviews(store: TelemetryStore, prefix: str, count: int) -> None:
    for index in range(count):
        item_id = f"{prefix}-{index}"
        row = {"task": "t", "reviewed_at": utc_now(), "kind": "k", "item_id": item_id, "decision": "d"}
        store.append("reviews", [row])
        print(item_id, flush=True)


def compact_until(store: TelemetryStore, stop: Path) -> None:
    merged = 0
    while not stop.exists():
        merged += store.compact("reviews")
        time.sleep(0.002)  # leave the writers some CPU; correctness does not depend on it
    print(merged, flush=True)


def main(argv: list[str]) -> None:
    mode, root = argv[1], argv[2]
    store = TelemetryStore(root)
    _wait_for_go()
    if mode == "traces":
        record_traces(store, argv[3], int(argv[4]))
    elif mode == "group":
        record_in_group(store, argv[3], int(argv[4]))
    elif mode == "batch":
        resolve_tickets(store, int(argv[3]))
    elif mode == "reviews":
        append_reviews(store, argv[3], int(argv[4]))
    elif mode == "compact":
        compact_until(store, Path(argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)
