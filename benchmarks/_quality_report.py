"""Figures of the quality benchmark: energy fitted from the run's own calls, per-arm metrics, the targets, the
measured causes of a miss, and the plots of cost per request over time windows.

Energy unit: milliseconds of compute on this machine. Chat calls are priced by the coefficients ``fit-energy``
fits to the local server's timings (``gpu_prompt_ms + gpu_predicted_ms``) of every chat call of the run; embedding
calls (the in-process MiniLM) by coefficients fitted the same way to their measured latency, since the server's
timings do not cover them.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from benchmarks._quality_arms import ArmRun, Outcome
from gil_core.maintenance import fit_and_store_energy
from gil_core.ontology import Tree
from gil_core.telemetry import EnergyModel, TelemetryStore
from gil_core.telemetry.stats import price_expression, wilson_bounds

WARMUP_SHARE = 1 / 3  # of the repeating stream: memory share and precision targets are read after it
TARGET_ENERGY_RATIO = 0.5
TARGET_MEMORY_SHARE = 0.60
TARGET_MEMORY_PRECISION = 0.99


@dataclass(frozen=True, slots=True)
class Prices:
    """The fitted coefficients (None where too few calls to fit: then priced by tokens, and said so)."""

    chat: EnergyModel | None
    embed: EnergyModel | None
    chat_samples: int
    embed_samples: int

    def chat_or_tokens(self) -> EnergyModel:
        return self.chat or EnergyModel.tokens()

    def embed_or_tokens(self) -> EnergyModel:
        return self.embed or EnergyModel.tokens()


@dataclass(frozen=True, slots=True)
class Interval:
    """``k`` of ``n`` with the 95% Wilson interval (the reference's z; pinned at the extremes)."""

    k: int
    n: int

    @property
    def rate(self) -> float | None:
        return self.k / self.n if self.n else None

    @property
    def bounds(self) -> tuple[float, float] | None:
        if not self.n:
            return None
        low, high = wilson_bounds(pl.lit(self.k), pl.lit(self.n))  # the stats' own interval, not a copy of it
        row = pl.select(low.alias("low"), high.alias("high")).row(0)
        return float(row[0]), float(row[1])

    def render(self) -> str:
        if not self.n:
            return "—"
        low, high = self.bounds or (0.0, 0.0)
        return f"{100 * self.k / self.n:.1f}% [{100 * low:.1f}, {100 * high:.1f}] ({self.k}/{self.n})"


@dataclass
class ArmFigures:
    """What the table shows for one arm, plus the diagnostics that explain a miss."""

    key: str
    title: str
    requests: int
    accuracy: Interval
    energy: float  # mean per request, fitted
    energy_by_role: dict[str, float]  # mean per request, by call role
    llm_calls: float
    embed_calls: float
    seconds: float
    seconds_p50: float
    memory: Interval  # memory answers among all requests (after warm-up for the memory arm)
    memory_precision: Interval  # correct memory answers among memory answers (after warm-up for the memory arm)
    modes: dict[str, int]
    windows: list[tuple[int, float]]  # (first position, mean energy per request) per window
    memory_windows: list[tuple[int, float]] = field(default_factory=list)
    diagnostics: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "arm": self.key,
            "title": self.title,
            "requests": self.requests,
            "accuracy": _interval_json(self.accuracy),
            "energy_per_request": self.energy,
            "energy_by_role": self.energy_by_role,
            "llm_calls_per_request": self.llm_calls,
            "embedding_calls_per_request": self.embed_calls,
            "wall_seconds_per_request": self.seconds,
            "wall_seconds_p50": self.seconds_p50,
            "memory_share": _interval_json(self.memory),
            "memory_precision": _interval_json(self.memory_precision),
            "modes": self.modes,
            "diagnostics": self.diagnostics,
        }


def _interval_json(interval: Interval) -> dict[str, Any]:
    return {"k": interval.k, "n": interval.n, "rate": interval.rate, "wilson95": interval.bounds}


