"""fit-energy, fit-reflex, rebuild-memory and compact-telemetry: the flows that keep a store's figures, its
learned judge and memory right."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact

from flows._prefect import artifact_key, gil_task
from flows._progress import task_progress
from gil_core.learned import describe_nodes
from gil_core.maintenance import compact_store, fit_and_store_energy
from gil_core.memory import compact_memory
from gil_core.reporting import learned_markdown
from gil_core.runtime import open_learner, open_runtime
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore


@gil_task(name="fit energy")
def fit_energy_task(task_file: str) -> dict[str, Any] | None:
    model = fit_and_store_energy(TelemetryStore(load_task_file(task_file).store))
    return asdict(model) if model is not None else None


@gil_task(name="fit learned reflex", retries=1)
async def fit_reflex_task(task_file: str) -> dict[str, Any]:
    """Refit the task's learned judge from the log (its store and embedder only: no chat model is started) and
    publish its per-node table as an artifact."""
    loaded = load_task_file(task_file)
    if loaded.task.policy.learned is None:
        get_run_logger().info("task %r has no learned_reflex: nothing to fit", loaded.task.name)
        return {"task": loaded.task.name, "nodes": []}
    async with open_learner(loaded) as learner:
        state = await learner.refresh(loaded.task, force=True)
    key = artifact_key(loaded.task.name, "learned-reflex")
    await acreate_markdown_artifact(learned_markdown(state), key=key, description="The learned reflex, per node")
    memory = state.memory.to_json() if state.memory is not None else None
    return {"task": state.task, "fitted_on": dict(state.fitted_on), "nodes": describe_nodes(state), "memory": memory}


@gil_task(name="rebuild memory", retries=2)
async def rebuild_memory_task(task_file: str) -> int:
    loaded = load_task_file(task_file)
    async with open_runtime(loaded) as runtime:
        return await runtime.resolver.rebuild_memory(loaded.task)


@gil_task(name="compact tables", retries=1)
def compact_task(task_file: str) -> dict[str, int]:
    return compact_store(TelemetryStore(load_task_file(task_file).store))


@gil_task(name="compact memory", retries=1)
async def compact_memory_task(task_file: str) -> dict[str, int]:
    loaded = load_task_file(task_file)
    if loaded.task.policy.memory_threshold is None:  # memory off: no table to keep
        return {}
    done = await compact_memory(loaded.memory)
    return {} if done is None else {"memory (data files merged)": done.fragments_removed}


@flow(name="fit-energy")
async def fit_energy_flow(task_file: str) -> dict[str, Any] | None:
    """Fit energy coefficients to the server timings in the store; later prices and stats use them."""
    fitted = fit_energy_task(task_file)
    get_run_logger().info("energy model: %s", json.dumps(fitted) if fitted else "too few samples to fit")
    return fitted


@flow(name="fit-reflex")
async def fit_reflex_flow(task_file: str) -> dict[str, Any]:
    """Refit the learned reflex from the log (feedback already refits the nodes it touched; this nightly run
    also picks up verdicts written by other means, and republishes the per-node table)."""
    async with task_progress(task_file, "fit-reflex-progress", "fit-reflex: the refit", steps=1) as progress:
        fitted = await fit_reflex_task(task_file)
        progress.advance()
    return fitted


@flow(name="rebuild-memory")
async def rebuild_memory_flow(task_file: str) -> int:
    """Make memory hold what the feedback history confirms (after a restart on a new disk, or a new store)."""
    async with task_progress(task_file, "rebuild-memory-progress", "rebuild-memory: the rebuild", steps=1) as progress:
        entries = await rebuild_memory_task(task_file)
        progress.advance()
    return entries


@flow(name="compact-telemetry")
async def compact_telemetry_flow(task_file: str) -> dict[str, int]:
    """Merge each table's small files into one, and memory's table's too, deleting its versions older than an
    hour (safe while other processes write and read)."""
    return compact_task(task_file) | await compact_memory_task(task_file)
