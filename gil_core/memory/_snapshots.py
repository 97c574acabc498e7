"""Memory generations and exact snapshots: what lets a process answer a task from files beside the table, without
importing LanceDB.

**Generation.** Each task of a local store has a marker, ``<path>/<table>.gil-index/<digest>/generation``,
holding a random token (uuid4, so two writers never write the same one). Every Gil write to the task
(``remember``, ``forget``, ``rebuild``) replaces it just before its LanceDB commit and again once the commit
returned (or failed), each time atomically (``gil_core.atomic``). A snapshot is stamped with the token read
*before* its rows were read from the table, so a write that lands during the read leaves the snapshot stale,
never wrong: while the marker still holds the stamp, no write has committed since the rows were read. A reader
that finds no marker (a store written before markers existed) or an unreadable one writes a fresh one before it
reads the table (advancing a marker only ever makes snapshots stale). A writer killed between its commit and its
second replacement (SIGKILL, power loss) can leave a snapshot read in that instant current; the next write to the
task ends it.

**Exact snapshot.** A task held in the process (below the index threshold) is kept as its exact rows,
``exact.arrow`` beside the marker: its entries, raw float32 vectors and ``created_at`` stamps as a load from the
table reads them (a key once, earliest first), the columns of an index snapshot's rows (``rows_table``), in one
Arrow IPC file replaced atomically, its schema metadata naming the format, the task, the width and the
generation. Opened, it is the ``TaskVectors`` a load from the table builds, so answers and similarities are bit
for bit those of the table. A large task's index snapshot carries its stamp in its ``meta.json`` instead
(``gil_core.memory._index``). Either is only ever served for the task it names, from the folder of that task's
digest.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import numpy as np

from gil_core.atomic import atomic_write_text, replacing
from gil_core.memory._index import TaskRows, rows_table
from gil_core.memory._vectors import TaskVectors
from gil_core.memory.ports import MemoryEntry

__all__ = [
    "advance_generation",
    "discard_generation",
    "exact_stamp",
    "open_exact",
    "read_generation",
    "settle_generation",
    "write_exact",
]

_LOG = logging.getLogger(__name__)
FORMAT = "1"  # of the exact snapshot; another is not read (a load from the table writes it again)
_GENERATION, _EXACT = "generation", "exact.arrow"
_TOKEN_LENGTH = 32  # uuid4().hex


def read_generation(folder: Path) -> str | None:
    """The token ``folder``'s marker holds; None when it is missing or is not a token."""
    try:
        token = (folder / _GENERATION).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if len(token) != _TOKEN_LENGTH or any(char not in "0123456789abcdef" for char in token):
        return None
    return token


def advance_generation(folder: Path) -> str:
    """Replace ``folder``'s marker with a fresh token (atomically) and return it; ``OSError`` when it cannot."""
    folder.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    atomic_write_text(folder / _GENERATION, token, encoding="ascii")
    return token


def discard_generation(folder: Path) -> None:
    """Remove ``folder``'s marker (no snapshot of the task is served until one is written again); ``OSError``
    when it cannot."""
    (folder / _GENERATION).unlink(missing_ok=True)


def settle_generation(folder: Path) -> str | None:
    """The token to stamp a snapshot read from now on with: the marker's, or a fresh one written when it is
    missing or unreadable; None when none can be written (no snapshot is kept then)."""
    token = read_generation(folder)
    if token is not None:
        return token
    try:
        return advance_generation(folder)
    except OSError as exc:
        _LOG.warning("memory generation %s cannot be written (%s): no snapshot kept", folder / _GENERATION, exc)
        return None


def exact_stamp(folder: Path) -> str | None:
    """The generation ``folder``'s exact snapshot was read at (its footer only), None when there is none."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(folder / _EXACT), "r") as source:
            metadata = pa.ipc.open_file(source).schema.metadata or {}
    except (OSError, pa.ArrowException):
        return None
    stamp = metadata.get(b"gil.generation")
    return stamp.decode("ascii", "replace") if stamp is not None else None


def write_exact(folder: Path, task: str, generation: str, rows: TaskRows, dimensions: int) -> None:
    """Keep ``rows`` (``task``'s, read after its marker held ``generation``) as its exact snapshot."""
    import pyarrow as pa

    metadata = {"gil.format": FORMAT, "gil.task": task, "gil.generation": generation, "gil.dimensions": str(dimensions)}
    table = rows_table(rows, dimensions).replace_schema_metadata(metadata)
    folder.mkdir(parents=True, exist_ok=True)
    with (
        replacing(folder / _EXACT) as temporary,
        pa.OSFile(str(temporary), "wb") as sink,
        pa.ipc.new_file(sink, table.schema) as writer,
    ):
        writer.write_table(table, max_chunksize=max(1, len(rows.entries)))


def open_exact(folder: Path, task: str, generation: str) -> TaskVectors | None:
    """``task``'s exact snapshot as ``TaskVectors``, when it is stamped ``generation``; None when there is none,
    it is stale, of another format or task, or cannot be read (a warning says which: it is never served)."""
    import pyarrow as pa

    path = folder / _EXACT
    try:
        rows = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()  # copied below: the map can go
        metadata = {key.decode(): value.decode() for key, value in (rows.schema.metadata or {}).items()}
        if metadata.get("gil.format") != FORMAT or metadata.get("gil.task") != task:
            _LOG.warning("memory snapshot %s is of another format or task: not served", path)
            return None
        if metadata.get("gil.generation") != generation:
            return None  # stale: the table is read instead
        dimensions = int(metadata["gil.dimensions"])
        keys, texts, answers = (rows.column(name).to_pylist() for name in ("key", "text", "answer"))
        entries = [MemoryEntry(key=k, text=t, answer=a) for k, t, a in zip(keys, texts, answers, strict=True)]
        flat = rows.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        vectors = np.asarray(flat, dtype=np.float32).reshape(len(entries), dimensions)
        created = np.asarray(rows.column("created_at").to_numpy(), dtype=np.int64)
        if len(set(keys)) != len(keys):
            _LOG.warning("memory snapshot %s cannot be read (a key appears twice): not served", path)
            return None
        return TaskVectors.from_rows(entries, vectors, dimensions=dimensions, created=created)
    except FileNotFoundError:
        return None
    except Exception as exc:  # a damaged snapshot is never served: the table answers, and a load writes it again
        _LOG.warning("memory snapshot %s cannot be read (%s: %s): not served", path, type(exc).__name__, exc)
        return None
