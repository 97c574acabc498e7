"""feedback-queue: the unconfirmed answers whose verdicts would teach the learned judge most, issued and published
as a table artifact for the person who answers them (``gil_core.learned.queue``)."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_table_artifact

from flows._prefect import artifact_key, gil_task
from gil_core.learned import DEFAULT_RANDOM_SHARE
from gil_core.learned.queue import issue_task_queue
from gil_core.taskfile import load_task_file

QUEUE_SIZE = 20


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


@flow(name="feedback-queue")
async def feedback_queue_flow(
    task_file: str, size: int = QUEUE_SIZE, random_share: float = DEFAULT_RANDOM_SHARE
) -> dict[str, Any]:
    """Issue a feedback queue of ``size`` answers (``random_share`` of them drawn uniformly at random) and publish
    it as the table artifact ``<task>-feedback-queue``; answer it with ``gil feedback`` or apply-feedback."""
    queue = await issue_queue_task(task_file, size, random_share)
    rows = queue_rows(queue)
    if rows:
        description = f"Answers to check for {queue['task']}: {len(rows)} of {queue['eligible']} unconfirmed"
        await acreate_table_artifact(rows, key=artifact_key(queue["task"], "feedback-queue"), description=description)
    get_run_logger().info("feedback queue %s: %d of %d unconfirmed answers", queue["queue_id"], len(rows),
                          queue["eligible"])  # fmt: skip
    return queue
