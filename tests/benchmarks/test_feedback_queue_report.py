"""The feedback-queue benchmark's report (benchmarks/feedback_queue.py): the target reads the queue as it ships, with
its random share; the queue's scored picks alone (random share 0) are reported beside it against the same random
verdicts, and never decide the verdict."""

from __future__ import annotations

from benchmarks.feedback_queue import Paired, RunResult, section
from gil_core.learned import QueueWeights


def _runs(*top1: float) -> tuple[RunResult, ...]:
    return tuple(RunResult(top1=value, served=0.0, served_share=0.0, requests=450) for value in top1)


def test_the_scored_picks_are_reported_against_the_same_random_runs_and_do_not_decide_the_verdict() -> None:
    paired = Paired(
        "home",
        (5, 6, 7),
        queue=_runs(0.72, 0.73, 0.71),  # +2 points on every shuffle: misses the target of 5
        random=_runs(0.70, 0.71, 0.69),
        scored=_runs(0.76, 0.77, 0.75),  # +6 points on every shuffle: would meet it
    )
    assert abs(paired.figures("top1")[2] - 2.0) < 1e-9
    assert abs(paired.figures("top1", arm="scored")[2] - 6.0) < 1e-9
    assert not paired.meets()  # the queue as it ships decides

    rendered = section([paired], QueueWeights()).render()
    assert "| home | top-1, the scored picks alone (random share 0) | 3 | 76.0% | 70.0% | +6.0 |" in rendered
    assert "**What the random share costs.**" in rendered
    assert "home +2.0 with the share, +6.0 without it" in rendered
    assert "is missed on home" in rendered


def test_without_the_scored_arm_there_is_no_share_row_or_note() -> None:
    paired = Paired("assistant", (5, 6), queue=_runs(0.95, 0.96), random=_runs(0.88, 0.90))
    rendered = section([paired], QueueWeights()).render()
    assert "scored picks alone" not in rendered
    assert "What the random share costs" not in rendered
    assert "met on assistant" in rendered
