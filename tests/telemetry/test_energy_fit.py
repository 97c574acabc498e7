"""EnergyModel.fit: coefficients from server timings, non-negative, a term only where the samples exercise it,
robust to gross outliers, and None when the samples cannot determine the terms."""

from __future__ import annotations

from dataclasses import astuple
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gil_core.errors import ConfigurationError
from gil_core.telemetry import CallRecord, EnergyModel, TelemetryStore
from gil_core.telemetry.energy import fit_energy_from_store

TRUE = EnergyModel(fixed=40.0, per_fresh_prompt_token=0.4, per_cached_token=0.04, per_output_token=6.0)


def synthetic(count: int, seed: int, *, outliers: float = 0.0, noise: float = 0.0) -> pl.DataFrame:
    """Judge and generation calls priced by ``TRUE`` in milliseconds, split into prompt and predicted time."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(20, 1500, count)
    cached = (prompt * rng.uniform(0.0, 0.9, count)).astype(np.int64)
    completion = rng.integers(1, 200, count)
    milliseconds = np.array([TRUE.price(p, c, o) for p, c, o in zip(prompt, cached, completion, strict=True)])
    milliseconds += rng.normal(0.0, noise, count)
    spoiled = rng.choice(count, int(outliers * count), replace=False)
    milliseconds[spoiled] *= rng.uniform(3.0, 20.0, len(spoiled))  # a stalled GPU, a cold cache
    return pl.DataFrame(
        {
            "role": "judge",
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "completion_tokens": completion,
            "gpu_prompt_ms": milliseconds * 0.7,
            "gpu_predicted_ms": milliseconds * 0.3,
        }
    )


def relative_errors(fitted: EnergyModel | None) -> list[float]:
    assert fitted is not None
    return [abs(got / want - 1.0) for got, want in zip(astuple(fitted), astuple(TRUE), strict=True)]


def test_clean_samples_give_back_the_coefficients_within_two_percent() -> None:
    assert max(relative_errors(EnergyModel.fit(synthetic(300, seed=1, noise=1.0)))) < 0.02


@pytest.mark.parametrize("seed", range(5))
def test_five_percent_gross_outliers_move_no_coefficient_more_than_ten_percent(seed: int) -> None:
    assert max(relative_errors(EnergyModel.fit(synthetic(500, seed=seed, outliers=0.05, noise=2.0)))) < 0.10


def test_rows_and_call_records_fit_like_a_frame() -> None:
    frame = synthetic(50, seed=2)
    rows = frame.to_dicts()
    records = [
        CallRecord(call_id=str(i), trace_id=None, created_at=datetime.now(UTC), model="m", **row)
        for i, row in enumerate(rows)
    ]
    expected = EnergyModel.fit(frame)
    assert EnergyModel.fit(rows) == expected
    assert EnergyModel.fit(records) == expected


def test_embeddings_and_calls_without_server_timings_are_left_out() -> None:
    frame = synthetic(40, seed=3)
    noise = frame.head(10).with_columns(gpu_prompt_ms=pl.lit(1e6))
    untimed = frame.head(10).with_columns(gpu_predicted_ms=pl.lit(None, dtype=pl.Float64))
    mixed = pl.concat([frame, noise.with_columns(role=pl.lit("embed")), untimed])
    assert EnergyModel.fit(mixed) == EnergyModel.fit(frame)


def test_a_term_the_samples_do_not_exercise_is_zero_and_fixed_absorbs_a_constant() -> None:
    # one-token judgments, nothing cached: only fixed and fresh prompt tokens can be told apart
    rows = [
        {"prompt_tokens": p, "cached_tokens": 0, "completion_tokens": 1, "gpu_prompt_ms": 5.0 + 0.5 * p,
         "gpu_predicted_ms": 2.0}
        for p in (100, 200, 300, 400)
    ]  # fmt: skip
    fitted = EnergyModel.fit(rows)
    assert fitted is not None
    assert fitted.per_cached_token == 0.0 and fitted.per_output_token == 0.0
    assert fitted.fixed == pytest.approx(7.0) and fitted.per_fresh_prompt_token == pytest.approx(0.5)


def test_fewer_samples_than_terms_give_none() -> None:
    assert EnergyModel.fit(synthetic(3, seed=4)) is None  # four terms vary
    assert EnergyModel.fit([]) is None


def test_collinear_terms_give_none() -> None:
    rows = [
        {"prompt_tokens": 10 * n, "cached_tokens": 0, "completion_tokens": n, "gpu_prompt_ms": 3.0 * n,
         "gpu_predicted_ms": 1.0}
        for n in range(1, 9)
    ]  # fmt: skip
    assert EnergyModel.fit(rows) is None


def test_a_frame_without_the_token_and_timing_columns_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="gpu_predicted_ms"):
        EnergyModel.fit(synthetic(10, seed=6).drop("gpu_predicted_ms"))


def test_a_fit_from_the_store_reads_its_calls(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path)
    frame = synthetic(30, seed=5)
    store.record_calls(
        [
            CallRecord(call_id=str(i), trace_id=None, created_at=datetime.now(UTC), model="m", **row)
            for i, row in enumerate(frame.to_dicts())
        ]
    )
    assert fit_energy_from_store(store) == EnergyModel.fit(frame)
    assert fit_energy_from_store(TelemetryStore(tmp_path / "empty")) is None


sample = st.fixed_dictionaries(
    {
        "prompt_tokens": st.integers(0, 5000),
        "cached_tokens": st.integers(0, 5000),
        "completion_tokens": st.integers(0, 500),
        "gpu_prompt_ms": st.floats(0, 1e5),
        "gpu_predicted_ms": st.floats(0, 1e5),
    }
)


@settings(max_examples=75, deadline=None)
@given(samples=st.lists(sample, max_size=30))
def test_no_fitted_coefficient_is_ever_negative(samples: list[dict[str, Any]]) -> None:
    fitted = EnergyModel.fit(samples)
    if fitted is not None:
        assert min(astuple(fitted)) >= 0.0
