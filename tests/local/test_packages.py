"""Finding model files inside installed packages, and the error that says what to install."""

from __future__ import annotations

import pytest

from gil_core.errors import ConfigurationError
from gil_core.local import LocalModelMissingError
from gil_core.local._packages import package_file


def test_a_missing_package_names_itself_and_the_install_command() -> None:
    with pytest.raises(
        LocalModelMissingError, match=r"'no-such-model' is not installed.*uv sync --extra local"
    ) as caught:
        package_file("gil_no_such_model_package", "model.bin", distribution="no-such-model")
    assert caught.value.distribution == "no-such-model"
    assert isinstance(caught.value, ConfigurationError)


def test_a_package_without_the_file_says_which_file_is_missing() -> None:
    with pytest.raises(LocalModelMissingError, match=r"'pytest' is installed but has no 'weights\.gguf'"):
        package_file("_pytest", "weights.gguf", distribution="pytest")


def test_a_file_inside_a_package_is_found_without_importing_the_package() -> None:
    path = package_file("gil_core", "py.typed", distribution="gil-core")
    assert path.name == "py.typed" and path.is_file()
