"""The Wilson score interval of ``k`` successes in ``n`` trials, defined once.

With ``p = k / n`` and ``z`` the normal quantile (95%, two-sided, by default)::

    centre = p + z² / 2n      half = z · √(p(1 − p) / n + z² / 4n²)      scale = 1 + z² / n
    low = (centre − half) / scale                                  high = (centre + half) / scale

``wilson_terms`` gives ``centre``, ``half`` and ``scale`` over plain numbers or Polars expressions alike (the
caller passes the square root), so a column-wise form computes the same formula; ``wilson_interval`` and
``wilson_lower_bound`` are the scalar bounds, pinned at the extremes: no success gives a low of exactly 0.0, all
successes a high of exactly 1.0 (floating point would land a hair off either way), and no trials (0.0, 1.0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from gil_core.errors import ConfigurationError

if TYPE_CHECKING:
    import polars as pl

__all__ = ["WILSON_Z", "wilson_interval", "wilson_lower_bound", "wilson_terms"]

WILSON_Z = 1.959963984540054
"""The two-sided 95% normal quantile (the reference's)."""

T = TypeVar("T", float, "pl.Expr")


def wilson_terms(successes: T, trials: T, z: float, sqrt: Callable[[T], T]) -> tuple[T, T, T]:
    """``(centre, half, scale)`` of the interval (see the module) for ``trials`` > 0: low is
    ``(centre - half) / scale``, high ``(centre + half) / scale``, each still to be clipped to [0, 1]."""
    p = successes / trials
    z2 = z * z
    centre = p + z2 / (2 * trials)
    half = z * sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials))
    return centre, half, 1 + z2 / trials


def wilson_interval(successes: int, trials: int, z: float = WILSON_Z) -> tuple[float, float]:
    """The Wilson score interval ``(low, high)`` of ``successes`` in ``trials``; (0.0, 1.0) with no trials."""
    if trials < 0 or not 0 <= successes <= trials:
        raise ConfigurationError(f"need 0 ≤ successes ≤ trials, got {successes} of {trials}")
    if trials == 0:
        return 0.0, 1.0
    centre, half, scale = wilson_terms(successes, trials, z, math.sqrt)
    low = 0.0 if successes == 0 else max(0.0, (centre - half) / scale)
    high = 1.0 if successes == trials else min(1.0, (centre + half) / scale)
    return low, high


def wilson_lower_bound(successes: int, trials: int, z: float = WILSON_Z) -> float:
    """The lower end of the Wilson score interval; 0.0 with no trials or no successes."""
    return wilson_interval(successes, trials, z)[0]
