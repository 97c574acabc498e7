"""Test-session wiring shared by every test folder."""

from __future__ import annotations

import pytest

from tests.conformance._fixtures import COUNTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not COUNTS:
        return
    terminalreporter.section("conformance replay")
    for name, (passed, total, what) in sorted(COUNTS.items()):
        terminalreporter.write_line(f"{name}: {passed}/{total} {what}")
