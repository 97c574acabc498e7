"""resolve-batch and apply-feedback: tickets → traces → results; verdicts → memory and habit statistics."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from prefect import State, flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.concurrency.asyncio import concurrency as hold_slots
from prefect.runtime import flow_run
from prefect.settings import PREFECT_API_URL
from prefect.states import Completed

from flows._prefect import RunnerKind, artifact_key, batch_task_runner, ensure_endpoint_limits, gil_task
from flows._progress import flow_progress, progress_of
from gil_core.batch import (
    MAX_LINE_BYTES,
    AnswerKey,
    BadInput,
    BatchReport,
    Ticket,
    TicketColumns,
    TicketFormat,
    chunk_sizes,
    pending_chunks,
    read_feedback,
    resolve_batch,
    write_results,
)
from gil_core.batch_feedback import apply_verdicts
from gil_core.batch_lock import WAIT_SECONDS, hold_batch_turn_async, skipped_batch
from gil_core.batch_scope import new_batch_id
from gil_core.batch_workers import model_endpoints, share_client_budget
from gil_core.reporting import decider_table, refusal_table, savings_markdown, stats_markdown, stats_table
from gil_core.runtime import open_runtime
from gil_core.savings_plot import savings_markdown_image
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore
from gil_core.telemetry.savings import compute_savings


def valid_tickets(tickets_path: str, form: TicketFormat, on_bad: list[BadInput] | None = None) -> Iterator[Ticket]:
    """The valid tickets of the file, read as ``form`` says, streamed; its bad lines go to ``on_bad`` (when given)
    and the run's log."""
    for item in form.read(tickets_path):
        if isinstance(item, Ticket):
            yield item
        elif on_bad is not None:
            get_run_logger().warning("skipped %s", item)
            on_bad.append(item)


@gil_task(name="plan batch")
def plan_batch(
    task_file: str,
    tickets_path: str,
    workers: int,
    form: TicketFormat,
) -> tuple[list[int], int, list[BadInput]]:
    """The sizes of the chunks of tickets still without a trace (one chunk without parallel workers, unless it
    would pass ``chunk_sizes``' bound), how many valid tickets the file holds, and its bad lines. The file is
    streamed: no ticket is held past its window."""
    logger = get_run_logger()
    loaded = load_task_file(task_file)
    bad: list[BadInput] = []
    valid = 0

    def counted() -> Iterator[Ticket]:
        nonlocal valid
        for ticket in valid_tickets(tickets_path, form, bad):
            valid += 1
            yield ticket

    todo = sum(len(chunk) for chunk in pending_chunks(TelemetryStore(loaded.store), loaded.task.name, counted(), []))
    sizes = chunk_sizes(todo, workers, per_worker=4 if workers > 1 else 1)
    logger.info("%d tickets, %d already resolved, %d in %d chunks", valid, valid - todo, todo, len(sizes))
    return sizes, valid, bad


SLOT_WAIT_SECONDS = 600.0


@asynccontextmanager
async def held_slots(limits: list[str], occupy: int) -> AsyncIterator[None]:
    """Hold ``occupy`` slots of each Prefect global concurrency limit in ``limits`` (none: nothing to hold).

    Not strict: a limit an operator deactivated (or deleted) in the UI lifts the bound, with Prefect's warning.
    Waiting is bounded: slots a killed batch left taken (leases live in the Prefect server's memory, so a
    server that stopped with the batch never frees them) end in an error naming the limit and the fix.
    """
    if not limits:
        yield
        return
    try:
        async with hold_slots(limits, occupy=occupy, strict=False, timeout_seconds=SLOT_WAIT_SECONDS):
            yield
    except TimeoutError as exc:
        names = ", ".join(limits)
        raise RuntimeError(
            f"no {occupy} free slot(s) of the Prefect concurrency limit(s) {names} within {SLOT_WAIT_SECONDS:.0f} s."
            " If no other batch is running, a killed batch left them taken: free them with"
            f" `prefect gcl update {limits[0]} --active-slots 0` (each limit in turn)"
        ) from exc


