"""The design's boundaries, checked: gil_core never imports Prefect, and imports point down only."""

from __future__ import annotations

import subprocess
import sys

from tests.architecture._imports import ROOT, imported_modules, module_name, source_files

PACKAGE = ROOT / "gil_core"


def test_no_module_of_gil_core_imports_prefect() -> None:
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in source_files("gil_core")
        if any(name == "prefect" or name.startswith("prefect.") for name in imported_modules(path))
    ]
    assert offenders == []


def test_importing_all_of_gil_core_loads_no_prefect() -> None:
    """Also catches an import done indirectly or at call time in a module's top level."""
    modules = sorted(module_name(path) for path in source_files("gil_core"))
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules) + "print('prefect' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# Lower layers never import higher ones (docs/architecture.md, "Which way imports point").
LAYERS = {
    "gil_core.telemetry": {"gil_core.llm", "gil_core.judge", "gil_core.traverse", "gil_core.ontology"},
    "gil_core.ontology": {"gil_core.llm", "gil_core.judge", "gil_core.traverse"},
    "gil_core.llm": {"gil_core.judge", "gil_core.traverse", "gil_core.ontology"},
    "gil_core.judge": {"gil_core.traverse"},
}


def test_imports_point_down_only() -> None:
    offenders = []
    for path in source_files("gil_core"):
        module = module_name(path)
        for layer, forbidden in LAYERS.items():
            if module.startswith(layer):
                bad = {name for name in imported_modules(path) if name.startswith(tuple(forbidden))}
                offenders += [(module, name) for name in sorted(bad)]
    assert offenders == []
