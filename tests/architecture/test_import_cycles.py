"""No import circles in gil_core, flows or benchmarks, type-only and lazy imports included.

The graph's nodes are modules: a file, and a package counted once (its `__init__.py`). Its edges are every import
that tests/architecture/_imports.py finds: module-level ones, those under `if TYPE_CHECKING:` and those inside
functions (lazy imports count too: a lazy import only hides a circle from the interpreter, not from the reader). A
type that two modules need lives below both, or behind a port (a Protocol), instead.

Importing `a.b.c` also runs the `__init__` of `a` and `a.b`; that is not an edge here (a package's modules would
otherwise all form a circle with an `__init__` that re-exports them), but `from a.b import name` is an edge to
`a.b` whenever `name` is not a submodule.

The failure names every circle: each strongly connected component of more than one module, or a module importing
itself, with the imports that close it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tests.architecture._imports import SCANNED, imported_modules, imports_in, module_name, source_files


def import_graph() -> dict[str, set[str]]:
    files = {module_name(path): path for path in source_files(*SCANNED)}
    return {module: imported_modules(path) & files.keys() for module, path in files.items()}


def test_every_kind_of_import_is_an_edge() -> None:
    source = """
from typing import TYPE_CHECKING

import gil_core.errors
from gil_core.telemetry import TelemetryStore, records
from . import _clock
from .._lazy import lazy

if TYPE_CHECKING:
    from gil_core.telemetry.energy import EnergyModel


def later() -> None:
    from benchmarks import quality
"""
    assert imports_in(source, "gil_core.telemetry.stats") == {
        "typing",
        "gil_core.errors",
        "gil_core.telemetry",  # TelemetryStore is a name, not a submodule: the package's __init__
        "gil_core.telemetry.records",
        "gil_core.telemetry._clock",
        "gil_core._lazy",
        "gil_core.telemetry.energy",
        "benchmarks.quality",
    }
    assert imports_in("from . import store", "gil_core.telemetry", is_package=True) == {"gil_core.telemetry.store"}


def strongly_connected_components(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit to meet): the graph's components, each sorted."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = lowlink[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = lowlink[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    lowlink[node] = min(lowlink[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    lowlink[parent] = min(lowlink[parent], lowlink[node])
                if lowlink[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The components that are circles: more than one module, or one that imports itself."""
    return sorted(c for c in strongly_connected_components(graph) if len(c) > 1 or c[0] in graph[c[0]])


def describe(graph: Mapping[str, Iterable[str]], circle: list[str]) -> str:
    members = set(circle)
    edges = [f"{a} -> {b}" for a in circle for b in sorted(graph[a]) if b in members]
    return "circle of " + ", ".join(circle) + ":\n    " + "\n    ".join(edges)


def test_the_component_finder_finds_every_circle() -> None:
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},
        "d": {"e"},
        "e": {"d"},
        "f": {"f"},
        "g": {"a"},
        "h": set(),
    }
    assert circles(graph) == [["a", "b", "c"], ["d", "e"], ["f"]]


def test_no_import_circles() -> None:
    graph = import_graph()
    found = circles(graph)
    assert found == [], "\n".join(describe(graph, circle) for circle in found)
