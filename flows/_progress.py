"""A flow run's progress as a Prefect progress artifact: created at 0% when the work starts, updated in place as
work finishes (at most once every ``interval`` seconds, and always at the end), so the run's Artifacts tab in the
Prefect UI shows a long batch, rebuild or review round moving.

Work is counted with ``advance`` from any thread of the flow's process (a chunk resolved on the thread runner
counts its tickets one by one); the updates are sent by one thread of the flow's own, in the flow run's context,
so they keep going while the flow waits on its chunks. On Dask, the workers do not touch the artifact: the flow
advances it as each chunk's result comes back.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from uuid import UUID

from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact, update_progress_artifact

__all__ = ["FlowProgress", "flow_progress", "progress_of", "task_progress"]

UPDATE_INTERVAL = 1.0
"""The shortest time between two updates of one artifact, in seconds (the last update is always sent)."""

_RUNNING: dict[str, FlowProgress] = {}  # by artifact id: what a task in this process advances
_RUNNING_LOCK = threading.Lock()


class FlowProgress:
    """``done`` of ``total`` units of work, as a percentage in the artifact ``artifact_id``."""

    def __init__(
        self,
        artifact_id: UUID,
        total: int,
        *,
        interval: float = UPDATE_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.artifact_id = artifact_id
        self.total = max(0, total)
        self.done = 0
        self.sent: list[float] = []  # every percentage sent, in order (what the UI was shown)
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last_sent_at = float("-inf")

    @property
    def percent(self) -> float:
        with self._lock:
            if self.total == 0:
                return 100.0
            return min(100.0, 100.0 * self.done / self.total)

    def advance(self, units: int = 1) -> None:
        """Count ``units`` more done (thread-safe; sends nothing)."""
        with self._lock:
            self.done += units

    def set_total(self, total: int) -> None:
        with self._lock:
            self.total = max(0, total)

    def publish(self) -> bool:
        """From a thread with no event loop: send the current percentage if it changed and the last update is
        ``interval`` old; whether it sent one."""
        percent = self._due(final=False)
        if percent is None:
            return False
        # `_sync`: the thread runs in a copy of an async flow's context, where Prefect's dispatch would otherwise
        # hand back the async form's coroutine, unawaited (and nothing sent).
        update_progress_artifact(self.artifact_id, percent, _sync=True)  # type: ignore[call-arg]
        return True

    async def finish(self) -> None:
        """From the flow's event loop: send 100%."""
        if self._due(final=True) is not None:
            await aupdate_progress_artifact(self.artifact_id, 100.0)

    def _due(self, *, final: bool) -> float | None:
        percent = 100.0 if final else self.percent
        with self._lock:
            if self.sent and self.sent[-1] == percent:
                return None
            if not final and self._clock() - self._last_sent_at < self._interval:
                return None
            self._last_sent_at = self._clock()
            self.sent.append(percent)
        return percent


def progress_of(artifact_id: str | None) -> FlowProgress | None:
    """The progress of this process's running flow with that artifact (None on another process: a Dask worker)."""
    if artifact_id is None:
        return None
    with _RUNNING_LOCK:
        return _RUNNING.get(artifact_id)


@contextlib.asynccontextmanager
async def flow_progress(
    key: str, description: str, total: int, *, interval: float = UPDATE_INTERVAL
) -> AsyncIterator[FlowProgress]:
    """Create the artifact at 0%, keep it current while the body runs (looked at every ``interval``), and send
    100% when the body completes (a body that raises leaves the last percentage it reached)."""
    artifact_id = await acreate_progress_artifact(0.0, key=key, description=description)
    progress = FlowProgress(artifact_id, total, interval=interval)
    progress.sent.append(0.0)
    with _RUNNING_LOCK:
        _RUNNING[str(artifact_id)] = progress
    stop = threading.Event()
    context = contextvars.copy_context()  # the flow run's client and settings, for the updating thread
    updater = threading.Thread(
        target=context.run, args=(_keep_current, progress, stop, interval), name="gil-progress", daemon=True
    )
    updater.start()
    completed = False
    try:
        yield progress
        completed = True
    finally:
        stop.set()
        updater.join()
        with _RUNNING_LOCK:
            _RUNNING.pop(str(artifact_id), None)
        if completed:
            await progress.finish()


def _keep_current(progress: FlowProgress, stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        with contextlib.suppress(Exception):  # a missed update is made good by the next one, or the last
            progress.publish()


def task_progress(task_file: str, kind: str, description: str, steps: int) -> AbstractAsyncContextManager[FlowProgress]:
    """``flow_progress`` for a flow of a few long steps on one task's file: the artifact ``<task>-<kind>``."""
    from flows._prefect import artifact_key
    from gil_core.taskfile import load_task_file

    return flow_progress(artifact_key(load_task_file(task_file).task.name, kind), description, total=steps)
