"""The telemetry tables, declared once as pandera models (polars backend): names, dtypes, cheap value checks.

Table and column names are the reference's (docs/reference.md, "Telemetry layout"); columns may be added at
the end, never renamed or repurposed. Ids and text are Utf8, JSON columns are Utf8 holding compact JSON,
timestamps are microsecond UTC datetimes, counts Int64, measures Float64. A column is nullable exactly where
the records in ``records.py`` allow a missing value. ``TelemetryStore`` validates every write with
``validate_frame``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import cache
from json.scanner import make_scanner
from typing import Annotated, Any

import pandera.polars as pa
import polars as pl
from pandera.errors import SchemaError, SchemaErrors

from gil_core.errors import SchemaViolationError

__all__ = [
    "CALL_ROLES",
    "COLUMNS",
    "COUNTERS",
    "DECIDERS",
    "DTYPES",
    "FEEDBACK_VERDICTS",
    "GIL_COLUMNS",
    "GIL_TABLES",
    "JSON_COLUMNS",
    "KEYS",
    "NULLABLE",
    "REFERENCE_TABLES",
    "TABLES",
    "CallsSchema",
    "HabitReliabilitySchema",
    "NodeChoicesSchema",
    "NodeStatsSchema",
    "PromotionRoundsSchema",
    "PromotionsSchema",
    "ReviewsSchema",
    "RunConfigsSchema",
    "StoreMetaSchema",
    "TracesSchema",
    "UnlearnedVerdictsSchema",
    "VectorsSchema",
    "validate_frame",
]

CALL_ROLES = ("embed", "judge", "fallback", "slot_fill", "baseline", "probe", "verify")
FEEDBACK_VERDICTS = ("correct", "wrong")
DECIDERS = ("memory", "learned", "reflex", "llm", "generation", "abstain")
"""Who settled a request, the most expensive first used counting: memory; a walk every step of which the learned
judge served; one with a description-reflex step but no LLM judgment; one with an LLM judgment; an answer that was
generated; no answer."""

# Probabilities are sums of exp(logprob) from a server: float noise may push an honest 1.0 a hair above it.
_PROBABILITY_MAX = 1.0 + 1e-9
_PROBABILITY = {"min_value": 0.0, "max_value": _PROBABILITY_MAX}

UtcTimestamp = Annotated[pl.Datetime, "us", "UTC"]


# The scanner json.loads runs, without its per-call wrapping (typeshed types make_scanner as taking itself).
_SCAN: Callable[[str, int], tuple[Any, int]] = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
_WHITESPACE = " \t\n\r"
_UNIQUE_FROM = 64  # rows from which checking each distinct value once is cheaper than checking every value


def _is_json(value: str | None) -> bool:
    """Whether ``json.loads(value)`` succeeds (None passes). A value that neither starts nor ends with
    whitespace is scanned directly, as ``json.loads`` would scan it (twice as fast); others go through it."""
    if value is None:
        return True
    try:
        if value and value[0] not in _WHITESPACE and value[-1] not in _WHITESPACE:
            return bool(_SCAN(value, 0)[1] == len(value))
        json.loads(value)
    except (StopIteration, ValueError):
        return False
    return True


def _all_json(column: pl.Series) -> bool:
    """Whether every value of ``column`` is None or JSON; a long column checks each distinct value once."""
    values = column.drop_nulls()
    if len(values) >= _UNIQUE_FROM:
        values = values.unique()
    return all(_is_json(value) for value in values.to_list())


def _json_check(data: pa.PolarsData) -> pl.LazyFrame:
    """Every non-null value parses as JSON (element-wise, so it costs a ``json.loads`` per row)."""
    return data.lazyframe.select(pl.col(data.key).map_elements(_is_json, return_dtype=pl.Boolean))


class _Table(pa.DataFrameModel):
    class Config:
        strict = True  # unknown columns are an error, never silently stored
        coerce = False  # the store builds frames with exact dtypes; a mismatch is a bug to report


class TracesSchema(_Table):
    """One row per resolved request; a later row with the same ``trace_id`` (feedback) supersedes it."""

    trace_id: str
    created_at: UtcTimestamp
    task: str
    state: str
    mode: str
    path: str
    output: str = pa.Field(nullable=True)
    confidence: pl.Float64 = pa.Field(nullable=True, in_range=_PROBABILITY)
    energy: pl.Float64 = pa.Field(ge=0)
    feedback_verdict: str = pa.Field(nullable=True, isin=FEEDBACK_VERDICTS)
    feedback_correction: str = pa.Field(nullable=True)
    implicit_signal: str = pa.Field(nullable=True)
    label: str = pa.Field(nullable=True)
    explored_output: str = pa.Field(nullable=True)
    recall: str = pa.Field(nullable=True)
    failure: str = pa.Field(nullable=True)
    # Gil's own columns (not the reference's; see GIL_COLUMNS):
    decider: str = pa.Field(nullable=True, isin=DECIDERS)
    batch_id: str = pa.Field(nullable=True)  # the resolve_batch call it came from (gil_core.batch_scope)
    flow_run_id: str = pa.Field(nullable=True)  # the orchestrator's run of that batch, when there is one
    # On a verdict's row: the tree answer it confirmed (``Option.answer_version``), when the answer is one of them.
    answer_version: str = pa.Field(nullable=True)

    class Config:
        name = "traces"

    @pa.check("path", "recall", name="is_json")
    @classmethod
    def _json(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return _json_check(data)


class CallsSchema(_Table):
    """One row per model call, priced; ``trace_id`` is null for calls made outside a request."""

    call_id: str
    trace_id: str = pa.Field(nullable=True)
    created_at: UtcTimestamp
    role: str = pa.Field(isin=CALL_ROLES)
    model: str
    node_id: str = pa.Field(nullable=True)
    layer: pl.Int64 = pa.Field(nullable=True, ge=0)
    prompt_tokens: pl.Int64 = pa.Field(ge=0)
    cached_tokens: pl.Int64 = pa.Field(ge=0)
    completion_tokens: pl.Int64 = pa.Field(ge=0)
    latency_ms: pl.Float64 = pa.Field(ge=0)
    gpu_prompt_ms: pl.Float64 = pa.Field(nullable=True, ge=0)
    gpu_predicted_ms: pl.Float64 = pa.Field(nullable=True, ge=0)
    content: str = pa.Field(nullable=True)
    first_token: str = pa.Field(nullable=True)
    top_logprobs: str
    distribution: str = pa.Field(nullable=True)
    label_mass: pl.Float64 = pa.Field(nullable=True, in_range=_PROBABILITY)
    confidence: pl.Float64 = pa.Field(nullable=True, in_range=_PROBABILITY)
    outcome: str = pa.Field(nullable=True)
    energy: pl.Float64 = pa.Field(ge=0)
    raw_response: str = pa.Field(nullable=True)
    candidates: str

    class Config:
        name = "calls"

    @pa.check("top_logprobs", "distribution", "candidates", name="is_json")
    @classmethod
    def _json(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return _json_check(data)


class RunConfigsSchema(_Table):
    """The configuration a task ran with (JSON), one current row per task."""

    task: str
    created_at: UtcTimestamp
    config: str

    class Config:
        name = "run_configs"

    @pa.check("config", name="is_json")
    @classmethod
    def _json(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return _json_check(data)


class NodeStatsSchema(_Table):
    """How often each node was judged, accepted and exited, per scope."""

    scope: str
    node_id: str
    hits: pl.Int64 = pa.Field(ge=0)
    accepts: pl.Int64 = pa.Field(ge=0)
    exits: pl.Int64 = pa.Field(ge=0)
    last_used_at: UtcTimestamp = pa.Field(nullable=True)

    class Config:
        name = "node_stats"


class NodeChoicesSchema(_Table):
    """How often each child or option was accepted at a node, per scope."""

    scope: str
    node_id: str
    chosen_id: str
    accepts: pl.Int64 = pa.Field(ge=0)

    class Config:
        name = "node_choices"


class HabitReliabilitySchema(_Table):
    """Verdict counters per habit (or shadow), per scope: the inputs of deactivation."""

    scope: str
    item_id: str
    reinforced: pl.Int64 = pa.Field(ge=0)
    penalized: pl.Int64 = pa.Field(ge=0)
    missed: pl.Int64 = pa.Field(ge=0)
    explored: pl.Int64 = pa.Field(ge=0)
    disputed: pl.Int64 = pa.Field(ge=0)

    class Config:
        name = "habit_reliability"


class StoreMetaSchema(_Table):
    """Key/value facts about the store; ``restricted`` = ``1`` forbids export."""

    key: str
    value: str

    class Config:
        name = "store_meta"


class PromotionRoundsSchema(_Table):
    """The trace index at which a promotion round ran for a task."""

    task: str
    at_index: pl.Int64 = pa.Field(ge=0)

    class Config:
        name = "promotion_rounds"


class PromotionsSchema(_Table):
    """One promoted option: where it was anchored, the option itself (JSON) and the evidence behind it."""

    task: str
    at_index: pl.Int64 = pa.Field(ge=0)
    anchor: str
    option_id: str
    option: str
    sources: str
    support: pl.Int64 = pa.Field(ge=0)
    anchor_volume: pl.Int64 = pa.Field(ge=0)
    expected_saving: pl.Float64 = pa.Field(ge=0)
    added_cost: pl.Float64 = pa.Field(ge=0)

    class Config:
        name = "promotions"

    @pa.check("option", "sources", name="is_json")
    @classmethod
    def _json(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return _json_check(data)


class ReviewsSchema(_Table):
    """A decision on a review item (promotion, deactivation, differentiation): a log, never superseded."""

    task: str
    reviewed_at: UtcTimestamp
    kind: str
    item_id: str
    decision: str
    note: str = pa.Field(nullable=True)

    class Config:
        name = "reviews"


class VectorsSchema(_Table):
    """The embedding of a request, kept with the log so that the learned judge refits without embedding again:
    ``vector`` is ``dimensions`` little-endian float32 values, from the embedder named ``model``. Never written
    for a do-not-record request. Not a reference table (added by the learned reflex)."""

    trace_id: str
    task: str
    created_at: UtcTimestamp
    model: str
    dimensions: pl.Int64 = pa.Field(ge=1)
    vector: pl.Binary

    class Config:
        name = "vectors"


class UnlearnedVerdictsSchema(_Table):
    """A verdict memory did not learn when it was given (its write failed: its store unreachable, a full disk), one
    row per trace, the newest winning: ``learned`` is false with the ``reason`` when it failed, true once a relearn
    of that verdict or a rebuild of the task's memory caught up. ``gil stats`` counts the ones still false. Not a
    reference table (Gil's own: the reference loses such a failure to the log)."""

    trace_id: str
    task: str
    at: UtcTimestamp
    learned: pl.Boolean
    reason: str = pa.Field(nullable=True)

    class Config:
        name = "unlearned_verdicts"


TABLES: Mapping[str, type[pa.DataFrameModel]] = {
    "traces": TracesSchema,
    "calls": CallsSchema,
    "run_configs": RunConfigsSchema,
    "node_stats": NodeStatsSchema,
    "node_choices": NodeChoicesSchema,
    "habit_reliability": HabitReliabilitySchema,
    "store_meta": StoreMetaSchema,
    "promotion_rounds": PromotionRoundsSchema,
    "promotions": PromotionsSchema,
    "reviews": ReviewsSchema,
    "vectors": VectorsSchema,
    "unlearned_verdicts": UnlearnedVerdictsSchema,
}
"""Table name → its pandera model, in the reference's order (then the tables Gil added)."""

GIL_TABLES: tuple[str, ...] = ("vectors", "unlearned_verdicts")
"""The tables Gil added: stored and read like the others, but not part of the SQLite layout."""

REFERENCE_TABLES: tuple[str, ...] = tuple(name for name in TABLES if name not in GIL_TABLES)
"""The reference's tables: the SQLite layout (``gil_core.telemetry.sqlite``) holds exactly these."""

GIL_COLUMNS: Mapping[str, tuple[str, ...]] = {"traces": ("decider", "batch_id", "flow_run_id", "answer_version")}
"""Columns Gil added at the end of a reference table: stored and read, but not part of the SQLite layout."""

COLUMNS: Mapping[str, tuple[str, ...]] = {name: tuple(model.to_schema().columns) for name, model in TABLES.items()}
"""Table name → its column names, in order."""

DTYPES: Mapping[str, pl.Schema] = {
    name: pl.Schema({column: spec.dtype.type for column, spec in model.to_schema().columns.items()})
    for name, model in TABLES.items()
}
"""Table name → its Polars schema (column → dtype), as stored."""

NULLABLE: Mapping[str, frozenset[str]] = {
    name: frozenset(column for column, spec in model.to_schema().columns.items() if spec.nullable)
    for name, model in TABLES.items()
}
"""Table name → the columns that may hold null (a write may leave them out)."""

KEYS: Mapping[str, tuple[str, ...]] = {
    "traces": ("trace_id",),
    "calls": ("call_id",),
    "run_configs": ("task",),
    "store_meta": ("key",),
    "promotion_rounds": ("task", "at_index"),
    "promotions": ("task", "at_index", "option_id"),
    "vectors": ("trace_id",),
    "unlearned_verdicts": ("trace_id",),
}
"""Keyed tables → their key: the last row written for a key supersedes earlier ones. ``reviews`` is a log."""

COUNTERS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "node_stats": (("scope", "node_id"), ("hits", "accepts", "exits"), ("last_used_at",)),
    "node_choices": (("scope", "node_id", "chosen_id"), ("accepts",), ()),
    "habit_reliability": (
        ("scope", "item_id"),
        ("reinforced", "penalized", "missed", "explored", "disputed"),
        (),
    ),
}
"""Counter tables → (key, summed columns, max columns). Each write is an increment; a read sums them per key,
so two processes counting at once never lose an update (no read-modify-write)."""

