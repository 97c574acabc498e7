"""promotion-round, deactivation-round and differentiation-round: each writes its review list as YAML and as
Prefect table + markdown artifacts.

With ``wait_for_decisions`` the run then pauses with a form in the Prefect UI, one row per proposal (accepted,
rejected or deferred, and a reason). On resume it records every decision in the review log, writes what was
accepted into a new version of the tree file beside the old one, and records the promotion round at its index
(``gil_core.reviews.apply_decisions``). Without it, decisions come back through ``gil review decide``.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

from prefect import flow
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from pydantic import BaseModel, Field, create_model

from flows._prefect import artifact_key, gil_task
from gil_core.habits.review_log import Decision
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
from gil_core.telemetry import TelemetryStore

DECISION_TIMEOUT = 7 * 24 * 3600  # a weekly round waits up to a week for its decisions


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
    rows = [{k: str(v) for k, v in item.items()} for item in review.items] or [{"items": "nothing to review"}]
    await acreate_table_artifact(rows, key=key, description=f"{review.kind.value} review for {review.task}")
    await acreate_markdown_artifact(
        f"# {review.kind.value} review — `{review.task}`\n\n{len(review.items)} items, written to `{path}`.\n\n"
        "Decide in the form of a run started with `wait_for_decisions: true` (Resume), or with "
        f"`gil review decide {review.kind.value} ITEM_ID accepted|rejected --note ...`.",
        key=f"{key}-howto",
    )
    return str(path)


class ItemDecisionInput(BaseModel):
    """One row of the decision form."""

    decision: Literal["accepted", "rejected", "deferred"] = Field(
        default="deferred",
        description="accepted: apply it; rejected: never propose it again; deferred: ask again next round",
    )
    reason: str | None = Field(default=None, description="why (kept in the review log)")


def decision_form(review: ReviewList) -> type[RunInput]:
    """The form a paused round shows: one row per item, keyed by the item's id, every row deferred until set."""
    fields: dict[str, Any] = {
        f"item_{number}": (
            ItemDecisionInput,
            Field(
                default=ItemDecisionInput(),
                alias=str(item["id"]),
                title=str(item["id"]),
                description=review.describe(item),
            ),
        )
        for number, item in enumerate(review.items)
    }
    form = create_model(f"{review.kind.value.title()}Decisions", __base__=RunInput, **fields)
    return form.with_initial_data(
        description=f"**{review.kind.value} review — `{review.task}`**: one row per proposal "
        f"({len(review.items)}). Accepted items go into a new version of the tree file, beside the old one."
    )


def decisions_from(review: ReviewList, answers: RunInput) -> list[ItemDecision]:
    rows = [getattr(answers, f"item_{number}") for number in range(len(review.items))]
    return [
        ItemDecision(str(item["id"]), Decision(row.decision), (row.reason or "").strip() or None)
        for item, row in zip(review.items, rows, strict=True)
    ]


@gil_task(name="apply decisions")
async def apply_decisions_task(task_file: str, review: ReviewList, decisions: list[ItemDecision]) -> dict[str, Any]:
    loaded = load_task_file(task_file)
    applied = apply_decisions(TelemetryStore(loaded.store), loaded.task, review, decisions)
    lines = [f"# {review.kind.value} decisions — `{review.task}`", ""]
    for entry in applied.recorded:
        lines.append(f"- `{entry.item_id}`: **{entry.decision.value}**" + (f" — {entry.note}" if entry.note else ""))
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
    await acreate_markdown_artifact("\n".join(lines), key=f"{review_artifact_key(review)}-decisions")
    return {
        "decisions": {entry.item_id: entry.decision.value for entry in applied.recorded},
        "tree_file": str(applied.tree_file) if applied.tree_file else None,
        "refused": applied.refused,
        "at_index": applied.at_index,
    }


async def decide_in_the_ui(review: ReviewList, task_file: str, timeout: int, poll_seconds: int) -> dict[str, Any]:
    """Pause this run with the decision form until someone resumes it with answers, then apply them."""
    form = decision_form(review)
    answers = await pause_flow_run(
        wait_for_input=form, timeout=timeout, poll_interval=poll_seconds, key=f"{review.kind.value}-decisions"
    )
    return await apply_decisions_task(task_file, review, decisions_from(review, answers))


async def run_round(
    review: ReviewList, task_file: str, wait_for_decisions: bool, decision_timeout: int, poll_seconds: int
) -> dict[str, Any]:
    result: dict[str, Any] = {"items": len(review.items), "file": await publish(review, task_file)}
    if wait_for_decisions and review.items:
        result |= await decide_in_the_ui(review, task_file, decision_timeout, poll_seconds)
    return result


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
    """Propose recurring confirmed answers as habits. ``wait_for_decisions``: pause with a decision form (at most
    ``decision_timeout`` seconds), then record and apply the decisions."""
    review = propose_promotions_task(task_file)
    return await run_round(review, task_file, wait_for_decisions, decision_timeout, poll_seconds)


@flow(name="deactivation-round")
async def deactivation_round_flow(
    task_file: str, wait_for_decisions: bool = False, decision_timeout: int = DECISION_TIMEOUT, poll_seconds: int = 10
) -> dict[str, Any]:
    """Propose unreliable, disputed or stale habits for retirement (``wait_for_decisions``: as promotion-round)."""
    review = propose_deactivations_task(task_file)
    return await run_round(review, task_file, wait_for_decisions, decision_timeout, poll_seconds)


@flow(name="differentiation-round")
async def differentiation_round_flow(
    task_file: str, wait_for_decisions: bool = False, decision_timeout: int = DECISION_TIMEOUT, poll_seconds: int = 10
) -> dict[str, Any]:
    """Propose categories to split or add (``wait_for_decisions``: as promotion-round; accepting a signal records
    it, a person then edits the tree)."""
    review = await propose_differentiation_task(task_file)
    return await run_round(review, task_file, wait_for_decisions, decision_timeout, poll_seconds)
