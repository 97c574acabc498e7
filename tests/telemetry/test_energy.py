"""EnergyModel: the reference's pricing formula, validated coefficients, and the tokens-as-energy default."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gil_core.errors import ConfigurationError
from gil_core.telemetry import EnergyModel


def test_price_is_the_reference_formula() -> None:
    model = EnergyModel(fixed=5.0, per_fresh_prompt_token=2.0, per_cached_token=0.5, per_output_token=10.0)
    # 5 + 2·(120 − 100) + 0.5·100 + 10·3
    assert model.price(prompt_tokens=120, cached_tokens=100, completion_tokens=3) == 125.0


def test_cached_tokens_beyond_the_prompt_never_make_fresh_tokens_negative() -> None:
    model = EnergyModel(fixed=0.0, per_fresh_prompt_token=2.0, per_cached_token=1.0, per_output_token=0.0)
    assert model.price(prompt_tokens=10, cached_tokens=15, completion_tokens=0) == 15.0


def test_tokens_model_prices_a_call_at_its_tokens() -> None:
    assert EnergyModel.tokens() == EnergyModel(0.0, 1.0, 1.0, 1.0)
    assert EnergyModel.tokens().price(prompt_tokens=120, cached_tokens=100, completion_tokens=1) == 121.0


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan, "1", True])
@pytest.mark.parametrize("field", ["fixed", "per_fresh_prompt_token", "per_cached_token", "per_output_token"])
def test_coefficients_must_be_finite_non_negative_numbers(field: str, bad: object) -> None:
    coefficients: dict[str, object] = {
        "fixed": 0.0,
        "per_fresh_prompt_token": 1.0,
        "per_cached_token": 1.0,
        "per_output_token": 1.0,
        field: bad,
    }
    with pytest.raises(ConfigurationError, match=field):
        EnergyModel(**coefficients)  # type: ignore[arg-type]


def test_the_model_is_frozen() -> None:
    with pytest.raises(AttributeError):
        EnergyModel.tokens().fixed = 1.0  # type: ignore[misc]


@given(
    prompt=st.integers(0, 10**6),
    cached=st.integers(0, 10**6),
    completion=st.integers(0, 10**4),
    coefficients=st.tuples(*[st.floats(0, 1e3) for _ in range(4)]),
)
def test_price_is_never_negative_and_grows_with_output(
    prompt: int, cached: int, completion: int, coefficients: tuple[float, float, float, float]
) -> None:
    model = EnergyModel(*coefficients)
    price = model.price(prompt, cached, completion)
    assert price >= 0
    assert model.price(prompt, cached, completion + 1) >= price
