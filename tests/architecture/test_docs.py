"""The docs the code cites are in the repository, and they name what is there.

- docs/architecture.md's section "The way of one request" names, in backticks, every module a request passes
  (`gil_core/resolver.py`, or dotted, `gil_core.resolver`): each must exist as a module or a package. In that
  section a backticked name that starts with one of the project's folders is read as a module, so it may not
  name a function or a class.
- A citation `docs/<file>.md, "Section"` in gil_core, flows, benchmarks or tests names a heading of that file.
- Nothing cites the design notes that lived beside the repository (ARCHITECTURE.md, REFERENCE.md, ../shared):
  the project stands alone. The exceptions are listed below, each with its reason.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PROJECT_FOLDERS = ("gil_core", "flows", "benchmarks", "tests", "scripts")
CITING = ("gil_core", "flows", "benchmarks", "tests")
REQUEST_PATH = "The way of one request"

# A Markdown heading, and a backticked name in prose.
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
_BACKTICKED = re.compile(r"`([^`\s]+)`")
# `docs/reference.md, "Stats"`, with or without backticks around the path.
_CITATION = re.compile(r"`{0,2}(docs/[\w./-]+\.md)`{0,2},\s*\"([^\"\n]+)\"")
# What the old design notes were called, and the folder beside the repository that held them.
_OUTSIDE = re.compile(
    r"\b(?:ARCHITECTURE|REFERENCE)(?:\.md)?\b"  # the notes themselves
    r"|\.\./shared\b|\bshared/(?:data|conformance)\b|\"shared\""  # the folder, as a path or built from parts
)

# Files that may still point outside the repository, and why.
OUTSIDE_ALLOWED = {
    # The round trip compares the copied fixtures with ../shared/conformance on purpose (skipped when absent).
    "tests/conformance/test_trees_roundtrip.py",
    "tests/conformance/_fixtures.py",
    # A byte-for-byte copy of the reference's fixture README, which the round trip compares with the original;
    # docs/reference.md, "Conformance fixtures" says what its pointer means here.
    "tests/fixtures/conformance/README.md",
    # This test names what it looks for.
    "tests/architecture/test_docs.py",
}
# Benchmark inputs still read from ../shared/data: no licence lets the repository carry them (data/README.md,
# "Benchmark inputs kept outside this folder"). File → the input it reads there.
UNBUNDLED = {
    "benchmarks/memory_pairs.py": "qqp_pairs.jsonl",
    "benchmarks/_memory_lookup.py": "qqp_pairs.jsonl",
    "benchmarks/_quality_streams.py": "headlines_test.csv",
}


def headings(doc: Path) -> list[str]:
    return [title for _, title in _HEADING.findall(doc.read_text(encoding="utf-8"))]


def section(doc: Path, title: str) -> str:
    """The text under the heading ``title``, its subsections included, up to the next heading of its level."""
    text = doc.read_text(encoding="utf-8")
    found = [match for match in _HEADING.finditer(text) if match.group(2) == title]
    assert found, f"{doc.relative_to(ROOT)} has no heading {title!r}"
    start, level = found[0].end(), len(found[0].group(1))
    following = (m.start() for m in _HEADING.finditer(text, start) if len(m.group(1)) <= level)
    return text[start : next(following, len(text))]


def named_modules(text: str) -> list[str]:
    """The backticked names in ``text`` that start with a project folder, in order of first mention."""
    names = [name.rstrip("/.,") for name in _BACKTICKED.findall(text)]
    wanted = [name for name in names if re.split(r"[/.]", name)[0] in PROJECT_FOLDERS]
    return list(dict.fromkeys(wanted))


def module_exists(name: str) -> bool:
    """A path (`gil_core/judge/`, `gil_core/resolver.py`) or a dotted name (`gil_core.judge`): a module or a
    package of the repository, nothing else."""
    if "/" in name:
        path = ROOT / name
        return (path.suffix == ".py" and path.is_file()) or (path / "__init__.py").is_file()
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def source_files(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for pattern in ("*.py", "*.md") for path in (ROOT / folder).rglob(pattern))


def test_the_request_path_names_only_modules_that_exist() -> None:
    modules = named_modules(section(DOCS / "architecture.md", REQUEST_PATH))
    assert len(modules) >= 20, modules  # the section is the request's way, not a summary
    missing = [name for name in modules if not module_exists(name)]
    assert missing == []
    # The spine of the way, in the order a request meets it.
    spine = ["flows/batch.py", "gil_core/runtime.py", "gil_core/batch.py", "gil_core/resolver.py"]
    spine += ["gil_core/memory/lancedb_memory.py", "gil_core/traverse.py", "gil_core/fallback/generator.py"]
    spine += ["gil_core/telemetry/store.py"]
    assert [name for name in modules if name in spine] == spine


def test_every_doc_citation_names_a_heading_of_that_doc() -> None:
    citations = [
        (path.relative_to(ROOT), doc, title)
        for path in source_files(*CITING)
        for doc, title in _CITATION.findall(path.read_text(encoding="utf-8"))
    ]
    cited_docs = {doc for _, doc, _ in citations}
    assert {"docs/architecture.md", "docs/reference.md"} <= cited_docs, citations
    wrong = [
        f'{path}: {doc}, "{title}"'
        for path, doc, title in citations
        if not (ROOT / doc).is_file() or title not in headings(ROOT / doc)
    ]
    assert wrong == []


def test_nothing_cites_the_notes_outside_the_repository() -> None:
    files = [*source_files(*PROJECT_FOLDERS, "docs"), ROOT / "README.md"]
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        if path.relative_to(ROOT).as_posix() not in OUTSIDE_ALLOWED | UNBUNDLED.keys()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _OUTSIDE.search(line)
    ]
    assert offenders == []


def test_benchmark_inputs_read_outside_are_the_unbundled_ones() -> None:
    """An input copied into data/ must be read from there: its exemption above lapses."""
    readme = (ROOT / "data" / "README.md").read_text(encoding="utf-8")
    for path, name in UNBUNDLED.items():
        assert name in (ROOT / path).read_text(encoding="utf-8"), f"{path} no longer reads {name}: drop it"
        assert not (ROOT / "data" / name).exists(), f"data/{name} is bundled now: point {path} at it"
        assert f"`{name}`" in readme, f"data/README.md does not say why {name} is not bundled"
