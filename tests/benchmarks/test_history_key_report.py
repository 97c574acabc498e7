"""The history-key benchmark's reading of a run (benchmarks/history_key.py): who settled each new ticket, from the
steps its trace recorded, and the shares the report prints."""

from __future__ import annotations

from benchmarks.history_key import ArmResult, Outcome, decider_of, section


def test_a_walk_is_the_learned_reflex_s_only_where_it_decided_every_step() -> None:
    learned = {"decided_by": "learned"}
    assert decider_of({"mode": "memory"}, []) == "memory"
    assert decider_of({"mode": "fallback"}, [learned]) == "generation"  # the walk did not settle it
    assert decider_of({"mode": "habit/template"}, [learned, learned]) == "learned"
    assert decider_of({"mode": "habit/answer"}, [learned, {"decided_by": "llm"}]) == "llm"
    assert decider_of({"mode": "none"}, [{}]) == "llm"  # a step that says nothing was the LLM's (older traces)


def test_the_report_gives_each_arm_s_share_right_and_who_settled_what() -> None:
    outcomes = [Outcome("habit/answer", True, "learned")] * 3 + [Outcome("memory", False, "memory", holds=True)]
    rendered = section([ArmResult("category column", "applied 4", outcomes)], history=4, new=4).render()
    assert "| category column: new tickets right | (reported) | 75.0% (3/4; 95% CI" in rendered
    assert "| learned 3/3, memory 0/1 | 1 | habit/answer 3, memory 1 |" in rendered
