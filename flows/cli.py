"""The ``gil`` command. Commands that a program reads take ``--json``; errors print one line and exit non-zero.

Every command works on a task file (``--task-file``, default ``gil.yaml`` or ``$GIL_TASK_FILE``); see the
README's "Task file" section for its keys.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.table import Table

from flows._cli_common import (
    EncodingOption,
    IdColumnOption,
    JsonOption,
    TaskFileOption,
    TextColumnOption,
    console,
    emit,
    fail,
    fit_to_output,
    guarded,
    run,
    task_file,
    warn,
)
from flows._cli_init import init_command
from flows._cli_maintenance import add_maintenance_commands, stats
from flows._cli_review import review_app

# Every command imports what it uses in its own body: `gil --help` and `gil lint-tree` load no Polars, pandera,
# LanceDB, Prefect or scikit-learn (benchmarks/speed.py, "commands start only what they use").

app = typer.Typer(
    name="gil",
    help="Gil: confirmed-answer memory and one-token judgments in front of an LLM.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.command()
def resolve(
    text: Annotated[str, typer.Argument(help="The request to resolve.")],
    task_file_path: TaskFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Resolve one request: memory, then the tree, then generation. Prints the answer and how it was found."""
    from gil_core.runtime import open_runtime

    loaded = task_file(task_file_path)
    if not text.strip():  # as a batch refuses a ticket without text
        raise fail("the request is empty: nothing to resolve")

    async def work() -> dict[str, Any]:
        async with open_runtime(loaded) as runtime:
            resolution = await runtime.resolver.resolve(loaded.task, text)
        return {
            "trace_id": resolution.trace_id,
            "mode": resolution.mode,
            "output": resolution.output,
            "confidence": resolution.confidence,
            "energy": resolution.energy,
            "path": [step.node for step in resolution.path],
            "failure": resolution.failure,
        }

    result = run(work())
    answer = result["output"] if result["output"] is not None else f"no answer ({result['failure'] or 'none given'})"
    emit(result, as_json, lambda: console.print(f"[bold]{result['mode']}[/bold]: {answer}", highlight=False))


