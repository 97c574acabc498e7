#!/usr/bin/env python3
"""The static checks the README's test command runs before pytest, in this order, stopping at the first failure:

1. ``ruff check .``
2. ``ruff format --check .``
3. ``mypy`` (its settings are pyproject.toml's: strict on gil_core, mypy's default strictness on flows and
   benchmarks)
4. the similarity check: pylint's ``symilar`` over every tracked ``.py`` file under gil_core and flows, which
   fails on any block of 6 or more lines found twice (comments, docstrings, imports and signatures left out).

    uv run python scripts/check.py                         # all four, from any folder of the repository
    uv run python scripts/check.py similarity [FILE ...]   # the similarity check alone (over FILEs, if given)

It runs inside ``uv run``: the tools are the dev group's, started with this interpreter (``python -m ...``).
The exit code is the failing step's (1 for a repeat the similarity check found), 0 when all pass.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ruff check .", ("ruff", "check", ".")),
    ("ruff format --check .", ("ruff", "format", "--check", ".")),
    ("mypy", ("mypy",)),
)

SIMILARITY_FOLDERS = ("gil_core", "flows")
# At least 6 lines alike, once comments (-i), docstrings and imports are left out. Signatures are left out too
# (--ignore-signatures): a Protocol's implementations repeat its method signatures by definition, and so do the
# overloads and wrappers of one function; a repeated body still counts.
SYMILAR_OPTIONS = ("-d", "6", "-i", "--ignore-docstrings", "--ignore-imports", "--ignore-signatures")

# symilar exits 0 whatever it finds: a repeat is read from its report instead, a heading per repeated block
# ("7 similar lines in 2 files") and a last line "TOTAL lines=25048 duplicates=0 percent=0.00".
_REPEAT = re.compile(r"^\d+ similar lines in \d+ files$", re.MULTILINE)
_TOTAL = re.compile(r"^TOTAL lines=\d+ duplicates=(\d+) percent=", re.MULTILINE)


def tracked_python_files(folders: Sequence[str] = SIMILARITY_FOLDERS) -> list[str]:
    """The ``.py`` files git tracks under ``folders`` (as paths from the repository's root), present on disk."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *(f"{folder}/*.py" for folder in folders)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sorted(name for name in listed.split("\0") if name and (ROOT / name).is_file())


def similarity(files: Sequence[str]) -> int:
    """Run ``symilar`` over ``files`` (paths from the repository's root, or absolute), print its report, and
    return 1 when it found a repeated block (or its report could not be read), else 0."""
    if not files:
        print("similarity: no files to compare", file=sys.stderr)
        return 1
    finished = subprocess.run(
        [sys.executable, "-m", "pylint.checkers.symilar", *SYMILAR_OPTIONS, *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    sys.stdout.write(finished.stdout)
    sys.stderr.write(finished.stderr)
    if finished.returncode != 0:
        return finished.returncode
    total = _TOTAL.search(finished.stdout)
    if total is None:
        print("similarity: symilar's report has no TOTAL line", file=sys.stderr)
        return 1
    repeats = len(_REPEAT.findall(finished.stdout))
    if repeats or int(total.group(1)):
        print(f"similarity: {repeats} repeated block(s) of 6 or more lines: make one piece of code serve both")
        return 1
    return 0


def run_all() -> int:
    for title, command in STEPS:
        print(f"== {title}", flush=True)
        code = subprocess.run([sys.executable, "-m", *command], cwd=ROOT).returncode
        if code != 0:
            print(f"== {title}: failed (exit code {code})", file=sys.stderr)
            return code
    print("== similarity", flush=True)
    code = similarity(tracked_python_files())
    if code != 0:
        print(f"== similarity: failed (exit code {code})", file=sys.stderr)
    return code


def main(arguments: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("only", nargs="?", choices=["similarity"], help="run this check alone")
    parser.add_argument("files", nargs="*", help="with similarity: the files to compare (default: the tree's)")
    options = parser.parse_args(arguments)
    if options.only is None:
        if options.files:
            parser.error("files are for the similarity check: scripts/check.py similarity FILE ...")
        return run_all()
    files = [str(Path(name).resolve()) for name in options.files] or tracked_python_files()
    return similarity(files)


if __name__ == "__main__":
    sys.exit(main())
