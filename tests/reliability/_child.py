"""A child process for the crash and concurrency tests: it does one job the way the flows do it, and says what it
has finished, so the parent knows what was acknowledged when it kills the child.

    _child.py feedback TASK_FILE VERDICTS   apply-feedback, one verdict at a time; print each trace id once applied
    _child.py compact TASK_FILE             compact-telemetry (compact_store); print the files merged per table

Each child prints "ready" once its imports are done.
"""

from __future__ import annotations

import asyncio
import json
import sys

from gil_core.batch import read_verdicts
from gil_core.batch_feedback import apply_verdicts
from gil_core.maintenance import compact_store
from gil_core.runtime import open_runtime
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore


async def apply_one_by_one(task_file: str, verdicts_path: str) -> None:
    loaded = load_task_file(task_file)
    verdicts, bad = read_verdicts(verdicts_path)
    assert not bad, bad
    async with open_runtime(loaded) as runtime:
        print("ready", flush=True)
        for verdict in verdicts:
            await apply_verdicts(runtime.resolver, loaded.task, [verdict])
            print(verdict.trace_id, flush=True)  # only after apply_verdicts returned: acknowledged


def compact(task_file: str) -> None:
    store = TelemetryStore(load_task_file(task_file).store)
    print("ready", flush=True)
    print(json.dumps(compact_store(store)), flush=True)


def main(argv: list[str]) -> None:
    mode = argv[1]
    if mode == "feedback":
        asyncio.run(apply_one_by_one(argv[2], argv[3]))
    elif mode == "compact":
        compact(argv[2])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)
