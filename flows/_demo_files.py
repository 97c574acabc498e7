"""Where the demo's bundled files are: its task file, tickets and answer key (no Prefect here: the CLI names the
demo's task file in an error before anything heavy is imported)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO_TASK_FILE = ROOT / "ontologies" / "support-task.yaml"
DEMO_TICKETS = ROOT / "data" / "support_tickets.jsonl"
DEMO_ANSWERS = ROOT / "data" / "support_answers.jsonl"


def shown(path: Path) -> str:
    """``path`` as a person would type it from here: relative below the working folder, else whole."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
