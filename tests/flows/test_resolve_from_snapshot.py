"""`gil resolve` answered from memory in a fresh process (issue #18, point 4): once a lookup has kept the task's
snapshot, the next command answers from it without importing LanceDB; after a write to memory it reads the table
again (and keeps a new snapshot)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gil_core.runtime import open_runtime
from gil_core.taskfile import load_task_file
from gil_core.testing import ScriptedChatModel, ScriptedReply
from tests.flows._support import write_task_file

REQUEST = "My parcel never arrived and the tracking page has not changed for a week, where is it?"
ANSWER = "We are sorry your parcel is late. We will trace it with the carrier and reply within 2 days."


def resolve(path: Path, text: str) -> tuple[dict[str, Any], bool]:
    """``gil resolve --json`` in a fresh process: its result, and whether the process imported lancedb."""
    code = (
        "import sys\nfrom flows.cli import app\n"
        f"try:\n    app(['resolve', '-t', {str(path)!r}, '--json', {text!r}])\nexcept SystemExit:\n    pass\n"
        "print('lancedb imported:', 'lancedb' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    *result, last = done.stdout.strip().splitlines()
    return json.loads("\n".join(result)), last == "lancedb imported: True"


async def learn(path: Path, text: str, answer: str) -> None:
    """``text`` resolved (the scripted model answers none of these) and corrected with ``answer``."""
    task_file = load_task_file(path)
    chat = ScriptedChatModel(responder=lambda messages, **_: ScriptedReply(task_file.task.language.none_of_these))
    async with open_runtime(task_file, chat=chat) as runtime:
        result = await runtime.resolver.resolve(runtime.task, text)
        assert await runtime.resolver.feedback(runtime.task, result.trace_id, False, answer)


@pytest.mark.slow  # fresh processes
async def test_resolve_answers_from_the_snapshot_without_importing_lancedb(tmp_path: Path) -> None:
    path = write_task_file(tmp_path, "http://127.0.0.1:9")  # never asked: memory answers
    await learn(path, REQUEST, ANSWER)
    first, imported = resolve(path, REQUEST)  # the memory's marker moved with the correction: the table answers
    assert first["mode"] == "memory" and imported
    second, imported = resolve(path, REQUEST)  # the first one's load kept the snapshot
    assert second["mode"] == "memory" and not imported
    assert second["output"] == first["output"] == ANSWER

    await learn(path, "Do you sell gift cards?", "Yes, in every shop.")
    third, imported = resolve(path, REQUEST)
    assert third["mode"] == "memory" and imported and third["output"] == ANSWER
