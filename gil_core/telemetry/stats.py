"""Reading the log: what a task's traces say about accuracy per mode, habit and memory use, cost over time and
misroutes (docs/reference.md, "Stats"), for ``gil stats`` and the review flows.

Everything is one lazy Polars plan over the store's tables (scan, filter, join, group-by), never a loop over rows:
a store holds millions of traces and the answer has to come back in well under a second (BENCHMARKS.md, "Stats
over a large store"). Telemetry sits below the ontology, so the tree is taken as the ``HabitTree`` protocol, which
``gil_core.ontology.Tree`` satisfies, rather than imported; and since ``TelemetryStore.stats`` calls in here, the
store is taken as the ``StatsSource`` port (``telemetry._ports``), which ``TelemetryStore`` satisfies. The values
it returns, and how they are laid out, are ``gil_core.telemetry.stats_result``'s; this module re-exports them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import polars as pl

from gil_core.errors import ConfigurationError
from gil_core.telemetry._ports import StatsSource, TableScanner
from gil_core.telemetry.energy import EnergyModel
from gil_core.telemetry.stats_result import (
    CostWindow,
    DeciderStats,
    MemoryRefusal,
    Misroute,
    Misroutes,
    ModeStats,
    Stats,
)
from gil_core.verdicts import confirmed_answer_expr
from gil_core.wilson import WILSON_Z, wilson_terms

__all__ = [
    "WILSON_Z",
    "CostWindow",
    "DeciderStats",
    "HabitTree",
    "MemoryRefusal",
    "Misroute",
    "Misroutes",
    "ModeStats",
    "Stats",
    "compute_stats",
    "decider_expression",
    "price_expression",
    "wilson_bounds",
]

_HABIT_PREFIX = "habit/"
# A failed lookup's recall carries an ``error`` string (nulls are left out of the JSON). Keys are the store's
# fixed set and a quote inside a JSON string is always escaped, so this pattern matches the key and nothing
# else; it is ~40× cheaper than parsing every recall (``json_path_match``) on a million traces. A hit a check
# took back is no failure: it says why in ``refused``, after the check's word; rows written before that key
# (2026-12-07) said it in ``error``, after the same words, and count as take-backs. One pass: the group is ""
# for a failure, the word for an older take-back, null without an ``error``. The take-backs are few: their
# check and source are read off them alone (``_refusals``).
_RECALL_ERROR = r'"error"\s*:\s*"((?:guard|learned|verification failed): |)'
_TAKEN_BACK = r'"(?:refused|error)"\s*:\s*"(guard: |learned: the log|learned: |verification failed: |tree: )'
# The check's word, as stats name it (``MemoryRefusal.check``).
_CHECKS = {"guard: ": "guard", "learned: the log": "memory cut", "learned: ": "learned judge",
           "verification failed: ": "verification", "tree: ": "tree changed"}  # fmt: skip
_SOURCE = r'"source"\s*:\s*"([^"]*)"'


# -- the tree, as far as stats need it ----------------------------------------------------------------------


class _HabitView(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def text(self) -> str | None: ...


class _NodeView(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def children(self) -> Sequence[_NodeView]: ...
    @property
    def options(self) -> Sequence[_HabitView]: ...


class HabitTree(Protocol):
    """What misroute detection reads from a tree: its nodes, depth first. ``ontology.Tree`` is one."""

    def iter_nodes(self) -> Iterator[tuple[_NodeView, int]]: ...


# -- expressions ----------------------------------------------------------------------------------------------


def wilson_bounds(correct: pl.Expr, judged: pl.Expr, z: float = WILSON_Z) -> tuple[pl.Expr, pl.Expr]:
    """The Wilson score interval of ``correct`` successes in ``judged`` trials, as (low, high) expressions.

    Null when ``judged`` is 0. At the extremes the bounds are pinned, not computed: no success gives a low of
    exactly 0.0 and all successes a high of exactly 1.0 (floating point would land a hair off either way).
    """
    centre, half, scale = wilson_terms(correct.cast(pl.Float64), judged.cast(pl.Float64), z, pl.Expr.sqrt)
    judged_any = judged > 0
    low = (
        pl.when(~judged_any).then(None).when(correct == 0).then(0.0).otherwise(((centre - half) / scale).clip(0.0, 1.0))
    )
    high = (
        pl.when(~judged_any)
        .then(None)
        .when(correct == judged)
        .then(1.0)
        .otherwise(((centre + half) / scale).clip(0.0, 1.0))
    )
    return low, high


def price_expression(model: EnergyModel) -> pl.Expr:
    """``model.price`` over the calls table's token columns (the reference's formula, as one expression)."""
    fresh = (pl.col("prompt_tokens") - pl.col("cached_tokens")).clip(lower_bound=0)
    return (
        model.fixed
        + model.per_fresh_prompt_token * fresh
        + model.per_cached_token * pl.col("cached_tokens")
        + model.per_output_token * pl.col("completion_tokens")
    )


# -- the computation ------------------------------------------------------------------------------------------


def compute_stats(
    store: StatsSource,
    task: str,
    *,
    window: int,
    pricing: EnergyModel | None = None,
    tree: HabitTree | None = None,
) -> Stats:
    """The stats of ``task`` from ``store`` (see ``Stats``).

    Cost windows are consecutive chunks of ``window`` requests in trace order (``created_at``, ties in write
    order); the last one may be shorter. Without ``pricing`` a request costs its recorded energy; with it, its
    chat calls (every role but ``embed``) are priced from their tokens by ``pricing`` while embeddings keep their
    recorded energy. Misroutes need ``tree``; a request counts as checked when it was judged, has a path whose
    last node is in the tree, and its confirmed answer is the text of an answer habit.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigurationError(f"a cost window holds at least one request, got {window!r}")
    columns = ["trace_id", "created_at", "mode", "feedback_verdict", "energy", "recall", "decider"]
    if tree is not None:
        columns += ["path", "output", "feedback_correction"]
    scan = (
        store.scan("traces")
        .filter(pl.col("task") == task)
        .select(columns)
        .with_columns(error=pl.col("recall").str.extract(_RECALL_ERROR, 1))
        .with_columns(
            failed=(pl.col("error") == "").fill_null(False),
            taken_back=pl.when((pl.col("error") != "") | pl.col("recall").str.contains('"refused"', literal=True)).then(
                pl.col("recall")
            ),
        )
        .drop("recall", "error")
    )
    if tree is not None:
        scan = scan.with_columns(answer=confirmed_answer_expr()).drop("output", "feedback_correction")
    # Read (and supersede) once; only the cost windows need request order, so only they sort, on two columns.
    frame = scan.collect().lazy()
    costs = frame.select("trace_id", "created_at", "energy")
    if pricing is not None:
        costs = _reprice(store, costs, pricing)
    refusals = frame.filter(pl.col("taken_back").is_not_null()).select(
        "trace_id",
        check=pl.col("taken_back").str.extract(_TAKEN_BACK, 1).replace_strict(_CHECKS, default="other"),
        source=pl.col("taken_back").str.extract(_SOURCE, 1),
    )
    queries = [
        _modes(frame), _totals(frame), _windows(costs, window), _deciders(frame), _not_learned(store, task), refusals
    ]  # fmt: skip
    if tree is not None:
        queries += _misroutes(frame, tree)
    modes, totals, windows, deciders, not_learned, refused, *misroutes = pl.collect_all(queries)
    quarantined = store.quarantined()
    requests, habits, memory, failures = totals.row(0)
    return Stats(
        task=task,
        requests=requests,
        modes=tuple(ModeStats(**row) for row in modes.iter_rows(named=True)),
        habit_rate=habits / requests if requests else None,
        memory_rate=memory / requests if requests else None,
        memory_failures=failures,
        window=window,
        repriced=pricing is not None,
        windows=tuple(CostWindow(**row) for row in windows.iter_rows(named=True)),
        misroutes=_misroute_result(*misroutes) if misroutes else None,
        deciders=tuple(DeciderStats(**row) for row in deciders.iter_rows(named=True)),
        quarantined_files=len(quarantined),
        quarantined_rows=sum(item.rows or 0 for item in quarantined),
        quarantined_uncounted=sum(item.rows is None for item in quarantined),
        memory_not_learned=not_learned.item(),
        memory_refused=_refusals(store, task, refused),
    )


