"""Package names loaded on first use (PEP 562), so importing a light part of a package does not import its
heavy parts: ``gil lint-tree`` and a refused task file start without httpx, Polars or the telemetry store."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_names(package: str, homes: Mapping[str, tuple[str, ...]], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports each name from its home module (``homes`` maps a
    module to the names it defines) the first time it is asked for, and keeps it in ``namespace``."""
    home_of = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = home_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
