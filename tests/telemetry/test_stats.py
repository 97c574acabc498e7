"""Stats over a real store: per-mode accuracy with Wilson intervals, rates, cost windows (recorded or repriced)
and misroutes, each counted once per trace (feedback supersedes) and never across tasks."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest

from gil_core.errors import ConfigurationError
from gil_core.memory import Recall
from gil_core.memory.guard import HitGuard
from gil_core.ontology import Node, Option, Tree
from gil_core.telemetry import CallRecord, EnergyModel, TelemetryStore, TraceRecord
from gil_core.telemetry.stats import WILSON_Z, price_expression, wilson_bounds

START = datetime(2026, 1, 1, tzinfo=UTC)
REFUND, INVOICE, RESET = "Refunds take 5 days", "Invoices are emailed", "Use the reset link"
TREE = Tree(
    Node(
        "root",
        children=(
            Node("billing", options=(Option("refund", text=REFUND), Option("invoice", text=INVOICE))),
            Node("account", options=(Option("reset", text=RESET),)),
        ),
    )
)


def walk(*nodes: str) -> list[dict[str, Any]]:
    """A path that accepted each next node in turn and stopped at the last one."""
    steps = [{"node": node, "layer": depth + 1, "chosen": following, "p": 0.9, "outcome": "accept"}
             for depth, (node, following) in enumerate(pairwise(nodes))]  # fmt: skip
    return [*steps, {"node": nodes[-1], "layer": len(nodes), "chosen": None, "p": 0.4, "outcome": "exit"}]


def trace(number: int, mode: str, verdict: str | None = None, *, task: str = "support", **fields: Any) -> TraceRecord:
    return TraceRecord(
        trace_id=f"t{number}",
        created_at=START + timedelta(seconds=number),
        task=task,
        state=f"request {number}",
        mode=mode,
        feedback_verdict=verdict,
        **fields,
    )


def call(number: int, trace_id: str, role: str, energy: float, tokens: tuple[int, int, int]) -> CallRecord:
    prompt, cached, completion = tokens
    return CallRecord(
        call_id=f"c{number}",
        trace_id=trace_id,
        created_at=START,
        role=role,  # type: ignore[arg-type]
        model="m",
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        energy=energy,
    )


@pytest.fixture
def store(tmp_path: Path) -> TelemetryStore:
    return TelemetryStore(tmp_path / "store")


def test_modes_are_counted_judged_and_sorted_by_requests_then_name(store: TelemetryStore) -> None:
    modes = ["fallback", "habit/answer", "habit/answer", "memory", "memory", "abstain"]
    verdicts = ["correct", "correct", "wrong", "correct", "correct", None]
    for number, (mode, verdict) in enumerate(zip(modes, verdicts, strict=True)):
        store.record_trace(trace(number, mode, verdict))
    stats = store.stats("support", window=10)
    assert [(m.mode, m.requests, m.judged, m.correct) for m in stats.modes] == [
        ("habit/answer", 2, 2, 1),
        ("memory", 2, 2, 2),
        ("abstain", 1, 0, 0),
        ("fallback", 1, 1, 1),
    ]
    habit, memory, abstain, _ = stats.modes
    assert habit.accuracy == 0.5 and memory.accuracy == 1.0
    assert memory.high == 1.0 and 0.0 < memory.low < 1.0  # type: ignore[operator]
    assert abstain.accuracy is None and abstain.low is None and abstain.high is None


def test_feedback_supersedes_the_trace_so_it_is_counted_once(store: TelemetryStore) -> None:
    store.record_trace(trace(1, "fallback"))
    store.record_trace(trace(1, "fallback", "wrong"))
    (mode,) = store.stats("support", window=1).modes
    assert (mode.requests, mode.judged, mode.correct, mode.low) == (1, 1, 0, 0.0)


def test_habit_and_memory_rates_and_memory_failures(store: TelemetryStore) -> None:
    failed = {"threshold": 0.8, "hit": False, "error": "lance unavailable"}
    missed = {"source": "t0", "similarity": 0.5, "threshold": 0.8, "hit": False}
    store.record_trace(trace(0, "habit/answer", recall=missed))
    store.record_trace(trace(1, "habit/template", recall=failed))
    store.record_trace(trace(2, "memory", recall={**missed, "similarity": 0.9, "hit": True}))
    store.record_trace(trace(3, "fallback", recall=failed))
    stats = store.stats("support", window=4)
    assert (stats.habit_rate, stats.memory_rate, stats.memory_failures) == (0.5, 0.25, 2)


def test_a_hit_a_check_took_back_is_a_miss_not_a_memory_failure(store: TelemetryStore) -> None:
    """Memory worked when the hit guard (or the learned judge, or a verification) took its hit back: the recall
    says why in ``refused``, and stats do not count it as a failed lookup; nor rows stored before that key, which
    said it in ``error``. A lookup that failed counts, whatever its message quotes."""
    remembered = Recall(0.8, hit=True, source="t0", similarity=0.95, answer="Sent.", text="refund 5 for order 7")
    refused = HitGuard().screen(remembered, "refund 50 for order 7")
    assert not refused.hit and refused.error is None and (refused.refused or "").startswith("guard: numbers differ")
    store.record_trace(trace(0, "fallback", recall=refused.to_json()))
    for index, why in enumerate(("guard: numbers differ", "learned: the learned judge serves x", "verification "
                                 "failed: HTTP 500"), start=1):  # fmt: skip
        store.record_trace(trace(index, "fallback", recall={**refused.to_json(), "refused": None, "error": why}))
    store.record_trace(trace(4, "fallback", recall={"threshold": 0.8, "hit": False, "error": "OSError: guard: x"}))
    stats = store.stats("support", window=5)
    assert (stats.memory_rate, stats.memory_failures) == (0.0, 1)


def test_hits_taken_back_are_counted_per_check_with_what_memory_would_have_served_and_what_was_served(
    store: TelemetryStore,
) -> None:
    """Per check, the hits it took back; of those whose own and remembered answers are confirmed, how many the
    remembered answer would have got wrong and how many the rest of the way got right. Rows that said it in
    ``error`` (before ``refused``) count under their check; failed lookups and other tasks' rows do not."""
    remembered = Recall(0.8, hit=True, source="t0", similarity=0.95, answer=REFUND, text="refund 5 for order 7")
    guarded = HitGuard().screen(remembered, "refund 5 for order 8").to_json()
    store.record_trace(trace(0, "habit/answer", "correct", output=REFUND))  # the remembered request
    store.record_trace(trace(1, "habit/answer", "correct", output=INVOICE, recall=guarded))  # memory: wrong
    store.record_trace(trace(2, "habit/answer", "correct", output=REFUND, recall=guarded))  # memory: right
    learned = {**guarded, "refused": "learned: the learned judge serves invoice"}
    store.record_trace(trace(3, "fallback", "wrong", output="Hello", feedback_correction=REFUND, recall=learned))
    legacy = {**guarded, "refused": None, "error": "learned: the log shows memory below the task's precision"}
    store.record_trace(trace(4, "habit/answer", recall=legacy))  # no verdict: not judged
    gone = {**guarded, "source": "t99"}  # the remembered request's trace is not in the store: not judged
    store.record_trace(trace(5, "habit/answer", "correct", output=RESET, recall=gone))
    store.record_trace(trace(6, "fallback", recall={"threshold": 0.8, "hit": False, "error": "lance unavailable"}))
    store.record_trace(trace(7, "habit/answer", "correct", output=INVOICE, recall=guarded, task="other"))
    stats = store.stats("support", window=10)
    assert [(r.check, r.hits, r.judged, r.remembered_wrong, r.answered_right) for r in stats.memory_refused] == [
        ("guard", 3, 2, 1, 2),
        ("learned judge", 1, 1, 0, 0),
        ("memory cut", 1, 0, 0, 0),
    ]
    assert stats.memory_failures == 1
    text = stats.render()
    assert "memory refused" in text and "memory wrong" in text
    assert [line.split() for line in text.splitlines() if line.startswith("guard")] == [["guard", "3", "2", "1", "2"]]
    assert stats.to_json()["memory_refused"][0] == {
        "check": "guard", "hits": 3, "judged": 2, "remembered_wrong": 1, "answered_right": 2
    }  # fmt: skip
    assert store.stats("nobody", window=10).memory_refused == ()


