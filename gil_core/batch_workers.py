"""What the worker processes of one batch share: the model servers, by which a concurrency bound held across the
processes is keyed, and the client's rate limit, split between them.
"""

from __future__ import annotations

from dataclasses import replace

import httpx

from gil_core.errors import ConfigurationError
from gil_core.settings import load_settings
from gil_core.taskfile import ModelSpec, TaskFile

__all__ = ["model_endpoints", "share_client_budget"]


def model_endpoints(task_file: TaskFile) -> tuple[str, ...]:
    """The model servers a task file's batch talks to, one key per server (``host:port``, or ``local`` for the
    embedded server): what a concurrency bound shared by several processes is keyed by. In-process models
    (``hash``, ``none``, the ``local`` embedder) are no server and have no key."""
    specs = [task_file.chat_model, task_file.embedding_model]
    if task_file.fallback_chat_model is not None:
        specs.append(task_file.fallback_chat_model)
    keys = [_endpoint(spec, chat=spec is not task_file.embedding_model) for spec in specs]
    return tuple(dict.fromkeys(key for key in keys if key is not None))


def _endpoint(spec: ModelSpec, *, chat: bool) -> str | None:
    if spec.kind == "local":
        return "local" if chat else None
    if spec.kind != "remote" or spec.url is None:
        return None
    url = httpx.URL(spec.url)
    return f"{url.host}:{url.port or (443 if url.scheme == 'https' else 80)}"


def share_client_budget(task_file: TaskFile, workers: int) -> TaskFile:
    """The task file as one of ``workers`` processes should run it: each process has its own rate limiter (a
    token bucket in memory), so each gets ``1/workers`` of the requests per second and of the burst, and the
    processes together stay within the configured rate. A limiter that is off stays off."""
    if workers < 1:
        raise ConfigurationError(f"workers must be ≥ 1, got {workers}")
    settings = load_settings(**task_file.client)
    local_unlimited = task_file.chat_model.kind == "local" and "requests_per_second" not in task_file.client
    if workers == 1 or settings.requests_per_second == 0 or local_unlimited:
        return task_file
    client = {
        **task_file.client,
        "requests_per_second": settings.requests_per_second / workers,
        "burst": max(1, settings.burst // workers),
    }
    return replace(task_file, client=client)
