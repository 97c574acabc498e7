"""Every flow as a deployment with its default schedule (docs/architecture.md, "Flows"), served by ``gil serve``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from prefect.types.entrypoint import EntrypointType

from flows.batch import apply_feedback_flow, resolve_batch_flow
from flows.maintenance import compact_telemetry_flow, fit_energy_flow, fit_reflex_flow, rebuild_memory_flow
from flows.queue import SCHEDULED_VERDICT_TIMEOUT, feedback_queue_flow
from flows.review import (
    SCHEDULED_DECISION_TIMEOUT,
    deactivation_round_flow,
    differentiation_round_flow,
    promotion_round_flow,
)
from gil_core.batch import DEFAULT_FORMAT, TicketFormat

EVERY_5_MINUTES = timedelta(minutes=5)
HOURLY = timedelta(hours=1)
NIGHTLY = "0 3 * * *"
WEEKLY = "0 6 * * 1"

# Deployment name → (flow, default schedule): an interval, a cron line, or None for on demand only.
SCHEDULES: dict[str, tuple[Any, timedelta | str | None]] = {
    "resolve-batch": (resolve_batch_flow, EVERY_5_MINUTES),
    "apply-feedback": (apply_feedback_flow, EVERY_5_MINUTES),
    "fit-energy": (fit_energy_flow, NIGHTLY),
    "fit-reflex": (fit_reflex_flow, NIGHTLY),
    "rebuild-memory": (rebuild_memory_flow, None),
    "compact-telemetry": (compact_telemetry_flow, HOURLY),
    "promotion-round": (promotion_round_flow, WEEKLY),
    "deactivation-round": (deactivation_round_flow, WEEKLY),
    "differentiation-round": (differentiation_round_flow, WEEKLY),
    "feedback-queue": (feedback_queue_flow, NIGHTLY),
}
REVIEW_ROUNDS = ("promotion-round", "deactivation-round", "differentiation-round")


def build_deployments(
    task_file: Path,
    tickets: Path,
    verdicts: Path,
    decision_timeout: int = SCHEDULED_DECISION_TIMEOUT,
    verdict_timeout: int = SCHEDULED_VERDICT_TIMEOUT,
    *,
    form: TicketFormat = DEFAULT_FORMAT,
) -> list[Any]:
    """The deployments, with parameters pointing at this task file and its queue files: the tickets file read as
    ``form`` says (``TicketFormat``), the verdicts file in its encoding, each parameter set only where it is not the
    default (the UI shows the flow's defaults otherwise). The review rounds pause
    for decisions in the Prefect UI for up to ``decision_timeout`` seconds (a parameter of each deployment, so an
    operator can change it per round in the UI), after which the undecided proposals stay deferred; the feedback
    queue pauses for verdicts on its answers for up to ``verdict_timeout`` seconds, after which the unanswered
    stay unanswered."""
    task = {"task_file": str(task_file.resolve())}
    own: dict[str, dict[str, Any]] = {  # each deployment's parameters besides the task file
        "resolve-batch": {"tickets": str(tickets.resolve()), "out": f"{tickets.resolve()}.results.jsonl"},
        "apply-feedback": {"verdicts": str(verdicts.resolve())},
    }
    if form.columns != DEFAULT_FORMAT.columns:
        own["resolve-batch"] |= {"id_column": form.columns.id, "text_columns": list(form.columns.text)}
    if form.encoding != DEFAULT_FORMAT.encoding:
        own["resolve-batch"]["encoding"] = own["apply-feedback"]["encoding"] = form.encoding
    if form.max_line_bytes != DEFAULT_FORMAT.max_line_bytes:
        own["resolve-batch"]["max_line_bytes"] = form.max_line_bytes
    own |= {name: {"wait_for_decisions": True, "decision_timeout": decision_timeout} for name in REVIEW_ROUNDS}
    own["feedback-queue"] = {"wait_for_verdicts": True, "verdict_timeout": verdict_timeout}
    deployments = []
    for name, (flow, schedule) in SCHEDULES.items():
        timing = {"interval": schedule} if isinstance(schedule, timedelta) else {"cron": schedule} if schedule else {}
        deployments.append(
            flow.to_deployment(
                name=name,
                parameters={**task, **own.get(name, {})},
                # `flows.batch.resolve_batch_flow` rather than a file path relative to wherever `gil serve` was
                # started: the runs import the installed package, from any directory.
                entrypoint_type=EntrypointType.MODULE_PATH,
                **timing,
            )
        )
    return deployments


def serve_all(
    task_file: Path,
    tickets: Path,
    verdicts: Path,
    decision_timeout: int = SCHEDULED_DECISION_TIMEOUT,
    verdict_timeout: int = SCHEDULED_VERDICT_TIMEOUT,
    *,
    form: TicketFormat = DEFAULT_FORMAT,
) -> None:
    """Register every deployment with the Prefect API and run them on their schedules (blocks).

    Missing queue files are created empty, so that the runs every 5 minutes find nothing to do instead of failing.
    """
    from prefect import serve

    for queue in (tickets, verdicts):
        queue.parent.mkdir(parents=True, exist_ok=True)
        queue.touch(exist_ok=True)
    serve(*build_deployments(task_file, tickets, verdicts, decision_timeout, verdict_timeout, form=form))
