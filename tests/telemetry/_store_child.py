"""A child process for test_durability: writes to, or compacts, a TelemetryStore in another process.

    _store_child.py traces  ROOT PREFIX COUNT  record traces (a call each), print each acknowledged id
    _store_child.py reviews ROOT PREFIX COUNT  append one review row at a time, print each acknowledged id
    _store_child.py compact ROOT STOP_FILE     compact "reviews" until STOP_FILE exists, print the count

Each child prints "ready" once its imports are done, then waits for one line on stdin before it starts, so the
parent can start several children at the same moment.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from gil_core.telemetry import CallRecord, TelemetryStore, TraceRecord, utc_now


def _wait_for_go() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def record_traces(store: TelemetryStore, prefix: str, count: int) -> None:
    for index in range(count):
        trace_id = f"{prefix}-{index}"
        call = CallRecord(call_id=f"{trace_id}/judge", trace_id=trace_id, created_at=utc_now(), role="judge", model="m")
        trace = TraceRecord(trace_id=trace_id, created_at=utc_now(), task="t", state="s", mode="fallback")
        store.record_trace(trace, [call])
        print(trace_id, flush=True)  # only after record_trace returned: acknowledged


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
    elif mode == "reviews":
        append_reviews(store, argv[3], int(argv[4]))
    elif mode == "compact":
        compact_until(store, Path(argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)
