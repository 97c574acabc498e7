"""The ``gil`` command. Commands that a program reads take ``--json``; errors print one line and exit non-zero.

Every command works on a task file (``--task-file``, default ``gil.yaml`` or ``$GIL_TASK_FILE``); see the
README's "Task file" section for its keys.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

import typer
from rich.console import Console
from rich.table import Table

from gil_core.errors import GilError

if TYPE_CHECKING:
    from gil_core.taskfile import TaskFile

# Every command imports what it uses in its own body: `gil --help` and `gil lint-tree` load no Polars, pandera,
# LanceDB, Prefect or scikit-learn (benchmarks/speed.py, "commands start only what they use").

app = typer.Typer(
    name="gil",
    help="Gil: confirmed-answer memory and one-token judgments in front of an LLM.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
errors = Console(stderr=True)
T = TypeVar("T")

TaskFileOption = Annotated[
    Path | None,
    typer.Option("--task-file", "-t", help="Task file (YAML). Default: $GIL_TASK_FILE, else ./gil.yaml."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for programs instead of tables.")]


def fail(message: str) -> typer.Exit:
    errors.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def warn(label: str, item: object) -> None:
    errors.print(f"[yellow]{label}[/yellow] {item}", highlight=False, soft_wrap=True)


def guarded(work: Callable[[], T]) -> T:
    """Run a command body; a Gil error or a missing file becomes one line on stderr and exit code 2."""
    try:
        return work()
    except GilError as exc:
        raise fail(str(exc)) from None
    except FileNotFoundError as exc:
        raise fail(f"{exc.filename}: no such file") from None
    except (OSError, ValueError) as exc:
        raise fail(str(exc)) from None


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return guarded(lambda: asyncio.run(coroutine))


def task_file(path: Path | None, **overrides: Any) -> TaskFile:
    from gil_core.taskfile import load_task_file

    chosen = path or Path(os.environ.get("GIL_TASK_FILE", "gil.yaml"))
    return guarded(lambda: load_task_file(chosen, **overrides))


def emit(data: Any, as_json: bool, render: Callable[[], None]) -> None:
    if as_json:
        sys.stdout.write(json.dumps(data, ensure_ascii=False, default=str) + "\n")
    else:
        render()


@app.command()
def resolve(
    text: Annotated[str, typer.Argument(help="The request to resolve.")],
    task_file_path: TaskFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Resolve one request: memory, then the tree, then generation. Prints the answer and how it was found."""
    from gil_core.runtime import open_runtime

    loaded = task_file(task_file_path)

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
    emit(result, as_json, lambda: console.print(f"[bold]{result['mode']}[/bold]: {result['output']}", highlight=False))


