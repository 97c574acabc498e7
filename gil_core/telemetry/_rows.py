"""Records and rows become frames of a table's exact dtypes: what the store writes, before it is validated.

``trace_row``/``call_row`` turn the sink's records into rows (JSON columns as compact text). ``conform`` builds
the frame a table stores from rows or a DataFrame (lossless fixes only), raising ``SchemaViolationError`` for
unknown columns and values of the wrong type. ``conformable`` is the cheap check a commit group runs on each
append before it queues raw rows: when it says yes, ``conform`` of those rows cannot fail.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from json import encoder as _json_encoder
from typing import Any

import polars as pl

from gil_core.errors import SchemaViolationError
from gil_core.telemetry.records import CallRecord, CandidateShown, TraceRecord
from gil_core.telemetry.schemas import DTYPES, NULLABLE

__all__ = ["call_row", "conform", "conformable", "trace_row"]


# One encoder for every value: json.dumps with options builds a new encoder per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_C_ENCODER = getattr(_json_encoder, "c_make_encoder", None)


class _Encoders(threading.local):
    """``_ENCODER``'s C encoding function, made once per thread instead of once per value (as ``encode`` does:
    a third of a small value's cost), with the circular-reference markers it owns."""

    def __init__(self) -> None:
        self.markers: dict[int, Any] = {}
        self.encode = _c_encoder(self.markers)


def _c_encoder(markers: dict[int, Any]) -> Any:
    """What ``JSONEncoder.iterencode`` builds for ``_ENCODER`` (None without the C accelerator)."""
    if _C_ENCODER is None:
        return None
    base = _ENCODER
    return _C_ENCODER(
        markers,
        base.default,
        _json_encoder.encode_basestring,  # ensure_ascii=False
        base.indent,
        base.key_separator,
        base.item_separator,
        base.sort_keys,
        base.skipkeys,
        base.allow_nan,
    )


_ENCODERS = _Encoders()


def _to_json(value: Any, table: str, column: str) -> str:
    """``_ENCODER.encode(value)``, the same text."""
    encoders = _ENCODERS
    try:
        if encoders.encode is None or isinstance(value, str):
            return _ENCODER.encode(value)
        return "".join(encoders.encode(value, 0))
    except (TypeError, ValueError) as exc:
        encoders.markers.clear()  # an encoding cut short leaves its markers behind
        raise SchemaViolationError(f"column {column!r} cannot be written as JSON: {exc}", table=table) from exc


def trace_row(trace: TraceRecord) -> dict[str, Any]:
    recall = None
    if trace.recall is not None:
        recall = _to_json({k: v for k, v in trace.recall.items() if v is not None}, "traces", "recall")
    row: dict[str, Any] = {
        "trace_id": trace.trace_id,
        "created_at": trace.created_at,
        "task": trace.task,
        "state": trace.state,
        "mode": trace.mode,
        "path": _to_json([dict(step) for step in trace.path], "traces", "path"),
        "output": trace.output,
        "confidence": trace.confidence,
        "energy": trace.energy,
        "feedback_verdict": trace.feedback_verdict,
        "feedback_correction": trace.feedback_correction,
        "implicit_signal": trace.implicit_signal,
        "label": trace.label,
        "explored_output": trace.explored_output,
        "recall": recall,
        "failure": trace.failure,
    }
    # ``extra`` carries columns added after the reference's; it may not overwrite one
    clashes = sorted(set(trace.extra) & set(row))
    if clashes:
        raise SchemaViolationError(f"TraceRecord.extra repeats columns {clashes}", table="traces")
    row.update(trace.extra)
    return row


def call_row(call: CallRecord) -> dict[str, Any]:
    distribution = None
    if call.distribution is not None:
        distribution = _to_json(dict(call.distribution), "calls", "distribution")
    top_logprobs = [{"token": token, "logprob": logprob} for token, logprob in call.top_logprobs]
    return {
        "call_id": call.call_id,
        "trace_id": call.trace_id,
        "created_at": call.created_at,
        "role": call.role,
        "model": call.model,
        "node_id": call.node_id,
        "layer": call.layer,
        "prompt_tokens": call.prompt_tokens,
        "cached_tokens": call.cached_tokens,
        "completion_tokens": call.completion_tokens,
        "latency_ms": call.latency_ms,
        "gpu_prompt_ms": call.gpu_prompt_ms,
        "gpu_predicted_ms": call.gpu_predicted_ms,
        "content": call.content,
        "first_token": call.first_token,
        "top_logprobs": _to_json(top_logprobs, "calls", "top_logprobs"),
        "distribution": distribution,
        "label_mass": call.label_mass,
        "confidence": call.confidence,
        "outcome": call.outcome,
        "energy": call.energy,
        "raw_response": call.raw_response,
        "candidates": _candidates_json(call.candidates),
    }


def _candidates_json(candidates: Sequence[CandidateShown]) -> str:
    """The ``candidates`` column: a node shows the same candidates to every request, so a tuple of them (frozen
    values) is written once and its text kept."""
    if isinstance(candidates, tuple):
        try:
            return _shown_json(candidates)
        except TypeError:  # a field that does not hash: written the long way
            pass
    return _to_json([_shown(item) for item in candidates], "calls", "candidates")


