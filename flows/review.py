"""promotion-round, deactivation-round and differentiation-round: each writes its review list as YAML and as
Prefect table + markdown artifacts.

With ``wait_for_decisions`` (the deployments ``gil serve`` runs set it) the run then pauses with a form in the
Prefect UI: above it every proposal with what accepting it does, why it is proposed and its evidence (counts and
their 95% Wilson intervals); one row per proposal below (accepted, rejected or deferred, and a reason), every row
deferred until set. On resume it records the decisions in the review log, writes what was accepted into a new
version of the tree file beside the old one, and records the promotion round at its index
(``gil_core.reviews.apply_decisions``). A proposal decided meanwhile (``gil review decide``, another round) keeps
that decision and is not recorded again; what the form said otherwise is reported in the run's logs and its
decisions artifact. Nobody answering within ``decision_timeout`` leaves every proposal deferred: nothing is
recorded, the next round asks again, and the run ends Completed. Without ``wait_for_decisions``, decisions come
back through ``gil review decide``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import anyio
from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.responses import SetStateStatus
from prefect.context import FlowRunContext
from prefect.flow_runs import apause_flow_run
from prefect.input import RunInput
from pydantic import BaseModel, Field, create_model

from flows._prefect import artifact_key, gil_task
from flows._progress import FlowProgress, task_progress
from gil_core.errors import GilError
from gil_core.feedback import Feedback
from gil_core.habits.deactivation import ReliabilityCounts, read_reliability
from gil_core.habits.review_log import Decision, ReviewDecision, ReviewKind, ReviewLog
from gil_core.reviews import (
    ItemDecision,
    ReviewList,
    apply_decisions,
    deactivation_review,
    differentiation_review,
    promotion_review,
    review_file_name,
)
from gil_core.runtime import open_runtime
from gil_core.taskfile import TaskFile, load_task_file
from gil_core.telemetry import TelemetryStore, utc_now
from gil_core.wilson import wilson_interval

DECISION_TIMEOUT = 7 * 24 * 3600  # a round started by hand waits up to a week for its decisions
# A weekly scheduled round gives up a day before the next one asks the same questions again.
SCHEDULED_DECISION_TIMEOUT = 6 * 24 * 3600
# Prefect fails a run still paused at its pause deadline; the round resumes itself this long before that.
RESUME_MARGIN = 60


def local_folder(loaded: TaskFile) -> Path:
    """The local folder for the files a person reads beside the store (review lists, the demo's files): the store
    folder's parent, or ``.gil`` beside the task file when the store is an ``s3://`` URI (such files are local
    even then: a person opens them, the task's tree is local too)."""
    return loaded.store.parent if isinstance(loaded.store, Path) else loaded.path.parent / ".gil"


def review_path(task_file: str, kind: str) -> Path:
    """Where a round's list is written: the reviews folder, under a file name no task name can lead out of."""
    loaded = load_task_file(task_file)
    return local_folder(loaded) / "reviews" / review_file_name(loaded.task.name, kind)


def review_artifact_key(review: ReviewList) -> str:
    """The round's Prefect artifact key: ``<task>-<kind>`` (``flows._prefect.artifact_key``)."""
    return artifact_key(review.task, review.kind.value)


@gil_task(name="publish review list")
async def publish(review: ReviewList, task_file: str) -> str:
    path = review.write(review_path(task_file, review.kind.value))
    key = review_artifact_key(review)
    rows = [{k: str(v) for k, v in item.items()} for item in review.items]
    await acreate_table_artifact(
        rows or [{"items": review.note or "nothing to review"}],
        key=key,
        description=f"{review.kind.value} review for {review.task}",
    )
    note = f"{review.note}.\n\n" if review.note else ""  # why a round proposed nothing yet
    await acreate_markdown_artifact(
        f"# {review.kind.value} review — `{review.task}`\n\n{len(review.items)} items, written to `{path}`.\n\n"
        f"{note}Decide in the form of a run started with `wait_for_decisions: true` (Resume), or with "
        f"`gil review decide {review.kind.value} ITEM_ID accepted|rejected --note ...`.",
        key=f"{key}-howto",
    )
    return str(path)


# -- what a person sees -----------------------------------------------------------------------------------------


def share(successes: int, trials: int, of: str) -> str:
    """``3 of 4 <of> (75%, 95% interval 30–95%)``."""
    if trials == 0:
        return f"no {of} yet"
    low, high = wilson_interval(successes, trials)
    return f"{successes} of {trials} {of} ({successes / trials:.0%}, 95% interval {low:.0%}–{high:.0%})"


@dataclass(frozen=True)
class ExplainedItem:
    """One item of a round as the form shows it: what accepting it does, why it is proposed, its evidence."""

    item_id: str
    what: str
    why: str
    evidence: str


def explain(review: ReviewList, reliability: Mapping[str, ReliabilityCounts]) -> list[ExplainedItem]:
    """Each item of ``review`` in words; ``reliability`` holds a deactivation round's counters per habit."""
    return [
        ExplainedItem(str(item["id"]), review.describe(item), *_why_and_evidence(review.kind, item, reliability))
        for item in review.items
    ]


def _why_and_evidence(
    kind: ReviewKind, item: Mapping[str, Any], reliability: Mapping[str, ReliabilityCounts]
) -> tuple[str, str]:
    if kind is ReviewKind.PROMOTION:
        why = (
            f"saves {item['expected_saving']:.3g} of generation energy per request reaching {item['anchor']}, adds "
            f"{item['added_cost']:.3g} to the judge's (net {item['net_saving']:.3g})"
            + ("; the node is full: it needs splitting first" if item.get("warned") else "")
        )
        return why, "confirmed answer in " + share(
            int(item["support"]), int(item["anchor_volume"]), "generated requests"
        )
    if kind is ReviewKind.DEACTIVATION:
        counts = reliability.get(str(item["id"]), ReliabilityCounts())
        why = f"{item['reason']}: reliability {item['score']:.2f}, recency {item['recency']:.3g}"
        judged = counts.reinforced + counts.penalized
        evidence = "in its favour: " + share(counts.reinforced, judged, "verdicts")
        evidence += "; disputed in " + share(counts.disputed, counts.explored, "cross-checks")
        return why, evidence
    signal = item.get("signal")
    if signal == "capacity":
        return "near its label scheme's capacity", f"{item['candidates']} of {item['capacity']} labels in use"
    if signal == "anchored":
        where = f"a habit at {item['target']}" if item.get("target") else "no habit"
        return f"{item['kind']}: the walk stopped at {item['node']} ({where})", f"{item['support']} correct answers"
    return "requests alike in meaning the tree could not serve", f"{item.get('support', 0)} unserved requests"


def form_description(review: ReviewList, proposals: Sequence[ExplainedItem], deadline: str) -> str:
    """The markdown above the form (the Prefect UI renders it): every proposal with what accepting it would do,
    why it is proposed and its evidence, then how to decide. A list, not a table: the form's dialog is narrow."""
    lines = [f"### {review.kind.value} review — `{review.task}`: {len(proposals)} proposals", ""]
    for number, proposal in enumerate(proposals, start=1):
        lines += [
            f"{number}. **`{proposal.item_id}`**: {proposal.what}",
            f"   - *why*: {proposal.why}",
            f"   - *evidence*: {proposal.evidence}",
        ]
    lines += [
        "",
        "Every row below starts **deferred** (ask again next round). *accepted* applies the proposal (accepted "
        "habits go into a new version of the tree file, beside the old one); *rejected* means it is never proposed "
        "again. The reason is kept in the review log.",
        "",
        f"Undecided by {deadline}, every proposal stays deferred. A proposal decided meanwhile with "
        "`gil review decide` keeps that decision.",
    ]
    return "\n".join(lines)


class ItemDecisionInput(BaseModel):
    """One row of the decision form."""

    decision: Literal["accepted", "rejected", "deferred"] = Field(
        default="deferred",
        description="accepted: apply it; rejected: never propose it again; deferred: ask again next round",
    )
    # A plain string: the UI renders `str | None` as a type switch the person must flip before typing.
    reason: str = Field(default="", description="why (kept in the review log)")


def decision_form(
    review: ReviewList, proposals: Sequence[ExplainedItem] | None = None, deadline: str = ""
) -> type[RunInput]:
    """The form a paused round shows: one row per item, keyed by the item's id, every row deferred until set, under
    a markdown table of the proposals with their evidence."""
    proposals = list(proposals) if proposals is not None else explain(review, {})
    fields: dict[str, Any] = {
        f"item_{number}": (
            ItemDecisionInput,
            Field(
                default=ItemDecisionInput(),
                alias=proposal.item_id,
                title=proposal.item_id,
                description=f"{proposal.what}. Evidence: {proposal.evidence}",
                json_schema_extra={"position": number},
            ),
        )
        for number, proposal in enumerate(proposals)
    }
    form = create_model(f"{review.kind.value.title()}Decisions", __base__=RunInput, **fields)
    return form.with_initial_data(description=form_description(review, proposals, deadline or "the deadline"))


def decisions_from(review: ReviewList, answers: RunInput) -> list[ItemDecision]:
    rows = [getattr(answers, f"item_{number}") for number in range(len(review.items))]
    return [
        ItemDecision(str(item["id"]), Decision(row.decision), row.reason.strip() or None)
        for item, row in zip(review.items, rows, strict=True)
    ]


# -- what comes back --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckedDecisions:
    """A form's answers checked against the review log: what to record, the items decided since the round read
    the log (their decision stands), and what the person should know (a stale row, a timeout)."""

    to_record: list[ItemDecision]
    decided_meanwhile: dict[str, ReviewDecision] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def check_decisions(
    answers: Sequence[ItemDecision],
    before: Mapping[str, ReviewDecision],
    now: Mapping[str, ReviewDecision],
) -> CheckedDecisions:
    """Keep every answer but those on items whose latest decision in the review log changed between ``before``
    (read when the round began) and ``now``: that decision was made meanwhile and stands, so nothing is recorded
    twice. A row that says otherwise than it (anything but the untouched default) came from a stale form."""
    to_record, meanwhile, problems = [], {}, []
    for answer in answers:
        latest = now.get(answer.item_id)
        if latest is None or latest == before.get(answer.item_id):
            to_record.append(answer)
            continue
        meanwhile[answer.item_id] = latest
        untouched = answer.decision is Decision.DEFERRED and answer.note is None
        same = answer.decision is latest.decision and answer.note in (None, latest.note)
        if not (untouched or same):
            problems.append(
                f"`{answer.item_id}`: the form said {answer.decision.value}"
                + (f" ({answer.note})" if answer.note else "")
                + f", but it was decided {latest.decision.value} at {latest.reviewed_at:%Y-%m-%d %H:%M:%S} UTC "
                "while the form was open (stale form): that decision stands; change it with `gil review decide`"
            )
    return CheckedDecisions(to_record, meanwhile, problems)


@gil_task(name="read review log")
def read_review_log(task_file: str, kind: str) -> dict[str, ReviewDecision]:
    """The latest decision per item of ``kind`` (what a round's answers are checked against)."""
    loaded = load_task_file(task_file)
    return ReviewLog(TelemetryStore(loaded.store)).decisions(loaded.task.name, kind)


@gil_task(name="explain proposals")
def explain_proposals(task_file: str, review: ReviewList) -> list[ExplainedItem]:
    """The round's items explained; a deactivation round reads its habits' verdict counters for that."""
    reliability: dict[str, ReliabilityCounts] = {}
    if review.kind is ReviewKind.DEACTIVATION:
        loaded = load_task_file(task_file)
        reliability = read_reliability(TelemetryStore(loaded.store), loaded.task.name)
    return explain(review, reliability)


@gil_task(name="apply decisions")
async def apply_decisions_task(
    task_file: str, review: ReviewList, checked: CheckedDecisions, timed_out_after: int | None = None
) -> dict[str, Any]:
    loaded = load_task_file(task_file)
    logger = get_run_logger()
    store = TelemetryStore(loaded.store)
    applied = apply_decisions(store, loaded.task, review, checked.to_record)
    problems = list(checked.problems)
    problems += [
        f"`{item}`: accepted, not applied ({why}): recorded as deferred" for item, why in applied.refused.items()
    ]
    lines = [f"# {review.kind.value} decisions — `{review.task}`", ""]
    if timed_out_after is not None:
        lines += [
            f"Nobody decided within {timedelta(seconds=timed_out_after)}: every proposal stays deferred "
            "(nothing recorded; the next round asks again).",
            "",
        ]
        logger.warning("no decisions within %s s: every proposal stays deferred", timed_out_after)
    for entry in applied.recorded:
        lines.append(f"- `{entry.item_id}`: **{entry.decision.value}**" + (f" — {entry.note}" if entry.note else ""))
    for item, entry in checked.decided_meanwhile.items():
        lines.append(
            f"- `{item}`: **{entry.decision.value}**, decided meanwhile (outside this form)"
            + (f" — {entry.note}" if entry.note else "")
            + ": recorded once, not again from the form"
        )
    if problems:
        lines += ["", "## Problems", ""] + [f"- {problem}" for problem in problems]
        for problem in problems:
            logger.warning("%s", problem.replace("`", ""))
    if applied.tree_file is not None and loaded.task.tree.source:
        old = Path(loaded.task.tree.source)
        diff = difflib.unified_diff(
            old.read_text(encoding="utf-8").splitlines(),
            applied.tree_file.read_text(encoding="utf-8").splitlines(),
            str(old.name),
            str(applied.tree_file.name),
            lineterm="",
        )
        lines += ["", f"New tree file `{applied.tree_file}`; point the task file's `tree` at it to use it:", ""]
        lines += ["```diff", *diff, "```"]
    stopped = 0  # memory entries standing for an answer the new tree no longer gives
    if applied.tree is not None:
        try:  # the decisions are recorded: a count that cannot be read is logged, and the round still succeeds
            stopped = Feedback(store, memory=None, learner=None).changed_by(loaded.task, applied.tree).stops_serving
        except GilError as exc:
            logger.warning("the remembered answers the new tree stops serving were not counted: %s", exc)
    if stopped:
        lines += [
            "",
            f"Once it is in use, memory stops serving {stopped} remembered answer{'s' if stopped != 1 else ''} that"
            " stood for the answers it removes.",
        ]
    await acreate_markdown_artifact("\n".join(lines), key=f"{review_artifact_key(review)}-decisions")
    return {
        "decisions": {entry.item_id: entry.decision.value for entry in applied.recorded},
        "decided_meanwhile": {item: entry.decision.value for item, entry in checked.decided_meanwhile.items()},
        "problems": problems,
        "timed_out": timed_out_after is not None,
        "tree_file": str(applied.tree_file) if applied.tree_file else None,
        "refused": applied.refused,
        "at_index": applied.at_index,
        "memory_stopped": stopped,
    }


def deadline_after(timeout: int) -> str:
    """When a form opened now stops waiting, as its description says it: ``2026-01-05 06:00 UTC``."""
    return f"{utc_now() + timedelta(seconds=timeout):%Y-%m-%d %H:%M} UTC"


async def wait_for_answers(form: type[RunInput], key: str, timeout: int, poll_seconds: int) -> RunInput | None:
    """Pause this run with ``form`` until someone resumes it; None when nobody did within ``timeout`` seconds.

    Prefect fails a run whose pause times out (catching ``FlowPauseTimeout`` does not save it), so the pause's own
    deadline is ``RESUME_MARGIN`` later and the run resumes itself, with no input, at ``timeout``. Whichever
    resume the server accepts first wins; ours winning means nobody answered.
    """
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        raise RuntimeError("a run waits for answers in a form only inside a flow run")
    run_id = context.flow_run.id
    timed_out = False

    async def resume_at_deadline() -> None:
        nonlocal timed_out
        await anyio.sleep(timeout)
        async with get_client() as client:
            result = await client.resume_flow_run(run_id, run_input=None)
        timed_out = result.status is SetStateStatus.ACCEPT

    async with anyio.create_task_group() as group:
        group.start_soon(resume_at_deadline)
        answers = await apause_flow_run(
            wait_for_input=form, timeout=timeout + RESUME_MARGIN, poll_interval=poll_seconds, key=key
        )
        group.cancel_scope.cancel()
    return None if timed_out else answers


async def decide_in_the_ui(
    review: ReviewList, task_file: str, timeout: int, poll_seconds: int, before: Mapping[str, ReviewDecision]
) -> dict[str, Any]:
    """Pause this run with the decision form until someone resumes it with answers (or the timeout), check the
    answers against what was decided meanwhile, then apply them."""
    form = decision_form(review, explain_proposals(task_file, review), deadline_after(timeout))
    answers = await wait_for_answers(form, f"{review.kind.value}-decisions", timeout, poll_seconds)
    if answers is None:
        return await apply_decisions_task(task_file, review, CheckedDecisions([]), timeout)
    now = read_review_log(task_file, review.kind.value)
    return await apply_decisions_task(task_file, review, check_decisions(decisions_from(review, answers), before, now))


async def run_round(
    review: ReviewList,
    task_file: str,
    wait_for_decisions: bool,
    decision_timeout: int,
    poll_seconds: int,
    before: Mapping[str, ReviewDecision],
    progress: FlowProgress | None = None,
) -> dict[str, Any]:
    """Publish the round's list, then (``wait_for_decisions``) wait for and record the decisions; ``progress``
    counts each step done."""
    result: dict[str, Any] = {"items": len(review.items), "file": await publish(review, task_file)}
    if progress is not None:
        progress.advance()
    if wait_for_decisions and review.items:
        result |= await decide_in_the_ui(review, task_file, decision_timeout, poll_seconds, before)
    return result


def round_progress(task_file: str, kind: ReviewKind, waiting: bool) -> AbstractAsyncContextManager[FlowProgress]:
    """A review round's progress artifact (``<task>-<kind>-progress``): proposing, publishing, and deciding when
    the round waits for decisions."""
    steps = ["propose", "publish", *(["decide"] if waiting else [])]
    return task_progress(task_file, f"{kind.value}-progress", f"{kind.value} round: {', '.join(steps)}", len(steps))


@gil_task(name="propose promotions")
def propose_promotions_task(task_file: str) -> ReviewList:
    loaded = load_task_file(task_file)
    return promotion_review(TelemetryStore(loaded.store), loaded.task)


@gil_task(name="propose retirements")
def propose_deactivations_task(task_file: str) -> ReviewList:
    loaded = load_task_file(task_file)
    return deactivation_review(TelemetryStore(loaded.store), loaded.task)


@gil_task(name="propose splits and additions")
async def propose_differentiation_task(task_file: str) -> ReviewList:
    loaded = load_task_file(task_file)
    async with open_runtime(loaded) as runtime:
        embedder = runtime.embedder
        if embedder is None:
            raise ValueError("differentiation needs an embedding_model in the task file")
        return await differentiation_review(runtime.store, loaded.task, embedder)


@flow(name="promotion-round")
async def promotion_round_flow(
    task_file: str, wait_for_decisions: bool = False, decision_timeout: int = DECISION_TIMEOUT, poll_seconds: int = 10
) -> dict[str, Any]:
    """Propose recurring confirmed answers as habits. ``wait_for_decisions``: pause with a decision form for at
    most ``decision_timeout`` seconds (then the undecided stay deferred), then record and apply the decisions."""
    async with round_progress(task_file, ReviewKind.PROMOTION, wait_for_decisions) as progress:
        before = read_review_log(task_file, ReviewKind.PROMOTION.value)  # read first: later decisions are "meanwhile"
        review = propose_promotions_task(task_file)
        progress.advance()
        return await run_round(review, task_file, wait_for_decisions, decision_timeout, poll_seconds, before, progress)


@flow(name="deactivation-round")
async def deactivation_round_flow(
    task_file: str, wait_for_decisions: bool = False, decision_timeout: int = DECISION_TIMEOUT, poll_seconds: int = 10
) -> dict[str, Any]:
    """Propose unreliable, disputed or stale habits for retirement (``wait_for_decisions``: as promotion-round)."""
    async with round_progress(task_file, ReviewKind.DEACTIVATION, wait_for_decisions) as progress:
        before = read_review_log(task_file, ReviewKind.DEACTIVATION.value)
        review = propose_deactivations_task(task_file)
        progress.advance()
        return await run_round(review, task_file, wait_for_decisions, decision_timeout, poll_seconds, before, progress)


@flow(name="differentiation-round")
async def differentiation_round_flow(
    task_file: str, wait_for_decisions: bool = False, decision_timeout: int = DECISION_TIMEOUT, poll_seconds: int = 10
) -> dict[str, Any]:
    """Propose categories to split or add (``wait_for_decisions``: as promotion-round; accepting a signal records
    it, a person then edits the tree)."""
    async with round_progress(task_file, ReviewKind.DIFFERENTIATION, wait_for_decisions) as progress:
        before = read_review_log(task_file, ReviewKind.DIFFERENTIATION.value)
        review = await propose_differentiation_task(task_file)
        progress.advance()
        return await run_round(review, task_file, wait_for_decisions, decision_timeout, poll_seconds, before, progress)
