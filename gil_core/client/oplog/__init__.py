"""The operation log: port ``OperationLog``, in-process and JSON-lines adapters, the ``LoggedChatModel`` decorator."""

from gil_core.client.oplog.in_process import DEFAULT_MAX_ENTRIES, InProcessOperationLog
from gil_core.client.oplog.jsonl import OPERATION_LOG_FOLDER, JsonLinesOperationLog
from gil_core.client.oplog.logged_model import LoggedChatModel, input_preview
from gil_core.client.oplog.ports import (
    INPUT_PREVIEW_CHARS,
    OperationEntry,
    OperationLog,
    OperationStats,
    RecalledOperation,
)

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "INPUT_PREVIEW_CHARS",
    "OPERATION_LOG_FOLDER",
    "InProcessOperationLog",
    "JsonLinesOperationLog",
    "LoggedChatModel",
    "OperationEntry",
    "OperationLog",
    "OperationStats",
    "RecalledOperation",
    "input_preview",
]
