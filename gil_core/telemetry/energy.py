"""The energy model: what one model call costs, linear in its token counts (docs/reference.md, "Pricing").

Every recorded call carries an energy priced by this model, so costs of different models and servers add up in
one unit. Until coefficients are fitted from server timings, ``EnergyModel.tokens()`` prices a call at its
tokens; ``EnergyModel.fit`` (and ``fit_energy_from_store``) fits them to the server time of logged calls.

Why the fit is shaped as it is: a coefficient is a cost, so it may not be negative (non-negative least squares,
not plain least squares), and server timings have gross outliers (a cold cache, a busy GPU), so the NNLS fit is
reweighted with Huber weights until it settles.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import polars as pl
from numpy.typing import NDArray

from gil_core.errors import ConfigurationError
from gil_core.telemetry._ports import TableScanner
from gil_core.telemetry.records import CallRecord

__all__ = ["EnergyModel", "EnergySample", "fit_energy_from_store"]

EnergySample = Mapping[str, Any] | CallRecord
"""One call to fit on: a ``calls`` row (mapping) or a ``CallRecord``; see ``EnergyModel.fit``."""

_SAMPLE_COLUMNS = ("role", "prompt_tokens", "cached_tokens", "completion_tokens", "gpu_prompt_ms", "gpu_predicted_ms")
_TERMS = ("per_fresh_prompt_token", "per_cached_token", "per_output_token")
_HUBER_K = 1.345  # 95% efficiency under normal noise
_MAD_TO_SIGMA = 0.6744897501960817  # the normal's median absolute deviation per unit standard deviation
_MAX_REWEIGHTS = 100
_TOLERANCE = 1e-10


@dataclass(frozen=True, slots=True)
class EnergyModel:
    """energy = fixed + per_fresh_prompt_token·max(prompt − cached, 0) + per_cached_token·cached
    + per_output_token·completion. Every coefficient is finite and non-negative."""

    fixed: float
    per_fresh_prompt_token: float
    per_cached_token: float
    per_output_token: float

    def __post_init__(self) -> None:
        for coefficient in fields(self):
            value = getattr(self, coefficient.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"EnergyModel.{coefficient.name} must be a number, not {type(value).__name__}")
            if not math.isfinite(value) or value < 0:
                raise ConfigurationError(
                    f"EnergyModel.{coefficient.name} must be finite and non-negative, got {value!r}"
                )

    @classmethod
    def tokens(cls) -> EnergyModel:
        """The model used before anything is fitted: a call costs its tokens (cached ones included)."""
        return cls(fixed=0.0, per_fresh_prompt_token=1.0, per_cached_token=1.0, per_output_token=1.0)

    @classmethod
    def fit(cls, samples: pl.DataFrame | Iterable[EnergySample]) -> EnergyModel | None:
        """Coefficients fitted to the server time (``gpu_prompt_ms + gpu_predicted_ms``) of ``samples``.

        Samples are ``calls`` rows or ``CallRecord``s; embedding calls (role ``embed``) and calls without both
        timings are left out. ``fixed`` is always fitted; a token term only where the samples exercise it (its
        count varies between samples: a constant count cannot be told apart from ``fixed``), the others are 0.
        Every coefficient is non-negative (NNLS), and gross outliers are damped by iteratively reweighted NNLS
        with Huber weights. None when there are fewer samples than fitted terms or the terms are collinear.
        """
        prompt, cached, completion, milliseconds = _sample_arrays(samples)
        fresh = np.maximum(prompt - cached, 0.0)
        candidates = np.column_stack([fresh, cached, completion])
        used = [j for j in range(len(_TERMS)) if np.ptp(candidates[:, j]) > 0] if len(milliseconds) else []
        design = np.column_stack([np.ones(len(milliseconds)), candidates[:, used]])
        if len(milliseconds) < design.shape[1]:
            return None
        scale = np.abs(design).max(axis=0)  # > 0: the ones, and columns that vary
        scaled = design / scale
        if np.linalg.matrix_rank(scaled) < design.shape[1]:
            return None
        solution = _huber_nnls(scaled, milliseconds) / scale
        coefficients = dict.fromkeys(_TERMS, 0.0)
        coefficients.update({_TERMS[j]: float(value) for j, value in zip(used, solution[1:], strict=True)})
        return cls(fixed=float(solution[0]), **coefficients)

    def price(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> float:
        """The energy of one call; cached tokens beyond the prompt never make fresh tokens negative."""
        fresh = max(prompt_tokens - cached_tokens, 0)
        return (
            self.fixed
            + self.per_fresh_prompt_token * fresh
            + self.per_cached_token * cached_tokens
            + self.per_output_token * completion_tokens
        )


def fit_energy_from_store(store: TableScanner) -> EnergyModel | None:
    """``EnergyModel.fit`` over every chat call in ``store``'s ``calls`` table that carries server timings."""
    calls = (
        store.scan("calls")
        .filter((pl.col("role") != "embed") & pl.col("gpu_prompt_ms").is_not_null())
        .select(_SAMPLE_COLUMNS)
        .collect()
    )
    return EnergyModel.fit(calls)


