"""Replays differentiation.json: capacity signals at two headrooms and the anchored signals of its run."""

from __future__ import annotations

from typing import Any

from gil_core.habits.differentiation import AnchoredSignal, CapacitySignal, anchored_signals, capacity_signals
from tests.conformance._fixtures import load_json, report
from tests.conformance.test_promotion_replay import fixture_evidence, quiet_tree, run_zero_modes, same


def capacity_json(signal: CapacitySignal) -> dict[str, Any]:
    return {"node": signal.node, "candidates": signal.candidates, "capacity": signal.capacity}


def anchored_json(signal: AnchoredSignal) -> dict[str, Any]:
    return {
        "kind": signal.kind.value,
        "node": signal.node,
        "output": signal.output,
        "target": signal.target,
        "support": signal.support,
        "sources": list(signal.sources),
    }


def test_every_signal_list_matches() -> None:
    runs = load_json("differentiation.json")["runs"]
    last_round = load_json("promotion.json")["rounds"][-1]
    modes = run_zero_modes()
    failures = []
    total = 0
    for index, run in enumerate(runs):
        assert run["candidates"] == last_round["candidates"]  # the reference says so; the replay relies on it
        tree = quiet_tree(run["tree"], f"differentiation.json run {index}")
        evidence = fixture_evidence(run["candidates"], modes)
        signals = {
            "capacity_0": [capacity_json(s) for s in capacity_signals(tree, 0)],
            "capacity_2": [capacity_json(s) for s in capacity_signals(tree, 2)],
            "anchored": [
                anchored_json(s) for s in anchored_signals(tree, evidence, min_support=run["n_min"], never=run["never"])
            ],
        }
        assert set(signals) == set(run["expected"])
        for name, got in signals.items():
            total += 1
            if not same(got, run["expected"][name]):
                failures.append((index, name, got, run["expected"][name]))
    report(
        "differentiation.json", total - len(failures), total, "signal lists (capacity at headroom 0 and 2, anchored)"
    )
    assert total == 3 and not failures, failures