@app.command("resolve-batch")
def resolve_batch_command(
    tickets: Annotated[
        Path,
        typer.Argument(
            help="Tickets: JSONL lines {id, text}, or Parquet with id and text, or CSV (.csv, .tsv) with a header "
            "naming id and text."
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Results JSONL (one line per ticket); .csv or .tsv: a sheet with empty correct and correction "
            "columns to fill in and give to gil feedback.",
        ),
    ],
    task_file_path: TaskFileOption = None,
    concurrency: Annotated[int | None, typer.Option(help="Requests in flight (default: the task file's).")] = None,
    task_runner: Annotated[
        str,
        typer.Option(
            "--task-runner",
            help="threads: in this process, without Prefect. dask: the resolve-batch flow, in chunks on Dask "
            "worker processes, calls per model server bounded across them by a Prefect global concurrency limit.",
        ),
    ] = "threads",
    workers: Annotated[int, typer.Option(help="Worker processes of the Dask LocalCluster (--task-runner dask).")] = 4,
    scheduler: Annotated[
        str | None, typer.Option(help="Address of a running Dask scheduler to use instead of a LocalCluster.")
    ] = None,
    max_line_bytes: Annotated[
        int, typer.Option(help="Longest ticket line accepted (bytes); a longer one is skipped, named file:line.")
    ] = 4 * 1024 * 1024,
    lock_wait: Annotated[
        float,
        typer.Option(help="Seconds to wait while another batch of the task runs; then this one skips (exit 0)."),
    ] = 60.0,
    id_column: IdColumnOption = "id",
    text_column: TextColumnOption = None,
    encoding_name: EncodingOption = "utf-8",
    as_json: JsonOption = False,
) -> None:
    """Resolve a batch of tickets. Idempotent by ticket id: a rerun resolves only tickets without a trace.
    One batch per task at a time: a second one waits up to --lock-wait, then skips, saying why."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gil_core.batch import (
        BadInput,
        Ticket,
        TicketColumns,
        TicketFormat,
        count_lines,
        resolve_batch,
        write_results,
    )
    from gil_core.batch_lock import hold_batch_turn_async, skipped_batch
    from gil_core.runtime import open_runtime

    loaded = task_file(task_file_path)
    if task_runner not in ("threads", "dask"):
        raise fail(f"--task-runner: expected threads or dask, got {task_runner!r}")
    if max_line_bytes < 1:
        raise fail(f"--max-line-bytes: must be ≥ 1, got {max_line_bytes}")
    texts = tuple(text_column or ("text",))
    form = guarded(lambda: TicketFormat(TicketColumns(id_column, texts), encoding_name, max_line_bytes))
    lines = guarded(lambda: count_lines(tickets))  # the bar's total; a missing or unreadable file stops here
    bad: list[BadInput] = []

    def valid(*, report_bad: bool) -> Iterator[Ticket]:
        """The file's tickets, streamed; each bad line warned about (and kept) on the first pass only."""
        for item in form.read(tickets):
            if isinstance(item, Ticket):
                yield item
            elif report_bad:
                warn("skipped", item)
                bad.append(item)

    async def on_dask() -> dict[str, Any]:
        _prefect_environment()
        from flows.batch import resolve_batch_flow

        for _ in valid(report_bad=True):  # the bad lines, said first as the in-process path says them
            pass
        returned = await resolve_batch_flow(
            str(loaded.path),
            str(tickets),
            str(out),
            concurrency,
            "dask",
            workers,
            scheduler,
            max_line_bytes,
            lock_wait,
            id_column=form.columns.id,
            text_columns=list(form.columns.text),
            encoding=form.encoding,
        )
        # A flow that returns a State (a skipped batch's Completed) hands its caller that state's data: a dict.
        summary = cast("dict[str, Any]", returned)
        failed = summary["failed"][len(bad) :]  # the flow lists the bad lines first
        return {**summary, "failed": failed, "bad_lines": [str(item) for item in bad], "out": str(out)}

    async def work() -> dict[str, Any]:
        def waiting(holder: str) -> None:
            warn("waiting", f"up to {lock_wait:g} s: {holder}")

        async with hold_batch_turn_async(loaded.store, loaded.task.name, wait_s=lock_wait, on_wait=waiting) as turn:
            if not turn.held:
                return {**skipped_batch(turn.reason), "bad_lines": [], "written": 0, "out": str(out)}
            return await resolve_tickets()

    async def resolve_tickets() -> dict[str, Any]:
        with Progress(
            TextColumn("resolving"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), disable=as_json
        ) as bar:
            job = bar.add_task("tickets", total=lines)
            async with open_runtime(loaded) as runtime:
                report = await resolve_batch(
                    runtime.resolver,
                    loaded.task,
                    valid(report_bad=True),
                    concurrency=concurrency or loaded.concurrency,
                    progress=lambda done, total: bar.update(job, completed=done, total=total),
                    total=lines,
                )
                bar.update(job, completed=report.resolved + report.skipped + len(report.failed), total=report.tickets)
                written = write_results(runtime.store, loaded.task, valid(report_bad=False), out)
        return {**report.to_json(), "bad_lines": [str(item) for item in bad], "written": written, "out": str(out)}

    result = run(on_dask() if task_runner == "dask" or scheduler else work())
    if "batch_skipped" in result:
        warn("skipped this batch:", result["batch_skipped"])
        emit(result, as_json, lambda: console.print(f"skipped: {result['batch_skipped']}", highlight=False))
        return
    for failure in result["failed"]:
        warn("failed", failure)
    emit(
        result,
        as_json,
        lambda: console.print(
            f"resolved {result['resolved']}, already done {result['skipped']}, "
            f"failed {len(result['failed'])}, bad lines {len(bad)} → {out}"
        ),
    )


