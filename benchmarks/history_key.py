"""A resolved history taught to a new task by its answer key: replies in the agents' own words, or a category column.

The way README's "Your own task" describes, through the ``gil`` command itself on the local models (the 135M LLM
and the MiniLM embedder): ``gil init`` in a fresh folder, ``gil resolve-batch`` over the history (the first
``--history`` support tickets, as a help desk's CSV export), ``gil feedback --key`` grading it, then
``gil resolve-batch`` over the next ``--new`` tickets, each compared with the answer key's tree answer. Two arms
in the same run, each its own task folder:

- **replies in own words**: the key's ``Reply`` column, each tree answer written as an agent might (a greeting
  before it and a signature after: a stand-in, stated as such, for replies that are none of the tree's answers),
  graded with ``--answer-column Reply``;
- **category column**: the key's ``Macro`` column naming each ticket's tree answer by id (``none`` for none of
  these), graded with ``--option-column Macro``.

A new ticket counts right when its answer is the key's tree answer. Memory in the first arm serves the replies as
they were written, wrong by the key; the table says how many of them hold the key's answer in those words.

    uv run --extra local python -m benchmarks.history_key [--history 60] [--new 40] [--output FILE | --no-write]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks._quality_streams import Request, support_stream
from benchmarks._report import Row, Section, add_output_options, destination, markdown_table, publish
from gil_core.wilson import wilson_interval

TITLE = "A resolved history taught by its answer key"
COMMAND = "uv run --extra local python -m benchmarks.history_key"
HISTORY, NEW = 60, 40
ARMS = {
    "replies in own words": ("--answer-column", "Reply"),
    "category column": ("--option-column", "Macro"),
}
LEARNED = ("habit/answer", "habit/template", "habit/procedure", "none")  # settled by the tree's walk


@dataclass(frozen=True)
class Outcome:
    """One new ticket's result line beside the key's answer."""

    mode: str
    right: bool
    decider: str  # who settled it, from the trace's steps: memory, learned, llm, generation
    holds: bool = False  # the answer holds the key's tree answer in other words around it (a reply as written)


@dataclass(frozen=True)
class ArmResult:
    arm: str
    said: str  # what gil feedback printed for the history
    outcomes: list[Outcome]


def _own_words(answer: str) -> str:
    return f"Hi there, thanks for writing in! {answer} Best wishes, Sam"


def write_files(work: Path, history: Sequence[Request], new: Sequence[Request]) -> None:
    """The history's export with both key columns, the new tickets, and their key (the tree answers)."""
    with (work / "history.csv").open("w", encoding="utf-8", newline="") as handle:
        sheet = csv.writer(handle)
        sheet.writerow(["Ticket ID", "Subject", "Reply", "Macro"])
        for request in history:
            sheet.writerow([request.id, request.text, _own_words(request.expected), request.option_id or "none"])
    with (work / "new.csv").open("w", encoding="utf-8", newline="") as handle:
        sheet = csv.writer(handle)
        sheet.writerow(["Ticket ID", "Subject"])
        sheet.writerows([request.id, request.text] for request in new)


def _gil(folder: Path, *arguments: str) -> str:
    environment = {**os.environ, "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", *arguments], cwd=folder, env=environment, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"gil {' '.join(arguments)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def decider_of(line: dict[str, object], path_steps: Sequence[dict[str, object]]) -> str:
    """Who settled a result: memory, the learned reflex (a walk whose every step it judged), the LLM judge (a
    walk it judged a step of), or generation."""
    mode = str(line["mode"])
    if mode == "memory":
        return "memory"
    if mode not in LEARNED:
        return "generation"
    judges = {str(step.get("decided_by") or "llm") for step in path_steps}
    return "learned" if judges == {"learned"} else "llm"


