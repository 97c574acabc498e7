"""The one escalation rule (gil_core.judge.escalation): what the tiered judge and the router both serve."""

from __future__ import annotations

import math

from gil_core.judge.escalation import reflex_serves


def test_a_confidence_at_the_threshold_is_served_and_below_or_nan_escalates() -> None:
    assert reflex_serves(0.9, 0.9)
    assert not reflex_serves(0.8999, 0.9)
    assert not reflex_serves(math.nan, 0.0)


def test_an_untrusted_or_deferred_answer_escalates_whatever_its_confidence() -> None:
    assert not reflex_serves(1.0, 0.5, trusted=False)
    assert not reflex_serves(1.0, 0.5, deferred=True)
    assert reflex_serves(1.0, 0.5, trusted=True, deferred=False)
