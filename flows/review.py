"""promotion-round, deactivation-round and differentiation-round: each writes its review list as YAML and as
Prefect table + markdown artifacts. Decisions come back through ``gil review decide``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact

from flows._prefect import gil_task
from gil_core.reviews import ReviewList, deactivation_review, differentiation_review, promotion_review
from gil_core.runtime import open_runtime
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore


def review_path(task_file: str, kind: str) -> Path:
    loaded = load_task_file(task_file)
    return loaded.store.parent / "reviews" / f"{loaded.task.name}-{kind}.yaml"


@gil_task(name="publish review list")
async def publish(review: ReviewList, task_file: str) -> str:
    path = review.write(review_path(task_file, review.kind.value))
    key = f"{review.task}-{review.kind.value}".lower().replace("_", "-")
    rows = [{k: str(v) for k, v in item.items()} for item in review.items] or [{"items": "nothing to review"}]
    await acreate_table_artifact(rows, key=key, description=f"{review.kind.value} review for {review.task}")
    await acreate_markdown_artifact(
        f"# {review.kind.value} review — `{review.task}`\n\n{len(review.items)} items, written to `{path}`.\n\n"
        f"Decide with `gil review decide {review.kind.value} ITEM_ID accepted|rejected --note ...`.",
        key=f"{key}-howto",
    )
    return str(path)


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
async def promotion_round_flow(task_file: str) -> dict[str, Any]:
    """Propose recurring confirmed answers as habits."""
    review = propose_promotions_task(task_file)
    return {"items": len(review.items), "file": await publish(review, task_file)}


@flow(name="deactivation-round")
async def deactivation_round_flow(task_file: str) -> dict[str, Any]:
    """Propose unreliable, disputed or stale habits for retirement."""
    review = propose_deactivations_task(task_file)
    return {"items": len(review.items), "file": await publish(review, task_file)}


@flow(name="differentiation-round")
async def differentiation_round_flow(task_file: str) -> dict[str, Any]:
    """Propose categories to split or add."""
    review = await propose_differentiation_task(task_file)
    return {"items": len(review.items), "file": await publish(review, task_file)}