JSON_COLUMNS: Mapping[str, tuple[str, ...]] = {
    "traces": ("path", "recall"),
    "calls": ("top_logprobs", "distribution", "candidates"),
    "run_configs": ("config",),
    "promotions": ("option", "sources"),
}
"""Columns that hold JSON text (snake_case keys, non-ASCII unescaped, compact separators)."""


def _in_range(
    column: pl.Expr, min_value: Any, max_value: Any, include_min: bool = True, include_max: bool = True
) -> pl.Expr:
    low = column.ge(min_value) if include_min else column.gt(min_value)
    high = column.le(max_value) if include_max else column.lt(max_value)
    return low & high


# pandera's built-in checks this module uses, as the very expressions its polars backend evaluates
_CHECK_EXPRESSIONS: Mapping[str, Callable[..., pl.Expr]] = {
    "isin": lambda column, allowed_values: column.is_in(list(allowed_values)),
    "greater_than_or_equal_to": lambda column, min_value: column.ge(min_value),
    "in_range": _in_range,
}


def _compile(schema: pa.DataFrameSchema, dtypes: pl.Schema, in_python: tuple[str, ...]) -> tuple[pl.Expr, ...] | None:
    """The schema's nullability and checks as boolean aggregates; None when a check has no translation."""
    passes: list[pl.Expr] = []
    for name, column in schema.columns.items():
        value = pl.col(name)
        if not column.nullable:
            present = value.is_not_null()
            if dtypes[name].is_float():
                present = present & value.is_not_nan()  # pandera counts NaN as missing here
            passes.append(present.all().alias(f"{len(passes)}:{name}:not_nullable"))
        for check in column.checks:
            if check.name == "is_json" and name in in_python:
                continue
            translate = _CHECK_EXPRESSIONS.get(str(check.name))
            if translate is None:
                return None
            # a null value passes a check (pandera's ignore_na); nullability is checked above
            passed = translate(value, **check.statistics).fill_null(True).all()
            passes.append(passed.alias(f"{len(passes)}:{name}:{check.name}"))
    return tuple(passes)


