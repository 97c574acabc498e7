"""``gil_core.atomic``: a file appears whole or not at all, and a failed write leaves neither half a file nor a
temporary one behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gil_core.atomic import atomic_open, atomic_write_bytes, atomic_write_text, replacing


def leftovers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name.endswith(".tmp"))


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old", encoding="utf-8")
    atomic_write_text(target, "néw\n")
    assert target.read_text(encoding="utf-8") == "néw\n"
    atomic_write_bytes(target, memoryview(b"\x00bytes"))
    assert target.read_bytes() == b"\x00bytes"
    assert leftovers(tmp_path) == []


def test_a_failing_stream_keeps_the_old_file_and_removes_the_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "results.jsonl"
    target.write_text("old\n", encoding="utf-8")
    with pytest.raises(RuntimeError), atomic_open(target) as handle:
        handle.write("half a new file")
        raise RuntimeError("the writer fails")
    assert target.read_text(encoding="utf-8") == "old\n"
    assert leftovers(tmp_path) == []


def test_without_overwrite_a_taken_name_raises_and_stays_as_it_was(tmp_path: Path) -> None:
    target = tmp_path / "tree.v2.yaml"
    atomic_write_text(target, "first", overwrite=False)
    with pytest.raises(FileExistsError):
        atomic_write_text(target, "second", overwrite=False)
    assert target.read_text(encoding="utf-8") == "first"
    assert leftovers(tmp_path) == []


def test_a_symbolic_link_stays_one_and_permissions_are_kept(tmp_path: Path) -> None:
    real = tmp_path / "trees" / "support.yaml"
    real.parent.mkdir()
    real.write_text("old", encoding="utf-8")
    real.chmod(0o640)
    link = tmp_path / "support.yaml"
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text(encoding="utf-8") == "new"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640


def test_the_mtime_is_set_before_the_file_appears_and_a_writer_may_open_the_path_itself(tmp_path: Path) -> None:
    target = tmp_path / "memory.jsonl"
    atomic_write_text(target, "row\n", modified_ns=1_000_000_000_123)
    assert os.stat(target).st_mtime_ns == 1_000_000_000_123
    with replacing(tmp_path / "export.sqlite") as temporary:
        assert not temporary.exists() and temporary.parent == tmp_path and temporary.name.startswith(".")
        temporary.write_bytes(b"SQLite format 3\x00")
    assert (tmp_path / "export.sqlite").read_bytes() == b"SQLite format 3\x00"
    assert leftovers(tmp_path) == []
