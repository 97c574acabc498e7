"""Every flow as a deployment with its default schedule (ARCHITECTURE.md, "Flows"), served by ``gil serve``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from flows.batch import apply_feedback_flow, resolve_batch_flow
from flows.maintenance import compact_telemetry_flow, fit_energy_flow, rebuild_memory_flow

EVERY_5_MINUTES = timedelta(minutes=5)
HOURLY = timedelta(hours=1)
NIGHTLY = "0 3 * * *"
WEEKLY = "0 6 * * 1"


def build_deployments(task_file: Path, tickets: Path, verdicts: Path) -> list[Any]:
    """The deployments, with parameters pointing at this task file and its queue files."""
    task = {"task_file": str(task_file.resolve())}
    deployments = [
        resolve_batch_flow.to_deployment(
            name="resolve-batch",
            interval=EVERY_5_MINUTES,
            parameters={**task, "tickets": str(tickets.resolve()), "out": str(tickets.resolve()) + ".results.jsonl"},
        ),
        apply_feedback_flow.to_deployment(
            name="apply-feedback", interval=EVERY_5_MINUTES, parameters={**task, "verdicts": str(verdicts.resolve())}
        ),
        fit_energy_flow.to_deployment(name="fit-energy", cron=NIGHTLY, parameters=task),
        rebuild_memory_flow.to_deployment(name="rebuild-memory", parameters=task),
        compact_telemetry_flow.to_deployment(name="compact-telemetry", interval=HOURLY, parameters=task),
    ]
    deployments += review_deployments(task)
    return deployments


def review_deployments(task: dict[str, str]) -> list[Any]:
    """The weekly review rounds (present once the review flows are)."""
    try:
        from flows.review import deactivation_round_flow, differentiation_round_flow, promotion_round_flow
    except ImportError:  # pragma: no cover - review flows arrive with the reading-the-log work
        return []
    return [
        flow.to_deployment(name=name, cron=WEEKLY, parameters=task)
        for name, flow in (
            ("promotion-round", promotion_round_flow),
            ("deactivation-round", deactivation_round_flow),
            ("differentiation-round", differentiation_round_flow),
        )
    ]


def serve_all(task_file: Path, tickets: Path, verdicts: Path) -> None:
    """Register every deployment with the Prefect API and run them on their schedules (blocks)."""
    from prefect import serve

    serve(*build_deployments(task_file, tickets, verdicts))
