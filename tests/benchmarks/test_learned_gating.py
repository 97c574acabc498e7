"""The learned judge's gating replica (benchmarks/learned_gating.py) on the support stream: it learns from the
verdicts it replays, counts what it did not serve by reason, and writes its section only where it is told. No
accuracy target is asserted here: those are the benchmark's findings."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import learned_gating
from benchmarks.feedback_queue import STREAMS, embed_stream
from gil_core.local import MiniLMEmbeddingModel
from gil_core.tasks import LearnedPolicy


@pytest.fixture(scope="module")
def support() -> learned_gating.Embedded:
    spec = replace(next(spec for spec in STREAMS if spec.name == "support"), size=250)
    return asyncio.run(embed_stream(spec, MiniLMEmbeddingModel()))


@pytest.mark.heavy
@pytest.mark.slow
def test_the_replay_learns_from_its_verdicts_and_accounts_for_every_request(support: learned_gating.Embedded) -> None:
    outcome = learned_gating.measure(support, LearnedPolicy(precision=0.97), loco=False, grouped=True)
    assert outcome.measured > 0
    assert len(outcome.answered) == len(support.texts)  # every request answered once, right or not
    # each request served, guessed (the stand-in did not settle a node, the learned choice did) or refused
    assert outcome.served + outcome.guessed + sum(outcome.refused.values()) == outcome.measured
    assert outcome.served_right <= outcome.served and outcome.guessed_right <= outcome.guessed
    assert outcome.right == outcome.served_right + outcome.guessed_right
    assert outcome.served_right > 0  # its rules serve only on logged evidence: the replayed verdicts made some
    # Grouped order: each category counted on the same requests in both orders, the worst difference reported.
    assert outcome.grouped and outcome.grouped_worst is not None
    differences = [100 * (grouped - mixed) for _, grouped, mixed in outcome.grouped.values()]
    assert outcome.grouped_worst == min(0.0, *differences)


@pytest.mark.heavy
@pytest.mark.slow
def test_leave_one_category_out_sends_each_category_to_a_tree_without_it(support: learned_gating.Embedded) -> None:
    outcome = learned_gating.measure(support, LearnedPolicy(precision=0.97, unseen=1.0), loco=True)
    categories = {category for category in learned_gating._categories(support) if category is not None}
    assert set(outcome.loco_folds) <= categories and outcome.loco_folds
    assert outcome.loco_sent == sum(int(fold.split("/")[1]) for fold in outcome.loco_folds.values())
    assert 0 <= outcome.loco_served <= outcome.loco_sent


@pytest.mark.heavy
@pytest.mark.slow
def test_the_section_is_written_only_into_the_file_named(tmp_path: Path) -> None:
    target = tmp_path / "BENCHMARKS.md"
    target.write_text("# Benchmarks\n\n## Someone else's\n\nkept\n", encoding="utf-8")
    learned_gating.main(["--quick", "--streams", "support", "--no-loco", "--output", str(target)])
    text = target.read_text(encoding="utf-8")
    assert "## Someone else's\n\nkept" in text
    assert f"## {learned_gating.TITLE}" in text and "| support: default |" in text
