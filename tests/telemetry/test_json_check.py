"""The JSON-column check of validation: exactly what ``json.loads`` accepts, whichever way it gets there."""

from __future__ import annotations

import json

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gil_core.errors import SchemaViolationError
from gil_core.telemetry import validate_frame
from gil_core.telemetry.schemas import _all_json, _is_json, _plan

# Pieces of JSON and of near-JSON: a random string of them is valid now and then, and invalid in many ways.
_PIECES = [
    "{", "}", "[", "]", ",", ":", '"a"', '"é"', "1", "-2.5e3", "01", ".5", "true", "null", "NaN", "Infinity",
    " ", "\n", "\t", "\ufeff", '"', "\\", '"\\ud800"', '"\\u0041"', "\x01", "x",
]  # fmt: skip


def loads_accepts(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=8).map("".join))
def test_the_check_accepts_exactly_what_json_loads_accepts(text: str) -> None:
    assert _is_json(text) == loads_accepts(text)


@given(
    st.recursive(
        st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=8,
    )
)
def test_whatever_the_store_serialises_passes(value: object) -> None:
    assert _is_json(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


@pytest.mark.parametrize("height", [3, 500])
def test_one_bad_value_among_repeated_good_ones_is_found(height: int) -> None:
    """A long column is checked by its distinct values: the one bad value still fails it, wherever it is."""
    values = ['[{"node":"root"}]'] * height
    values[height // 2] = '[{"node":"root"}'
    assert not _all_json(pl.Series("path", values))
    assert _all_json(pl.Series("path", ['[{"node":"root"}]'] * height + [None]))


def test_a_long_frame_with_one_bad_json_value_is_rejected_naming_the_column() -> None:
    dtypes = _plan("run_configs").dtypes
    frame = pl.DataFrame(
        {"task": [f"t{i}" for i in range(200)], "created_at": [None] * 200, "config": ["{}"] * 199 + ["{"]},
        schema=dtypes,
    ).with_columns(pl.lit("2026-01-01T00:00:00").str.to_datetime(time_zone="UTC").alias("created_at"))
    with pytest.raises(SchemaViolationError, match="config"):
        validate_frame("run_configs", frame)
