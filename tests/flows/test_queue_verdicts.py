"""The feedback queue's form rows checked before they are applied: a correction names one of the tree's answers
(listed, or a template written out filled in), a trace answered meanwhile keeps its verdict, a do-not-record trace
takes none."""

from __future__ import annotations

from pathlib import Path

from flows.queue import NO_CORRECTION, Answer, answers_from, check_verdicts, correction_choices, verdict_form
from gil_core.batch import Verdict
from tests.flows._support import write_task_file
from tests.resolver._support import support_task

TRACKED = "Order 4711 is on its way; the tracking link is in your confirmation email."
DELIVERY = "Standard delivery takes 3 to 5 business days."


def test_a_correction_names_a_tree_answer_and_a_verdict_given_meanwhile_stands() -> None:
    task = support_task("support")
    answers = [
        Answer("listed", "wrong", DELIVERY),
        Answer("template", "wrong", written=TRACKED),  # a template answer, filled in
        Answer("none", "wrong", "None of these"),
        Answer("bare", "wrong"),  # wrong, the right answer not given
        Answer("free", "wrong", written="Call us."),
        Answer("two", "wrong", DELIVERY, written=TRACKED),
        Answer("private", "correct"),
        Answer("meanwhile-same", "correct"),
        Answer("meanwhile-other", "wrong", DELIVERY),
        Answer("meanwhile-untouched", "unanswered"),
        Answer("left", "unanswered"),
    ]
    stored = {name: ("correct", None) for name in ("meanwhile-same", "meanwhile-other", "meanwhile-untouched")}
    checked = check_verdicts(answers, stored, {"private"}, task)
    assert checked.to_apply == [
        Verdict("listed", False, DELIVERY),
        Verdict("template", False, TRACKED),
        Verdict("none", False, "None of these"),
        Verdict("bare", False, None),
    ]
    assert list(checked.refused) == ["free", "two", "private"]
    assert "'Call us.' is none of the tree's answers" in checked.refused["free"]
    assert set(checked.already_answered) == {"meanwhile-same", "meanwhile-other", "meanwhile-untouched"}
    assert checked.unanswered == ["left"]
    stale, *refused = checked.problems  # only the row that says otherwise than the stored verdict is a problem
    assert stale.startswith("`meanwhile-other`: the form said wrong, but it was answered correct")
    assert [problem.split(":")[0] for problem in refused] == ["`free`", "`two`", "`private`"]


def test_the_form_lists_the_tree_answers_and_reads_its_rows_back() -> None:
    task = support_task("support")
    choices = correction_choices(task)
    assert DELIVERY in choices and choices[-1] == task.language.none_of_these
    assert not any("{" in choice for choice in choices)  # templates are written out, not listed
    queue = {
        "task": "support",
        "items": [
            {"trace_id": "t1", "request": "is it <b>here</b>?", "answer": "**yes**", "chosen_by": "queue", "why": "w"},
            {"trace_id": "t2", "request": "and now?", "answer": None, "chosen_by": "random", "why": "w"},
        ],
    }
    form = verdict_form(queue, choices, "2026-01-01 03:00 UTC")
    description = form._description or ""
    assert "is it &lt;b\\>here&lt;/b\\>?" in description  # people's text is shown as text, not markup
    assert "\\*\\*yes\\*\\*" in description and "drawn at random (w)" in description
    answered = form.model_validate({"t1": {"verdict": "wrong", "correction": DELIVERY, "written_correction": " "}})
    assert answers_from(queue, answered) == [Answer("t1", "wrong", DELIVERY, ""), Answer("t2", "unanswered")]
    assert form.model_validate({}).item_0.correction == NO_CORRECTION  # type: ignore[attr-defined]


def test_the_nightly_queue_deployment_waits_for_verdicts(tmp_path: Path) -> None:
    from flows.deployments import build_deployments
    from flows.queue import SCHEDULED_VERDICT_TIMEOUT

    task = write_task_file(tmp_path, "http://127.0.0.1:9/v1")
    deployments = {d.name: d for d in build_deployments(task, tmp_path / "t.jsonl", tmp_path / "v.jsonl")}
    assert deployments["feedback-queue"].parameters == {
        "task_file": str(task.resolve()),
        "wait_for_verdicts": True,
        "verdict_timeout": SCHEDULED_VERDICT_TIMEOUT,
    }
    shorter = build_deployments(task, tmp_path / "t.jsonl", tmp_path / "v.jsonl", verdict_timeout=600)
    assert {d.name: d for d in shorter}["feedback-queue"].parameters["verdict_timeout"] == 600
