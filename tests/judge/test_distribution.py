"""The label distribution: how top logprobs become probabilities, trust, confidence and a choice."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from gil_core.judge import read_distribution
from gil_core.llm import TokenLogprob
from gil_core.telemetry.records import CandidateShown

SHOWN = [CandidateShown(None, "A"), CandidateShown("x", "B"), CandidateShown("y", "C")]


def alternatives(*pairs: tuple[str, float | None]) -> list[TokenLogprob]:
    return [TokenLogprob(token, logprob) for token, logprob in pairs]


def test_tokens_are_stripped_and_summed_per_label() -> None:
    got = read_distribution(alternatives(("B", math.log(0.5)), (" B", math.log(0.3)), ("C\n", math.log(0.2))), SHOWN)
    assert got.probs == {"x": 0.8, "y": 0.2} and got.choice == "x" and got.trusted
    assert math.isclose(got.label_mass, 1.0)


def test_tokens_outside_the_scheme_lower_the_label_mass_and_distrust_the_judgment() -> None:
    got = read_distribution(alternatives(("The", math.log(0.5)), ("B", math.log(0.45)), ("Z", math.log(0.05))), SHOWN)
    assert math.isclose(got.label_mass, 0.45)
    assert not got.trusted and got.choice is None and got.outcome == "exit"
    assert got.probs["x"] == 1.0 and got.confidence == 1.0


def test_a_null_logprob_counts_as_zero_probability() -> None:
    got = read_distribution(alternatives(("B", None), ("C", 0.0)), SHOWN)
    assert got.probs == {"x": 0.0, "y": 1.0} and got.choice == "y"


def test_none_winning_is_an_exit_with_its_probability_as_confidence() -> None:
    got = read_distribution(alternatives(("A", math.log(0.7)), ("B", math.log(0.3))), SHOWN)
    assert got.choice is None and got.none_selected and got.outcome == "exit"
    assert math.isclose(got.confidence, 0.7) and math.isclose(got.none_prob, 0.7)


def test_ties_go_to_the_label_that_sorts_first() -> None:
    got = read_distribution(alternatives(("C", math.log(0.5)), ("B", math.log(0.5))), SHOWN)
    assert got.choice == "x"


def test_no_label_at_all_is_an_untrusted_exit() -> None:
    got = read_distribution(alternatives(("hello", 0.0)), SHOWN)
    assert got.label_mass == 0.0 and not got.trusted and got.choice is None and got.confidence == 0.0


def test_the_trust_threshold_is_configurable() -> None:
    tops = alternatives(("B", math.log(0.6)), ("junk", math.log(0.4)))
    assert read_distribution(tops, SHOWN).choice is None
    assert read_distribution(tops, SHOWN, trust_threshold=0.5).choice == "x"


_logprob = st.one_of(st.none(), st.floats(min_value=-30.0, max_value=0.0))
_token = st.sampled_from(["A", "B", "C", " B", "C ", "D", "\n", "The", ""])


@given(st.lists(st.tuples(_token, _logprob), max_size=20))
def test_the_distribution_is_a_distribution(pairs: list[tuple[str, float | None]]) -> None:
    got = read_distribution(alternatives(*pairs), SHOWN)
    total = sum(got.probs.values()) + got.none_prob
    assert got.label_mass == 0.0 or math.isclose(total, 1.0, rel_tol=1e-9)
    assert all(0.0 <= p <= 1.0 for p in got.probs.values())
    assert got.confidence == max([*got.probs.values(), got.none_prob])
    assert got.choice is None or (got.trusted and got.probs[got.choice] == got.confidence)
    # The order the server lists tokens in never changes the figures.
    assert read_distribution(alternatives(*reversed(pairs)), SHOWN) == got
