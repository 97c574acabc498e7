"""What a verdict confirms: the one rule every reader of feedback uses (memory, habits and their reviews, the
per-layer thresholds, the learned judge's log, stats).

A verdict ``"correct"`` confirms the trace's output; ``"wrong"`` confirms its correction, when one was given.
Either is stripped of surrounding white space, and an empty or missing text confirms nothing (None): a wrong
verdict without a correction only withdraws the answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

__all__ = ["confirmed_answer", "confirmed_answer_expr"]


def confirmed_answer(verdict: str | None, output: str | None, correction: str | None) -> str | None:
    """The answer ``verdict`` confirms (module doc), or None."""
    if verdict == "correct":
        answer = output
    elif verdict == "wrong":
        answer = correction
    else:
        return None
    answer = (answer or "").strip()
    return answer or None


def confirmed_answer_expr(
    verdict: str = "feedback_verdict", output: str = "output", correction: str = "feedback_correction"
) -> pl.Expr:
    """The same rule over a frame's columns: a String expression, null where nothing is confirmed."""
    import polars as pl  # only the vectorised readers need it

    answer = (
        pl.when(pl.col(verdict) == "correct")
        .then(pl.col(output))
        .when(pl.col(verdict) == "wrong")
        .then(pl.col(correction))
        .str.strip_chars()
    )
    return pl.when(answer.str.len_chars() > 0).then(answer)