@app.command()
def feedback(
    verdicts: Annotated[
        Path,
        typer.Argument(
            help="Verdicts JSONL: {trace_id, correct, correction?} per line; or CSV (.csv, .tsv) with those columns, "
            "such as a results sheet filled in (a row with correct empty is passed over). With --key, an answer key."
        ),
    ],
    task_file_path: TaskFileOption = None,
    key: Annotated[
        bool,
        typer.Option(
            "--key",
            help="The file is an answer key (JSONL, CSV or Parquet): each resolved ticket's id and the answer it "
            "should have got. A ticket whose answer matches is right; any other is wrong, corrected to the key's.",
        ),
    ] = False,
    id_column: IdColumnOption = "id",
    answer_column: Annotated[str, typer.Option(help="With --key: the column holding the right answer.")] = "answer",
    option_column: Annotated[
        str | None,
        typer.Option(
            help="With --key, instead of --answer-column: the column naming the right answer in the tree (an "
            "option's id or label, or none of these), as a help desk's category column may. Graded by which answer "
            "it is; a wrong one is corrected to the named answer's text (a template's filled from the request by "
            "its patterns; a procedure, or a template they do not fill, is wrong without a correction)."
        ),
    ] = None,
    encoding_name: EncodingOption = "utf-8",
    as_json: JsonOption = False,
) -> None:
    """Apply verdicts: memory remembers confirmed answers and forgets wrong hits; habit statistics learn."""
    from gil_core.batch import AnswerKey, read_feedback
    from gil_core.batch_feedback import apply_verdicts
    from gil_core.runtime import open_runtime
    from gil_core.telemetry import TelemetryStore

    loaded = task_file(task_file_path)
    if option_column is not None and not key:
        raise fail("--option-column: names a column of an answer key: give --key too")
    answer_key = AnswerKey(id_column, answer_column, option_column) if key else None
    store = TelemetryStore(loaded.store)
    items, bad = guarded(lambda: read_feedback(store, loaded.task, verdicts, encoding=encoding_name, key=answer_key))
    for item in bad:
        warn("skipped", item)

    async def work() -> dict[str, Any]:
        async with open_runtime(loaded) as runtime:
            report = await apply_verdicts(runtime.resolver, loaded.task, items)
        return {**report.to_json(), "bad_lines": [str(item) for item in bad]}

    result = run(work())

    def said() -> None:
        for failure in result["failed"]:  # as resolve-batch names its failed tickets
            warn("failed", failure)
        line = (
            f"applied {result['applied']}, unchanged {result['unchanged']}, failed {len(result['failed'])}, "
            f"bad lines {len(bad)}"
        )
        if result.get("not_learned"):
            line += f"; memory did not learn {result['not_learned']} (the verdicts are stored: gil rebuild-memory)"
        console.print(line)
        if outside := result.get("not_tree_answers"):
            console.print(
                f"{outside} correction{'s are' if outside != 1 else ' is'} none of the tree's answers: memory keeps"
                " them, the learned reflex learns nothing from them (correct with the tree's answer, its text or"
                " template filled in, or with none of these)",
                highlight=False,
            )

    emit(result, as_json, said)


add_maintenance_commands(app)  # stats, fit-reflex, …, doctor: listed after feedback
app.command("init")(init_command)
app.add_typer(review_app, name="review")


UI_HOST, UI_PORT = "127.0.0.1", 4200


def _prefect_environment(api_url: str | None = None) -> None:
    """Analytics off everywhere; point at our UI server when asked. Set before Prefect reads its settings."""
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ["DO_NOT_TRACK"] = "1"
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    # The ephemeral server's first start runs its migrations: on a busy 2-core machine that takes a while.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    if api_url:
        os.environ["PREFECT_API_URL"] = api_url


@app.command()
def demo(
    task_file_path: TaskFileOption = None,
    limit: Annotated[int, typer.Option(help="Use only the first N tickets (0 = all 300).")] = 0,
    chunk: Annotated[
        int,
        typer.Option(
            help="Tickets per batch in the first pass, feedback after each: a small queue with frequent feedback, "
            "so the learned reflex starts serving early."
        ),
    ] = 10,
    fresh: Annotated[
        bool,
        typer.Option(
            help="Start from an empty demo store and memory. --no-fresh keeps them (what earlier runs taught) and "
            "sends the tickets again as new ones."
        ),
    ] = True,
    as_json: JsonOption = False,
) -> None:
    """Run the bundled support tickets twice through the flows on the local models, with feedback between."""
    _prefect_environment()
    from flows._demo_files import DEMO_ANSWERS, DEMO_TASK_FILE, DEMO_TICKETS, shown
    from flows.demo import demo_flow, prepare

    chosen = task_file_path or DEMO_TASK_FILE
    loaded = task_file(chosen)
    paths = guarded(lambda: prepare(chosen, fresh=fresh))
    console.print(f"demo: {DEMO_TICKETS.name} through {loaded.task.tree.source} (task {loaded.task.name})")
    if paths.run:
        console.print(
            f"demo: the store is kept, with what earlier runs taught; this run's tickets are new to it, their ids "
            f"ending in {paths.run}"
        )
    summary = run(
        demo_flow(
            str(chosen),
            str(DEMO_TICKETS),
            str(DEMO_ANSWERS),
            str(paths.work),
            chunk=chunk,
            limit=limit,
            run=paths.run,
        )
    )

    def render() -> None:
        table = Table(title="gil demo: two passes over the bundled tickets")
        for column in ("pass", "requests", "accuracy", "memory share", "mean energy / request", "modes"):
            table.add_column(column, justify="left" if column in ("pass", "modes") else "right")
        for name, row in summary.items():
            modes = ", ".join(f"{mode} {count}" for mode, count in row["modes"].items())
            table.add_row(
                name,
                str(row["requests"]),
                f"{row['accuracy']:.1%}",
                f"{row['memory_share']:.1%}",
                f"{row['mean_energy']:.1f}",
                modes,
            )
        console.print(table)
        missed = summary["first"].get("misses", {})
        console.print("first pass, why the misses missed: " + ", ".join(f"{k} {v}" for k, v in missed.items()))
        stats(task_file_path=chosen, window=50, as_json=False)
        store = loaded.store.resolve() if isinstance(loaded.store, Path) else loaded.store
        console.print(
            f"Everything is in the store at {store}: `gil stats -t {shown(Path(chosen))}` reads it again. The runs, "
            f"logs and artifacts are in Prefect: run `gil ui` and open http://{UI_HOST}:{UI_PORT}/runs"
        )

    emit(summary, as_json, render)


