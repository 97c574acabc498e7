"""One error contract (gil_core.errors, module doc): outside ``gil_core.testing`` every error ``gil_core`` raises
itself is a ``GilError``; a built-in exception is raised only where Python's conventions want it, each listed
below with the reason it is allowed."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

from gil_core.errors import ConfigurationError, GilError, InvalidArgumentError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gil_core"

# (file, exception): why it may be raised there.
ALLOWED = {
    ("gil_core/_lazy.py", "AttributeError"): "a module's __getattr__ for a name it does not have",
    ("gil_core/learned/memory_cut.py", "ValueError"): "internal: reading a stored state turns it into a refit "
    "(gil_core.learned.state)",
    ("gil_core/memory/lexical_memory.py", "ValueError"): "internal: _io_errors turns it into MemoryUnavailableError",
    ("gil_core/batch.py", "KeyError"): "a mapping's lookup (BatchResults[ticket_id])",
    ("gil_core/_record_files.py", "StopIteration"): "the iterator protocol: _BoundedLines.__next__, the lines "
    "csv.reader reads (a generator that raised would end the file at its first bad record)",
    ("gil_core/client/oplog/_base.py", "NotImplementedError"): "abstract methods every adapter overrides",
    ("gil_core/llm/openai_compat.py", "AssertionError"): "unreachable: tenacity returns or reraises",
    ("gil_core/storage.py", "ValueError"): "inside a pydantic validator: load_s3_settings turns it into a "
    "ConfigurationError",
    ("gil_core/telemetry/_quarantine.py", "ValueError"): "internal: the store's restore catches it",
}


def raised_builtins(source: str) -> set[str]:
    """The names of built-in exception classes that ``raise`` statements in ``source`` raise (bare or called)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(target, ast.Name):
            candidate = getattr(builtins, target.id, None)
            if isinstance(candidate, type) and issubclass(candidate, BaseException):
                names.add(target.id)
    return names


def test_only_gil_errors_leave_gil_core_apart_from_the_listed_conventions() -> None:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("gil_core/testing/"):
            continue  # fakes for tests: they raise what the real things' callers would see
        found |= {(relative, name) for name in raised_builtins(path.read_text(encoding="utf-8"))}
    unexpected = sorted(found - ALLOWED.keys())
    assert not unexpected, f"built-in exceptions raised in gil_core (raise a GilError subclass): {unexpected}"
    stale = sorted(ALLOWED.keys() - found)
    assert not stale, f"listed but no longer raised (drop them from ALLOWED): {stale}"


def test_the_scan_sees_bare_and_called_raises_and_leaves_gil_errors_alone() -> None:
    source = (
        "def f():\n    raise ValueError('x')\n"
        "def g():\n    raise KeyError\n"
        "def h():\n    raise InvalidArgumentError('fine')\n"
        "def i(exc):\n    raise exc\n"
    )
    assert raised_builtins(source) == {"ValueError", "KeyError"}


def test_an_impossible_argument_is_both_a_gil_error_and_a_value_error() -> None:
    from gil_core.memory._rules import check_k

    with pytest.raises(InvalidArgumentError, match="k must be at least 0") as caught:
        check_k(-1)
    assert isinstance(caught.value, GilError)
    assert isinstance(caught.value, ConfigurationError)
    assert isinstance(caught.value, ValueError)
