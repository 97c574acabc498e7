"""Telemetry: what Gil records about every request and model call, and where (Parquet tables, one per folder).

``records`` holds the value objects and sink ports callers use; ``schemas`` declares the tables (pandera);
``store`` is the Parquet-backed sink; ``energy`` prices a call.
"""

from gil_core.telemetry.energy import EnergyModel, fit_energy_from_store
from gil_core.telemetry.records import (
    CallRecord,
    CallRole,
    CallSink,
    CandidateShown,
    TraceRecord,
    TraceSink,
    utc_now,
)
from gil_core.telemetry.schemas import COLUMNS, COUNTERS, KEYS, TABLES, validate_frame
from gil_core.telemetry.sqlite import (
    TIMESTAMP_FORMAT,
    ExportReport,
    ExportRestrictedError,
    ImportReport,
    SqliteLayoutError,
    export_sqlite,
    import_sqlite,
)
from gil_core.telemetry.stats import (
    CostWindow,
    DeciderStats,
    MemoryRefusal,
    ModeStats,
    Stats,
    compute_stats,
    wilson_bounds,
)
from gil_core.telemetry.store import TelemetryStore

__all__ = [
    "COLUMNS",
    "COUNTERS",
    "KEYS",
    "TABLES",
    "TIMESTAMP_FORMAT",
    "CallRecord",
    "CallRole",
    "CallSink",
    "CandidateShown",
    "CostWindow",
    "DeciderStats",
    "EnergyModel",
    "ExportReport",
    "ExportRestrictedError",
    "ImportReport",
    "MemoryRefusal",
    "ModeStats",
    "SqliteLayoutError",
    "Stats",
    "TelemetryStore",
    "TraceRecord",
    "TraceSink",
    "compute_stats",
    "export_sqlite",
    "fit_energy_from_store",
    "import_sqlite",
    "utc_now",
    "validate_frame",
    "wilson_bounds",
]
