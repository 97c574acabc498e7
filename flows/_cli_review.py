"""The ``gil review`` commands: review rounds (promotion, deactivation, differentiation) proposed, then decided item
by item, and the feedback queue that asks for the verdicts which would teach the learned judge most.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from flows._cli_common import JsonOption, TaskFileOption, console, emit, fail, guarded, run, task_file, warn

# Each command imports what it uses in its own body (flows/cli.py says why).

review_app = typer.Typer(help="Review rounds: propose, then decide item by item.", no_args_is_help=True)


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
    store = guarded(lambda: TelemetryStore(loaded.store))
    tree = guarded(lambda: record_decision(store, loaded.task, kind, item_id, decision, note))
    changed = tree is not None
    stopped = 0  # memory entries standing for an answer the decided tree no longer gives
    if tree is not None:
        from gil_core.errors import GilError
        from gil_core.feedback import Feedback

        try:  # the decision is recorded: a count that cannot be read is said, not an error
            stopped = Feedback(store, memory=None, learner=None).changed_by(loaded.task, tree).stops_serving
        except GilError as exc:
            warn("not counted:", f"the remembered answers the decision stops serving ({exc})")
    said = f"{kind} {item_id}: {decision}" + (f" — {loaded.task.tree.source} updated" if changed else "")
    if stopped:
        entries = "the entry that stood" if stopped == 1 else f"the {stopped} entries that stood"
        said += f"; memory stops serving {entries} for the answer it removed"
    emit(
        {"kind": kind, "item_id": item_id, "decision": decision, "tree_changed": changed, "memory_stopped": stopped},
        as_json,
        lambda: console.print(said, highlight=False, soft_wrap=True),
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
    waiting: Annotated[
        bool,
        typer.Option(
            "--waiting",
            help="Issue nothing: show again the answers issued queues asked about that still have no verdict, "
            "oldest queue first (--size and --random-share do not apply).",
        ),
    ] = False,
    peek: Annotated[
        bool,
        typer.Option(
            "--peek",
            help="Issue nothing: show what a queue would ask about now (its random share is one draw); its answers "
            "stay eligible for the next queue, and a verdict given on one counts as chosen the way the peek chose "
            "it. For looking: --out is refused with it.",
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Also write the queue as a sheet (.csv or .tsv) with empty correct and correction columns: filled "
            "in, give it to gil feedback.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Ask for the verdicts that would teach the learned judge most: unconfirmed answers where it is least sure,
    requests far from anything confirmed, nodes close to being proven or withdrawn; a share drawn at random.
    Prints the queue and records it as issued (an answer is asked about once); --waiting shows again what was
    asked about and is not answered yet; --peek shows a queue without issuing it. Answer it with `gil feedback`."""
    from gil_core.batch import CSV_DELIMITERS, write_sheet
    from gil_core.learned import read_waiting
    from gil_core.runtime import issue_task_queue
    from gil_core.telemetry import TelemetryStore

    loaded = task_file(task_file_path)
    if size < 1:
        raise fail(f"--size: at least 1, got {size}")
    if not 0.0 <= random_share <= 1.0:
        raise fail(f"--random-share: a share between 0 and 1, got {random_share}")
    if peek and waiting:
        raise fail("--peek and --waiting: choose one (--waiting shows what issued queues asked about)")
    if peek and out is not None:
        raise fail("--out with --peek: a peek is for looking; issue the queue (without --peek) to answer it as a sheet")
    if out is not None and out.suffix not in CSV_DELIMITERS:
        raise fail(f"--out: a sheet is written to .csv or .tsv, got {out.name!r}")  # before the queue is issued
    if waiting:
        queues = guarded(lambda: read_waiting(TelemetryStore(loaded.store), loaded.task.name))
        items = [item for queue in queues for item in queue.items]
        data: dict[str, Any] = {"task": loaded.task.name, "waiting": len(items)}
        data["queues"] = [queue.to_json() for queue in queues]
    else:
        queue = run(issue_task_queue(loaded, size=size, random_share=random_share, peek=peek))
        items = list(queue.items)
        data = queue.to_json()
        data["issued"] = not peek and bool(items)  # an empty queue is never recorded
        data["peek"] = peek
    if out is not None:
        header = ("trace_id", "request", "answer", "chosen", "why", "score")
        rows = (
            (item.trace_id, item.request, item.answer, item.chosen_by, item.teaching.why, f"{item.teaching.score:.3f}")
            for item in items
        )
        data["out"] = str(out)
        data["written"] = guarded(lambda: write_sheet(out, header, rows))

    def render() -> None:
        if waiting:
            if not items:
                console.print(f"nothing waiting in {loaded.task.name}: every answer a queue asked about has a verdict")
            else:
                issued = f"{len(queues)} issued queue{'s' if len(queues) != 1 else ''}"
                console.print(f"waiting for a verdict in {loaded.task.name}: {len(items)} answers, from {issued}")
        else:
            # Eligible: unconfirmed and not issued before (an answer is asked about once).
            shown = f"{len(queue.items)} of {queue.eligible} unconfirmed answers not yet asked about"
            peeked = " (a peek: not issued)" if peek else ""
            console.print(f"feedback queue for {queue.task}{peeked}: {shown}", highlight=False)
            if not items:
                console.print("nothing to ask about: every answer has a verdict or has been asked about already")
        if not items:
            return
        table = Table()
        for column in ("trace", "request", "answer", "chosen", "why", "score"):
            table.add_column(column, justify="right" if column == "score" else "left", overflow="fold")
        for item in items:
            why = item.teaching.why if item.chosen_by == "queue" else f"random share ({item.teaching.why})"
            table.add_row(
                item.trace_id, item.request, item.answer or "—", item.chosen_by, why, f"{item.teaching.score:.3f}"
            )
        console.print(table)
        if peek:
            console.print("not issued: its answers stay eligible; without --peek a queue is issued (drawn anew)")
        elif not waiting:
            console.print(f"recorded as issued (queue {queue.queue_id})")
        if out is not None:
            console.print(f"wrote {out}: fill in correct (and correction where wrong), then gil feedback {out}")

    emit(data, as_json, render)