@app.command()
def ui(
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = UI_HOST,
    port: Annotated[int, typer.Option(help="Port of the Prefect server and UI.")] = UI_PORT,
) -> None:
    """Start the Prefect server and UI on loopback, analytics off (blocks until stopped)."""
    _prefect_environment()
    address = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    # `prefect server start --port` does not tell the page where the API is: without this it calls :4200 (or
    # whatever PREFECT_API_URL says) and shows an empty UI. Offline users need no Prefect Cloud banners either.
    os.environ["PREFECT_SERVER_UI_API_URL"] = f"{address}/api"
    os.environ.setdefault("PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT", "false")
    command = [
        sys.executable,
        "-m",
        "prefect",
        "server",
        "start",
        "--host",
        host,
        "--port",
        str(port),
        "--analytics-off",
    ]
    console.print(f"Prefect UI on {address} (Ctrl-C stops it)")
    sys.stdout.flush()
    # Become the server rather than wait for a child: Ctrl-C and SIGTERM then reach it directly, and stopping
    # `gil ui` can never leave an orphaned server holding the port.
    os.execv(sys.executable, command)


@app.command()
def serve(
    task_file_path: TaskFileOption = None,
    tickets: Annotated[Path, typer.Option(help="The queue file resolve-batch reads every 5 minutes.")] = Path(
        "queue/tickets.jsonl"
    ),
    verdicts: Annotated[Path, typer.Option(help="The verdicts file apply-feedback reads.")] = Path(
        "queue/verdicts.jsonl"
    ),
    api_url: Annotated[
        str, typer.Option(help="Prefect API of the `gil ui` server.")
    ] = f"http://{UI_HOST}:{UI_PORT}/api",
    decision_timeout: Annotated[
        int | None,
        typer.Option(
            min=60,
            help="Seconds a scheduled review round waits for decisions in the UI before the undecided proposals"
            " stay deferred (default: six days; each deployment's parameter can be changed in the UI).",
        ),
    ] = None,
    verdict_timeout: Annotated[
        int | None,
        typer.Option(
            min=60,
            help="Seconds the nightly feedback queue waits for verdicts in the UI before its unanswered rows stay"
            " unanswered (default: 23 hours; a deployment parameter too).",
        ),
    ] = None,
    id_column: IdColumnOption = "id",
    text_column: TextColumnOption = None,
    encoding_name: EncodingOption = "utf-8",
) -> None:
    """Register every flow as a deployment with its default schedule against `gil ui`, and run them. The tickets
    file is read by --id-column and --text-column (a help desk's CSV export, say), and both queue files in
    --encoding: the resolve-batch and apply-feedback deployments' parameters, which the UI can change too."""
    _prefect_environment(api_url)
    chosen = task_file_path or Path(os.environ.get("GIL_TASK_FILE", "gil.yaml"))
    task_file(chosen)  # fail early, in one line, on a bad task file
    from gil_core.batch import TicketColumns, TicketFormat

    form = guarded(lambda: TicketFormat(TicketColumns(id_column, tuple(text_column or ("text",))), encoding_name))
    _require_prefect_api(api_url)
    from flows.deployments import serve_all

    timeouts = {"decision_timeout": decision_timeout, "verdict_timeout": verdict_timeout}
    chosen_timeouts = {name: value for name, value in timeouts.items() if value is not None}
    guarded(lambda: serve_all(chosen, tickets, verdicts, form=form, **chosen_timeouts))


def _require_prefect_api(api_url: str) -> None:
    """One line instead of Prefect's traceback when no server answers at the API URL."""
    import httpx

    try:
        httpx.get(f"{api_url.rstrip('/')}/health", timeout=10.0).raise_for_status()
    except httpx.HTTPError as exc:
        raise fail(f"no Prefect API at {api_url} ({exc}): start `gil ui` first, or pass --api-url") from None


def main() -> None:  # the console-script entry point
    fit_to_output()
    app()


if __name__ == "__main__":
    main()
