"""``gil demo``: the bundled support tickets through the flows, twice, with feedback from the answer key between.

The first pass meets every request cold, in chunks with feedback after each, so memory grows as it would in a
queue; the second pass replays the same tickets (new ids) and memory answers what was confirmed. Everything runs
on the task file's models (the embedded local LLM and embedder by default) and shows up in the Prefect UI.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow

from flows.batch import apply_feedback_flow, resolve_batch_flow
from flows.maintenance import fit_energy_flow
from flows.review import local_folder
from gil_core.batch_feedback import graded
from gil_core.errors import ConfigurationError
from gil_core.learned import verdict_digest
from gil_core.ontology.model import OptionKind
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore


@dataclass(frozen=True)
class DemoPaths:
    """The demo's task file and working folder. ``run``: what this run adds to the tickets' ids ("" on a fresh
    store; on a kept one, ``#`` and the time, so that its tickets are new to the store and resolved, not found
    done)."""

    task_file: Path
    work: Path
    run: str = ""

    def file(self, name: str) -> Path:
        return self.work / name


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def verdicts_from_key(results: list[dict[str, Any]], answers: dict[str, str]) -> list[dict[str, Any]]:
    """A verdict per result from the answer key (``graded``, as ``gil feedback --key`` gives them), as JSON."""
    verdicts = []
    for result in results:
        verdict = graded(result["trace_id"], result["output"], answers[result["id"].split("#", 1)[0]])
        correction = {} if verdict.correct else {"correction": verdict.correction}
        verdicts.append({"trace_id": verdict.trace_id, "correct": verdict.correct, **correction})
    return verdicts


@flow(name="demo")
async def demo_flow(
    task_file: str,
    tickets: str,
    answers: str,
    work: str,
    chunk: int = 100,
    limit: int = 0,
    run: str = "",
) -> dict[str, Any]:
    """Pass 1 in chunks with feedback after each; pass 2 over the same tickets; then fit energy. ``run`` is added
    to every ticket id (``DemoPaths.run``); on a kept store that already held verdicts no miss counts as "before
    any verdict"."""
    paths = DemoPaths(Path(task_file), Path(work))
    rows = _read_jsonl(Path(answers))
    key = {row["id"]: row["answer"] for row in rows}
    options = {row["id"]: row.get("option_id") for row in rows}
    all_tickets = _read_jsonl(Path(tickets))
    if limit:
        all_tickets = all_tickets[:limit]
    passes: dict[str, list[dict[str, Any]]] = {"first": [], "second": []}
    plan = [("first", all_tickets[start : start + chunk], run) for start in range(0, len(all_tickets), chunk)]
    plan.append(("second", all_tickets, run + "#again"))
    loaded = load_task_file(task_file)
    held = run != "" and verdict_digest(TelemetryStore(loaded.store), loaded.task.name).verdicts > 0
    first_chunk = set() if held else {t["id"] for t in all_tickets[:chunk]}
    for number, (name, tickets_chunk, suffix) in enumerate(plan, start=1):
        batch = _write_jsonl(
            paths.file(f"tickets-{number}.jsonl"), [{"id": t["id"] + suffix, "text": t["text"]} for t in tickets_chunk]
        )
        out = paths.file(f"results-{number}.jsonl")
        await resolve_batch_flow(str(paths.task_file), str(batch), out=str(out))
        results = _read_jsonl(out)
        passes[name].extend(results)
        verdicts = _write_jsonl(paths.file(f"verdicts-{number}.jsonl"), verdicts_from_key(results, key))
        await apply_feedback_flow(str(paths.task_file), str(verdicts))
    await fit_energy_flow(str(paths.task_file))
    summary = {name: summarize(results, key) for name, results in passes.items()}
    tree = loaded.task.tree
    procedures = {option.id for option, _ in tree.options() if option.kind is OptionKind.PROCEDURE}
    summary["first"]["misses"] = misses(passes["first"], key, options, first_chunk, procedures)
    return summary


def summarize(results: list[dict[str, Any]], key: dict[str, str]) -> dict[str, Any]:
    """Per pass: requests, accuracy, memory share and mean energy per request."""
    total = len(results) or 1
    correct = sum((r["output"] or "").strip() == key[r["id"].split("#", 1)[0]] for r in results)
    return {
        "requests": len(results),
        "accuracy": correct / total,
        "memory_share": sum(r["mode"] == "memory" for r in results) / total,
        "mean_energy": sum(r["energy"] or 0.0 for r in results) / total,
        "modes": {mode: sum(r["mode"] == mode for r in results) for mode in sorted({r["mode"] for r in results})},
    }


def misses(
    results: list[dict[str, Any]],
    key: dict[str, str],
    options: dict[str, str | None],
    first_chunk: set[str],
    procedures: set[str],
) -> dict[str, int]:
    """Why the wrong answers of a pass were wrong: asked before any verdict existed (the first chunk), the right
    template with a slot filled wrong, a procedure (its expected reply is a fixed text no generation copies), or
    routed to another answer (or none)."""
    counts = {"before any verdict": 0, "slots": 0, "procedures": 0, "routing": 0}
    for result in results:
        ticket = result["id"].split("#", 1)[0]
        if (result["output"] or "").strip() == key[ticket]:
            continue
        expected = options.get(ticket)
        if ticket in first_chunk:
            counts["before any verdict"] += 1
        elif expected is not None and result.get("option_id") == expected:
            counts["slots"] += 1
        elif expected in procedures or str(result["mode"]) == "habit/procedure":
            counts["procedures"] += 1
        else:
            counts["routing"] += 1
    return counts


def prepare(task_file: Path, *, fresh: bool) -> DemoPaths:
    """The demo's working folder beside its store; ``fresh`` starts from an empty store and memory (local folders
    only: it never deletes objects from a bucket). A kept store gives this run's tickets ids of their own."""
    loaded = load_task_file(task_file)
    work = local_folder(loaded) / "demo-files"
    if fresh:
        remote = [str(where) for where in (loaded.store, loaded.memory) if not isinstance(where, Path)]
        if remote:
            raise ConfigurationError(
                f"{task_file}: a fresh demo empties its store and memory, and {' and '.join(remote)} is not a local "
                "folder: run with --no-fresh, or with a task file whose store and memory are folders"
            )
        for folder in (loaded.store, loaded.memory, work):
            shutil.rmtree(folder, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    return DemoPaths(task_file, work, run="" if fresh else f"#{datetime.now(UTC):%Y%m%dT%H%M%S.%f}")
