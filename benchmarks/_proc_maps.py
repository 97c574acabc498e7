"""This process's memory mappings as ``/proc/self/smaps`` lists them, for the soak's samples (``_soak_worker``'s
per-kind totals, ``_soak_ablations``' per-mapping list)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple


class MemoryMapping(NamedTuple):
    start: str  # the address, in hex as listed
    size_kib: int
    kind: str  # "[heap]", "[anon]", "[stack]", another bracketed name, or "file" (any path)
    resident_kib: int
    path: str = ""  # the mapped file's path, for kind "file"


def mappings() -> Iterator[MemoryMapping]:
    """Every mapping with its resident size."""
    current: tuple[str, int, str, str] | None = None
    for row in Path("/proc/self/smaps").read_text(encoding="utf-8").splitlines():
        head = row.split()
        if head and "-" in head[0] and ":" not in head[0]:  # a mapping's header line: "start-end perms ..."
            start, end = head[0].split("-")
            kind = head[5] if len(head) > 5 else "[anon]"
            path = " ".join(head[5:]) if kind.startswith("/") else ""
            current = (start, (int(end, 16) - int(start, 16)) >> 10, "file" if path else kind, path)
        elif row.startswith("Rss:") and current is not None:
            start, size, kind, path = current
            yield MemoryMapping(start, size, kind, int(head[1]), path)