@gil_task(name="resolve chunk")
async def resolve_chunk(
    task_file: str,
    tickets: list[Ticket],
    in_flight: int,
    limits: list[str],
    processes: int,
    progress_id: str | None = None,
    batch_id: str | None = None,
    flow_run_id: str | None = None,
) -> BatchReport:
    """Resolve one chunk in this process, with its own runtime (models, memory and store opened here from the
    task file's paths and URLs). While it runs the chunk holds ``in_flight`` slots of each model server's global
    concurrency limit, and resolves at most that many tickets at once. ``progress_id``: the flow's progress
    artifact, advanced ticket by ticket when the chunk runs in the flow's process (``flows._progress``);
    ``batch_id`` and ``flow_run_id``: what every chunk's traces record (``gil_core.batch_scope``)."""
    logger = get_run_logger()
    loaded = share_client_budget(load_task_file(task_file), processes)
    step = max(1, len(tickets) // 4)
    flow_progress_here = progress_of(progress_id)
    counted = 0

    def progress(done: int, total: int) -> None:
        nonlocal counted
        if flow_progress_here is not None:
            flow_progress_here.advance(done - counted)
            counted = done
        if done == total or done % step == 0:
            logger.info("chunk: %d/%d tickets", done, total)

    async with held_slots(limits, in_flight), open_runtime(loaded) as runtime:
        report = await resolve_batch(
            runtime.resolver,
            loaded.task,
            tickets,
            concurrency=in_flight,
            progress=progress,
            batch_id=batch_id,
            flow_run_id=flow_run_id,
        )
    for item in report.failed:
        logger.warning("ticket failed: %s", item)
    report.trace_ids = {}  # the flow derives them; sent back, they would carry the chunk's tickets with them
    return report


def resolve_chunks(
    runner: Any,
    chunks: Iterable[list[Ticket]],
    parameters: dict[str, Any],
    *,
    ahead: int,
    finished: Callable[[int], None] | None = None,
) -> list[BatchReport]:
    """Submit ``resolve_chunk`` for each chunk as the stream yields it, at most ``ahead`` not finished at once:
    the flow holds those chunks' tickets, never the whole batch's. ``finished(tickets)`` is told as each chunk's
    report comes back."""
    reports: list[BatchReport] = []
    running: deque[tuple[Any, int]] = deque()

    def collect() -> None:
        future, size = running.popleft()
        reports.append(future.result())
        if finished is not None:
            finished(size)

    for chunk in chunks:
        if len(running) >= ahead:
            collect()
        running.append((runner.submit(resolve_chunk, {**parameters, "tickets": chunk}), len(chunk)))
    while running:
        collect()
    return reports


@gil_task(name="write results")
def finish_batch(
    task_file: str,
    tickets_path: str,
    valid: int,
    reports: list[BatchReport],
    bad: list[BadInput],
    out: str | None,
    form: TicketFormat,
) -> dict[str, Any]:
    """Merge the chunks' reports into the batch's, and write one result line per ticket (the file read again,
    streamed)."""
    loaded = load_task_file(task_file)
    report = BatchReport.merged(reports)
    report.tickets = valid
    report.skipped = valid - report.resolved - len(report.failed)
    report.failed[:0] = bad
    store = TelemetryStore(loaded.store)
    tickets = valid_tickets(tickets_path, form)
    written = write_results(store, loaded.task, tickets, out) if out else 0
    return {**report.to_json(), "written": written}


@gil_task(name="apply verdicts")
async def apply_feedback_task(
    task_file: str,
    verdicts_path: str,
    encoding: str = "utf-8",
    key: AnswerKey | None = None,
) -> dict[str, Any]:
    logger = get_run_logger()
    loaded = load_task_file(task_file)
    store = TelemetryStore(loaded.store)
    verdicts, bad = read_feedback(store, loaded.task, verdicts_path, encoding=encoding, key=key)
    for item in bad:
        logger.warning("skipped %s", item)
    async with open_runtime(loaded) as runtime:
        report = await apply_verdicts(runtime.resolver, loaded.task, verdicts)
    report.failed[:0] = bad
    return report.to_json()


@gil_task(name="publish stats")
async def publish_stats(task_file: str, window: int = 50) -> str:
    loaded = load_task_file(task_file)
    store = TelemetryStore(loaded.store)
    stats = store.stats(loaded.task.name, window, tree=loaded.task.tree)
    key = artifact_key(loaded.task.name, "stats")
    await acreate_table_artifact(stats_table(stats), key=key, description="Requests per mode")
    await acreate_table_artifact(
        decider_table(stats), key=f"{key}-deciders", description="Who settled the requests: share, accuracy, energy"
    )
    if stats.memory_refused:
        await acreate_table_artifact(
            refusal_table(stats),
            key=f"{key}-memory-refused",
            description="Memory hits a check took back: judged, memory wrong, answered right instead",
        )
    markdown = stats_markdown(stats)
    await acreate_markdown_artifact(markdown, key=f"{key}-cost", description="Cost per request, by window")
    savings = compute_savings(store, loaded.task.name)
    await acreate_markdown_artifact(
        savings_markdown(savings, savings_markdown_image(savings)),
        key=artifact_key(loaded.task.name, "savings"),
        description="What settled each batch, and energy per request against full generation (estimated)",
    )
    return markdown


@flow(name="resolve-batch", log_prints=True)
async def resolve_batch_flow(
    task_file: str,
    tickets: str,
    out: str | None = None,
    concurrency: int | None = None,
    task_runner: RunnerKind = "threads",
    workers: int = 4,
    scheduler: str | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    lock_wait_s: float = WAIT_SECONDS,
    id_column: str = "id",
    text_columns: list[str] | None = None,
    encoding: str = "utf-8",
) -> dict[str, Any] | State:
    """Resolve queued tickets (JSONL, Parquet or CSV with id and text); a rerun resolves only what is missing.

    One batch per task at a time (``gil_core.batch_lock``): the flow holds the task's turn while it runs (on
    Dask too: the workers never take it). A batch that finds another one running waits up to ``lock_wait_s``,
    then skips, saying why: its run ends Completed, named Skipped, with the reason in its message and its
    summary (``batch_skipped``), and nothing resolved or written.

    The tickets file is streamed: the flow holds the chunks being resolved (at most two per worker, each at most
    ``chunk_sizes``' bound), never the whole file; a line longer than ``max_line_bytes`` is a bad line, named
    file:line, and the rest run. ``id_column`` and ``text_columns`` name where the file holds each ticket's id and
    text (``TicketColumns``; several text columns make one text), ``id`` and ``text`` by default; ``encoding`` the
    encoding a JSONL or CSV file was saved in, UTF-8 by default (``text_encoding``).

    ``task_runner``: ``threads`` (one chunk in this process) or ``dask`` (chunks on a LocalCluster of ``workers``
    processes, or on the Dask scheduler at ``scheduler``). Calls in flight to each model server stay within its
    Prefect global concurrency limit (created with ``concurrency``, default the task file's), across processes;
    a batch on threads against Prefect's ephemeral server is bounded by ``concurrency`` in-process instead.
    """
    loaded = load_task_file(task_file)
    logger = get_run_logger()
    form = TicketFormat(TicketColumns(id_column, tuple(text_columns or ("text",))), encoding, max_line_bytes)

    def waiting(holder: str) -> None:
        logger.info("waiting up to %g s: %s", lock_wait_s, holder)

    async with hold_batch_turn_async(loaded.store, loaded.task.name, wait_s=lock_wait_s, on_wait=waiting) as turn:
        if not turn.held:
            logger.warning("skipped this batch: %s", turn.reason)
            summary = {**skipped_batch(turn.reason), "written": 0}
            return Completed(name="Skipped", message=f"skipped: {turn.reason}", data=summary)
        return await _resolve_batch(task_file, tickets, out, concurrency, task_runner, workers, scheduler, form)


async def _resolve_batch(
    task_file: str,
    tickets: str,
    out: str | None,
    concurrency: int | None,
    task_runner: RunnerKind,
    workers: int,
    scheduler: str | None,
    form: TicketFormat,
) -> dict[str, Any]:
    """The flow's body, while it holds its task's turn."""
    loaded = load_task_file(task_file)
    wanted = concurrency or loaded.concurrency
    if task_runner == "threads" and not PREFECT_API_URL.value():
        # One process on its own ephemeral server: `concurrency` bounds it in-process. A global limit would only
        # add risk here: that server keeps its leases in memory, so a killed batch's slots would stay taken.
        limits: list[str] = []
        slots = wanted
    else:
        limits, slots = await ensure_endpoint_limits(model_endpoints(loaded), wanted)
    with batch_task_runner(task_runner, workers, scheduler) as (runner, parallel):
        path = str(Path(tickets))
        sizes, valid, bad = plan_batch(task_file, path, parallel, form)
        in_flight = max(1, slots // parallel)
        key = artifact_key(loaded.task.name, "batch-progress")
        async with flow_progress(key, f"resolve-batch: {valid:,} tickets", total=valid) as progress:
            here = task_runner == "threads"  # chunks in this process count ticket by ticket; Dask's as they end
            parameters = {
                "task_file": task_file,
                "in_flight": in_flight,
                "limits": limits,
                "processes": parallel,
                "progress_id": str(progress.artifact_id) if here else None,
                "batch_id": new_batch_id(),  # one batch, however many chunks
                "flow_run_id": flow_run.id,
            }
            chunks = pending_chunks(
                TelemetryStore(loaded.store),
                loaded.task.name,
                valid_tickets(path, form),
                sizes,
            )
            reports = resolve_chunks(
                runner, chunks, parameters, ahead=2 * parallel, finished=None if here else progress.advance
            )
    report = finish_batch(task_file, path, valid, reports, bad, out, form)
    await publish_stats(task_file)
    return report


@flow(name="apply-feedback", log_prints=True)
async def apply_feedback_flow(
    task_file: str,
    verdicts: str,
    encoding: str = "utf-8",
    key: bool = False,
    id_column: str = "id",
    answer_column: str = "answer",
    option_column: str | None = None,
) -> dict[str, Any]:
    """Apply a verdicts file (JSONL: trace_id, correct, correction?; or a sheet filled in, ``read_verdicts``) saved
    in ``encoding`` (UTF-8 by default); a verdict already applied counts once. With ``key``, the file is an answer
    key instead, each resolved ticket's id under ``id_column`` and its right answer under ``answer_column``,
    graded against the store (``key_verdicts``, as ``gil feedback --key``); with ``option_column`` too, the key names
    each ticket's right answer in the tree under it instead (an option's id or label, or none of these), as
    ``gil feedback --key --option-column``."""
    answer_key = AnswerKey(id_column, answer_column, option_column) if key else None
    report = await apply_feedback_task(task_file, verdicts, encoding, answer_key)
    await publish_stats(task_file)
    return report