class _Plan:
    """One table's schema evaluated as a single Polars select, plus a JSON parse of its JSON columns."""

    def __init__(self, table: str) -> None:
        self.schema = TABLES[table].to_schema()
        self.dtypes = DTYPES[table]
        self.json_columns = JSON_COLUMNS.get(table, ())
        self.passes = _compile(self.schema, self.dtypes, self.json_columns)

    def quick_pass(self, frame: pl.DataFrame) -> bool:
        """True when ``frame`` certainly satisfies the schema; False means "ask pandera"."""
        if self.passes is None or frame.schema != self.dtypes:
            return False
        if self.passes and not all(frame.select(self.passes).row(0)):
            return False
        return all(_all_json(frame.get_column(name)) for name in self.json_columns)


@cache
def _plan(table: str) -> _Plan:
    return _Plan(table)


def validate_frame(table: str, frame: pl.DataFrame) -> None:
    """Validate ``frame`` against ``table``'s pandera model, eagerly; raise ``SchemaViolationError`` if not.

    The pandera model is the contract and the error report. Pandera costs about a millisecond per column on a
    small frame (20–40 ms for one trace or call), so the same model (dtypes, nullability, built-in checks) is
    first evaluated as one Polars select; pandera validates in full whenever that does not pass outright. The
    frame must also carry exactly the model's dtypes, in its column order, because it is stored as is.
    """
    if table not in TABLES:
        raise SchemaViolationError(f"unknown table; tables are {', '.join(TABLES)}", table=table)
    plan = _plan(table)
    if plan.quick_pass(frame):
        return
    try:
        plan.schema.validate(frame, lazy=True)
    except SchemaErrors as exc:
        raise SchemaViolationError(_describe(exc), table=table) from exc
    except SchemaError as exc:
        raise SchemaViolationError(str(exc), table=table) from exc
    if frame.schema != plan.dtypes:
        expected = ", ".join(f"{name}: {dtype}" for name, dtype in plan.dtypes.items())
        raise SchemaViolationError(f"columns must be exactly ({expected})", table=table)


def _describe(exc: SchemaErrors) -> str:
    """One clause per failing (column, check) with up to five offending values; table-level ones in full."""
    cases = exc.failure_cases
    clauses = []
    for (context, column, check), group in cases.group_by(["schema_context", "column", "check"], maintain_order=True):
        values = group.get_column("failure_case")
        examples = ", ".join(repr(value) for value in (values if context != "Column" else values.head(5)))
        where = f"column {column!r}" if context == "Column" else "table"
        clauses.append(f"{where} fails {check} ({examples})")
    return "; ".join(clauses) or str(exc)
