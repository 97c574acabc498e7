"""The public names of gil_core.telemetry, pinned: removing or renaming one is an API change."""

from __future__ import annotations

import gil_core.telemetry


def test_exported_members() -> None:
    assert sorted(gil_core.telemetry.__all__) == sorted(
        [
            "COLUMNS",
            "KEYS",
            "TABLES",
            "CallRecord",
            "CallRole",
            "CallSink",
            "CandidateShown",
            "EnergyModel",
            "TelemetryStore",
            "TraceRecord",
            "TraceSink",
            "utc_now",
            "validate_frame",
        ]
    )
    for name in gil_core.telemetry.__all__:
        assert getattr(gil_core.telemetry, name) is not None
