"""The one benchmark command at its quick size: it produces every section with its table, writes only where it is
told, and leaves the repository's BENCHMARKS.md alone. No speed target is asserted: those are the findings.

The quality part runs at its quick size in tests/benchmarks/test_quality_quick.py, which checks its section; the
harness run here leaves it out (``--parts``), so the suite does not run it twice."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import PARTS, expected_sections
from benchmarks._report import BENCHMARKS_FILE, Row, Section, replace_section

ROOT = Path(__file__).resolve().parents[2]
HARNESS_PARTS = tuple(part for part in PARTS if part != "quality")  # quality: its own quick test


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def _sections(text: str) -> dict[str, str]:
    """``## title`` → the section's text up to the next ``## ``."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.local_model
def test_the_quick_harness_writes_every_section_with_a_table_into_the_file_it_is_given(tmp_path: Path) -> None:
    output = tmp_path / "BENCHMARKS.md"
    output.write_text("# Benchmarks\n\n## Someone else's section\n\nkept as it is\n", encoding="utf-8")
    before = _digest(BENCHMARKS_FILE)
    environment = {
        **os.environ,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_HOME": str(tmp_path / "prefect"),
    }
    finished = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--parts", ",".join(HARNESS_PARTS), "--output", str(output)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert finished.returncode == 0, finished.stderr[-4000:]

    assert _digest(BENCHMARKS_FILE) == before, "a quick run must not rewrite the repository's BENCHMARKS.md"
    sections = _sections(output.read_text(encoding="utf-8"))
    assert sections.pop("Someone else's section").strip() == "kept as it is"
    expected = expected_sections(HARNESS_PARTS, local_model=os.environ.get("GIL_SKIP_LOCAL_MODEL") != "1")
    assert sorted(sections) == sorted(expected)
    for title, body in sections.items():
        assert re.search(r"^\|.*\|\n\|[-:|]+\|\n\|", body, flags=re.MULTILINE), f"no table in {title!r}"
    for title in expected:
        if title.startswith("Speed:") or title.startswith("Memory false hits"):
            assert "python -m benchmarks --quick" in sections[title], title
            if title != "Speed: memory lookup (part B)":  # its targets are at 100k and 1M entries: full runs only
                assert "| what | target | measured | verdict |" in sections[title], title
    assert (
        "| entries | arm | p50 ms | CPU ms | × numpy (p50) | recall@1 | setup |"
        in sections["Speed: memory lookup (part B)"]
    )


def test_a_section_replaces_only_its_own_heading() -> None:
    text = "# Benchmarks\n\n## A\n\nold a\n\n## B\n\nb stays\n"
    replaced = replace_section(text, "A", "## A\n\nnew a\n")
    assert replaced == "# Benchmarks\n\n## A\n\nnew a\n\n## B\n\nb stays\n"
    assert replace_section(replaced, "C", "## C\n\nc\n").endswith("## B\n\nb stays\n\n## C\n\nc\n")
    assert replace_section("## B\n\nold\n", "B", "## B\n\nnew\n") == "## B\n\nnew\n"


def test_a_section_states_its_command_date_targets_and_misses() -> None:
    section = Section(
        "Speed: example",
        "uv run --extra local python -m benchmarks",
        "What was measured.",
        [Row("p50", "≤ 1 ms", "3.00 ms", False), Row("baseline", "—", "0.02 ms")],
    )
    text = section.render()
    assert text.startswith("## Speed: example\n\nCommand: `uv run --extra local python -m benchmarks` — run ")
    assert "| p50 | ≤ 1 ms | 3.00 ms | **misses** |" in text
    assert "| baseline | — | 0.02 ms |  |" in text
    assert section.misses == [section.rows[0]]
