"""``InProcessOperationLog``: the operation log in this process's memory, the last N entries."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from gil_core.client.oplog._base import OperationLogBase, of_task
from gil_core.client.oplog.ports import OperationEntry
from gil_core.errors import ConfigurationError
from gil_core.llm.ports import EmbeddingModel

__all__ = ["DEFAULT_MAX_ENTRIES", "InProcessOperationLog"]

DEFAULT_MAX_ENTRIES = 10_000


class InProcessOperationLog(OperationLogBase):
    """``OperationLog`` keeping the last ``max_entries`` entries (0 = all of them). With ``embedder``, entries
    are embedded as they are recorded and ``recall`` ranks by cosine (see ``_base`` for the rules)."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, *, embedder: EmbeddingModel | None = None) -> None:
        if max_entries < 0:
            raise ConfigurationError(f"max_entries must be >= 0 (0 keeps every entry), got {max_entries}")
        super().__init__(embedder)
        self._entries: deque[OperationEntry] = deque(maxlen=max_entries or None)
        self._lock = threading.Lock()

    def entries(self, task: str | None = None) -> Sequence[OperationEntry]:
        with self._lock:
            return of_task(tuple(self._entries), task)

    def _keep(self, entry: OperationEntry) -> None:
        with self._lock:
            self._entries.append(entry)

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()