def test_other_tasks_are_never_counted(store: TelemetryStore) -> None:
    store.record_trace(trace(0, "memory"))
    store.record_trace(trace(1, "memory", task="other"))
    assert store.stats("support", window=1).requests == 1
    empty = store.stats("nobody", window=1)
    assert (empty.requests, empty.modes, empty.windows, empty.habit_rate) == (0, (), (), None)


def test_cost_windows_are_consecutive_chunks_in_request_order(store: TelemetryStore) -> None:
    for number in (4, 0, 3, 1, 2):  # written out of order: windows follow created_at
        store.record_trace(trace(number, "fallback", energy=float(10**number)))
    stats = store.stats("support", window=2)
    assert [(w.first, w.requests, w.total_energy, w.mean_energy) for w in stats.windows] == [
        (0, 2, 11.0, 5.5),
        (2, 2, 1100.0, 550.0),
        (4, 1, 10000.0, 10000.0),
    ]
    assert not stats.repriced


def test_repricing_prices_chat_calls_from_tokens_and_keeps_embedding_energy(store: TelemetryStore) -> None:
    store.record_trace(
        trace(0, "habit/answer", energy=999.0),
        [call(0, "t0", "embed", 3.0, (7, 0, 0)), call(1, "t0", "judge", 50.0, (100, 60, 1))],
    )
    store.record_trace(trace(1, "fallback", energy=999.0), [call(2, "t1", "fallback", 80.0, (10, 0, 20))])
    store.record_trace(trace(2, "abstain", energy=0.0))  # no calls at all
    pricing = EnergyModel(fixed=1.0, per_fresh_prompt_token=0.5, per_cached_token=0.1, per_output_token=2.0)
    stats = store.stats("support", window=1, pricing=pricing)
    # t0: embed 3 + judge (1 + 0.5·40 + 0.1·60 + 2·1 = 29); t1: 1 + 0.5·10 + 2·20 = 46
    assert [w.total_energy for w in stats.windows] == [32.0, 46.0, 0.0]
    assert stats.repriced