def run_arm(work: Path, arm: str, column: tuple[str, str], new: Sequence[Request]) -> ArmResult:
    folder = work / arm.replace(" ", "-")
    _gil(work, "init", folder.name)
    ticket_columns = ("--id-column", "Ticket ID", "--text-column", "Subject")
    _gil(folder, "resolve-batch", "../history.csv", *ticket_columns, "-o", "../history-results.jsonl", "--json")
    said = _gil(folder, "feedback", "../history.csv", "--key", "--id-column", "Ticket ID", *column).strip()
    out = work / f"{folder.name}-new.jsonl"
    _gil(folder, "resolve-batch", "../new.csv", *ticket_columns, "-o", str(out), "--json")
    key = {request.id: request.expected for request in new}
    steps = _steps(folder / ".gil" / "store")
    outcomes = []
    for line in map(json.loads, out.read_text(encoding="utf-8").splitlines()):
        output, expected = (line["output"] or "").strip(), key[line["id"]].strip()
        decider = decider_of(line, steps.get(line["trace_id"], []))
        outcomes.append(Outcome(line["mode"], output == expected, decider, output != expected and expected in output))
    return ArmResult(arm, " ".join(said.split()), outcomes)


def _steps(store: Path) -> dict[str, list[dict[str, object]]]:
    from gil_core.telemetry import TelemetryStore

    traces = TelemetryStore(store).read("traces")
    return {row["trace_id"]: json.loads(row["path"] or "[]") for row in traces.iter_rows(named=True)}


def _share(count: int, total: int) -> str:
    low, high = wilson_interval(count, total)
    return f"{count / total:.1%} ({count}/{total}; 95% CI {low:.1%}–{high:.1%})" if total else "—"


def section(results: Sequence[ArmResult], history: int, new: int) -> Section:
    lead = (
        f"A new task (`gil init`, the local models) resolves a history of {history} support tickets, is graded by "
        f"the history's answer key with `gil feedback --key`, then resolves the next {new} tickets; each is right "
        "when its answer is the key's tree answer (`benchmarks/history_key.py`). Two arms in the same run: the "
        "key's replies written as an agent might (the tree answer between a greeting and a signature, a stand-in "
        "for replies in one's own words; `--answer-column Reply`), and the key's category column naming each "
        "tree answer by id (`--option-column Macro`). Memory in the first arm serves the replies as written, wrong "
        "by the key; *holding the key's answer* counts the answers that hold it with other words around it."
    )
    rows = [Row(f"{result.arm}: new tickets right", "(reported)", _share(sum(o.right for o in result.outcomes),
                len(result.outcomes))) for result in results]  # fmt: skip
    header = ["arm", "gil feedback said", "right", "settled by (right / all)", "holding the key's answer", "modes"]
    lines = []
    for result in results:
        by = Counter(o.decider for o in result.outcomes)
        right_by = Counter(o.decider for o in result.outcomes if o.right)
        settled = ", ".join(f"{name} {right_by[name]}/{count}" for name, count in by.most_common())
        modes = ", ".join(f"{mode} {count}" for mode, count in Counter(o.mode for o in result.outcomes).most_common())
        right = sum(o.right for o in result.outcomes)
        holds = f"{sum(o.holds for o in result.outcomes)}"
        lines.append([result.arm, result.said, _share(right, len(result.outcomes)), settled, holds, modes])
    return Section(TITLE, COMMAND, lead, rows, extra_tables=[markdown_table(header, lines)])


def main(arguments: list[str] | None = None) -> list[Section]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=HISTORY, help="support tickets in the resolved history")
    parser.add_argument("--new", type=int, default=NEW, help="support tickets resolved after it")
    parser.add_argument("--work", type=Path, help="keep the task folders here (default: a temporary folder)")
    add_output_options(parser)
    options = parser.parse_args(arguments)
    history, new = (min(options.history, 20), min(options.new, 10)) if options.quick else (options.history, options.new)
    requests = list(support_stream().requests)
    with tempfile.TemporaryDirectory() as scratch:
        work = options.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        write_files(work, requests[:history], requests[history : history + new])
        results = []
        for arm, column in ARMS.items():
            print(f"{arm}: …", file=sys.stderr, flush=True)
            results.append(run_arm(work, arm, column, requests[history : history + new]))
    sections = [section(results, history, new)]
    publish(sections, destination(options))
    return sections


if __name__ == "__main__":
    main()
