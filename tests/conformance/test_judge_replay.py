"""Replays judge.json: every judgment's distribution, label mass, outcome and none probability, to the bit."""

from __future__ import annotations

from gil_core.judge import read_distribution
from gil_core.llm import TokenLogprob
from gil_core.telemetry.records import CandidateShown
from tests.conformance._fixtures import is_overridden, load_json, report


def test_every_recorded_judgment_reads_to_the_same_distribution() -> None:
    cases = load_json("judge.json", "GIL_COMPAT_JUDGE")
    mismatches = []
    for case in cases:
        shown = [CandidateShown(item["id"], item["shown_as"]) for item in case["shown"]]
        alternatives = [TokenLogprob(item["token"], item["logprob"]) for item in case["top_logprobs"]]
        got = read_distribution(alternatives, shown)
        actual = {
            "distribution": dict(got.probs),
            "label_mass": got.label_mass,
            "outcome": got.outcome,
            "none_prob": got.none_prob,
        }
        expected = {key: case[key] for key in actual}
        if actual != expected:
            mismatches.append((case["trace_id"], case["node"], actual, expected))
    report("judge.json", len(cases) - len(mismatches), len(cases), "judgments bit-exact")
    assert is_overridden("GIL_COMPAT_JUDGE") or len(cases) == 341
    assert not mismatches, mismatches[:3]
