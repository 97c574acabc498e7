"""One root for every error Gil raises, so callers can catch ``GilError`` and nothing else.

::

    GilError
    ├── TreeFileError            a tree file cannot be read (file, line, node)
    │   └── LabelCapacityError   a node has more candidates than its label scheme holds
    ├── ConfigurationError       a value object or setting is invalid
    │   └── InvalidArgumentError a caller passed a value its parameter cannot take (also a ValueError)
    ├── ModelError               a model endpoint failed (endpoint, reason)
    │   ├── ModelUnavailableError   refused, timed out, 5xx after retries
    │   ├── RateLimitedError        429 after retries (retry_after when the server said)
    │   └── BadResponseError        the reply is not what the protocol promises
    ├── TelemetryError           a table write or read failed
    │   ├── SchemaViolationError a row does not fit its table's schema
    │   ├── ExportRestrictedError the store is marked restricted (gil_core.telemetry.sqlite)
    │   └── SqliteLayoutError    a SQLite file is not in the reference's layout (gil_core.telemetry.sqlite)
    ├── UnknownTraceError        feedback names a trace the task does not have (task, trace_id)
    ├── BatchFileError           a ticket, verdict or results file cannot be read or written (its path)
    ├── LearnedStateError        a stored learned judge cannot be used: unreadable, of another task (its file)
    └── MemoryUnavailableError   memory cannot answer: its embedder or store failed, or its circuit is open (task)

Built-in exceptions leave ``gil_core`` only where Python's conventions want them for a caller's programming
error: ``TypeError`` for an argument of the wrong type, ``KeyError`` from a mapping's lookup (``BatchResults``
and the like), ``NotImplementedError`` from an abstract method. An argument of the right type but an impossible
value raises ``InvalidArgumentError``, which is both a ``GilError`` and a ``ValueError``.
"""

from __future__ import annotations

__all__ = [
    "BadResponseError",
    "BatchFileError",
    "ConfigurationError",
    "GilError",
    "InvalidArgumentError",
    "LabelCapacityError",
    "LearnedStateError",
    "MemoryUnavailableError",
    "ModelError",
    "ModelUnavailableError",
    "RateLimitedError",
    "SchemaViolationError",
    "TelemetryError",
    "TreeFileError",
    "UnknownTraceError",
]


class GilError(Exception):
    """Root of every error raised by gil_core."""


class TreeFileError(GilError):
    """A tree file is malformed. The message names the file, the line and the node id when known."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        node: str | None = None,
    ) -> None:
        self.reason = message
        self.path = path
        self.line = line
        self.node = node
        where = path or "<tree>"
        if line is not None:
            where = f"{where}:{line}"
        if node is not None:
            where = f"{where}: node {node!r}"
        super().__init__(f"{where}: {message}")


class LabelCapacityError(TreeFileError):
    """A node shows more candidates than its label scheme can label."""


class ConfigurationError(GilError):
    """A setting or value object is invalid."""


class InvalidArgumentError(ConfigurationError, ValueError):
    """A caller passed a value its parameter cannot take (a programming error: a NaN threshold, a negative
    count, a share above 1). A ``ValueError`` too, as Python's convention for such values has it; the message
    names the parameter and the value."""


class ModelError(GilError):
    """A model endpoint failed. ``endpoint`` is the URL called; ``reason`` says why."""

    def __init__(self, reason: str, *, endpoint: str, status: int | None = None) -> None:
        self.reason = reason
        self.endpoint = endpoint
        self.status = status
        suffix = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"{endpoint}: {reason}{suffix}")


class ModelUnavailableError(ModelError):
    """The endpoint refused the connection, timed out, or kept answering 5xx."""


class RateLimitedError(ModelError):
    """The endpoint kept answering 429. ``retry_after`` is the server's last hint in seconds, if any."""

    def __init__(
        self, reason: str, *, endpoint: str, status: int | None = 429, retry_after: float | None = None
    ) -> None:
        self.retry_after = retry_after
        super().__init__(reason, endpoint=endpoint, status=status)


class BadResponseError(ModelError):
    """The endpoint answered, but not in the shape the OpenAI-compatible protocol promises."""


class TelemetryError(GilError):
    """A telemetry table could not be written or read."""


class SchemaViolationError(TelemetryError):
    """Rows do not fit the pandera schema of their table. ``table`` names it."""

    def __init__(self, message: str, *, table: str) -> None:
        self.table = table
        super().__init__(f"table {table!r}: {message}")


class MemoryUnavailableError(GilError):
    """Memory cannot answer for ``task``: its embedder or its store failed, or its circuit breaker is open.

    ``open_until`` is set when a breaker refused the call: the time on the breaker's clock from which it lets
    one trial call through again.
    """

    def __init__(self, reason: str, *, task: str, open_until: float | None = None) -> None:
        self.reason = reason
        self.task = task
        self.open_until = open_until
        super().__init__(f"memory of task {task!r}: {reason}")


class UnknownTraceError(GilError):
    """Feedback (or a look-up) names a trace that ``task`` does not have; another task's trace counts as none."""

    def __init__(self, message: str, *, trace_id: str, task: str) -> None:
        self.trace_id = trace_id
        self.task = task
        super().__init__(message)


class BatchFileError(GilError):
    """A batch's file cannot be used as a whole: a ticket or verdict file is missing, a folder, unreadable, or a
    ``.parquet`` file that is not Parquet; a results file cannot be written. ``path`` is the file; the message names
    it and the reason. (A bad line or row of a readable file is no error: it is reported where it stands, and the
    rest of the file runs.)"""

    def __init__(self, reason: str, *, path: str) -> None:
        self.reason = reason
        self.path = path
        super().__init__(f"{path}: {reason}")


class LearnedStateError(GilError):
    """A stored learned judge cannot be used: unreadable, fitted for another task, or inconsistent. The message
    names the file; the learned judge refits from the log (``gil_core.learned``)."""