@app.command("resolve-batch")
def resolve_batch_command(
    tickets: Annotated[Path, typer.Argument(help="Tickets: JSONL lines {id, text}, or Parquet with id and text.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Results JSONL (one line per ticket).")],
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
    as_json: JsonOption = False,
) -> None:
    """Resolve a batch of tickets. Idempotent by ticket id: a rerun resolves only tickets without a trace.
    One batch per task at a time: a second one waits up to --lock-wait, then skips, saying why."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gil_core.batch import BadInput, Ticket, count_lines, iter_tickets, resolve_batch, write_results
    from gil_core.batch_lock import hold_batch_turn_async, skipped_batch
    from gil_core.runtime import open_runtime

    loaded = task_file(task_file_path)
    if task_runner not in ("threads", "dask"):
        raise fail(f"--task-runner: expected threads or dask, got {task_runner!r}")
    if max_line_bytes < 1:
        raise fail(f"--max-line-bytes: must be ≥ 1, got {max_line_bytes}")
    lines = guarded(lambda: count_lines(tickets))  # the bar's total; a missing or unreadable file stops here
    bad: list[BadInput] = []

    def valid(*, report_bad: bool) -> Iterator[Ticket]:
        """The file's tickets, streamed; each bad line warned about (and kept) on the first pass only."""
        for item in iter_tickets(tickets, max_line_bytes=max_line_bytes):
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
            str(loaded.path), str(tickets), str(out), concurrency, "dask", workers, scheduler, max_line_bytes, lock_wait
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
    verdicts: Annotated[Path, typer.Argument(help="Verdicts JSONL: {trace_id, correct, correction?} per line.")],
    task_file_path: TaskFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Apply verdicts: memory remembers confirmed answers and forgets wrong hits; habit statistics learn."""
    from gil_core.batch import apply_verdicts, read_verdicts
    from gil_core.runtime import open_runtime

    loaded = task_file(task_file_path)
    items, bad = guarded(lambda: read_verdicts(verdicts))
    for item in bad:
        warn("skipped", item)

    async def work() -> dict[str, Any]:
        async with open_runtime(loaded) as runtime:
            report = await apply_verdicts(runtime.resolver, loaded.task, items)
        return {**report.to_json(), "bad_lines": [str(item) for item in bad]}

    result = run(work())

    def said() -> None:
        line = f"applied {result['applied']}, unchanged {result['unchanged']}"
        if result.get("not_learned"):
            line += f"; memory did not learn {result['not_learned']} (the verdicts are stored: gil rebuild-memory)"
        console.print(line)

    emit(result, as_json, said)


@app.command()
def stats(
    task_file_path: TaskFileOption = None,
    window: Annotated[int, typer.Option(help="Requests per cost window.")] = 50,
    as_json: JsonOption = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Also draw what settled each batch, and energy per request against full generation (estimated),"
            " into this PNG file (needs the plot extra: matplotlib)."
        ),
    ] = None,
) -> None:
    """Accuracy per mode with 95% Wilson intervals, habit and memory rates, and cost per request over time."""
    loaded = task_file(task_file_path)  # a bad task file is refused before the heavy imports
    from gil_core.learned import describe_nodes
    from gil_core.telemetry import TelemetryStore

    store = guarded(lambda: TelemetryStore(loaded.store))
    result = guarded(lambda: store.stats(loaded.task.name, window, tree=loaded.task.tree))
    state = guarded(lambda: stored_learned_state(store, loaded)) if loaded.task.policy.learned is not None else None
    nodes = describe_nodes(state) if state is not None else None

    def render() -> None:
        console.print(result.render(), highlight=False)
        if loaded.task.policy.learned is not None:
            console.print(_learned_table(nodes) if nodes is not None else "learned reflex: not fitted yet")
            if state is not None and state.memory is not None:
                console.print(state.memory.describe(), highlight=False)

    memory = state.memory.to_json() if state is not None and state.memory is not None else None
    if plot is not None:
        from gil_core.savings_plot import write_savings_plot
        from gil_core.telemetry.savings import compute_savings

        savings = guarded(lambda: compute_savings(store, loaded.task.name))
        guarded(lambda: write_savings_plot(savings, plot))
        if not as_json:
            console.print(f"savings chart ({len(savings.batches)} batches) written to {plot}", highlight=False)
    emit({**result.to_json(), "learned": nodes, "learned_memory": memory}, as_json, render)


def stored_learned_state(store: Any, loaded: TaskFile) -> Any:
    """The learned reflex's newest stored state for the task (None when it was never fitted)."""
    from gil_core.learned import stored_state

    return stored_state(store, loaded.task)


def _learned_table(nodes: list[dict[str, Any]]) -> Table:
    """Per node: how many rows it learned from, the rule it serves by, its cut and the log's figures there."""
    table = Table(title="learned reflex, per node")
    from gil_core.reporting import next_judge_words

    columns = ("node", "rows", "classes", "rule", "evidence", "cut", "precision", "lower bound", "coverage")
    for column in (*columns, "LLM asked"):
        text = column in ("node", "rule", "evidence", "LLM asked")
        # A narrow terminal (80 columns when piped) wraps the long cells and never cuts a node's name or rule.
        table.add_column(column, justify="left" if text else "right", no_wrap=column in ("node", "rule"))
    for row in nodes:
        figures = [row[name] for name in ("cut", "precision", "lower_bound", "coverage")]
        table.add_row(
            row["node"],
            f"{row['rows']:,}",
            str(row["classes"]),
            row["rule"],
            row["evidence"],
            *("—" if value is None else f"{value:.3f}" for value in figures),
            next_judge_words(row),
        )
    return table


@app.command("fit-reflex")
def fit_reflex_command(task_file_path: TaskFileOption = None, as_json: JsonOption = False) -> None:
    """Refit the learned reflex from the log and print, per node, its rows, classes, the rule that lets it serve
    (proven, better than the LLM, withdrawn or learning), the cut, and precision and coverage at the cut; then
    memory's similarity cut read from the same log, and whether generation is still asked."""
    from gil_core.learned import describe_nodes
    from gil_core.runtime import open_learner

    loaded = task_file(task_file_path)
    if loaded.task.policy.learned is None:
        raise fail(f"{loaded.path}: the task has no learned_reflex (see README, Task file)")

    async def work() -> Any:
        async with open_learner(loaded) as learner:
            return await learner.refresh(loaded.task, force=True)

    state = run(work())
    nodes = describe_nodes(state)
    memory = state.memory.to_json() if state.memory is not None else None

    generation = state.generation.to_json() if state.generation is not None else None

    def render() -> None:
        console.print(_learned_table(nodes))
        if state.memory is not None:
            console.print(state.memory.describe(), highlight=False)
        if state.generation is not None:
            console.print(state.generation.describe(), highlight=False)

    summary = {"task": state.task, "fitted_on": dict(state.fitted_on), "nodes": nodes, "memory": memory}
    emit({**summary, "generation": generation}, as_json, render)