@lru_cache(maxsize=4096)
def _shown_json(candidates: tuple[CandidateShown, ...]) -> str:
    return _to_json([_shown(item) for item in candidates], "calls", "candidates")


def _shown(shown: CandidateShown) -> dict[str, Any]:
    return {
        "id": shown.id,
        "shown_as": shown.shown_as,
        "label": shown.label,
        "description": shown.description,
        "answer": shown.answer,
    }


# -- rows → a frame with the table's exact dtypes -----------------------------------------------------------


def conform(table: str, rows: Sequence[Mapping[str, Any]] | pl.DataFrame) -> pl.DataFrame:
    """Build a frame in the table's column order and dtypes; missing nullable columns become null."""
    dtypes = DTYPES[table]
    if isinstance(rows, pl.DataFrame):
        given: Collection[str] = rows.columns
    else:
        given = set().union(*rows)  # every row's names, in C: a group's flush conforms thousands of rows
    unknown = sorted(name for name in given if name not in dtypes)
    if unknown:
        raise SchemaViolationError(f"unknown columns {unknown}; columns are {list(dtypes)}", table=table)
    height = rows.height if isinstance(rows, pl.DataFrame) else len(rows)
    columns: list[pl.Series] = []
    for name, dtype in dtypes.items():
        if name not in given:
            if name in NULLABLE[table]:
                columns.append(pl.Series(name, [None] * height, dtype=dtype))
            continue  # a missing required column: validation names it
        if isinstance(rows, pl.DataFrame):
            columns.append(_conform_series(table, rows.get_column(name), dtype))
        else:
            columns.append(_series(table, name, [row.get(name) for row in rows], dtype))
    return pl.DataFrame(columns)


def _series(table: str, name: str, values: list[Any], dtype: pl.DataType) -> pl.Series:
    if isinstance(dtype, pl.Datetime) and any(isinstance(value, datetime) and value.tzinfo is None for value in values):
        raise SchemaViolationError(f"column {name!r} holds a naive datetime; give UTC-aware ones", table=table)
    try:
        return pl.Series(name, values, dtype=dtype, strict=True)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError) as exc:
        reason = str(exc).splitlines()[0]
        raise SchemaViolationError(f"column {name!r} is not {dtype}: {reason}", table=table) from exc


def _conform_series(table: str, series: pl.Series, dtype: pl.DataType) -> pl.Series:
    """Lossless fixes only: an all-null column takes the dtype, an aware datetime becomes UTC microseconds."""
    if series.dtype == pl.Null:
        return series.cast(dtype)
    if isinstance(dtype, pl.Datetime) and isinstance(series.dtype, pl.Datetime) and series.dtype != dtype:
        if series.dtype.time_zone is None:
            raise SchemaViolationError(f"column {series.name!r} is a naive datetime; give UTC", table=table)
        return series.dt.convert_time_zone("UTC").dt.cast_time_unit("us")
    return series  # anything else must already match; validation reports a mismatch


# -- the cheap check before a commit group queues raw rows ---------------------------------------------------

_INT64_MIN, _INT64_END = -(2**63), 2**63


def _accepted(dtype: pl.DataType) -> frozenset[type]:
    """The Python types a column of ``dtype`` takes without conversion (None always: validation judges nulls)."""
    if dtype == pl.String:
        return frozenset({str, _NONE})
    if dtype == pl.Int64:
        return frozenset({int, _NONE})
    if dtype == pl.Float64:
        return frozenset({float, int, _NONE})
    if isinstance(dtype, pl.Datetime):
        return frozenset({datetime, _NONE})  # and aware: checked per value
    if dtype == pl.Binary:
        return frozenset({bytes, _NONE})
    return frozenset({_NONE})  # a dtype without a cheap check: such values take the slow way (conform at once)


_NONE = type(None)
_UNKNOWN: frozenset[type] = frozenset()  # a column the table does not have: no value fits
_ACCEPTED: Mapping[str, Mapping[str, frozenset[type]]] = {
    table: {name: _accepted(dtype) for name, dtype in dtypes.items()} for table, dtypes in DTYPES.items()
}
_REQUIRED: Mapping[str, frozenset[str]] = {
    table: frozenset(dtypes.names()) - NULLABLE[table] for table, dtypes in DTYPES.items()
}


def conformable(table: str, rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``conform(table, rows)`` (and of any rows queued with them) certainly succeeds: every column is
    known, every required column is given (its value may still be null: validation judges values), and every
    value is None or of exactly the Python type the column's dtype takes without conversion (a str, an int in
    Int64's range, a float or such an int, a timezone-aware datetime). False only means "conform now": the
    exotic but valid (a numpy integer, a bool for an Int64) are conformed the slow way."""
    accepted, required = _ACCEPTED[table], _REQUIRED[table]
    for row in rows:
        if not row.keys() >= required:
            return False
        for name, value in row.items():  # one set lookup per value: this runs for every value a group queues
            kind = type(value)
            if kind not in accepted.get(name, _UNKNOWN):
                return False
            if kind is int:
                if not _INT64_MIN <= value < _INT64_END:
                    return False
            elif kind is datetime and value.tzinfo is None:
                return False
    return True
