"""The judge cost model: its fit, its prices, and the samples it reads from the log."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gil_core.habits.costs import (
    CostModelError,
    CostSample,
    JudgeCostModel,
    evidence_from_row,
    mean_judge_energy,
    read_cost_samples,
    read_evidence,
    shown_chars,
)
from gil_core.telemetry import TelemetryStore
from tests.habits.test_promotion import record_request


def sample(chars: int, energy: float, node: str | None = None) -> CostSample:
    return CostSample(chars=chars, energy=energy, state_chars=30, none_chars=5, node=node)


def test_a_noiseless_line_is_recovered_exactly() -> None:
    model = JudgeCostModel.fit([sample(chars, 20.0 + 0.5 * chars) for chars in (100, 150, 200, 250)])
    assert (model.fixed, model.per_char, model.mean_state_chars, model.none_chars) == (20.0, 0.5, 30.0, 5.0)


@given(
    fixed=st.integers(0, 500),
    per_char=st.integers(0, 64).map(lambda n: n / 16),
    chars=st.lists(st.integers(1, 2000), min_size=2, max_size=30).filter(lambda c: len(set(c)) > 1),
)
def test_any_non_negative_line_is_recovered(fixed: int, per_char: float, chars: list[int]) -> None:
    model = JudgeCostModel.fit([sample(c, fixed + per_char * c) for c in chars])
    assert math.isclose(model.per_char, per_char, abs_tol=1e-9)
    assert math.isclose(model.fixed, fixed, abs_tol=1e-6)


def test_a_marginal_habit_costs_its_characters_and_a_new_call_a_whole_typical_prompt() -> None:
    model = JudgeCostModel(fixed=25.0, per_char=0.25, mean_state_chars=36.0, none_chars=4.0)
    assert model.marginal(80) == 20.0
    assert model.new_call(80) == 25.0 + 0.25 * (36 + 4 + 80)


def test_a_falling_line_is_priced_at_the_mean_energy() -> None:
    model = JudgeCostModel.fit([sample(100, 60.0), sample(200, 40.0)])
    assert (model.fixed, model.per_char) == (50.0, 0.0)


def test_a_line_below_the_origin_is_fitted_through_it() -> None:
    model = JudgeCostModel.fit([sample(100, 10.0), sample(200, 30.0)])  # OLS: −10 + 0.2·chars
    assert model.fixed == 0.0
    assert math.isclose(model.per_char, (100 * 10 + 200 * 30) / (100**2 + 200**2))


@pytest.mark.parametrize(
    "samples",
    [[], [sample(100, 50.0)], [sample(100, 50.0), sample(100, 60.0)]],
    ids=["none", "one", "all-the-same-length"],
)
def test_too_few_or_alike_samples_cannot_be_fitted(samples: list[CostSample]) -> None:
    with pytest.raises(CostModelError):
        JudgeCostModel.fit(samples)


def test_shown_characters_count_code_points_of_request_none_labels_and_descriptions() -> None:
    assert shown_chars("환불 언제 돼요", "해당 없음", [("환불", "돈을 돌려받기"), ("배송", "")]) == 8 + 5 + 2 + 7 + 2


def test_mean_judge_energy_is_per_node_sorted_by_id() -> None:
    samples = [sample(10, 4.0, "shipping"), sample(10, 6.0, "billing"), sample(10, 8.0, "shipping"), sample(10, 1.0)]
    assert list(mean_judge_energy(samples).items()) == [("billing", 6.0), ("shipping", 6.0)]


def test_samples_are_read_from_judge_calls_in_request_order(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path)
    shown = [("billing", "money"), ("shipping", "parcels")]
    record_request(store, 1, state="where is it", judged=[("root", shown, 70.0)], fallback_energy=100.0)
    record_request(store, 0, state="refund?", judged=[("root", shown, 60.0), ("billing", shown[:1], 40.0)])
    record_request(store, 2, state="late one", judged=[("root", shown, 90.0)])
    samples = read_cost_samples(store, "support", none_text="None of these", upto=2)
    assert samples == [
        CostSample(chars=7 + 13 + 7 + 5 + 8 + 7, energy=60.0, state_chars=7, none_chars=13, node="root"),
        CostSample(chars=7 + 13 + 7 + 5, energy=40.0, state_chars=7, none_chars=13, node="billing"),
        CostSample(chars=11 + 13 + 7 + 5 + 8 + 7, energy=70.0, state_chars=11, none_chars=13, node="root"),
    ]
    assert read_cost_samples(TelemetryStore(tmp_path / "empty"), "support", none_text="x") == []


def test_evidence_is_read_from_generated_traces_in_arrival_order(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path)
    record_request(store, 2, path=("root", "billing"), output="Late.", verdict="correct", fallback_energy=50.0)
    record_request(
        store, 0, path=("root", "shipping"), mode="partial", output="A.", verdict="correct", fallback_energy=80.0
    )
    record_request(
        store, 1, path=("root", "billing"), habit="refund", mode="habit/answer", output="Refunds take 5 days."
    )
    record_request(store, 3, output="Wrong.", verdict="wrong", correction="Right.", fallback_energy=70.0)
    evidence = read_evidence(store, "support", upto=3)
    assert [(t.trace_id, t.evidence.anchor, t.evidence.mode, t.fallback_energy) for t in evidence] == [
        ("t-0000", "shipping", "partial", 80.0),
        ("t-0002", "billing", "fallback", 50.0),
    ]
    [last] = [t for t in read_evidence(store, "support") if t.trace_id == "t-0003"]
    assert (last.evidence.verdict, last.evidence.correction) == ("wrong", "Right.")


def test_a_trace_that_walked_no_node_is_no_evidence() -> None:
    row = {"state": "hi", "path": "[]", "mode": "fallback", "output": "Hello.", "feedback_verdict": "correct"}
    assert evidence_from_row({**row, "feedback_correction": None, "explored_output": None}) is None
    walked = evidence_from_row(
        {**row, "path": '[{"node": "root"}]', "feedback_correction": None, "explored_output": None}
    )
    assert walked is not None and (walked.anchor, walked.verdict) == ("root", "correct")
