"""The learned-reflex report's paired interval (benchmarks/_learned_report.py): grouped order against mixed order is
the same requests judged twice, so its difference gets an interval for paired proportions (Newcombe, 1998,
method 10)."""

from __future__ import annotations

import math
import random

import pytest

from benchmarks._learned_report import paired_difference
from gil_core.wilson import wilson_interval


def _pairs(*, both: int, only_first: int, only_second: int, neither: int) -> tuple[list[bool], list[bool]]:
    first = [True] * both + [True] * only_first + [False] * only_second + [False] * neither
    second = [True] * both + [False] * only_first + [True] * only_second + [False] * neither
    return first, second


def test_paired_difference_covers_the_true_difference_about_95_percent_of_the_time() -> None:
    # Pairs drawn with known chances (right under both, first only, second only): the interval should hold the
    # true difference about 95% of the time, on samples as small as a category's in the grouped-order table.
    rng = random.Random(7)
    chances = (0.6, 0.08, 0.16)  # true difference 0.08 - 0.16 = -0.08
    covered, trials = 0, 2000
    for _ in range(trials):
        first, second = [], []
        for _ in range(40):
            draw = rng.random()
            first.append(draw < chances[0] + chances[1])
            second.append(draw < chances[0] or chances[0] + chances[1] <= draw < sum(chances))
        _, low, high = paired_difference(first, second)
        covered += low <= -0.08 <= high
    assert 0.93 <= covered / trials <= 0.985


def test_without_correlation_it_is_the_hybrid_score_interval_of_two_wilson_intervals() -> None:
    # a·d = b·c makes the correlation term vanish: the limits are then the square-root combination of each
    # accuracy's distance to its own Wilson limit.
    first, second = _pairs(both=4, only_first=2, only_second=6, neither=3)
    difference, low, high = paired_difference(first, second)
    (l1, u1), (l2, u2) = wilson_interval(6, 15), wilson_interval(10, 15)
    p1, p2 = 6 / 15, 10 / 15
    assert low == pytest.approx(difference - math.hypot(p1 - l1, u2 - p2))
    assert high == pytest.approx(difference + math.hypot(p2 - l2, u1 - p1))


def test_paired_difference_is_antisymmetric_and_narrows_with_more_pairs() -> None:
    first, second = _pairs(both=20, only_first=3, only_second=6, neither=7)
    forward = paired_difference(first, second)
    backward = paired_difference(second, first)
    assert forward[0] == pytest.approx(-backward[0])
    assert (forward[1], forward[2]) == pytest.approx((-backward[2], -backward[1]))
    wider = paired_difference(*_pairs(both=20, only_first=3, only_second=6, neither=7))
    narrower = paired_difference(*_pairs(both=200, only_first=30, only_second=60, neither=70))
    assert wider[0] == pytest.approx(narrower[0])
    assert narrower[2] - narrower[1] < wider[2] - wider[1]
    assert narrower[1] < narrower[0] < narrower[2]


def test_identical_outcomes_differ_by_nothing_and_the_interval_still_has_width() -> None:
    difference, low, high = paired_difference([True, False, True, True], [True, False, True, True])
    assert difference == 0.0 and low < 0.0 < high


def test_paired_difference_refuses_lists_of_other_lengths() -> None:
    with pytest.raises(ValueError, match="equally long"):
        paired_difference([True], [True, False])
