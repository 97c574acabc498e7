"""What every ``gil`` command shares: the consoles, the ``--task-file`` and ``--json`` options, the task file's
loading, and errors printed as one line with a non-zero exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console

from flows._demo_files import DEMO_TASK_FILE, shown
from gil_core.errors import GilError

if TYPE_CHECKING:
    from gil_core.taskfile import TaskFile

PIPED_WIDTH = 120
console = Console()
errors = Console(stderr=True)


def fit_to_output() -> None:
    """Printed to a file or a pipe, lay tables out ``PIPED_WIDTH`` columns wide rather than rich's 80 (a file has
    no width to keep to, and the per-node tables need about 100), unless COLUMNS says otherwise; a terminal keeps
    its own width. Called by the entry point, when the output is known."""
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPED_WIDTH


T = TypeVar("T")

TaskFileOption = Annotated[
    Path | None,
    typer.Option("--task-file", "-t", help="Task file (YAML). Default: $GIL_TASK_FILE, else ./gil.yaml."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for programs instead of tables.")]
IdColumnOption = Annotated[
    str, typer.Option(help="The column (a CSV header, a Parquet column, a JSONL key) holding each ticket's id.")
]
TextColumnOption = Annotated[
    list[str] | None,
    typer.Option(
        help="The column holding each ticket's text; give it again for more (a subject and a body, say): the "
        "non-empty ones make one text, a blank line between. Default: text."
    ),
]
EncodingOption = Annotated[
    str,
    typer.Option(
        "--encoding",
        help="The encoding a JSONL or CSV file was saved in, when not UTF-8: cp949 or cp1252, say (a spreadsheet's "
        "legacy CSV).",
    ),
]


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
    if path is None and not chosen.exists():  # the default, where a newcomer has none yet: say how to give one
        where = "$GIL_TASK_FILE" if "GIL_TASK_FILE" in os.environ else "the default"
        raise fail(
            f"{chosen}: no task file there ({where}); give one with --task-file/-t or $GIL_TASK_FILE "
            f"(the demo's is {shown(DEMO_TASK_FILE)}), or start one with gil init"
        )
    return guarded(lambda: load_task_file(chosen, **overrides))


def emit(data: Any, as_json: bool, render: Callable[[], None]) -> None:
    if as_json:
        sys.stdout.write(json.dumps(data, ensure_ascii=False, default=str) + "\n")
    else:
        render()