def _sample_arrays(samples: pl.DataFrame | Iterable[EnergySample]) -> tuple[NDArray[np.float64], ...]:
    """Prompt, cached and completion tokens and server milliseconds of the usable samples, as float arrays."""
    if isinstance(samples, pl.DataFrame):
        missing = [name for name in _SAMPLE_COLUMNS[1:] if name not in samples.columns]
        if missing:
            raise ConfigurationError(f"energy samples lack the columns {missing}")
        frame = samples
    else:
        rows = [_sample_row(sample) for sample in samples]
        frame = pl.DataFrame(rows, schema=dict.fromkeys(_SAMPLE_COLUMNS, pl.Float64) | {"role": pl.String})
    if "role" in frame.columns:
        frame = frame.filter(pl.col("role").is_null() | (pl.col("role") != "embed"))
    milliseconds = pl.col("gpu_prompt_ms").cast(pl.Float64) + pl.col("gpu_predicted_ms").cast(pl.Float64)
    usable = frame.select(
        *(pl.col(name).cast(pl.Float64) for name in ("prompt_tokens", "cached_tokens", "completion_tokens")),
        milliseconds.alias("milliseconds"),
    ).filter(pl.all_horizontal(pl.all().is_not_null() & pl.all().is_finite()))
    return tuple(usable.get_column(name).to_numpy().astype(np.float64) for name in usable.columns)


def _sample_row(sample: EnergySample) -> dict[str, Any]:
    if isinstance(sample, CallRecord):
        return {name: getattr(sample, name) for name in _SAMPLE_COLUMNS}
    return {name: sample.get(name) for name in _SAMPLE_COLUMNS}


def _huber_nnls(design: NDArray[np.float64], target: NDArray[np.float64]) -> NDArray[np.float64]:
    """Non-negative least squares, reweighted with Huber weights around the current fit until it settles.

    The residual scale is re-estimated each round from the median absolute deviation, so a few gross outliers
    neither set the scale nor pull the fit more than ``_HUBER_K`` scales' worth each.
    """
    from scipy.optimize import nnls  # type: ignore[import-untyped]  # scipy is heavy: import on first fit

    solution: NDArray[np.float64] = nnls(design, target)[0]
    for _ in range(_MAX_REWEIGHTS):
        residuals = target - design @ solution
        floor = _TOLERANCE * (1.0 + float(np.max(np.abs(target))))
        if float(np.max(np.abs(residuals))) <= floor:
            break  # every sample on the fit: nothing to reweight
        # When most samples sit exactly on the fit the deviation is 0: the floor then weighs the rest ~0.
        spread = max(float(np.median(np.abs(residuals - np.median(residuals)))) / _MAD_TO_SIGMA, floor)
        weights = np.sqrt(np.minimum(1.0, _HUBER_K * spread / np.maximum(np.abs(residuals), 1e-300)))
        updated: NDArray[np.float64] = nnls(design * weights[:, None], target * weights)[0]
        settled = np.max(np.abs(updated - solution)) <= _TOLERANCE * (1.0 + float(np.max(np.abs(solution))))
        solution = updated
        if settled:
            break
    return solution
