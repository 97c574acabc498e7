"""The ``gil`` commands that look after a task's store and learned state rather than resolve requests: its
statistics, the refits (learned reflex, energy, memory), the tree file's lint, SQLite export and import, and the
store's check.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from flows._cli_common import JsonOption, TaskFileOption, console, emit, fail, guarded, run, task_file, warn

if TYPE_CHECKING:
    from gil_core.answer_versions import TreeChange
    from gil_core.taskfile import TaskFile

# Each command imports what it uses in its own body (flows/cli.py says why).


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


def _withheld_lines(nodes: list[dict[str, Any]]) -> list[str]:
    """Per serving node, what its cuts keep from being served among its logged predictions, and how many of those
    the learned choice had right (what each cut costs); nothing when no node keeps anything back."""
    lines = []
    for row in nodes:
        kept = row.get("withheld") or {}
        parts = [
            f"{words} {count:,} ({right:,} right)"
            for key, words in (("novel", "unlike the confirmed"), ("below_cut", "below the cut"))
            for count, right in [kept.get(key, (0, 0))]
            if count
        ]
        if parts:
            lines.append(f"  {row['node']}: " + ", ".join(parts))
    title = "withheld by the cuts among the logged predictions (how many the learned choice had right):"
    return [title, *lines] if lines else []


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
        for line in _withheld_lines(nodes):
            console.print(line, highlight=False)
        if state.memory is not None:
            console.print(state.memory.describe(), highlight=False)
        if state.generation is not None:
            console.print(state.generation.describe(), highlight=False)

    summary = {"task": state.task, "fitted_on": dict(state.fitted_on), "nodes": nodes, "memory": memory}
    emit({**summary, "generation": generation}, as_json, render)


def lint_tree_command(
    path: Annotated[Path, typer.Argument(help="Tree file (YAML).")],
    task_file_path: Annotated[
        Path | None,
        typer.Option(
            "--task-file",
            "-t",
            help="Also say what this tree, put in place of the task's, changes of what the task learned: the answers"
            " memory stops serving, and the examples the learned reflex no longer learns.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Check a tree file: errors (with file:line and node) fail; warnings are listed."""
    import warnings

    from gil_core.ontology import TreeLintWarning, lint_tree, load_tree

    loaded = task_file(task_file_path) if task_file_path is not None else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TreeLintWarning)
        tree = guarded(lambda: load_tree(path))
    findings = [str(finding) for finding in lint_tree(tree)]
    nodes = sum(1 for _ in tree.iter_nodes())
    report: dict[str, Any] = {"file": str(path), "nodes": nodes, "warnings": findings}
    lines = [*findings, f"{path}: {nodes} nodes, {len(findings)} warnings"]
    if loaded is not None:
        from dataclasses import asdict

        from gil_core.feedback import Feedback
        from gil_core.telemetry import TelemetryStore

        feedback = Feedback(guarded(lambda: TelemetryStore(loaded.store)), memory=None, learner=None)
        change = guarded(lambda: feedback.changed_by(loaded.task, tree))
        changed = [asdict(item) for item in change.answers]
        report["task"] = {"name": loaded.task.name, "remembered": change.remembered, "changed": changed}
        lines.extend(_changed_lines(loaded.task.name, change))
    emit(report, as_json, lambda: console.print("\n".join(lines), highlight=False, soft_wrap=True))


def _changed_lines(task: str, change: TreeChange) -> list[str]:
    """What a tree changes of what ``task`` learned, for a person: one line, then one per answer it changes."""
    if not change.answers:
        return [f"task {task!r}: this tree gives every answer its verdicts confirmed ({change.remembered} remembered)"]
    lines = [
        f"task {task!r}: this tree changes {len(change.answers)} answers verdicts confirmed; memory stops serving"
        f" {change.stops_serving} of its {change.remembered} entries (kept: they serve again under a tree that gives"
        " their answers)"
    ]
    for item in change.answers:
        how = "removed" if item.removed else "changed"
        learns = "no longer learns them" if item.removed else "learns them as before"
        lines.append(
            f"  {item.option_id}  {how}: {item.remembered} remembered, {item.confirmed} confirmed"
            f" (the learned reflex {learns})"
        )
    return lines


def rebuild_memory_command(task_file_path: TaskFileOption = None, as_json: JsonOption = False) -> None:
    """Make memory hold exactly what the feedback history confirms."""
    from gil_core.runtime import open_runtime

    loaded = task_file(task_file_path)

    async def work() -> int:
        async with open_runtime(loaded) as runtime:
            return await runtime.resolver.rebuild_memory(loaded.task)

    entries = run(work())
    emit({"entries": entries}, as_json, lambda: console.print(f"memory holds {entries} confirmed answers"))


def fit_energy_command(task_file_path: TaskFileOption = None, as_json: JsonOption = False) -> None:
    """Fit energy coefficients to the server timings in the store; later prices use them."""
    from dataclasses import asdict

    from gil_core.maintenance import fit_and_store_energy
    from gil_core.telemetry import TelemetryStore

    loaded = task_file(task_file_path)
    model = guarded(lambda: fit_and_store_energy(TelemetryStore(loaded.store)))
    data = asdict(model) if model is not None else None

    def said() -> None:
        if data is None:
            console.print("too few server timings to fit")
            return
        console.print("energy fitted to the server's timings (milliseconds); later prices use it:")
        for name, value in data.items():
            console.print(f"  {name.replace('_', ' ')}: {value:.4g}", highlight=False)

    emit(data, as_json, said)


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
    said = f"wrote {out}: {_rows_per_table(report.rows)}"
    emit({"out": str(out), "rows": report.rows}, as_json, lambda: console.print(said, highlight=False))


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
    said = f"read {database} into {where}: {_rows_per_table(report.rows)}"
    emit({"store": str(where), "rows": report.rows}, as_json, lambda: console.print(said, highlight=False))


def _rows_per_table(rows: Mapping[str, int]) -> str:
    """``"204 traces, 331 calls"``: the tables that hold rows; the number of the others that hold none."""
    held = [f"{count:,} {table}" for table, count in rows.items() if count]
    empty = sum(1 for count in rows.values() if not count)
    return ", ".join(held or ["no rows"]) + (f" ({empty} tables empty)" if empty else "")


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


def add_maintenance_commands(app: typer.Typer) -> None:
    """Register these commands on ``app``, in the order ``gil --help`` lists them."""
    app.command()(stats)
    app.command("fit-reflex")(fit_reflex_command)
    app.command("lint-tree")(lint_tree_command)
    app.command("rebuild-memory")(rebuild_memory_command)
    app.command("fit-energy")(fit_energy_command)
    app.command("export-sqlite")(export_sqlite_command)
    app.command("import-sqlite")(import_sqlite_command)
    app.command()(doctor)
