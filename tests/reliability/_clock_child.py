"""A child process for the clock tests: it resolves requests and applies verdicts on a shared store and memory, with
its store's clock set off the machine's by an offset, as a process on a machine whose clock is wrong.

    _clock_child.py STORE MEMORY_DIR CHAT_URL OFFSET_S STEPS_JSON

``STORE`` is a folder or an ``s3://`` URI (settings from ``GIL_S3_*``); ``MEMORY_DIR`` holds a lexical memory;
``CHAT_URL`` is the scripted OpenAI-compatible server; each step of ``STEPS_JSON`` is ``[task, "resolve", ticket,
text]`` or ``[task, "feedback", ticket, correct, correction]``, done in order the way ``gil resolve-batch`` and
``gil feedback`` do them. Task ``support`` has memory, task ``learned`` the learned reflex (over a hash embedding).
Prints one JSON line per step (its mode, or the feedback report), then ``{"pid": …}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

from gil_core.batch import Ticket, Verdict, resolve_batch, ticket_trace_id
from gil_core.batch_feedback import apply_verdicts
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.memory import LexicalMemory
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from gil_core.telemetry._clock import HybridClock
from gil_core.testing import HashEmbeddingModel
from tests.learned._support import learned_task
from tests.resolver._support import support_task

TASKS = {"support": support_task("support", memory_threshold=0.95), "learned": learned_task("learned")}


async def run(store_root: str, memory_dir: str, chat_url: str, offset_s: float, steps: list[list[object]]) -> None:
    offset_ns = round(offset_s * 1e9)
    clock = HybridClock(wall_ns=lambda: time.time_ns() + offset_ns)
    store = TelemetryStore(store_root, clock=clock)
    chat = OpenAICompatibleChatModel(chat_url, "scripted")
    memory = LexicalMemory(Path(memory_dir))
    resolver = Resolver(chat, store, memory=memory, reflex_embedder=HashEmbeddingModel())
    for step in steps:
        task = TASKS[str(step[0])]
        if step[1] == "resolve":
            ticket = Ticket(str(step[2]), str(step[3]))
            await resolve_batch(resolver, task, [ticket])
            traces = store.read("traces")
            row = traces.filter(traces["trace_id"] == ticket_trace_id(task.name, ticket.id))
            print(json.dumps({"resolved": ticket.id, "mode": row["mode"][0]}), flush=True)
        else:
            _, _, ticket_id, correct, correction = step
            verdict = Verdict(ticket_trace_id(task.name, str(ticket_id)), bool(correct), correction and str(correction))
            report = await apply_verdicts(resolver, task, [verdict])
            print(json.dumps({"feedback": ticket_id, **report.to_json()}), flush=True)
    print(json.dumps({"pid": os.getpid()}), flush=True)


def main(argv: list[str]) -> None:
    _, store_root, memory_dir, chat_url, offset_s, steps = argv
    asyncio.run(run(store_root, memory_dir, chat_url, float(offset_s), json.loads(steps)))


if __name__ == "__main__":
    main(sys.argv)
