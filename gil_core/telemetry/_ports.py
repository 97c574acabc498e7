"""What the readers of the log (``stats``, ``energy``) need of a store, as a port: ``TelemetryStore`` is one.

Kept below ``store``, which calls those readers: they take this protocol rather than import the store.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

import polars as pl

from gil_core.telemetry._quarantine import QuarantinedFile


class TableScanner(Protocol):
    """A lazy view of one of the store's tables (``TelemetryStore.scan``)."""

    def scan(self, table: str) -> pl.LazyFrame: ...


class StatsSource(TableScanner, Protocol):
    """A scanner that also reads a few keys' rows (``only``) and lists the files its quarantine holds
    (``TelemetryStore.quarantined``)."""

    def scan(self, table: str, *, only: Mapping[str, Collection[Any]] | None = None) -> pl.LazyFrame: ...

    def quarantined(self) -> Sequence[QuarantinedFile]: ...
