"""Memory and requests of no category of the tree: what memory answers once the log has lowered its cut.

With the learned reflex on, memory's similarity cut is read from the log for the task's precision
(docs/learned-reflex.md, "Memory's cut, read from the same log"): on the bundled support stream it goes far below
the task file's 0.9, and it is right that low for requests *like the confirmed ones*. This part asks what memory
then does with requests of another kind. The support task (the demo's task file, the local MiniLM embedder, the
design arms' stand-in for the 135M LLM: it never answers a judgment with a label and generates the none answer)
confirms its 300 tickets in chunks of 50 with feedback from the answer key, twice over as ``gil demo`` does, then is
sent, with no feedback, requests of two streams written for other trees (the bundled assistant and home streams:
none of them is a support request).

A stranger answered from memory with one of the tree's answers is wrong; "none of these" from memory is right.
Two arms, in the same run, each with its own store and memory:

- **as shipped**: ``learned_reflex: {precision: 0.97}`` (memory's cut read from the log; a hit below the task
  file's cut is refused where the learned judge finds the request unlike the confirmed requests at the root);
- **cut as configured**: the same with ``memory_cut: false`` (memory serves at the task file's 0.9 throughout).

    uv run --extra local python -m benchmarks.memory_strangers [--strangers N] [--output FILE | --no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks._learned_runs import Record, run_chunks
from benchmarks._learned_setup import POLICY, assistant_stream, categories_of
from benchmarks._quality_streams import Request, home_stream, support_stream
from benchmarks._report import Row, Section, add_output_options, destination, markdown_table, publish
from benchmarks.learned import standin_model
from gil_core.batch import ticket_trace_id
from gil_core.learned import stored_state
from gil_core.taskfile import TaskFile, load_task_file, with_overrides
from gil_core.telemetry import TelemetryStore
from gil_core.wilson import wilson_interval

TITLE = "Memory and requests of no category"
COMMAND = "uv run --extra local python -m benchmarks.memory_strangers"
STRANGERS = 200  # from each foreign stream
REFUSED = "learned: the log's lower memory cut"  # the reason a refused hit gives (gil_core.recall)


@dataclass(frozen=True)
class ArmResult:
    arm: str
    trained: list[Record]
    strangers: dict[str, list[Record]]
    refused: dict[str, int]  # per foreign stream: memory hits the lowered-cut check took back
    cut: str


def _task_file(work: Path, arm: str, *, memory_cut: bool) -> TaskFile:
    stream = support_stream()
    loaded = load_task_file(stream.task_file)
    policy = replace(POLICY, memory_cut=memory_cut)
    task = replace(loaded.task, name=f"strangers-{arm}", policy=replace(loaded.task.policy, learned=policy))
    client = {**loaded.client, "cache_enabled": False}
    return with_overrides(loaded, task=task, store=work / arm / "store", memory=work / arm / "memory", client=client)


def _strangers(count: int) -> dict[str, list[Request]]:
    return {stream.name: list(stream.requests[:count]) for stream in (assistant_stream(), home_stream())}


async def run_arm(work: Path, arm: str, *, memory_cut: bool, strangers: dict[str, list[Request]]) -> ArmResult:
    task_file = _task_file(work, arm, memory_cut=memory_cut)
    task = task_file.task
    stream = support_stream()
    chat = standin_model(task.language.none_of_these)
    categories = categories_of(stream, task.tree)
    trained = await run_chunks(task_file, task, stream.requests, work / arm / "trained", categories=categories,
                               chat=chat, log=_log)  # fmt: skip
    # The demo's second pass: the same tickets again (new ids), feedback after each chunk as in the first.
    again = [replace(request, id=f"{request.id}#again") for request in stream.requests]
    categories |= {request.id: categories.get(request.id[: -len("#again")]) for request in again}
    await run_chunks(task_file, task, again, work / arm / "again", categories=categories, chat=chat, log=_log)
    sent: dict[str, list[Record]] = {}
    refused: dict[str, int] = {}
    store = TelemetryStore(work / arm / "store")
    for name, requests in strangers.items():
        # Renamed: the same ids as the support stream's would be found done. Never confirmed, never fed back.
        renamed = [replace(request, id=f"{name}-{request.id}") for request in requests]
        sent[name] = await run_chunks(task_file, task, renamed, work / arm / name, categories={}, chat=chat,
                                      feedback=False, log=_log)  # fmt: skip
        ids = {ticket_trace_id(task.name, request.id) for request in renamed}
        traces = store.read("traces")
        recalls = traces.filter(traces["trace_id"].is_in(list(ids)))["recall"].drop_nulls().to_list()
        refused[name] = sum(REFUSED in (json.loads(text).get("refused") or "") for text in recalls)
    state = stored_state(store, task)
    cut = state.memory.describe() if state is not None and state.memory is not None else "0.9, as configured"
    return ArmResult(arm, trained, sent, refused, cut)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _share(count: int, total: int) -> str:
    low, high = wilson_interval(count, total)
    return f"{count / total:.1%} ({count}/{total}; 95% CI {low:.1%}–{high:.1%})" if total else "—"


def _memory_wrong(records: Sequence[Record], none_text: str) -> int:
    return sum(r.mode == "memory" and (r.output or "").strip() != none_text for r in records)


def section(results: Sequence[ArmResult], none_text: str, count: int) -> Section:
    lead = (
        "The support task confirms its 300 tickets in chunks of 50 (feedback from the answer key, the design arms' "
        "stand-in LLM), twice over as `gil demo` does (the second pass the same tickets with new ids), then is sent"
        f" the first {count} requests of the assistant stream and of the home stream, "
        "written for other trees, with no feedback (`benchmarks/memory_strangers.py`). A stranger answered from "
        'memory with one of the tree\'s answers is wrong ("none of these" from memory is right). Two arms in the '
        "same run, each with its own store: **as shipped** (memory's cut read from the log; a hit below the task "
        "file's 0.9 refused where the learned judge finds the request unlike the confirmed ones at the root) and "
        "**cut as configured** (`memory_cut: false`: memory serves at 0.9 throughout)."
    )
    rows: list[Row] = []
    tables = []
    for result in results:
        for name, records in result.strangers.items():
            wrong = _memory_wrong(records, none_text)
            rows.append(Row(f"{result.arm}: {name} requests given a support answer from memory", "(reported)",
                            _share(wrong, len(records))))  # fmt: skip
    header = ["arm", "memory's cut after both passes", "support, first pass: right", "… from memory",
              *(f"{name}: modes" for name in results[0].strangers), "hits the check refused"]  # fmt: skip
    lines = []
    for result in results:
        right = sum(r.right for r in result.trained)
        memory = sum(r.mode == "memory" for r in result.trained)
        modes = [
            ", ".join(f"{mode} {n}" for mode, n in Counter(r.mode for r in records).most_common())
            for records in result.strangers.values()
        ]
        refused = ", ".join(f"{name} {n}" for name, n in result.refused.items())
        lines.append([result.arm, result.cut, _share(right, len(result.trained)),
                      _share(memory, len(result.trained)), *modes, refused])  # fmt: skip
    tables.append(markdown_table(header, lines))
    return Section(TITLE, COMMAND, lead, rows, extra_tables=tables)


async def measure(work: Path, count: int) -> tuple[list[ArmResult], str]:
    strangers = _strangers(count)
    results = [
        await run_arm(work, "as shipped", memory_cut=True, strangers=strangers),
        await run_arm(work, "cut as configured", memory_cut=False, strangers=strangers),
    ]
    return results, load_task_file(support_stream().task_file).task.language.none_of_these


def main(arguments: list[str] | None = None) -> list[Section]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strangers", type=int, default=STRANGERS, help="requests sent from each other stream")
    parser.add_argument("--work", type=Path, help="keep the stores here (default: a temporary folder)")
    add_output_options(parser)
    options = parser.parse_args(arguments)
    with tempfile.TemporaryDirectory() as scratch:
        work = options.work or Path(scratch)
        count = min(options.strangers, 20) if options.quick else options.strangers
        results, none_text = asyncio.run(measure(work, count))
    sections = [section(results, none_text, count)]
    publish(sections, destination(options))
    return sections


if __name__ == "__main__":
    main()
