"""Our defaults for Prefect tasks: no result caching (handles and stores are not hashable inputs), results kept
in memory only, retries only where a task does I/O that a retry can fix. Also the task runners a batch runs on,
and the Prefect global concurrency limits that bound calls to each model server across every process."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, Literal, ParamSpec, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from gil_core.reviews import safe_name

P = ParamSpec("P")
R = TypeVar("R")
RunnerKind = Literal["threads", "dask"]


_ARTIFACT_KEY = re.compile(r"[a-z0-9-]{1,64}")  # what Prefect accepts in an artifact key


def artifact_key(task_name: str, *kinds: str) -> str:
    """A task's Prefect artifact key, ``<task>-<kind>…``: a task name Prefect would refuse (capitals, ``_``, ``/``,
    spaces…) escaped by ``gil_core.reviews.safe_name`` to lower-case letters, digits and dashes."""
    task = safe_name(task_name, _ARTIFACT_KEY).lower().replace("_", "-")
    return "-".join((task, *kinds))


def gil_task(
    *, name: str, retries: int = 0, retry_delay_seconds: float = 2.0
) -> Callable[[Callable[P, R]], Task[P, R]]:
    """``prefect.task`` with Gil's defaults."""
    return task(
        name=name,
        cache_policy=NO_CACHE,
        persist_result=False,
        retries=retries,
        retry_delay_seconds=retry_delay_seconds,
    )


@contextmanager
def batch_task_runner(kind: RunnerKind, workers: int, scheduler: str | None = None) -> Iterator[tuple[TaskRunner, int]]:
    """A started task runner for a batch's chunks and how many chunks it runs at once.

    ``threads``: one thread in this process. ``dask``: the scheduler at ``scheduler`` (its workers' threads), or
    a ``distributed.LocalCluster`` of ``workers`` processes with one thread each, started with the 'spawn' method
    (a worker never inherits this process's LanceDB or HTTP handles) and stopped on exit. Task runs in the
    workers report to the Prefect API this flow reports to (``api_for_workers``).
    """
    if kind == "threads":
        with ThreadPoolTaskRunner[Any](max_workers=1) as threads:
            yield threads, 1
        return
    if kind != "dask":
        raise ValueError(f"task_runner must be 'threads' or 'dask', got {kind!r}")
    try:
        from prefect_dask.task_runners import DaskTaskRunner
    except ImportError as exc:  # the optional 'scale' extra
        raise ValueError("task_runner 'dask' needs prefect-dask and distributed (the 'scale' extra)") from exc
    if scheduler:
        runner = DaskTaskRunner(address=scheduler)
    else:
        cluster = local_cluster_options(workers)
        runner = DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=cluster)
    with spawned_workers(), api_for_workers(), runner:
        yield runner, max(1, sum(runner.client.nthreads().values()))


def local_cluster_options(workers: int) -> dict[str, Any]:
    """The ``distributed.LocalCluster`` arguments of a batch: ``workers`` processes of one thread each, every
    server on loopback. Start it inside ``spawned_workers()``."""
    if workers < 1:
        raise ValueError(f"workers must be ≥ 1, got {workers}")
    return {
        "n_workers": workers,
        "processes": True,
        "threads_per_worker": 1,
        "host": "127.0.0.1",
        "dashboard_address": "127.0.0.1:0",  # its HTTP server binds anyway: loopback, a free port
        "silence_logs": logging.WARNING,
    }


@contextmanager
def spawned_workers() -> Iterator[None]:
    """Dask worker processes started in here are spawned, never forked: a worker inherits no LanceDB or HTTP
    handle of this process, only its environment (where it reads ``GIL_S3_*`` and the other settings)."""
    import dask

    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}):
        yield


@contextmanager
def api_for_workers() -> Iterator[None]:
    """Make task runs submitted inside report to this process's Prefect API.

    Without ``PREFECT_API_URL`` a flow runs on Prefect's ephemeral server, and a worker process would start an
    ephemeral server of its own (a different database); the submitted context carries the settings, so pinning
    the address here sends every worker to the same server. With ``PREFECT_API_URL`` set, nothing changes.
    """
    if PREFECT_API_URL.value():
        yield
        return
    with get_client(sync_client=True) as client:
        url = str(client.api_url)
    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


def endpoint_limit_name(endpoint: str) -> str:
    """The Prefect global concurrency limit that bounds calls in flight to one model server."""
    return f"gil-model-{endpoint}"


async def ensure_endpoint_limits(endpoints: Sequence[str], default: int) -> tuple[list[str], int]:
    """The global concurrency limits of ``endpoints`` (created with ``default`` slots where missing; an existing
    limit is kept, so a value an operator set in the UI wins) and the smallest of their slot counts."""
    names = [endpoint_limit_name(endpoint) for endpoint in endpoints]
    slots: list[int] = []
    async with get_client() as client:
        for name in names:
            try:  # read first: a create that collides makes the server log a traceback
                limit = await client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                with suppress(ObjectAlreadyExists):  # another batch made it in between
                    await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=default))
                limit = await client.read_global_concurrency_limit_by_name(name)
            if limit.active and limit.limit < 1:
                raise ValueError(f"the Prefect concurrency limit {name!r} has no slots: raise it to run a batch")
            slots.append(limit.limit if limit.active else default)
    return names, min(slots, default=default)