def _refusals(store: StatsSource, task: str, refused: pl.DataFrame) -> tuple[MemoryRefusal, ...]:
    """Per check, the hits it took back, and of those judged, how many the remembered answer would have got
    wrong: the refused requests' and their remembered requests' confirmed answers, read for those keys only."""
    if refused.is_empty():
        return ()
    keys = set(refused["trace_id"]) | {source for source in refused["source"] if source}
    answers = (
        store.scan("traces", only={"trace_id": keys})
        .filter(pl.col("task") == task)
        .select("trace_id", answer=confirmed_answer_expr(), right=pl.col("feedback_verdict") == "correct")
        .collect()
    )
    remembered = answers.select(source="trace_id", remembered="answer")
    judged = pl.col("answer").is_not_null() & pl.col("remembered").is_not_null()
    rows = (
        refused.join(answers, on="trace_id", how="left")
        .join(remembered, on="source", how="left")
        .group_by("check")
        .agg(
            hits=pl.len().cast(pl.Int64),
            judged=judged.sum().cast(pl.Int64),
            remembered_wrong=(judged & (pl.col("answer") != pl.col("remembered"))).sum().cast(pl.Int64),
            answered_right=(judged & pl.col("right")).sum().cast(pl.Int64),
        )
        .sort(["hits", "check"], descending=[True, False])
    )
    return tuple(MemoryRefusal(**row) for row in rows.iter_rows(named=True))