def test_misroutes_are_confirmed_habits_outside_the_last_nodes_subtree(store: TelemetryStore) -> None:
    store.record_trace(trace(0, "habit/answer", "correct", path=walk("root", "billing"), output=REFUND))
    store.record_trace(
        trace(1, "partial", "wrong", path=walk("root", "billing"), output="x", feedback_correction=f" {RESET} ")
    )
    store.record_trace(trace(2, "partial", "correct", path=walk("root", "billing"), output=RESET))
    store.record_trace(trace(3, "fallback", "correct", path=walk("root"), output=RESET))  # root holds all
    store.record_trace(trace(4, "partial", "correct", path=walk("root", "account"), output="not a habit"))
    store.record_trace(trace(5, "memory", "correct", output=RESET))  # no path: nothing routed
    store.record_trace(trace(6, "partial", "wrong", path=walk("root", "account"), output=RESET))  # no answer
    misroutes = store.stats("support", window=10, tree=TREE).misroutes
    assert misroutes is not None
    assert (misroutes.checked, misroutes.count) == (4, 2)
    assert [(m.node, m.habit, m.count) for m in misroutes.by_node] == [("billing", "reset", 2)]
    assert store.stats("support", window=10).misroutes is None


def test_json_and_text_reports_carry_the_figures(store: TelemetryStore) -> None:
    store.record_trace(trace(0, "habit/answer", "correct", path=walk("root", "billing"), output=REFUND))
    stats = store.stats("support", window=5, tree=TREE)
    document = json.loads(json.dumps(stats.to_json()))
    assert document["modes"][0] == {
        "mode": "habit/answer",
        "requests": 1,
        "judged": 1,
        "correct": 1,
        "accuracy": 1.0,
        "low": pytest.approx(0.2065, abs=1e-4),
        "high": 1.0,
    }
    assert document["windows"] == [{"first": 0, "requests": 1, "total_energy": 0.0, "mean_energy": 0.0}]
    assert document["misroutes"] == {"checked": 1, "count": 0, "by_node": []}
    text = stats.render()
    assert "habit/answer" in text and "100.0%" in text and "misroutes: 0 of 1 checked" in text


def test_a_window_holds_at_least_one_request(store: TelemetryStore) -> None:
    with pytest.raises(ConfigurationError, match="window"):
        store.stats("support", window=0)


def bounds(correct: list[int], judged: list[int]) -> list[tuple[float | None, float | None]]:
    frame = pl.DataFrame({"correct": correct, "judged": judged})
    low, high = wilson_bounds(pl.col("correct"), pl.col("judged"))
    return list(frame.select(low.alias("low"), high.alias("high")).iter_rows())


trials = st.integers(1, 10_000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n)))


@settings(max_examples=40, deadline=None)
@given(cases=st.lists(trials, min_size=1, max_size=25))
def test_wilson_bounds_hold_the_estimate_and_pin_the_extremes(cases: list[tuple[int, int]]) -> None:
    correct, judged = [k for k, _ in cases], [n for _, n in cases]
    for (k, n), (low, high) in zip(cases, bounds(correct, judged), strict=True):
        assert low is not None and high is not None
        assert 0.0 <= low <= k / n <= high <= 1.0
        assert (low == 0.0) == (k == 0) and (high == 1.0) == (k == n)
        expected = binomtest(k, n).proportion_ci(method="wilson")
        assert low == pytest.approx(0.0 if k == 0 else expected.low, abs=1e-12)
        assert high == pytest.approx(1.0 if k == n else expected.high, abs=1e-12)


def test_wilson_bounds_are_null_without_verdicts_and_use_the_reference_z() -> None:
    assert bounds([0], [0]) == [(None, None)]
    assert WILSON_Z == 1.959963984540054


@settings(max_examples=50, deadline=None)
@given(
    tokens=st.tuples(st.integers(0, 10**5), st.integers(0, 10**5), st.integers(0, 10**4)),
    coefficients=st.tuples(*[st.floats(0, 100) for _ in range(4)]),
)
def test_the_price_expression_is_the_energy_models_price(
    tokens: tuple[int, int, int], coefficients: tuple[float, float, float, float]
) -> None:
    model = EnergyModel(*coefficients)
    frame = pl.DataFrame([tokens], schema=["prompt_tokens", "cached_tokens", "completion_tokens"], orient="row")
    assert frame.select(price_expression(model)).item() == pytest.approx(model.price(*tokens), rel=1e-12)
