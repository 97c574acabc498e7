"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every file Gil writes whole on this machine goes the same way: its bytes go to a temporary dot-name beside it
(``.{name}.{random}.tmp``, which ``LocalFolder.remove_stale_temporary_files`` knows), the temporary file is
``fsync``-ed, renamed to its final name (``os.replace``; or hard-linked there, when it must not overwrite), and
then the folder is ``fsync``-ed so the rename itself survives a power loss. A failure at any step removes the
temporary file and raises. A symbolic link at the final name stays one: its target is replaced. Replacing a file
keeps its permission bits.

``atomic_write_bytes`` and ``atomic_write_text`` write what is in memory, ``atomic_open`` yields a text file to
stream into, and ``replacing`` yields the temporary path itself, for a writer that opens it on its own (SQLite).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["atomic_open", "atomic_write_bytes", "atomic_write_text", "fsync_directory", "replacing"]


@contextmanager
def replacing(
    path: str | Path, *, overwrite: bool = True, sync_folder: bool = True, modified_ns: int | None = None
) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` that does not exist yet; when the block ends without an error the
    file written there becomes ``path`` (see the module). ``overwrite=False``: ``FileExistsError`` when ``path``
    exists, which is then left as it was. ``sync_folder=False`` leaves the folder's ``fsync`` to the caller
    (``fsync_directory``). ``modified_ns`` becomes the file's mtime before it appears under ``path``."""
    target = Path(os.path.realpath(path))
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    try:
        yield temporary
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        if modified_ns is not None:
            os.utime(temporary, ns=(modified_ns, modified_ns))
        if overwrite:
            with contextlib.suppress(FileNotFoundError):
                os.chmod(temporary, stat.S_IMODE(os.stat(target).st_mode))
            os.replace(temporary, target)
        else:
            os.link(temporary, target)  # fails if the name is taken: the file there stays as it was
    finally:
        temporary.unlink(missing_ok=True)
    if sync_folder:
        fsync_directory(target.parent)


@contextmanager
def atomic_open(
    path: str | Path,
    *,
    encoding: str = "utf-8",
    overwrite: bool = True,
    sync_folder: bool = True,
    modified_ns: int | None = None,
) -> Iterator[IO[str]]:
    """A text file (in ``encoding``, newlines as ``open`` writes them) to stream ``path``'s content into; it
    replaces ``path`` when the block ends without an error (``replacing`` says how, and what the keywords do)."""
    with (
        replacing(path, overwrite=overwrite, sync_folder=sync_folder, modified_ns=modified_ns) as temporary,
        open(temporary, "w", encoding=encoding) as handle,
    ):
        yield handle


def atomic_write_bytes(
    path: str | Path,
    data: bytes | bytearray | memoryview,
    *,
    overwrite: bool = True,
    sync_folder: bool = True,
    modified_ns: int | None = None,
) -> None:
    """Write ``data`` as the whole of ``path``, atomically (``replacing`` says what the keywords do)."""
    with (
        replacing(path, overwrite=overwrite, sync_folder=sync_folder, modified_ns=modified_ns) as temporary,
        open(temporary, "wb") as handle,
    ):
        handle.write(data)


def atomic_write_text(
    path: str | Path,
    text: str,
    *,
    encoding: str = "utf-8",
    overwrite: bool = True,
    sync_folder: bool = True,
    modified_ns: int | None = None,
) -> None:
    """Write ``text`` as the whole of ``path`` in ``encoding`` (newlines as ``Path.write_text`` writes them),
    atomically (``replacing`` says what the keywords do)."""
    with atomic_open(
        path, encoding=encoding, overwrite=overwrite, sync_folder=sync_folder, modified_ns=modified_ns
    ) as handle:
        handle.write(text)


def fsync_directory(folder: str | Path) -> None:
    """Make the names in ``folder`` durable: a rename or a new file survives a power loss only once its folder
    is synced (POSIX). A no-op on Windows, which cannot open a folder."""
    if os.name == "nt":
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