@app.command("lint-tree")
def lint_tree_command(
    path: Annotated[Path, typer.Argument(help="Tree file (YAML).")],
    as_json: JsonOption = False,
) -> None:
    """Check a tree file: errors (with file:line and node) fail; warnings are listed."""
    import warnings

    from gil_core.ontology import TreeLintWarning, lint_tree, load_tree

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        tree = guarded(lambda: load_tree(path))
    findings = [str(finding) for finding in lint_tree(tree)]
    nodes = sum(1 for _ in tree.iter_nodes())
    emit(
        {"file": str(path), "nodes": nodes, "warnings": findings},
        as_json,
        lambda: console.print(
            "\n".join([*findings, f"{path}: {nodes} nodes, {len(findings)} warnings"]), highlight=False
        ),
    )


@app.command("rebuild-memory")
def rebuild_memory_command(task_file_path: TaskFileOption = None, as_json: JsonOption = False) -> None:
    """Make memory hold exactly what the feedback history confirms."""
    from gil_core.runtime import open_runtime

    loaded = task_file(task_file_path)

    async def work() -> int:
        async with open_runtime(loaded) as runtime:
            return await runtime.resolver.rebuild_memory(loaded.task)

    entries = run(work())
    emit({"entries": entries}, as_json, lambda: console.print(f"memory holds {entries} confirmed answers"))


@app.command("fit-energy")
def fit_energy_command(task_file_path: TaskFileOption = None, as_json: JsonOption = False) -> None:
    """Fit energy coefficients to the server timings in the store; later prices use them."""
    from dataclasses import asdict

    from gil_core.maintenance import fit_and_store_energy
    from gil_core.telemetry import TelemetryStore

    loaded = task_file(task_file_path)
    model = guarded(lambda: fit_and_store_energy(TelemetryStore(loaded.store)))
    data = asdict(model) if model is not None else None
    emit(data, as_json, lambda: console.print(data if data else "too few server timings to fit"))


StoreArgument = Annotated[
    str,
    typer.Argument(
        metavar="STORE",
        help="The telemetry store: a folder, or s3://bucket/prefix reached with the GIL_S3_* settings.",
    ),
]


def store_location(value: str, command: str) -> str | Path:
    """A store named on the command line, checked as a task file's ``store`` is: an ``s3://`` URI kept whole, or a
    folder relative to the working directory. A location that cannot be one is one line naming command and
    argument."""
    from gil_core.taskfile import store_location as checked_location

    return guarded(lambda: checked_location(value, None, path=f"gil {command}", key="STORE"))


@app.command("export-sqlite")
def export_sqlite_command(
    store: StoreArgument,
    out: Annotated[Path, typer.Argument(help="The SQLite file to write (the reference's layout).")],
    as_json: JsonOption = False,
) -> None:
    """Write the store in the reference's SQLite layout (refused when the store is marked restricted)."""
    from gil_core.telemetry import TelemetryStore
    from gil_core.telemetry.sqlite import export_sqlite

    where = store_location(store, "export-sqlite")
    if isinstance(where, Path) and not where.is_dir():
        raise fail(f"{where}: no such store directory")
    report = guarded(lambda: export_sqlite(TelemetryStore(where), out))
    if isinstance(where, str) and not any(report.rows.values()):
        warn("empty", f"{where} holds no rows: check the bucket and prefix")  # a prefix is never missing, only empty
    emit({"out": str(out), "rows": report.rows}, as_json, lambda: console.print(f"wrote {out}: {report.rows}"))


@app.command("import-sqlite")
def import_sqlite_command(
    database: Annotated[Path, typer.Argument(help="A SQLite file in the reference's layout.")],
    store: StoreArgument,
    as_json: JsonOption = False,
) -> None:
    """Read a reference-layout SQLite file into a store (validated like every write)."""
    from gil_core.telemetry import TelemetryStore
    from gil_core.telemetry.sqlite import import_sqlite

    where = store_location(store, "import-sqlite")
    if not database.is_file():
        raise fail(f"{database}: no such file")
    report = guarded(lambda: import_sqlite(database, TelemetryStore(where)))
    emit({"store": str(where), "rows": report.rows}, as_json, lambda: console.print(f"read {database}: {report.rows}"))


