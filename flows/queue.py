"""feedback-queue: the unconfirmed answers whose verdicts would teach the learned judge most, issued and published
as a table artifact for the person who answers them (``gil_core.learned.queue``).

With ``wait_for_verdicts`` (the nightly deployment ``gil serve`` runs sets it) the run then pauses with a form in
the Prefect UI: above it every queued request with Gil's answer and why it is asked about; one row per answer
below (unanswered, correct or wrong, and for a wrong one the right answer), every row unanswered until set. A
correction on a task whose tree has answers names one of them: chosen from the tree's answer texts, or, for a
template answer, written out filled in; written text that is none of the tree's answers is refused and reported.
On resume the answered rows are applied like ``gil feedback`` (``gil_core.batch_feedback.apply_verdicts``: memory,
habit statistics, and the learned judge refits); a trace given its verdict meanwhile (``gil feedback``,
apply-feedback) keeps that verdict and counts once. Nobody answering within ``verdict_timeout`` leaves every row
unanswered and the run Completed (an issued trace is not queued again: answer it with ``gil feedback``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import polars as pl
from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.input import RunInput
from pydantic import BaseModel, Field, create_model

from flows._prefect import artifact_key, gil_task
from flows.batch import publish_stats
from flows.review import deadline_after, wait_for_answers
from gil_core.batch import Verdict
from gil_core.batch_feedback import apply_verdicts
from gil_core.habits.attribution import AnswerIndex
from gil_core.learned import DEFAULT_RANDOM_SHARE
from gil_core.ontology.model import OptionKind
from gil_core.runtime import issue_task_queue, open_runtime
from gil_core.taskfile import load_task_file
from gil_core.tasks import TaskDefinition
from gil_core.telemetry import TelemetryStore

QUEUE_SIZE = 20
VERDICT_TIMEOUT = 7 * 24 * 3600  # a queue issued by hand waits up to a week for its verdicts
# The nightly queue gives up an hour before the next one is issued.
SCHEDULED_VERDICT_TIMEOUT = 23 * 3600
NO_CORRECTION = "(no correction)"  # the correction list's first entry, the default


def queue_rows(queue: dict[str, Any]) -> list[dict[str, Any]]:
    """The artifact's table: one row per answer to check, queue-chosen first (best first), then the random share."""
    return [
        {
            "trace_id": item["trace_id"],
            "request": item["request"],
            "answer": item["answer"],
            "chosen_by": item["chosen_by"],
            "why": item["why"],
            "score": round(item["score"], 3),
            "chance": round(item["chance"], 4),
        }
        for item in queue["items"]
    ]


@gil_task(name="issue feedback queue")
async def issue_queue_task(task_file: str, size: int, random_share: float) -> dict[str, Any]:
    """Rank the task's unconfirmed answers by its learned judge's current state and record the queue as issued.
    No retries: a queue written and then retried would be issued twice."""
    loaded = load_task_file(task_file)
    if loaded.task.policy.learned is None:  # nothing ranks its answers: the nightly run says so and ends
        get_run_logger().info("task %r has no learned_reflex: no feedback queue", loaded.task.name)
        return {"task": loaded.task.name, "queue_id": None, "eligible": 0, "items": []}
    queue = await issue_task_queue(loaded, size=size, random_share=random_share)
    return queue.to_json()


# -- what a person sees -----------------------------------------------------------------------------------------


def correction_choices(task: TaskDefinition) -> tuple[str, ...]:
    """The corrections the form lists: the tree's answer texts in file order, then the contract's "none of these"
    (what the learned judge learns a correction as); empty when the tree has no answer, and then a correction is
    free text."""
    texts = [
        option.text.strip() for option, _ in task.tree.options() if option.kind is OptionKind.ANSWER and option.text
    ]
    has_templates = any(option.kind is OptionKind.TEMPLATE for option, _ in task.tree.options())
    if not texts and not has_templates:
        return ()
    return tuple(dict.fromkeys([*texts, task.language.none_of_these]))


