"""Where the replay reads the reference's fixtures, and the counts it reports at the end of the run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "conformance"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "conformance"

# name → (passed, total, what); printed by tests/conftest.py after the run.
COUNTS: dict[str, tuple[int, int, str]] = {}


def fixture_path(name: str, env: str | None = None) -> Path:
    """The fixture file ``name``; ``env`` names a variable that may point the replay at another recording."""
    override = os.environ.get(env) if env else None
    return Path(override) if override else FIXTURES / name


def is_overridden(env: str) -> bool:
    """True when the replay was pointed at another recording, whose case count we cannot know."""
    return bool(os.environ.get(env))


def load_json(name: str, env: str | None = None) -> Any:
    return json.loads(fixture_path(name, env).read_text(encoding="utf-8"))


def report(name: str, passed: int, total: int, what: str) -> None:
    COUNTS[name] = (passed, total, what)
