"""What the memory tests share: how each adapter is opened (also from a fresh process) and what it answers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gil_core.llm import EmbeddingModel
from gil_core.memory import LanceDBMemory, LexicalMemory, Memory
from gil_core.telemetry import CallRecord
from gil_core.testing import HashEmbeddingModel

ADAPTERS = ("lancedb", "lexical")
ROOT = Path(__file__).resolve().parents[2]


class Peer:
    """Another process with its own memory on each root it is given (``tests.memory._remote``), kept alive."""

    def __init__(self) -> None:
        command = [sys.executable, "-m", "tests.memory._remote"]
        self.process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self, command: str, root: Path, task: str, *arguments: str) -> Any:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps([command, str(root), task, *arguments]) + "\n")
        stdin.flush()
        return json.loads(stdout.readline())

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


class ListSink:
    """A call sink that keeps the records in a list."""

    def __init__(self) -> None:
        self.calls: list[CallRecord] = []

    def record_calls(self, calls: Sequence[CallRecord]) -> None:
        self.calls.extend(calls)


def open_memory(adapter: str, root: Path, *, embedder: EmbeddingModel | None = None) -> Memory:
    """The adapter named ``adapter`` storing under ``root`` (the same store for every call with that root)."""
    if adapter == "lancedb":
        return LanceDBMemory(root / "lancedb", embedder or HashEmbeddingModel())
    if adapter == "lexical":
        return LexicalMemory(root / "lexical")
    raise ValueError(adapter)


async def describe(memory: Memory, task: str, queries: Sequence[str], threshold: float = 0.5) -> dict[str, Any]:
    """Everything ``task`` holds and the recall of each query, as JSON-ready values."""
    recalls = [await memory.lookup(task, query, threshold=threshold) for query in queries]
    return {
        "entries": [[entry.key, entry.text, entry.answer] for entry in await memory.entries(task)],
        "recalls": [None if recall is None else [recall.source, recall.similarity, recall.hit] for recall in recalls],
    }


def main(arguments: Sequence[str]) -> None:
    """``python -m tests.memory._support ADAPTER ROOT TASK QUERY...``: print ``describe`` as JSON."""
    adapter, root, task, *queries = arguments
    print(json.dumps(asyncio.run(describe(open_memory(adapter, Path(root)), task, queries))))


if __name__ == "__main__":
    main(sys.argv[1:])