def fit_prices(store: TelemetryStore) -> Prices:
    """``gil fit-energy`` over the run's chat calls (stored in the store, as the command does), and the same fit
    over the embedding calls' measured latency."""
    calls = store.read("calls")
    chat = calls.filter((pl.col("role") != "embed") & pl.col("gpu_prompt_ms").is_not_null())
    embed = calls.filter(pl.col("role") == "embed").select(
        "prompt_tokens",
        pl.lit(0).alias("cached_tokens"),
        pl.lit(0).alias("completion_tokens"),
        pl.col("latency_ms").alias("gpu_prompt_ms"),
        pl.lit(0.0).alias("gpu_predicted_ms"),
    )
    return Prices(fit_and_store_energy(store), EnergyModel.fit(embed), chat.height, embed.height)


def priced_calls(store: TelemetryStore, prices: Prices) -> pl.DataFrame:
    """Per trace: energy (fitted), energy by role, LLM calls and embedding calls."""
    energy = (
        pl.when(pl.col("role") == "embed")
        .then(price_expression(prices.embed_or_tokens()))
        .otherwise(price_expression(prices.chat_or_tokens()))
    )
    calls = store.read("calls").with_columns(priced=energy)
    by_role = calls.pivot(on="role", index="trace_id", values="priced", aggregate_function="sum").fill_null(0.0)
    totals = calls.group_by("trace_id").agg(
        energy=pl.col("priced").sum(),
        llm_calls=(pl.col("role") != "embed").sum(),
        embed_calls=(pl.col("role") == "embed").sum(),
    )
    return totals.join(by_role, on="trace_id", how="left")


def generated_texts(store: TelemetryStore) -> dict[str, str]:
    """The text of each trace's last generation call (what the model wrote, kept or not)."""
    calls = (
        store.read("calls")
        .filter(pl.col("role") == "fallback")
        .sort("created_at", maintain_order=True)
        .group_by("trace_id", maintain_order=True)
        .agg(pl.col("content").last())
    )
    return {row[0]: row[1] or "" for row in calls.iter_rows()}


def arm_figures(
    run: ArmRun, costs: pl.DataFrame, tree: Tree, *, window: int, texts: dict[str, str] | None = None
) -> ArmFigures:
    outcomes = run.outcomes
    frame = pl.DataFrame({"trace_id": [o.trace_id for o in outcomes], "position": [o.position for o in outcomes]})
    joined = frame.join(costs, on="trace_id", how="left").fill_null(0).sort("position")
    roles = [c for c in costs.columns if c not in ("trace_id", "energy", "llm_calls", "embed_calls")]
    counted = _after_warmup(outcomes) if run.arm.repeating else outcomes
    remembered = [o for o in counted if o.mode == "memory"]
    seconds = [o.seconds for o in outcomes]
    figures = ArmFigures(
        key=run.arm.key,
        title=run.arm.title,
        requests=len(outcomes),
        accuracy=Interval(sum(o.correct for o in outcomes), len(outcomes)),
        energy=_mean(joined["energy"]),
        energy_by_role={role: _mean(joined[role]) for role in roles},
        llm_calls=_mean(joined["llm_calls"]),
        embed_calls=_mean(joined["embed_calls"]),
        seconds=statistics.fmean(seconds) if seconds else 0.0,
        seconds_p50=statistics.median(seconds) if seconds else 0.0,
        memory=Interval(len(remembered), len(counted)),
        memory_precision=Interval(sum(o.correct for o in remembered), len(remembered)),
        modes=dict(Counter(o.mode for o in outcomes).most_common()),
        windows=_windows(joined["energy"].to_list(), window),
        memory_windows=_windows([float(o.mode == "memory") for o in outcomes], window) if run.arm.repeating else [],
    )
    figures.diagnostics = _diagnostics(run, tree, texts or {})
    return figures


def _mean(series: pl.Series) -> float:
    return float(series.mean() or 0.0) if series.len() else 0.0  # type: ignore[arg-type]


def _after_warmup(outcomes: Sequence[Outcome]) -> list[Outcome]:
    return list(outcomes[math.ceil(len(outcomes) * WARMUP_SHARE) :])


def _windows(values: Sequence[float], window: int) -> list[tuple[int, float]]:
    return [(first, statistics.fmean(values[first : first + window])) for first in range(0, len(values), window)]


