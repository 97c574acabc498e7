"""Every third-party module that gil_core, flows or benchmarks imports comes from a distribution pyproject.toml
declares: in `dependencies`, an extra (`optional-dependencies`) or a dependency group.

Imports are those of tests/architecture/_imports.py (every import statement, lazy and `TYPE_CHECKING` ones
included), read by their top-level name; the standard library (`sys.stdlib_module_names`) and our own packages
are left out. A module is mapped to its distributions by `importlib.metadata.packages_distributions()`; one that
is not installed here (an extra not synced) is taken to come from the distribution of its own name, and fails if
there is none declared. A transitive dependency does not count: what we import, we declare.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from typing import Any

from tests.architecture._imports import FIRST_PARTY, ROOT, SCANNED, imported_modules, source_files

# Imported only when importable, and deliberately declared nowhere: module -> why.
UNDECLARED: dict[str, str] = {}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(entries: list[Any]) -> Iterator[str]:
    """The distribution names of requirement strings (a group's `{include-group = ...}` tables skipped)."""
    for entry in entries:
        if isinstance(entry, str):
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", entry)
            assert match, f"unreadable requirement {entry!r}"
            yield normalized(match.group(1))


def declared_distributions() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    lists = [
        pyproject["project"].get("dependencies", []),
        *pyproject["project"].get("optional-dependencies", {}).values(),
        *pyproject.get("dependency-groups", {}).values(),
    ]
    return {name for entries in lists for name in requirement_names(entries)}


def third_party_imports() -> dict[str, set[str]]:
    """Top-level module -> the files (relative to the repository) that import it."""
    found: dict[str, set[str]] = {}
    for path in source_files(*SCANNED):
        for name in imported_modules(path):
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                found.setdefault(top, set()).add(path.relative_to(ROOT).as_posix())
    return found


def test_requirement_names_are_read_with_extras_markers_and_pins() -> None:
    entries = ["pandera[polars]>=0.30", "llama-cpp-python[server]==0.3.36", "types-PyYAML", "a.b; python_version<'4'"]
    assert list(requirement_names([*entries, {"include-group": "dev"}])) == [
        "pandera",
        "llama-cpp-python",
        "types-pyyaml",
        "a-b",
    ]


def test_every_third_party_import_is_declared() -> None:
    declared = declared_distributions()
    installed = packages_distributions()
    undeclared = []
    for module, importers in sorted(third_party_imports().items()):
        if module in UNDECLARED:
            continue
        distributions = {normalized(name) for name in installed.get(module, [module])}
        if not distributions & declared:
            undeclared.append(f"{module} (from {', '.join(sorted(distributions))}), imported by {sorted(importers)}")
    assert undeclared == [], "declare these in pyproject.toml:\n" + "\n".join(undeclared)


def test_every_undeclared_exception_is_still_imported() -> None:
    stale = sorted(UNDECLARED.keys() - third_party_imports().keys())
    assert stale == [], "remove these from UNDECLARED"
