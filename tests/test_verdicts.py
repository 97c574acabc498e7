"""What a verdict confirms (gil_core.verdicts): one rule, as a function and as a Polars expression that agree."""

from __future__ import annotations

import itertools

import polars as pl

from gil_core.verdicts import confirmed_answer, confirmed_answer_expr

VERDICTS = ("correct", "wrong", None)
TEXTS = ("refund sent", "  refund sent \n", "", "   ", None)


def test_correct_confirms_the_output_wrong_the_correction_stripped_and_empty_confirms_nothing() -> None:
    assert confirmed_answer("correct", " yes ", "no") == "yes"
    assert confirmed_answer("wrong", "yes", " no\n") == "no"
    assert confirmed_answer("wrong", "yes", None) is None
    assert confirmed_answer("wrong", "yes", "  ") is None
    assert confirmed_answer("correct", "", "no") is None
    assert confirmed_answer(None, "yes", "no") is None


def test_the_expression_agrees_with_the_function_on_every_combination() -> None:
    rows = list(itertools.product(VERDICTS, TEXTS, TEXTS))
    frame = pl.DataFrame(
        {
            "feedback_verdict": [v for v, _, _ in rows],
            "output": [o for _, o, _ in rows],
            "feedback_correction": [c for _, _, c in rows],
        },
        schema={"feedback_verdict": pl.String, "output": pl.String, "feedback_correction": pl.String},
    )
    got = frame.select(confirmed_answer_expr().alias("answer"))["answer"].to_list()
    assert got == [confirmed_answer(*row) for row in rows]
