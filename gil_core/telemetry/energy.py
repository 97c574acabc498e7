"""The energy model: what one model call costs, linear in its token counts (REFERENCE.md, "Pricing").

Every recorded call carries an energy priced by this model, so costs of different models and servers add up in
one unit. Until coefficients are fitted from server timings, ``EnergyModel.tokens()`` prices a call at its
tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from gil_core.errors import ConfigurationError

__all__ = ["EnergyModel"]


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

    def price(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> float:
        """The energy of one call; cached tokens beyond the prompt never make fresh tokens negative."""
        fresh = max(prompt_tokens - cached_tokens, 0)
        return (
            self.fixed
            + self.per_fresh_prompt_token * fresh
            + self.per_cached_token * cached_tokens
            + self.per_output_token * completion_tokens
        )
