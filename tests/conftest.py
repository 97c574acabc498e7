"""Test-session wiring shared by every test folder."""

from __future__ import annotations

import os

import pytest

from tests.conformance._fixtures import COUNTS

# The rate limiter defaults to 5 requests/s per remote provider; the suite's scripted loopback servers are
# not rate-limited, so tests (and the `gil` subprocesses they start) run without it unless a test sets it.
# tests/client/test_limiter.py and tests/resolver/test_client_layers.py test the limiter itself.
os.environ.setdefault("GIL_REQUESTS_PER_SECOND", "0")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not COUNTS:
        return
    terminalreporter.section("conformance replay")
    for name, (passed, total, what) in sorted(COUNTS.items()):
        terminalreporter.write_line(f"{name}: {passed}/{total} {what}")