def verdict_row(choices: Sequence[str]) -> type[BaseModel]:
    """One row of the form: the verdict, and for a wrong answer the right one (listed ``choices``, or written)."""
    # create_model's field definitions, (type, FieldInfo); a Literal is a typing special form, not a type, to mypy
    verdict: tuple[Any, Any] = (
        Literal["unanswered", "correct", "wrong"],
        Field(
            default="unanswered", description="correct: Gil's answer is right; wrong: it is not; unanswered: no verdict"
        ),
    )
    if not choices:
        correction = (str, Field(default="", description="when wrong: the right answer"))
        return create_model("VerdictRow", verdict=verdict, correction=correction)
    listed: tuple[Any, Any] = (
        Literal[(NO_CORRECTION, *choices)],  # type: ignore[valid-type]  # the tree's answers, known at run time
        Field(default=NO_CORRECTION, description="when wrong: the right answer, one of the tree's"),
    )
    written = (
        str,
        Field(default="", description="when wrong and the right answer is a template: write it out filled in"),
    )
    return create_model("VerdictRow", verdict=verdict, correction=listed, written_correction=written)


def brief(text: str | None, limit: int = 70) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    line = " ".join((text or "").split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


_MARKDOWN = re.compile(r"([\\`*_\[\]{}#|>!~])")


def plain(text: str | None) -> str:
    """A request or answer as literal markdown text on one line (people's text: no markup, no raw HTML)."""
    line = " ".join((text or "").split()) or "(empty)"
    return _MARKDOWN.sub(r"\\\1", line).replace("<", "&lt;")


def form_description(queue: Mapping[str, Any], choices: Sequence[str], deadline: str) -> str:
    """The markdown above the form (the Prefect UI renders it): every queued request with Gil's answer and why it
    is asked about, then how to answer."""
    items = queue["items"]
    answers = "1 answer" if len(items) == 1 else f"{len(items)} answers"
    lines = [f"### Feedback queue — `{queue['task']}`: {answers} to check", ""]
    for number, item in enumerate(items, start=1):
        asked = f"drawn at random ({item['why']})" if item["chosen_by"] == "random" else item["why"]
        lines += [
            f"{number}. **Request:** {plain(item['request'])}",
            f"   - *Gil answered:* {plain(item['answer'])}",
            f"   - *asked because:* {asked}",
        ]
    how = (
        "*wrong*: it is not; choose the right answer under *Correction* (one of the tree's answers, or "
        f"{choices[-1]!r}), or, for a template answer, write it out filled in under *Written correction* (written "
        "text that is none of the tree's answers is refused)."
        if choices
        else "*wrong*: it is not; write the right answer under *Correction* (or leave it empty)."
    )
    lines += [
        "",
        f"Every row below starts **unanswered** (no verdict). *correct*: Gil's answer is right; {how}",
        "",
        f"Unanswered by {deadline}, every row stays unanswered. A verdict given meanwhile with `gil feedback` "
        "stands and counts once.",
    ]
    return "\n".join(lines)


def verdict_form(queue: Mapping[str, Any], choices: Sequence[str], deadline: str = "") -> type[RunInput]:
    """The form a paused queue shows: one row per queued answer, keyed by its trace id, every row unanswered until
    set, under the list of the requests and Gil's answers."""
    row = verdict_row(choices)
    fields: dict[str, Any] = {
        f"item_{number}": (
            row,
            Field(
                default=row(),
                alias=item["trace_id"],
                title=f"{number + 1}. {brief(item['request'], 50)}",
                description=f"Gil answered: {brief(item['answer'], 120)}",
                json_schema_extra={"position": number},
            ),
        )
        for number, item in enumerate(queue["items"])
    }
    form = create_model("QueueVerdicts", __base__=RunInput, **fields)
    return form.with_initial_data(description=form_description(queue, choices, deadline or "the deadline"))


@dataclass(frozen=True)
class Answer:
    """One row of the form as answered: the verdict, and what was given as the correction (listed or written)."""

    trace_id: str
    verdict: str
    correction: str = ""
    written: str = ""


def answers_from(queue: Mapping[str, Any], answers: RunInput) -> list[Answer]:
    rows = [getattr(answers, f"item_{number}") for number in range(len(queue["items"]))]
    return [
        Answer(
            item["trace_id"],
            row.verdict,
            "" if row.correction == NO_CORRECTION else row.correction.strip(),
            getattr(row, "written_correction", "").strip(),
        )
        for item, row in zip(queue["items"], rows, strict=True)
    ]


# -- what comes back --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckedVerdicts:
    """A form's rows checked against the store and the tree: the verdicts to apply, the traces given a verdict
    meanwhile (that verdict stands), the rows refused (why), the unanswered ones, and what the person should know."""

    to_apply: list[Verdict]
    already_answered: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    unanswered: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def check_verdicts(
    answers: Sequence[Answer],
    stored: Mapping[str, tuple[str | None, str | None]],
    private: set[str],
    task: TaskDefinition,
) -> CheckedVerdicts:
    """Keep the answered rows on traces still without a verdict (``stored``: the verdict and correction each trace
    carries now; the queue took only traces without one, so one there arrived meanwhile and stands). A
    do-not-record trace (``private``, never queued) takes no verdict from here. On a task whose tree has answers
    a correction names one of them (``AnswerIndex``, or the contract's "none of these"); other text is refused."""
    index = AnswerIndex(task.tree)
    tree_task = bool(correction_choices(task))
    checked = CheckedVerdicts([])
    for answer in answers:
        now = stored.get(answer.trace_id, (None, None))
        if now[0] is not None:
            checked.already_answered[answer.trace_id] = now[0] + (f" ({now[1]})" if now[1] else "")
            same = answer.verdict == now[0] and (now[0] == "correct" or (answer.correction or answer.written) == now[1])
            if answer.verdict != "unanswered" and not same:
                checked.problems.append(
                    f"`{answer.trace_id}`: the form said {answer.verdict}, but it was answered {now[0]} while the "
                    "form was open (already answered): that verdict stands; change it with `gil feedback`"
                )
            continue
        if answer.verdict == "unanswered":
            checked.unanswered.append(answer.trace_id)
            continue
        if answer.trace_id in private:
            checked.refused[answer.trace_id] = "a do-not-record trace keeps no text: no verdict is taken for it"
            continue
        if answer.verdict == "correct":
            checked.to_apply.append(Verdict(answer.trace_id, True))
            continue
        if answer.correction and answer.written and answer.correction != answer.written:
            checked.refused[answer.trace_id] = (
                f"two corrections ({answer.correction!r} listed, {answer.written!r} written): give one"
            )
            continue
        correction = answer.correction or answer.written
        if tree_task and correction and correction != task.language.none_of_these and not index.option_for(correction):
            checked.refused[answer.trace_id] = (
                f"the correction {correction!r} is none of the tree's answers: on a tree task a correction names "
                "one of them (choose it under Correction, or write a template answer out filled in)"
            )
            continue
        checked.to_apply.append(Verdict(answer.trace_id, False, correction or None))
    checked.problems.extend(f"`{trace_id}`: refused: {why}" for trace_id, why in checked.refused.items())
    return checked


def stored_verdicts(store: TelemetryStore, task: str, trace_ids: Sequence[str]) -> tuple[dict[str, Any], set[str]]:
    """The verdict and correction each of ``trace_ids`` carries now, and which of them are do-not-record."""
    rows = store.rescanning(
        lambda: (
            store.scan("traces", only={"trace_id": trace_ids})
            .filter(pl.col("task") == task)
            .select("trace_id", "state", "feedback_verdict", "feedback_correction")
            .collect()
        )
    )
    stored = {row[0]: (row[2], row[3]) for row in rows.iter_rows()}
    return stored, {row[0] for row in rows.iter_rows() if not row[1]}


@gil_task(name="apply queue verdicts")
async def apply_queue_verdicts(
    task_file: str, queue: dict[str, Any], answers: list[Answer], timed_out_after: int | None = None
) -> dict[str, Any]:
    """Check the form's rows against the store as it is now, apply what stands like ``gil feedback`` (the task's
    runtime: memory, habit statistics, the learned judge refits), and publish what was applied. No retries: a
    verdict is applied once."""
    loaded = load_task_file(task_file)
    logger = get_run_logger()
    trace_ids = [item["trace_id"] for item in queue["items"]]
    stored, private = stored_verdicts(TelemetryStore(loaded.store), loaded.task.name, trace_ids)
    checked = check_verdicts(answers, stored, private, loaded.task)
    report = None
    if checked.to_apply:
        async with open_runtime(loaded) as runtime:
            report = await apply_verdicts(runtime.resolver, loaded.task, checked.to_apply)
    failed = {item.where: str(item) for item in report.failed} if report else {}
    applied = [verdict for verdict in checked.to_apply if f"trace {verdict.trace_id!r}" not in failed]
    problems = checked.problems + [f"not applied: {why}" for why in failed.values()]
    lines = [f"# Feedback queue verdicts — `{queue['task']}`", ""]
    if timed_out_after is not None:
        lines += [
            f"Nobody answered within {timedelta(seconds=timed_out_after)}: every answer stays unanswered (an issued "
            "answer is not queued again: give its verdict with `gil feedback`, trace ids in the "
            f"`{artifact_key(queue['task'], 'feedback-queue')}` table).",
            "",
        ]
        logger.warning("no verdicts within %s s: every answer stays unanswered", timed_out_after)
    requests = {item["trace_id"]: item["request"] for item in queue["items"]}
    for verdict in applied:
        said = (
            "correct"
            if verdict.correct
            else "wrong" + (f" → {plain(verdict.correction)}" if verdict.correction else "")
        )
        lines.append(f"- `{verdict.trace_id}` ({plain(brief(requests[verdict.trace_id], 60))}): **{said}**")
    for trace_id, given in checked.already_answered.items():
        lines.append(f"- `{trace_id}`: **{plain(given)}**, already answered (outside this form): counted once")
    if checked.unanswered and timed_out_after is None:
        lines.append(f"- {len(checked.unanswered)} left unanswered")
    if problems:
        lines += ["", "## Problems", ""] + [f"- {problem}" for problem in problems]
        for problem in problems:
            logger.warning("%s", problem.replace("`", ""))
    await acreate_markdown_artifact("\n".join(lines), key=artifact_key(queue["task"], "feedback-queue-verdicts"))
    return {
        "applied": [verdict.trace_id for verdict in applied],
        "already_answered": checked.already_answered,
        "refused": checked.refused,
        "unanswered": checked.unanswered if timed_out_after is None else trace_ids,
        "problems": problems,
        "timed_out": timed_out_after is not None,
        "report": report.to_json() if report else None,
    }


async def answer_in_the_ui(queue: dict[str, Any], task_file: str, timeout: int, poll_seconds: int) -> dict[str, Any]:
    """Pause this run with the verdict form until someone resumes it with answers (or the timeout), then apply the
    answered rows that still stand."""
    choices = correction_choices(load_task_file(task_file).task)
    form = verdict_form(queue, choices, deadline_after(timeout))
    answers = await wait_for_answers(form, "feedback-verdicts", timeout, poll_seconds)
    if answers is None:
        return await apply_queue_verdicts(task_file, queue, [], timeout)
    return await apply_queue_verdicts(task_file, queue, answers_from(queue, answers))


@flow(name="feedback-queue")
async def feedback_queue_flow(
    task_file: str,
    size: int = QUEUE_SIZE,
    random_share: float = DEFAULT_RANDOM_SHARE,
    wait_for_verdicts: bool = False,
    verdict_timeout: int = VERDICT_TIMEOUT,
    poll_seconds: int = 10,
) -> dict[str, Any]:
    """Issue a feedback queue of ``size`` answers (``random_share`` of them drawn uniformly at random) and publish
    it as the table artifact ``<task>-feedback-queue``; answer it with ``gil feedback`` or apply-feedback, or, with
    ``wait_for_verdicts``, in the form this run pauses with for at most ``verdict_timeout`` seconds (then the
    unanswered stay unanswered)."""
    queue = await issue_queue_task(task_file, size, random_share)
    rows = queue_rows(queue)
    if rows:
        description = (
            f"Answers to check for {queue['task']}: {len(rows)} of {queue['eligible']} unconfirmed answers not yet "
            "asked about"
        )
        await acreate_table_artifact(rows, key=artifact_key(queue["task"], "feedback-queue"), description=description)
    get_run_logger().info("feedback queue %s: %d of %d unconfirmed answers not yet asked about", queue["queue_id"],
                          len(rows), queue["eligible"])  # fmt: skip
    if wait_for_verdicts and rows:
        verdicts = await answer_in_the_ui(queue, task_file, verdict_timeout, poll_seconds)
        if verdicts["applied"]:
            await publish_stats(task_file)  # the stats and savings artifacts, as after apply-feedback
        queue = {**queue, "verdicts": verdicts}
    return queue
