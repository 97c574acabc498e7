"""resolve-batch and apply-feedback: tickets → traces → results; verdicts → memory and habit statistics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact

from flows._prefect import gil_task
from gil_core.batch import apply_verdicts, read_tickets, read_verdicts, resolve_batch, write_results
from gil_core.reporting import stats_markdown, stats_table
from gil_core.runtime import open_runtime
from gil_core.taskfile import load_task_file


@gil_task(name="resolve tickets")
async def resolve_tickets(
    task_file: str, tickets_path: str, out: str | None, concurrency: int | None
) -> dict[str, Any]:
    logger = get_run_logger()
    loaded = load_task_file(task_file)
    tickets, bad = read_tickets(tickets_path)
    for item in bad:
        logger.warning("skipped %s", item)
    step = max(1, len(tickets) // 10)

    def progress(done: int, total: int) -> None:
        if done == total or done % step == 0:
            logger.info("resolved %d/%d tickets", done, total)

    async with open_runtime(loaded) as runtime:
        report = await resolve_batch(
            runtime.resolver, loaded.task, tickets, concurrency=concurrency or loaded.concurrency, progress=progress
        )
        report.failed[:0] = bad
        for item in report.failed[len(bad) :]:
            logger.warning("ticket failed: %s", item)
        if out:
            write_results(runtime.resolver, loaded.task, report, out)
    return report.to_json()


@gil_task(name="apply verdicts")
async def apply_feedback_task(task_file: str, verdicts_path: str) -> dict[str, Any]:
    logger = get_run_logger()
    loaded = load_task_file(task_file)
    verdicts, bad = read_verdicts(verdicts_path)
    for item in bad:
        logger.warning("skipped %s", item)
    async with open_runtime(loaded) as runtime:
        report = await apply_verdicts(runtime.resolver, loaded.task, verdicts)
    report.failed[:0] = bad
    return report.to_json()


@gil_task(name="publish stats")
async def publish_stats(task_file: str, window: int = 50) -> str:
    from gil_core.telemetry import TelemetryStore

    loaded = load_task_file(task_file)
    stats = TelemetryStore(loaded.store).stats(loaded.task.name, window, tree=loaded.task.tree)
    key = f"{loaded.task.name}-stats".lower().replace("_", "-")
    await acreate_table_artifact(stats_table(stats), key=key, description="Requests per mode")
    markdown = stats_markdown(stats)
    await acreate_markdown_artifact(markdown, key=f"{key}-cost", description="Cost per request, by window")
    return markdown


@flow(name="resolve-batch", log_prints=True)
async def resolve_batch_flow(
    task_file: str, tickets: str, out: str | None = None, concurrency: int | None = None
) -> dict[str, Any]:
    """Resolve queued tickets (JSONL or Parquet with id and text); a rerun resolves only what is missing."""
    report = await resolve_tickets(task_file, str(Path(tickets)), out, concurrency)
    await publish_stats(task_file)
    return report


@flow(name="apply-feedback", log_prints=True)
async def apply_feedback_flow(task_file: str, verdicts: str) -> dict[str, Any]:
    """Apply a verdicts file (JSONL: trace_id, correct, correction?); a verdict already applied counts once."""
    report = await apply_feedback_task(task_file, verdicts)
    await publish_stats(task_file)
    return report
