"""One scanner of the project's imports, shared by the architecture tests: which modules a source file imports.

Every import statement in the file counts, wherever it stands: at module level, under `if TYPE_CHECKING:`, in a
`try`, or inside a function (a lazy import). Relative imports are resolved against the file's own package, and
`from package import name` counts as the submodule `package.name` where that is one of our modules, else as
`package` (whose `__init__` the import runs).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import gil_core

ROOT = Path(gil_core.__file__).resolve().parent.parent
FIRST_PARTY = ("gil_core", "flows", "benchmarks", "tests")
# The packages whose modules the import-graph tests scan.
SCANNED = ("gil_core", "flows", "benchmarks")


def module_name(path: Path) -> str:
    """`gil_core/telemetry/store.py` is `gil_core.telemetry.store`; a package's `__init__.py` is the package."""
    parts = path.resolve().relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files(*packages: str) -> list[Path]:
    return sorted(path for package in packages for path in (ROOT / package).rglob("*.py"))


@cache
def is_first_party_module(name: str) -> bool:
    """Whether `name` is a module or package of this repository (a file or a folder under ROOT)."""
    if name.split(".")[0] not in FIRST_PARTY:
        return False
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _target(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module that `from ... import ...` reads from."""
    if node.level == 0:
        return node.module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported_modules(path: Path) -> set[str]:
    """Every module that the file at `path` imports (see the module's docstring for what counts)."""
    return imports_in(path.read_text(encoding="utf-8"), module_name(path), is_package=path.name == "__init__.py")


def imports_in(source: str, importer: str, *, is_package: bool = False) -> set[str]:
    """Every module that `source`, the text of module `importer`, imports: absolute dotted names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _target(node, importer, is_package)
            submodules = {f"{module}.{alias.name}" for alias in node.names}
            found = {name for name in submodules if is_first_party_module(name)}
            names.update(found)
            if len(found) < len(node.names):  # some imported name is an attribute of `module`, not a submodule
                names.add(module)
    names.discard("")
    return names