def _not_learned(store: TableScanner, task: str) -> pl.LazyFrame:
    """How many of ``task``'s verdicts memory has not learned: their newest ``unlearned_verdicts`` row says so."""
    rows = store.scan("unlearned_verdicts").filter((pl.col("task") == task) & ~pl.col("learned"))
    return rows.select(not_learned=pl.len().cast(pl.Int64))


def _reprice(store: TableScanner, traces: pl.LazyFrame, pricing: EnergyModel) -> pl.LazyFrame:
    """Replace each trace's energy by its calls': chat calls priced by ``pricing``, embeddings as recorded.
    Rows keep their order, so requests logged at the same instant stay in write order."""
    energy = pl.when(pl.col("role") == "embed").then(pl.col("energy")).otherwise(price_expression(pricing))
    per_trace = (
        store.scan("calls")
        .select("trace_id", "role", "prompt_tokens", "cached_tokens", "completion_tokens", "energy")
        .group_by("trace_id")  # calls of other tasks find no trace below: grouping first hashes each id once
        .agg(energy.sum().alias("energy"))
    )
    return (
        traces.drop("energy")
        .join(per_trace, on="trace_id", how="left", maintain_order="left")
        .with_columns(pl.col("energy").fill_null(0.0))
    )


def _modes(base: pl.LazyFrame) -> pl.LazyFrame:
    verdict = pl.col("feedback_verdict")
    low, high = wilson_bounds(pl.col("correct"), pl.col("judged"))
    return (
        base.group_by("mode")
        .agg(
            requests=pl.len().cast(pl.Int64),
            judged=verdict.is_not_null().sum().cast(pl.Int64),
            correct=(verdict == "correct").sum().cast(pl.Int64),
        )
        .with_columns(
            accuracy=pl.when(pl.col("judged") > 0).then(pl.col("correct") / pl.col("judged")),
            low=low,
            high=high,
        )
        .sort(["requests", "mode"], descending=[True, False])
    )


_GENERATED_MODES = ("fallback", "partial", "habit/procedure")


def decider_expression() -> pl.Expr:
    """Who settled a trace (``schemas.DECIDERS``). Traces from before the ``decider`` column: memory, generation
    or else the LLM, read off their mode."""
    mode = pl.col("mode")
    return pl.coalesce(
        pl.col("decider"),
        pl.when(mode == "memory")
        .then(pl.lit("memory"))
        .when(mode.is_in(_GENERATED_MODES))
        .then(pl.lit("generation"))
        .when(mode == "abstain")
        .then(pl.lit("abstain"))
        .otherwise(pl.lit("llm")),
    )


