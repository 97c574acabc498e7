"""Housekeeping a scheduler runs: fitting energy coefficients into the store, and compacting its tables."""

from __future__ import annotations

import json
from dataclasses import asdict

from gil_core.telemetry import EnergyModel, TelemetryStore, utc_now

__all__ = ["ENERGY_META_KEY", "compact_store", "fit_and_store_energy"]

ENERGY_META_KEY = "energy_model"


def fit_and_store_energy(store: TelemetryStore) -> EnergyModel | None:
    """Fit coefficients to the store's server timings and keep them in ``store_meta``; None when too few."""
    from gil_core.telemetry.energy import fit_energy_from_store

    model = fit_energy_from_store(store)
    if model is not None:
        store.append("store_meta", [{"key": ENERGY_META_KEY, "value": json.dumps(asdict(model))}])
        store.append("store_meta", [{"key": "energy_model_fitted_at", "value": utc_now().isoformat()}])
    return model


def compact_store(store: TelemetryStore) -> dict[str, int]:
    """Compact every table; returns how many files each one merged."""
    return {table: store.compact(table) for table in store.tables()}