@app.command()
def doctor(
    task_file_path: TaskFileOption = None,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Move the broken files found into quarantine, and put back the quarantined files whose columns "
            "cast to the table's types without loss.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Check the telemetry store: decode every file of every table whole, and list the files quarantine holds.
    Without --repair nothing is moved; exit code 1 while a broken file is still among a table's files."""
    from dataclasses import asdict

    from gil_core.telemetry import TelemetryStore

    loaded = task_file(task_file_path)
    store = guarded(lambda: TelemetryStore(loaded.store))
    check = guarded(lambda: store.check(repair=repair))
    data = {
        "store": str(store.location),
        "files": check.files,
        "broken": [asdict(item) for item in check.broken],
        "restored": [asdict(item) for item in check.restored],
        "quarantined": [asdict(item) for item in check.quarantined],
    }

    def render() -> None:
        lines = [f"{store.location}: {check.files:,} files decoded whole"]
        for broken in check.broken:
            done = "moved into quarantine" if broken.moved else (broken.note or "not moved: run with --repair")
            lines.append(f"broken: {broken.table}/{broken.name}: {broken.reason} ({done})")
        lines += [f"put back: {restored.table}/{restored.name}" for restored in check.restored]
        for held in check.quarantined:
            rows = "rows unknown" if held.rows is None else f"{held.rows:,} rows"
            lines.append(f"quarantined: {held.where} ({rows}): {held.reason}")
        counts = len(check.broken), len(check.restored), len(check.quarantined)
        lines.append("{} broken, {} put back, {} quarantined".format(*counts))
        console.print("\n".join(lines), highlight=False, soft_wrap=True)

    emit(data, as_json, render)
    if any(not item.moved for item in check.broken):
        raise typer.Exit(code=1)


review_app = typer.Typer(help="Review rounds: propose, then decide item by item.", no_args_is_help=True)
app.add_typer(review_app, name="review")


def _review(kind: str, task_file_path: Path | None, as_json: bool) -> None:
    from flows.review import review_path
    from gil_core.reviews import deactivation_review, differentiation_review, promotion_review
    from gil_core.runtime import open_runtime
    from gil_core.telemetry import TelemetryStore

    loaded = task_file(task_file_path)
    store = TelemetryStore(loaded.store)

    async def differentiate() -> Any:
        async with open_runtime(loaded) as runtime:
            if runtime.embedder is None:
                raise fail("differentiation needs an embedding_model in the task file")
            return await differentiation_review(store, loaded.task, runtime.embedder)

    if kind == "promotion":
        review = guarded(lambda: promotion_review(store, loaded.task))
    elif kind == "deactivation":
        review = guarded(lambda: deactivation_review(store, loaded.task))
    else:
        review = run(differentiate())
    path = review.write(review_path(str(loaded.path), kind))
    emit(
        {"kind": kind, "file": str(path), "items": review.items},
        as_json,
        lambda: console.print(review.to_yaml() + f"\n{len(review.items)} items → {path}", highlight=False),
    )


@review_app.command()
def promote(task_file_path: TaskFileOption = None, as_json: JsonOption = False) -> None:
    """Propose recurring confirmed answers as new habits (net saving > 0), best first."""
    _review("promotion", task_file_path, as_json)


@review_app.command()
def deactivate(task_file_path: TaskFileOption = None, as_json: JsonOption = False) -> None:
    """Propose unreliable, disputed or stale habits for retirement."""
    _review("deactivation", task_file_path, as_json)


@review_app.command()
def differentiate(task_file_path: TaskFileOption = None, as_json: JsonOption = False) -> None:
    """Propose categories to split (near capacity) or add (unserved requests), and answers anchored too high."""
    _review("differentiation", task_file_path, as_json)


@review_app.command()
def decide(
    kind: Annotated[str, typer.Argument(help="promotion | deactivation | differentiation")],
    item_id: Annotated[str, typer.Argument(help="The item's id from the review list.")],
    decision: Annotated[str, typer.Argument(help="accepted | rejected | deferred")],
    note: Annotated[str | None, typer.Option(help="Why (kept in the review log).")] = None,
    task_file_path: TaskFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Record a decision. Accepting a promotion adds the habit to the tree file; accepting a retirement removes it."""
    from gil_core.reviews import decide as record_decision
    from gil_core.telemetry import TelemetryStore

    loaded = task_file(task_file_path)
    tree = guarded(lambda: record_decision(TelemetryStore(loaded.store), loaded.task, kind, item_id, decision, note))
    changed = tree is not None
    emit(
        {"kind": kind, "item_id": item_id, "decision": decision, "tree_changed": changed},
        as_json,
        lambda: console.print(
            f"{kind} {item_id}: {decision}" + (f" — {loaded.task.tree.source} updated" if changed else "")
        ),
    )


@review_app.command("queue")
def queue_command(
    task_file_path: TaskFileOption = None,
    size: Annotated[int, typer.Option("--size", help="Answers in the queue.")] = 20,
    random_share: Annotated[
        float,
        typer.Option(
            "--random-share",
            help="Share of the queue drawn uniformly at random from all unconfirmed answers: the verdicts the "
            "learned judge's rules read precision from.",
        ),
    ] = 0.3,
    as_json: JsonOption = False,
) -> None:
    """Ask for the verdicts that would teach the learned judge most: unconfirmed answers where it is least sure,
    requests far from anything confirmed, nodes close to being proven or withdrawn; a share drawn at random.
    Prints the queue and records it as issued (an answer is asked about once). Answer it with `gil feedback`."""
    from gil_core.runtime import issue_task_queue

    loaded = task_file(task_file_path)
    if size < 1:
        raise fail(f"--size: at least 1, got {size}")
    if not 0.0 <= random_share <= 1.0:
        raise fail(f"--random-share: a share between 0 and 1, got {random_share}")
    queue = run(issue_task_queue(loaded, size=size, random_share=random_share))
    data = queue.to_json()

    def render() -> None:
        table = Table(title=f"feedback queue for {queue.task}: {len(queue.items)} of {queue.eligible} unconfirmed")
        for column in ("trace", "request", "answer", "chosen", "why", "score"):
            table.add_column(column, justify="right" if column == "score" else "left", overflow="fold")
        for item in queue.items:
            why = item.teaching.why if item.chosen_by == "queue" else f"random share ({item.teaching.why})"
            table.add_row(
                item.trace_id, item.request, item.answer or "—", item.chosen_by, why, f"{item.teaching.score:.3f}"
            )
        console.print(table)
        console.print(f"recorded as issued (queue {queue.queue_id})" if queue.items else "nothing to ask about")

    emit(data, as_json, render)


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
    fresh: Annotated[bool, typer.Option(help="Start from an empty demo store and memory.")] = True,
    as_json: JsonOption = False,
) -> None:
    """Run the bundled support tickets twice through the flows on the local models, with feedback between."""
    _prefect_environment()
    from flows.demo import DEMO_ANSWERS, DEMO_TASK_FILE, DEMO_TICKETS, demo_flow, prepare

    chosen = task_file_path or DEMO_TASK_FILE
    loaded = task_file(chosen)
    paths = guarded(lambda: prepare(chosen, fresh=fresh))
    console.print(f"demo: {DEMO_TICKETS.name} through {loaded.task.tree.source} (task {loaded.task.name})")
    summary = run(
        demo_flow(str(chosen), str(DEMO_TICKETS), str(DEMO_ANSWERS), str(paths.work), chunk=chunk, limit=limit)
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
        console.print(
            f"Everything is in the store at {loaded.store}. The runs, logs and artifacts are in Prefect: "
            f"run `gil ui` and open http://{UI_HOST}:{UI_PORT}/runs"
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
) -> None:
    """Register every flow as a deployment with its default schedule against `gil ui`, and run them."""
    _prefect_environment(api_url)
    chosen = task_file_path or Path(os.environ.get("GIL_TASK_FILE", "gil.yaml"))
    task_file(chosen)  # fail early, in one line, on a bad task file
    _require_prefect_api(api_url)
    from flows.deployments import serve_all

    timeouts = {"decision_timeout": decision_timeout, "verdict_timeout": verdict_timeout}
    chosen_timeouts = {name: value for name, value in timeouts.items() if value is not None}
    guarded(lambda: serve_all(chosen, tickets, verdicts, **chosen_timeouts))


def _require_prefect_api(api_url: str) -> None:
    """One line instead of Prefect's traceback when no server answers at the API URL."""
    import httpx

    try:
        httpx.get(f"{api_url.rstrip('/')}/health", timeout=10.0).raise_for_status()
    except httpx.HTTPError as exc:
        raise fail(f"no Prefect API at {api_url} ({exc}): start `gil ui` first, or pass --api-url") from None


def main() -> None:  # the console-script entry point
    app()


if __name__ == "__main__":
    main()