def _deciders(base: pl.LazyFrame) -> pl.LazyFrame:
    """Requests per decider (``decider_expression``)."""
    decider = decider_expression()
    verdict = pl.col("feedback_verdict")
    low, high = wilson_bounds(pl.col("correct"), pl.col("judged"))
    return (
        base.with_columns(decider=decider)
        .group_by("decider")
        .agg(
            requests=pl.len().cast(pl.Int64),
            judged=verdict.is_not_null().sum().cast(pl.Int64),
            correct=(verdict == "correct").sum().cast(pl.Int64),
            energy_per_request=pl.col("energy").mean(),
        )
        .with_columns(
            share=pl.col("requests") / pl.col("requests").sum(),
            accuracy=pl.when(pl.col("judged") > 0).then(pl.col("correct") / pl.col("judged")),
            low=low,
            high=high,
        )
        .select("decider", "requests", "share", "judged", "correct", "accuracy", "low", "high", "energy_per_request")
        .sort(["requests", "decider"], descending=[True, False])
    )


def _totals(base: pl.LazyFrame) -> pl.LazyFrame:
    mode = pl.col("mode")
    return base.select(
        requests=pl.len().cast(pl.Int64),
        habits=mode.str.starts_with(_HABIT_PREFIX).sum().cast(pl.Int64),
        memory=(mode == "memory").sum().cast(pl.Int64),
        failures=pl.col("failed").sum().cast(pl.Int64),
    )


def _windows(base: pl.LazyFrame, window: int) -> pl.LazyFrame:
    return (
        base.sort("created_at", maintain_order=True)
        .select("energy")
        .with_row_index("position")
        .group_by((pl.col("position") // window).alias("chunk"))
        .agg(
            first=pl.col("position").min().cast(pl.Int64),
            requests=pl.len().cast(pl.Int64),
            total_energy=pl.col("energy").sum(),
            mean_energy=pl.col("energy").mean(),
        )
        .sort("chunk")
        .drop("chunk")
    )


def _misroutes(base: pl.LazyFrame, tree: HabitTree) -> list[pl.LazyFrame]:
    """Two queries: how many requests were checked, and the misrouted ones counted per (last node, habit)."""
    homes = _habit_homes(tree)
    habits = homes.group_by("text").agg(pl.col("habit").first()).lazy()
    nodes = pl.LazyFrame({"node": sorted({node.id for node, _ in tree.iter_nodes()})}, schema={"node": pl.String})
    last_node = pl.col("path").str.json_decode(pl.List(pl.Struct({"node": pl.String}))).list.last().struct.field("node")
    checked = (
        base.select(text=pl.col("answer"), path=pl.col("path"))
        .join(habits, on="text", how="semi")
        .select("text", node=last_node)
        .join(nodes, on="node", how="semi")
    )
    misrouted = (
        checked.join(homes.lazy(), on=["text", "node"], how="anti")
        .join(habits, on="text", how="left")
        .group_by("node", "habit")
        .agg(count=pl.len().cast(pl.Int64))
        .sort(["count", "node", "habit"], descending=[True, False, False])
    )
    return [checked.select(checked=pl.len().cast(pl.Int64)), misrouted]


def _habit_homes(tree: HabitTree) -> pl.DataFrame:
    """One row (text, habit, node) per answer habit and per node on the way from the root to it: the nodes
    whose subtree holds the habit."""
    rows: dict[str, list[str]] = {"text": [], "habit": [], "node": []}
    ancestors: list[str] = []
    for node, layer in tree.iter_nodes():  # depth first: the stack of ancestors is the path to ``node``
        del ancestors[layer - 1 :]
        ancestors.append(node.id)
        for option in node.options:
            if option.kind == "answer" and option.text is not None:
                for home in ancestors:
                    rows["text"].append(option.text.strip())
                    rows["habit"].append(option.id)
                    rows["node"].append(home)
    return pl.DataFrame(rows, schema={"text": pl.String, "habit": pl.String, "node": pl.String})


def _misroute_result(checked: pl.DataFrame, misrouted: pl.DataFrame) -> Misroutes:
    by_node = tuple(Misroute(**row) for row in misrouted.iter_rows(named=True))
    return Misroutes(checked=checked.item(), count=sum(item.count for item in by_node), by_node=by_node)
