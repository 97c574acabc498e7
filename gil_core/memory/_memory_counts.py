"""What LanceDB memories count: each instance's work against the table (``MemoryStats``, read by tests and
benchmarks), and the writes a process's instances made to each table (so they see each other's writes at once)."""

from __future__ import annotations

import threading
from pathlib import Path

__all__ = ["MemoryStats", "ProcessWrites", "process_writes"]


class MemoryStats:
    """What an instance has done against the table, counted (tests and benchmarks read it)."""

    def __init__(self) -> None:
        self.version_checks = 0  # table versions read
        self.catch_ups = 0  # tasks brought in step with another writer's commits
        self.loads = 0  # tasks read whole from the table
        self.index_lookups = 0  # lookups answered from a task's index
        self.snapshot_opens = 0  # tasks' index snapshots opened (memory-mapped, nothing read whole)
        self.connects = 0  # connections to LanceDB opened (0: every call was answered from snapshots)
        self.snapshot_lookups = 0  # lookups answered from a snapshot, without LanceDB
        self.generation_reads = 0  # memory generation markers read to serve a snapshot
        self.snapshot_writes = 0  # exact snapshots written after a load


class ProcessWrites:
    """How many writes the instances of this process have made to one table: an instance that sees the count
    move looks at the table on its next call, so writes within a process are seen at once."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def bump(self) -> None:
        with self._lock:
            self.count += 1


_WRITES: dict[tuple[str, str], ProcessWrites] = {}
_WRITES_LOCK = threading.Lock()


def process_writes(path: str | Path, table: str) -> ProcessWrites:
    """The write count of the table ``table`` under ``path``, shared by the process's instances on it."""
    key = (str(Path(path).resolve()) if isinstance(path, Path) else path, table)
    with _WRITES_LOCK:
        writes = _WRITES.get(key)
        if writes is None:
            writes = _WRITES[key] = ProcessWrites()
        return writes
