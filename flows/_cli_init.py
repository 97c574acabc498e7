"""``gil init``: a task file and a tree to start a task of one's own from, checked before they are written."""

from __future__ import annotations

import json
import shlex
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flows._cli_common import (
    EncodingOption,
    IdColumnOption,
    TextColumnOption,
    console,
    fail,
    guarded,
    run,
    warn,
)
from flows._demo_files import ROOT, shown

if TYPE_CHECKING:
    from gil_core.tree_draft import DraftedTree

STARTER_TREE = ROOT / "ontologies" / "support.yaml"

_TASK_FILE = """\
# A Gil task, written by `gil init`: README.md, "Task file", says what each key does.
task: {name}
# The tree of categories and answers the judge walks (docs/tree-format.md). It starts as the demo's support tree:
# put your own categories and answers in it, then check it with `gil lint-tree tree.yaml` (in this folder).
tree: tree.yaml
language: {language}
contract: tree
thresholds:
  per_layer: [0.5]
  leaf: 0.5
# Memory serves a request that means the same as one whose answer a verdict confirmed; its guard refuses a hit
# that differs from the remembered request in a negation, a number or an amount.
memory_threshold: 0.9
memory_guard: true
# Each node learns its judgment from the confirmed answers below it, and serves where the log shows it right at
# least this often (docs/learned-reflex.md).
learned_reflex:
  precision: 0.97
# The embedded local models: no key, nothing leaves this machine. Any OpenAI-compatible server instead:
#   chat_model: {{url: "https://api.example.com/v1", name: "a-model", api_key_env: "ITS_KEY_VARIABLE"}}
chat_model: local
embedding_model: local
# Budgets for the local model on a small CPU, as the demo's: one generation attempt of at most 48 tokens.
fallback_scope: full
fallback_max_attempts: 1
fallback_max_tokens: 48
slot_max_attempts: 1
concurrency: 1
# What this task learns is kept here (folders beside this file, or s3:// URIs).
store: .gil/store
memory: .gil/memory
"""


def task_file_text(name: str, language: str = "en") -> str:
    """The starter task file for ``name`` (quoted as YAML reads it back), its prompts in ``language``."""
    return _TASK_FILE.format(name=json.dumps(name, ensure_ascii=False), language=language)


