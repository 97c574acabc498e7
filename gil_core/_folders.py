"""A folder of immutable files, the interface a store's tables and side folders are kept through (``Folder``, with
the ``Claim`` that lets one maintainer at a time compact it), and ``LocalFolder``, the one on this machine. The
object-store folder and the store's locations are ``gil_core.storage``'s.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import polars as pl
from filelock import FileLock

from gil_core.atomic import atomic_write_bytes, fsync_directory
from gil_core.errors import ConfigurationError

__all__ = ["Claim", "Folder", "LocalFolder"]

# LZ4 decodes ~3x cheaper than zstd (reading 1.3M trace rows: 0.2 s CPU instead of 0.6 s) for files ~1.9x larger:
# the right trade on a local disk. Objects keep Polars' zstd: over a network, bytes cost more than CPU.
_LOCAL_COMPRESSION: Final = "lz4"
_STALE_TEMP_SECONDS = 3600.0  # an unfinished temporary file this old belongs to a writer that died


@dataclass(frozen=True, slots=True)
class Claim:
    """The right to maintain a folder (compact it). ``held`` is False when another maintainer has it now;
    ``fresh()`` says whether the right still holds (an object-store claim expires, a file lock does not)."""

    held: bool
    expires: float | None = None  # time.monotonic() after which the claim may be taken over

    def fresh(self) -> bool:
        return self.held and (self.expires is None or time.monotonic() < self.expires)


class Folder(Protocol):
    """One folder of immutable files, local or in an object store."""

    @property
    def where(self) -> str:
        """The folder, for messages."""
        ...

    @property
    def storage_options(self) -> dict[str, str] | None:
        """What Polars needs to read a ``source``."""
        ...

    def source(self, name: str) -> str | Path:
        """The file ``name`` as Polars reads it."""
        ...

    def names(self) -> list[str]:
        """Final names of the files present (dot-names excluded), sorted; empty when the folder is missing."""
        ...

    def write_parquet(self, name: str, frame: pl.DataFrame, metadata: dict[str, str] | None = None) -> None:
        """Store ``frame`` as ``name``: when this returns the file is durable and whole; before, it is absent."""
        ...

    def remove(self, names: Iterable[str]) -> None:
        """Delete these files (missing ones are fine)."""
        ...

    def read_bytes(self, name: str) -> bytes:
        """The file's bytes, whole. ``FileNotFoundError`` when it is gone; any other failure is the read's."""
        ...

    def move_into(self, name: str, target: Folder) -> None:
        """Move the file ``name`` into ``target`` (a folder of the same kind and store), keeping its name.
        ``FileNotFoundError`` when it is gone already."""
        ...

    def walk(self) -> list[str]:
        """Every file under the folder, at any depth, as paths relative to it (``/``-separated), sorted."""
        ...

    def remove_stale_temporary_files(self) -> None:
        """Delete what writers that died left behind."""
        ...

    def claim(self) -> AbstractContextManager[Claim]:
        """A context manager yielding a ``Claim``: one maintainer at a time."""
        ...


class LocalFolder:
    """A folder on this machine. A write goes to a temporary dot-name, is fsynced, renamed into place and the
    folder fsynced: it survives a SIGKILL (and a power loss, as far as the file system honours fsync)."""

    def __init__(self, path: Path, *, lock_name: str = ".compact.lock") -> None:
        self._path = path
        self._lock_name = lock_name
        self._ready = False

    @property
    def where(self) -> str:
        return str(self._path)

    @property
    def storage_options(self) -> dict[str, str] | None:
        return None

    def source(self, name: str) -> Path:
        return self._path / name

    def names(self) -> list[str]:
        try:
            with os.scandir(self._path) as entries:
                return sorted(
                    entry.name
                    for entry in entries
                    if entry.name.endswith(".parquet") and not entry.name.startswith(".")
                )
        except FileNotFoundError:
            return []

    def write_parquet(self, name: str, frame: pl.DataFrame, metadata: dict[str, str] | None = None) -> None:
        self._ensure()
        # Encoded in memory, then written by Python: a write Polars makes itself fails as a ComputeError without
        # its errno, and a full disk must be told apart (an OSError with ENOSPC) from a bad frame.
        encoded = io.BytesIO()
        frame.write_parquet(encoded, compression=_LOCAL_COMPRESSION, metadata=metadata)
        atomic_write_bytes(self._path / name, encoded.getbuffer(), sync_folder=False)
        try:
            fsync_directory(self._path)
        except OSError:
            (self._path / name).unlink(missing_ok=True)  # raising says "not written": take the file back
            raise

    def remove(self, names: Iterable[str]) -> None:
        removed = False
        for name in names:
            (self._path / name).unlink(missing_ok=True)
            removed = True
        if removed:
            fsync_directory(self._path)

    def read_bytes(self, name: str) -> bytes:
        return (self._path / name).read_bytes()

    def move_into(self, name: str, target: Folder) -> None:
        if not isinstance(target, LocalFolder):
            raise ConfigurationError(f"{self.where}: cannot move {name} into {target.where}, a folder of another kind")
        target._ensure()
        os.replace(self._path / name, target._path / name)  # one rename: the file is in exactly one folder
        fsync_directory(target._path)
        fsync_directory(self._path)

    def walk(self) -> list[str]:
        found = []
        for folder, _, files in os.walk(self._path):
            relative = Path(folder).relative_to(self._path)
            found += [(relative / name).as_posix() for name in files if not name.startswith(".")]
        return sorted(found)

    def remove_stale_temporary_files(self) -> None:
        cutoff = time.time() - _STALE_TEMP_SECONDS
        stale = []
        with os.scandir(self._path) as entries:
            for entry in entries:
                if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                    try:
                        if entry.stat().st_mtime < cutoff:
                            stale.append(entry.name)
                    except FileNotFoundError:
                        continue
        self.remove(stale)

    @contextmanager
    def claim(self) -> Iterator[Claim]:
        """Wait for the folder's file lock: maintainers on this machine (or a shared file system) take turns."""
        if not self._path.is_dir():
            yield Claim(held=False)
            return
        with FileLock(self._path / self._lock_name):
            yield Claim(held=True)

    def _ensure(self) -> None:
        if self._ready:
            return
        if not self._path.is_dir():
            self._path.mkdir(parents=True, exist_ok=True)
            fsync_directory(self._path.parent)  # the folder's own entry must be durable before files inside it
        self._ready = True
