"""No block of code written twice in gil_core or flows (issue #21, point 3): the similarity step of
scripts/check.py (pylint's ``symilar``, blocks of 6 or more lines) fails on a repeat and passes on the tree.

symilar itself exits 0 whatever it finds, so the failing case is what shows the step reads its report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "check.py"

BLOCK = """\
    total = 0
    for item in range(count):
        total += item * 2
        if total > 100:
            total -= 7
        total %= 13
    return total
"""


def similarity(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), "similarity", *map(str, files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_repeated_seven_line_block_fails_the_check(tmp_path: Path) -> None:
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text(f'"""One."""\n\n\ndef first(count: int) -> int:\n{BLOCK}', encoding="utf-8")
    second.write_text(f'"""Two."""\n\n\ndef second(count: int) -> int:\n    """Alike."""\n{BLOCK}', encoding="utf-8")

    finished = similarity(first, second)

    assert finished.returncode == 1, finished.stdout + finished.stderr
    assert "7 similar lines in 2 files" in finished.stdout
    assert "1 repeated block(s)" in finished.stdout


@pytest.mark.slow
def test_gil_core_and_flows_hold_no_repeated_block() -> None:
    finished = similarity()  # every tracked .py file under gil_core and flows

    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "duplicates=0 " in finished.stdout