def init_command(
    folder: Annotated[Path, typer.Argument(help="Where to write gil.yaml and tree.yaml (made if missing).")] = Path(
        "."
    ),
    task: Annotated[
        str | None,
        typer.Option(help="The task's name: its memory, stats and caches are its own. Default: the folder's name."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Write over a gil.yaml or tree.yaml already there.")] = False,
    language: Annotated[
        str, typer.Option(help="The language of the judge's prompts: en, or ko (the reference's Korean wording).")
    ] = "en",
    export: Annotated[
        Path | None,
        typer.Option(
            "--from",
            help="Draft tree.yaml from an export of answered requests (JSONL, CSV or Parquet: an id, the request's "
            "text and the answer it got) instead of copying the demo's: the answers given at least --min-count "
            "times become its options, those differing only in their numbers one template, grouped into "
            "categories by --category-column or by what their requests mean (docs/tree-format.md, 'Drafting').",
        ),
    ] = None,
    answer_column: Annotated[str, typer.Option(help="With --from: the column holding each answer.")] = "answer",
    category_column: Annotated[
        str | None,
        typer.Option(help="With --from: a column filing each row under a category, used instead of grouping."),
    ] = None,
    min_count: Annotated[
        int, typer.Option(help="With --from: how many times an answer is given to become an option.")
    ] = 2,
    id_column: IdColumnOption = "id",
    text_column: TextColumnOption = None,
    encoding_name: EncodingOption = "utf-8",
) -> None:
    """Start a task of your own: a task file (gil.yaml) on the local models, with memory, its guard and the learned
    reflex on, and a tree (tree.yaml) to make yours, starting from the demo's or drafted from an export (--from)."""
    from gil_core.atomic import atomic_write_text
    from gil_core.errors import GilError
    from gil_core.ontology.lint import TreeLintWarning
    from gil_core.taskfile import load_task_file

    if language not in ("en", "ko"):
        raise fail(f"--language: en or ko, got {language!r}")
    folder = folder.resolve()
    name = task if task is not None else folder.name
    task_path, tree_path = folder / "gil.yaml", folder / "tree.yaml"
    there = [path for path in (task_path, tree_path) if path.exists()]
    if there and not force:
        named = " and ".join(shown(path) for path in there)
        raise fail(f"{named}: already there; gil init writes over nothing unless --force")
    if export is not None:
        tree_text, drafted = _drafted(export, answer_column, category_column, min_count, id_column, text_column,
                                      encoding_name)  # fmt: skip
    elif not STARTER_TREE.is_file():  # a wheel holds the packages only; the trees and the demo come with a checkout
        raise fail(f"{STARTER_TREE}: no starter tree there; gil init copies it from a checkout of Gil")
    else:
        tree_text, drafted = STARTER_TREE.read_text(encoding="utf-8"), None
    texts = {task_path.name: task_file_text(name, language), tree_path.name: tree_text}
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings(record=True) as linted:
        # Checked as it will be read, before anything is written; a lint warning is told of the file written.
        warnings.simplefilter("always", TreeLintWarning)
        for file_name, text in texts.items():
            (Path(scratch) / file_name).write_text(text, encoding="utf-8")
        try:
            load_task_file(Path(scratch) / task_path.name)
        except GilError as exc:  # told of the files it would have written, not of the scratch copies
            raise fail(_as_written(str(exc), Path(scratch), task_path, tree_path)) from None
        told = [
            _as_written(str(item.message), Path(scratch), task_path, tree_path)
            for item in linted
            if issubclass(item.category, TreeLintWarning)
        ]
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(tree_path, texts[tree_path.name])
    atomic_write_text(task_path, texts[task_path.name])
    if drafted is not None and export is not None:
        console.print(_draft_said(drafted, export, tree_path, min_count), highlight=False, soft_wrap=True)
    for message in told:
        warn("lint", message)
    if export is not None:  # the two commands as a shell reads them (a path or column name with spaces quoted)
        columns = "".join(
            f" {flag} {shlex.quote(value)}"
            for flag, value, default in (("--id-column", id_column, "id"), ("--encoding", encoding_name, "utf-8"))
            if value != default
        )
        texts_named = "".join(f" --text-column {shlex.quote(column)}" for column in text_column or ())
        answers_named = f" --answer-column {shlex.quote(answer_column)}" if answer_column != "answer" else ""
        source, task_named = shlex.quote(shown(export)), shlex.quote(shown(task_path))
        console.print(
            f"wrote {shown(task_path)} (task {name!r}) and {shown(tree_path)}. Next: check the draft (gil lint-tree "
            f"{shown(tree_path)}), then teach the task the export's answers: gil resolve-batch {source} -o "
            f"results.jsonl -t {task_named}{columns}{texts_named}, and gil feedback {source} --key -t "
            f"{task_named}{columns}{answers_named}",
            highlight=False,
            soft_wrap=True,
        )
        return
    console.print(
        f"wrote {shown(task_path)} (task {name!r}) and {shown(tree_path)}. Next: make the tree yours and check it "
        f"(gil lint-tree {shown(tree_path)}); then gil resolve-batch TICKETS -o results.csv -t {shown(task_path)}, "
        f"judge the sheet, and gil feedback results.csv -t {shown(task_path)}",
        highlight=False,
        soft_wrap=True,
    )


def _as_written(message: str, scratch: Path, task_path: Path, tree_path: Path) -> str:
    """``message`` with the scratch copies' paths put back as the files ``gil init`` writes."""
    for path in (tree_path, task_path):
        message = message.replace(str(scratch / path.name), shown(path))
    return message


def _drafted(
    export: Path,
    answer_column: str,
    category_column: str | None,
    min_count: int,
    id_column: str,
    text_column: list[str] | None,
    encoding_name: str,
) -> tuple[str, DraftedTree]:
    """The tree drafted from ``export`` as the text of a tree file, and what went into it; bad rows are skipped,
    the first named."""
    from gil_core.batch import TicketColumns, TicketFormat
    from gil_core.local import MiniLMEmbeddingModel
    from gil_core.ontology import dump_tree
    from gil_core.tree_draft import MAX_DRAFT_ROWS, draft_tree, read_answered

    if min_count < 1:
        raise fail(f"--min-count: at least 1, got {min_count}")
    form = guarded(lambda: TicketFormat(TicketColumns(id_column, tuple(text_column or ("text",))), encoding_name))
    if not export.is_file():
        raise fail(f"{export}: no such file")
    rows, bad, more = guarded(
        lambda: read_answered(export, form, answer_column=answer_column, category_column=category_column)
    )
    if bad:
        warn("skipped", f"{len(bad)} row{'s' if len(bad) != 1 else ''} without an id, a request and an answer; "
                        f"the first: {bad[0]}")  # fmt: skip
    if more:
        warn("read", f"the first {MAX_DRAFT_ROWS:,} rows of {export} (a draft needs no more)")
    if not rows:
        raise fail(f"{export}: no answered request read from it")
    embedder = guarded(MiniLMEmbeddingModel)
    drafted = run(draft_tree(rows, embedder, min_count=min_count, source=str(export)))
    return dump_tree(drafted.tree), drafted


def _draft_said(drafted: DraftedTree, export: Path, tree_path: Path, min_count: int) -> str:
    """What a draft made of the export, in a sentence or three."""
    options = f"{drafted.options} answer{'s' if drafted.options != 1 else ''}"
    templates = f" ({drafted.templates} of them templates)" if drafted.templates else ""
    if drafted.silhouette is not None:
        grouped = f"grouped by meaning into {drafted.categories} categories named by their words (silhouette "
        grouped += f"{drafted.silhouette:.2f})"
    elif drafted.clustered:
        grouped = "in one category (too few to group)"
    else:
        grouped = f"filed under the export's {drafted.categories} categories"
    unkept = drafted.rows - drafted.covered - drafted.none
    left = f"; {drafted.left_out} answers given fewer times left out ({unkept} rows)" if drafted.left_out else ""
    if drafted.none:
        left += f"; {drafted.none} rows answered none of these (the tree's first label says it)"
    times = f"{min_count} time{'s' if min_count != 1 else ''}"
    return (
        f"drafted {shown(tree_path)} from {drafted.rows:,} answered requests of {export}: {options}{templates} given "
        f"at least {times}, {grouped}, covering {drafted.covered:,} rows{left}. "
        "It is a draft: check the categories, their names and descriptions first."
    )
