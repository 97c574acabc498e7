"""Fixtures of the memory tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.memory._support import Peer


@pytest.fixture(scope="session")
def peer() -> Iterator[Peer]:
    """Another process on the memories the test names (see ``tests.memory._remote``), kept for the session."""
    process = Peer()
    yield process
    process.close()
