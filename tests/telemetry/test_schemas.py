"""The telemetry tables' contract: exact column sets, and validation that always agrees with pandera."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pandera.errors import SchemaError, SchemaErrors

from gil_core.errors import SchemaViolationError
from gil_core.telemetry import COLUMNS, COUNTERS, KEYS, TABLES, validate_frame
from gil_core.telemetry.schemas import JSON_COLUMNS, _plan


def test_every_table_has_exactly_the_reference_columns_in_order() -> None:
    """Columns may be added at the end, never renamed: any change here is a contract change."""
    assert dict(COLUMNS) == {
        "traces": (
            "trace_id", "created_at", "task", "state", "mode", "path", "output", "confidence", "energy",
            "feedback_verdict", "feedback_correction", "implicit_signal", "label", "explored_output",
            "recall", "failure",
            "decider", "batch_id", "flow_run_id", "answer_version",  # Gil's own (GIL_COLUMNS), after the reference's
        ),
        "calls": (
            "call_id", "trace_id", "created_at", "role", "model", "node_id", "layer", "prompt_tokens",
            "cached_tokens", "completion_tokens", "latency_ms", "gpu_prompt_ms", "gpu_predicted_ms",
            "content", "first_token", "top_logprobs", "distribution", "label_mass", "confidence", "outcome",
            "energy", "raw_response", "candidates",
        ),
        "run_configs": ("task", "created_at", "config"),
        "node_stats": ("scope", "node_id", "hits", "accepts", "exits", "last_used_at"),
        "node_choices": ("scope", "node_id", "chosen_id", "accepts"),
        "habit_reliability": (
            "scope", "item_id", "reinforced", "penalized", "missed", "explored", "disputed",
        ),
        "store_meta": ("key", "value"),
        "promotion_rounds": ("task", "at_index"),
        "promotions": (
            "task", "at_index", "anchor", "option_id", "option", "sources", "support", "anchor_volume",
            "expected_saving", "added_cost",
        ),
        "reviews": ("task", "reviewed_at", "kind", "item_id", "decision", "note"),
        "vectors": ("trace_id", "task", "created_at", "model", "dimensions", "vector"),  # Gil's own table
        "unlearned_verdicts": ("trace_id", "task", "at", "learned", "reason"),  # Gil's own table
    }  # fmt: skip


def test_keys_and_json_columns_name_real_columns() -> None:
    for table, key in KEYS.items():
        assert set(key) <= set(COLUMNS[table])
    for table, columns in JSON_COLUMNS.items():
        assert set(columns) <= set(COLUMNS[table])
    assert set(KEYS) == set(TABLES) - {"reviews"} - set(COUNTERS)


def test_timestamps_are_utc_microseconds() -> None:
    for model in TABLES.values():
        for column in model.to_schema().columns.values():
            if isinstance(column.dtype.type, pl.Datetime):
                assert column.dtype.type == pl.Datetime("us", "UTC")


# Values chosen at the checks' edges: nulls, NaN, negatives, probabilities just above 1, JSON and non-JSON.
_POOLS: dict[type[pl.DataType], list[object]] = {
    pl.String: [None, "judge", "oracle", "correct", "wrong", "[]", '{"a":1}', "{broken", "x"],
    pl.Float64: [None, math.nan, -1.0, -0.0, 0.0, 0.5, 1.0, 1.0 + 1e-12, 1.5, math.inf],
    pl.Int64: [None, -1, 0, 1, 7],
    pl.Datetime: [None, datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)],
}


def _valid_value(table: str, name: str, dtype: pl.DataType) -> object:
    if name in JSON_COLUMNS.get(table, ()):
        return "[]"
    if name == "role":
        return "judge"
    if name == "feedback_verdict":
        return "correct"
    return _POOLS[dtype.base_type()][-2]  # a plain valid value of the dtype


def _frames(table: str) -> st.SearchStrategy[pl.DataFrame]:
    """Valid rows with zero to two columns set to edge values, so both verdicts occur often."""
    dtypes = _plan(table).dtypes
    valid = {name: _valid_value(table, name, dtype) for name, dtype in dtypes.items()}
    edit = st.sampled_from(list(dtypes)).flatmap(
        lambda name: st.tuples(st.just(name), st.sampled_from(_POOLS[dtypes[name].base_type()]))
    )
    row = st.lists(edit, max_size=2).map(lambda changes: {**valid, **dict(changes)})

    def build(rows: list[dict[str, object]]) -> pl.DataFrame:
        return pl.DataFrame([pl.Series(name, [row[name] for row in rows], dtype=dtypes[name]) for name in dtypes])

    return st.lists(row, min_size=1, max_size=3).map(build)


@pytest.mark.parametrize("table", ["traces", "calls", "promotions"])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_fast_validation_agrees_with_pandera(table: str, data: st.DataObject) -> None:
    """The one-select fast path accepts exactly what the pandera model accepts (else pandera decides)."""
    frame = data.draw(_frames(table))
    try:
        TABLES[table].to_schema().validate(frame, lazy=True)
        pandera_accepts = True
    except (SchemaError, SchemaErrors):
        pandera_accepts = False
    assert _plan(table).quick_pass(frame) == pandera_accepts


def test_validate_frame_names_the_table_and_the_failing_check() -> None:
    frame = pl.DataFrame({"key": ["restricted"], "value": [None]}, schema=_plan("store_meta").dtypes)
    with pytest.raises(SchemaViolationError) as caught:
        validate_frame("store_meta", frame)
    assert caught.value.table == "store_meta"
    assert "'value'" in str(caught.value)


def test_a_valid_row_passes_without_asking_pandera() -> None:
    """Keeps the fast path honest: a plain valid call row must not fall back to full pandera validation."""
    frame = pl.DataFrame(
        {
            "call_id": ["c"], "trace_id": [None], "created_at": [datetime.now(UTC)], "role": ["judge"],
            "model": ["m"], "node_id": [None], "layer": [1], "prompt_tokens": [3], "cached_tokens": [0],
            "completion_tokens": [1], "latency_ms": [2.5], "gpu_prompt_ms": [None],
            "gpu_predicted_ms": [None],
            "content": ["A"], "first_token": ["A"], "top_logprobs": ["[]"], "distribution": [None],
            "label_mass": [1.0], "confidence": [1.0], "outcome": ["accept"], "energy": [4.0],
            "raw_response": [None], "candidates": ["[]"],
        },
        schema=_plan("calls").dtypes,
    )  # fmt: skip
    assert _plan("calls").quick_pass(frame)
    validate_frame("calls", frame)


def test_an_unknown_table_is_a_schema_violation() -> None:
    with pytest.raises(SchemaViolationError) as caught:
        validate_frame("oracles", pl.DataFrame())
    assert caught.value.table == "oracles"
