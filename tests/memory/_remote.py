"""Another process on a LanceDB memory, for the freshness tests.

``python -m tests.memory._remote`` reads one JSON list per stdin line and answers each with one stdout line:
``["lookup", root, task, text]`` → ``[source, similarity]`` of the lookup (``null`` when the task holds nothing);
``["remember", root, task, key, text, answer]`` and ``["forget", root, task, key]`` → ``"ok"`` once written. One
``LanceDBMemory`` per root, kept for the life of the process (so it is a long-lived reader).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from gil_core.memory import LanceDBMemory
from gil_core.testing import HashEmbeddingModel


async def serve() -> None:
    memories: dict[str, LanceDBMemory] = {}
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        command, root, task, *arguments = json.loads(line)
        memory = memories.get(root)
        if memory is None:
            memory = memories[root] = LanceDBMemory(Path(root), HashEmbeddingModel())
        reply: Any = "ok"
        if command == "lookup":
            recall = await memory.lookup(task, arguments[0], threshold=0.0)
            reply = None if recall is None else [recall.source, recall.similarity]
        elif command == "remember":
            await memory.remember(task, *arguments)
        elif command == "forget":
            await memory.forget(task, *arguments)
        else:
            reply = f"unknown command {command!r}"
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    asyncio.run(serve())
