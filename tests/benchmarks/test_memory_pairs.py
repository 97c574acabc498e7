"""Part C's bookkeeping, without a model: how pairs are read and split, how arms decide and how outcomes count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.memory_pairs import (
    Decision,
    FalseHitBudget,
    Lookup,
    Pair,
    SelectedThreshold,
    StaticThreshold,
    read_pairs,
    score,
    split_halves,
)


def lookup(line: int, similarity: float, *, duplicate: bool, own: bool = True, b: str = "how do I reset it") -> Lookup:
    pair = Pair(line, f"question {line}", b, duplicate)
    return Lookup(pair, pair.a if own else "another question", similarity)


def test_a_bad_line_is_named_by_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"a": "x", "b": "y", "duplicate": True}) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{path}:2: not a pair"):
        read_pairs(path)


def test_halves_are_disjoint_and_each_holds_half_of_the_duplicates_and_of_the_others() -> None:
    pairs = [Pair(line, f"a{line}", f"b{line}", line % 4 == 0) for line in range(1, 401)]
    calibration, evaluation = split_halves(pairs, limit=None)
    assert not {p.line for p in calibration} & {p.line for p in evaluation}
    assert len(calibration) + len(evaluation) == 400
    assert sum(p.duplicate for p in calibration) == sum(p.duplicate for p in evaluation) == 50
    small = split_halves(pairs, limit=100)
    assert [len(half) for half in small] == [50, 50]
    assert sum(p.duplicate for p in small[0]) == 25


def test_a_hit_on_another_question_is_a_wrong_entry_and_a_non_duplicate_hit_is_a_false_hit() -> None:
    evaluation = [
        lookup(1, 0.95, duplicate=True),
        lookup(2, 0.95, duplicate=True, own=False),
        lookup(3, 0.95, duplicate=False),
        lookup(4, 0.50, duplicate=False),
    ]
    outcome = score("arm", Decision([True, True, True, False], 0.9), evaluation)
    assert (outcome.right_hits, outcome.wrong_entry_hits, outcome.false_hits) == (1, 1, 1)
    assert outcome.hit_rate == 0.5 and outcome.false_hit_rate == 0.5
    assert outcome.precision == pytest.approx(1 / 3)


async def test_the_guard_refuses_a_hit_whose_request_differs_in_a_negation() -> None:
    evaluation = [lookup(1, 0.97, duplicate=False, b="question 1 not")]
    plain = await StaticThreshold(0.8).decide([], evaluation)
    guarded = await StaticThreshold(0.8, guard=True).decide([], evaluation)
    assert plain.served == [True] and guarded.served == [False]


async def test_a_selected_threshold_serves_only_where_the_calibration_half_met_the_precision() -> None:
    # Calibration: duplicates above 0.9 are all right, below it a mix.
    calibration = [lookup(i, 0.91 + i / 1000, duplicate=True) for i in range(30)]
    calibration += [lookup(100 + i, 0.85, duplicate=i % 2 == 0) for i in range(20)]
    decision = await SelectedThreshold(0.99).decide(calibration, [lookup(1, 0.95, duplicate=True)])
    assert decision.threshold == pytest.approx(0.91) and decision.served == [True]
    unreachable = await SelectedThreshold(0.99).decide(calibration[30:], [lookup(1, 0.95, duplicate=True)])
    assert unreachable.threshold is None and unreachable.served == [False]


async def test_a_false_hit_budget_sets_the_threshold_just_above_the_allowed_non_duplicates() -> None:
    calibration = [lookup(i, 0.5 + i / 100, duplicate=False) for i in range(40)]  # 0.50 … 0.89
    decision = await FalseHitBudget(0.05).decide(calibration, [lookup(1, 0.885, duplicate=True)])
    # 5% of 40 = 2 non-duplicates may hit: 0.89 and 0.88, so the threshold sits just above 0.87.
    assert decision.threshold is not None and 0.87 < decision.threshold < 0.8701
    assert decision.served == [True]
