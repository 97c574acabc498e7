"""``JsonLinesOperationLog``: the operation log kept under a store root, as JSON-lines files.

The telemetry store's table set is fixed (and pinned by a test), so the log lives beside its tables in
``<root>/operation_log/``. Each batch of entries becomes ONE new file ``<ns>-<pid>-<random>.jsonl``, written
under a temporary dot-name, flushed and ``fsync``-ed, ``os.replace``-d to its final name, and then the folder
is ``fsync``-ed: an acknowledged batch survives a crash, a reader (listing ``*.jsonl``) never sees half a file,
and two processes never write the same file. With ``batch_size=1`` (the default) every entry is acknowledged
when ``record`` returns; larger batches trade that for fewer files (``flush`` writes what is pending).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from typing import Any

from gil_core.atomic import atomic_write_text
from gil_core.client.oplog._base import OperationLogBase, of_task
from gil_core.client.oplog.ports import OperationEntry
from gil_core.errors import ConfigurationError, TelemetryError
from gil_core.llm.ports import EmbeddingModel

__all__ = ["OPERATION_LOG_FOLDER", "JsonLinesOperationLog"]

OPERATION_LOG_FOLDER = "operation_log"
_SUFFIX = ".jsonl"
_FIELDS = frozenset(field.name for field in fields(OperationEntry))

_log = logging.getLogger(__name__)


def _to_json(entry: OperationEntry) -> str:
    row: dict[str, Any] = {
        "entry_id": entry.entry_id,
        "task": entry.task,
        "created_at": entry.created_at.isoformat(timespec="microseconds"),
        "intent": entry.intent,
        "input_preview": entry.input_preview,
        "output": entry.output,
        "target_type": entry.target_type,
        "success": entry.success,
        "attempts": entry.attempts,
        "provider": entry.provider,
        "model": entry.model,
        "prompt_tokens": entry.prompt_tokens,
        "completion_tokens": entry.completion_tokens,
        "duration_ms": entry.duration_ms,
        "tags": list(entry.tags),
        "error": entry.error,
        "embedding": list(entry.embedding) if entry.embedding is not None else None,
    }
    return json.dumps(row, ensure_ascii=False)


def _from_json(line: str) -> OperationEntry:
    row = json.loads(line)
    embedding = row.get("embedding")
    # Fields added by a later version are ignored rather than making the line unreadable; a field a line lacks
    # (``task`` on lines written before entries carried it) takes its default.
    known = {name: value for name, value in row.items() if name in _FIELDS}
    return OperationEntry(
        **{
            **known,
            "created_at": datetime.fromisoformat(row["created_at"]),
            "tags": tuple(row.get("tags") or ()),
            "embedding": tuple(float(x) for x in embedding) if embedding is not None else None,
        }
    )


class JsonLinesOperationLog(OperationLogBase):
    """``OperationLog`` persisted under ``root`` (a telemetry store's root); see the module doc."""

    def __init__(
        self, root: str | os.PathLike[str], *, batch_size: int = 1, embedder: EmbeddingModel | None = None
    ) -> None:
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be at least 1, got {batch_size}")
        super().__init__(embedder)
        self._folder = Path(root) / OPERATION_LOG_FOLDER
        self._batch_size = batch_size
        self._pending: list[OperationEntry] = []
        self._lock = threading.Lock()
        self._last_stamp = 0

    @property
    def folder(self) -> Path:
        """Where the files are."""
        return self._folder

    def entries(self, task: str | None = None) -> Sequence[OperationEntry]:
        """Every written entry in write order, then the pending ones (``task``'s only, when given); an unreadable
        line is skipped (warned), a file that cannot be read at all raises ``TelemetryError`` naming it."""
        written: list[OperationEntry] = []
        files = sorted(self._folder.glob(f"*{_SUFFIX}")) if self._folder.is_dir() else []
        for path in files:
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:  # a folder in a file's place, bytes that are not UTF-8
                raise TelemetryError(f"operation log: cannot read {path} ({type(exc).__name__}: {exc})") from exc
            for number, line in enumerate(text.splitlines(), start=1):
                try:
                    written.append(_from_json(line))
                except (ValueError, KeyError, TypeError):
                    _log.warning("operation log: %s line %d is unreadable; skipped", path.name, number)
        with self._lock:
            return of_task((*written, *self._pending), task)

    def flush(self) -> None:
        """Write the pending entries as one durable file (nothing when none is pending)."""
        with self._lock:
            batch, self._pending = self._pending, []
            if batch:
                try:
                    self._write(batch)
                except OSError as exc:
                    self._pending = batch + self._pending
                    raise TelemetryError(f"operation log: cannot write to {self._folder}: {exc}") from exc

    def _keep(self, entry: OperationEntry) -> None:
        with self._lock:
            self._pending.append(entry)
            full = len(self._pending) >= self._batch_size
        if full:
            self.flush()

    def _write(self, batch: Sequence[OperationEntry]) -> None:
        self._folder.mkdir(parents=True, exist_ok=True)
        # A stamp that never repeats in this process keeps file names in write order.
        self._last_stamp = max(time.time_ns(), self._last_stamp + 1)
        name = f"{self._last_stamp:020d}-{os.getpid()}-{secrets.token_hex(4)}{_SUFFIX}"
        atomic_write_text(self._folder / name, "".join(_to_json(entry) + "\n" for entry in batch))
