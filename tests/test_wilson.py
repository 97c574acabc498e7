"""``gil_core.wilson``: the one Wilson score interval, scalar and as Polars expressions."""

from __future__ import annotations

import math

import polars as pl
import pytest

from gil_core.errors import ConfigurationError
from gil_core.wilson import WILSON_Z, wilson_interval, wilson_lower_bound, wilson_terms


def test_the_interval_of_3_in_10_is_the_textbook_one() -> None:
    low, high = wilson_interval(3, 10)
    assert (round(low, 4), round(high, 4)) == (0.1078, 0.6032)
    assert wilson_lower_bound(3, 10) == low


def test_the_ends_are_pinned_and_no_trials_knows_nothing() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 7)[0] == 0.0 and wilson_interval(7, 7)[1] == 1.0
    with pytest.raises(ConfigurationError):
        wilson_interval(3, 2)


def test_the_interval_is_symmetric_and_holds_the_rate() -> None:
    for n in range(1, 60):
        for k in range(n + 1):
            low, high = wilson_interval(k, n)
            assert 0.0 <= low <= k / n <= high <= 1.0
            assert math.isclose(1.0 - high, wilson_lower_bound(n - k, n), abs_tol=1e-12)


def test_the_terms_give_the_same_bounds_over_polars_columns() -> None:
    frame = pl.DataFrame({"k": [1, 3, 9], "n": [2, 10, 12]}, schema={"k": pl.Float64, "n": pl.Float64})
    centre, half, scale = wilson_terms(pl.col("k"), pl.col("n"), WILSON_Z, lambda e: e.sqrt())
    rows = frame.select(((centre - half) / scale).alias("low"), ((centre + half) / scale).alias("high")).rows()
    assert rows == [wilson_interval(k, n) for k, n in [(1, 2), (3, 10), (9, 12)]]