def _diagnostics(run: ArmRun, tree: Tree, texts: dict[str, str]) -> dict[str, Any]:
    """Numbers that say where a miss comes from: the judge, the generator, the data, or memory."""
    outcomes = run.outcomes
    out: dict[str, Any] = {}
    # The model or the server failed (not the model's answer breaking the contract): the run was disturbed.
    out["model_errors"] = sum((o.failure or "").startswith(("model failed", "judge failed")) for o in outcomes)
    generated = [o for o in outcomes if o.mode in ("partial", "fallback")]
    answers = {option.text for option, _ in tree.options() if option.text}
    if generated:
        out["generated"] = len(generated)
        out["generated_correct"] = sum(o.correct for o in generated)
        out["generated_no_output"] = sum(o.output is None for o in generated)
        out["generated_in_answer_set"] = sum((o.output or "").strip() in answers for o in generated)
        # A generation that broke the contract may still name one answer ('The answer is "down"'): how many
        # named exactly one, and how many of those the expected one. A strict contract is what refuses them.
        named = [_named_answer(texts.get(o.trace_id, ""), answers) for o in generated if o.output is None]
        out["violations_naming_one_answer"] = sum(answer is not None for answer in named)
        out["violations_naming_the_expected"] = sum(
            answer == o.request.expected
            for answer, o in zip(named, (o for o in generated if o.output is None), strict=True)
        )
    habits = [o for o in outcomes if o.mode.startswith("habit/")]
    out["habits"] = len(habits)
    out["habits_correct"] = sum(o.correct for o in habits)
    walked = [o for o in outcomes if o.steps and o.request.option_id and tree.has_option(o.request.option_id)]
    if walked:
        first = [_expected_first_node(tree, o.request.option_id or "") for o in walked]
        chosen = [o.steps[0].chosen for o in walked]
        out["root_judged"] = len(walked)
        out["root_right"] = sum(c == f for c, f in zip(chosen, first, strict=True))
        out["root_accepted"] = sum(step.outcome == "accept" for o in walked for step in o.steps[:1])
        out["root_choices"] = len(tree.root.children) + len(tree.root.options)
    steps = [step for o in outcomes for step in o.steps if step.outcome != "skip"]
    if any(step.decided_by is not None for step in steps):
        out["steps"] = len(steps)
        out["reflex_steps"] = sum(step.decided_by == "reflex" for step in steps)
        reflexed = [(o, step) for o in walked for step in o.steps[:1] if step.decided_by == "reflex"]
        out["reflex_root_right"] = sum(
            step.chosen == _expected_first_node(tree, o.request.option_id or "") for o, step in reflexed
        )
        out["reflex_root"] = len(reflexed)
    if run.arm.repeating:
        out.update(_memory_diagnostics(outcomes))
    return out


def _named_answer(text: str, answers: set[str]) -> str | None:
    """The one answer of ``answers`` that ``text`` names as a word (None: none, or several)."""
    found = {answer for answer in answers if re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", text)}
    return found.pop() if len(found) == 1 else None


def _expected_first_node(tree: Tree, option_id: str) -> str:
    path = tree.path_to(tree.owner(option_id).id)
    return path[1].id if len(path) > 1 else option_id


def _memory_diagnostics(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Why requests after warm-up were not answered by memory, and which memory answers were wrong."""
    counted = _after_warmup(outcomes)
    seen: set[str] = set()
    first_seen: set[int] = set()
    for o in outcomes:
        base = o.request.id.split("#", 1)[0]
        if base not in seen:
            seen.add(base)
            first_seen.add(o.position)
    missed = [o for o in counted if o.mode != "memory"]
    wrong = [o for o in counted if o.mode == "memory" and not o.correct]
    return {
        "after_warmup": len(counted),
        "warmup": len(outcomes) - len(counted),
        "missed_new": sum(o.position in first_seen for o in missed),
        "missed_repeat": sum(o.position not in first_seen and o.request.kind == "repeat" for o in missed),
        "missed_paraphrase": sum(o.position not in first_seen and o.request.kind == "paraphrase" for o in missed),
        "missed_guard": sum((o.recall_error or "").startswith("guard") for o in missed),
        # How close the paraphrases that missed came: the nearest entry's cosine (None: memory was empty).
        "missed_paraphrase_similarity": sorted(
            round(o.similarity, 3)
            for o in missed
            if o.position not in first_seen and o.request.kind == "paraphrase" and o.similarity is not None
        ),
        "kinds_after_warmup": dict(Counter(o.request.kind for o in counted)),
        "wrong_hits": [
            {"request": o.request.text, "expected": o.request.expected, "output": o.output, "similarity": o.similarity}
            for o in wrong[:5]
        ],
        "wrong_hit_count": len(wrong),
    }
