"""A small file system of a test's own (tmpfs): a full disk and a read-only file system, for real. Mounting needs
root, as CI has here; elsewhere the tests that need one are skipped, saying why."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(where: Path, *, size: str = "16m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (made if missing) for the block; unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def remount_read_only(where: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)


def leave_free(where: Path, free: int) -> Path:
    """Fill the file system holding ``where`` with one file until it is full, then give ``free`` bytes back; the
    file is returned (delete it to make room)."""
    filler = where / "filler"
    chunk = b"\x01" * 65536
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while True:
            try:
                os.write(descriptor, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(descriptor)
    os.truncate(filler, max(0, filler.stat().st_size - free))
    return filler


def free_bytes(where: Path) -> int:
    stats = os.statvfs(where)
    return stats.f_bavail * stats.f_frsize
