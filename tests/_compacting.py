"""Another maintainer compacting a store's tables in a loop while a test's body reads and writes, as another
process would (each its own ``TelemetryStore`` object, on its own thread)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gil_core.telemetry import TelemetryStore


@contextmanager
def compacting(root: Path, *tables: str) -> Iterator[list[int]]:
    """Compact ``tables`` of the store at ``root`` over and over until the body ends; yields the list of what each
    compaction merged (filled as they run). What the compactor raised is raised when the body ends."""
    compactor = TelemetryStore(root)
    done = threading.Event()
    failures: list[BaseException] = []
    merged: list[int] = []

    def compact_until_done() -> None:
        try:
            while not done.is_set():
                merged.extend(compactor.compact(table) for table in tables)
        except BaseException as exc:  # raised below, in the test's thread
            failures.append(exc)

    thread = threading.Thread(target=compact_until_done, name="test-compactor")
    thread.start()
    try:
        yield merged
    finally:
        done.set()
        thread.join(timeout=120)
    if failures:
        raise failures[0]
