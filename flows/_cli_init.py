"""``gil init``: a task file and a tree to start a task of one's own from, checked before they are written."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from flows._cli_common import console, fail, guarded
from flows._demo_files import ROOT, shown

STARTER_TREE = ROOT / "ontologies" / "support.yaml"

_TASK_FILE = """\
# A Gil task, written by `gil init`: README.md, "Task file", says what each key does.
task: {name}
# The tree of categories and answers the judge walks (docs/tree-format.md). It starts as the demo's support tree:
# put your own categories and answers in it, then check it with `gil lint-tree tree.yaml` (in this folder).
tree: tree.yaml
language: en
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


def task_file_text(name: str) -> str:
    """The starter task file for ``name`` (quoted as YAML reads it back)."""
    return _TASK_FILE.format(name=json.dumps(name, ensure_ascii=False))


def init_command(
    folder: Annotated[Path, typer.Argument(help="Where to write gil.yaml and tree.yaml (made if missing).")] = Path(
        "."
    ),
    task: Annotated[
        str | None,
        typer.Option(help="The task's name: its memory, stats and caches are its own. Default: the folder's name."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Write over a gil.yaml or tree.yaml already there.")] = False,
) -> None:
    """Start a task of your own: a task file (gil.yaml) on the local models, with memory, its guard and the learned
    reflex on, and a tree (tree.yaml) to make yours, starting from the demo's."""
    from gil_core.atomic import atomic_write_text
    from gil_core.taskfile import load_task_file

    folder = folder.resolve()
    name = task if task is not None else folder.name
    task_path, tree_path = folder / "gil.yaml", folder / "tree.yaml"
    there = [path for path in (task_path, tree_path) if path.exists()]
    if there and not force:
        named = " and ".join(shown(path) for path in there)
        raise fail(f"{named}: already there; gil init writes over nothing unless --force")
    if not STARTER_TREE.is_file():  # a wheel holds the packages only; the trees and the demo come with a checkout
        raise fail(f"{STARTER_TREE}: no starter tree there; gil init copies it from a checkout of Gil")
    texts = {
        task_path.name: task_file_text(name),
        tree_path.name: STARTER_TREE.read_text(encoding="utf-8"),
    }
    with tempfile.TemporaryDirectory() as scratch:  # checked as it will be read, before anything is written
        for file_name, text in texts.items():
            (Path(scratch) / file_name).write_text(text, encoding="utf-8")
        guarded(lambda: load_task_file(Path(scratch) / task_path.name))
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(tree_path, texts[tree_path.name])
    atomic_write_text(task_path, texts[task_path.name])
    console.print(
        f"wrote {shown(task_path)} (task {name!r}) and {shown(tree_path)}. Next: make the tree yours and check it "
        f"(gil lint-tree {shown(tree_path)}); then gil resolve-batch TICKETS -o results.csv -t {shown(task_path)}, "
        f"judge the sheet, and gil feedback results.csv -t {shown(task_path)}",
        highlight=False,
        soft_wrap=True,
    )
