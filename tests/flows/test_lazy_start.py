"""Commands start only what they use (issue #18): with the embedded local model as the task's chat model,
`gil feedback`, `gil rebuild-memory` and `gil review differentiate` never ask it anything, so they start no model
server; `gil --help` and `gil lint-tree` import none of the heavy libraries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gil_core.resolver import Resolver
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedChatModel, ScriptedReply
from tests.flows._support import write_task_file
from tests.resolver._support import ROOT

HEAVY = ("polars", "pandera", "lancedb", "prefect", "sklearn")


def _gil(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "from flows.cli import main; main()", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, env=env)


@pytest.fixture
def cache_home(tmp_path: Path) -> dict[str, str]:
    """A private XDG cache: where the local server would record itself if anything started it."""
    home = tmp_path / "xdg-cache"
    home.mkdir()
    return {**os.environ, "XDG_CACHE_HOME": str(home)}


@pytest.mark.heavy
async def test_feedback_rebuild_and_a_review_round_start_no_model_server(
    tmp_path: Path, cache_home: dict[str, str]
) -> None:
    path = write_task_file(tmp_path, "unused", chat_model="local")
    loaded = load_task_file(path)
    chat = ScriptedChatModel(responder=lambda messages, **_: ScriptedReply("None of these"))
    resolver = Resolver(chat, TelemetryStore(loaded.store))  # traces written here, judged by the commands
    traces = [(await resolver.resolve(loaded.task, text)).trace_id for text in ("where is my refund?", "hello")]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text(
        "".join(json.dumps({"trace_id": t, "correct": False, "correction": "None of these"}) + "\n" for t in traces),
        encoding="utf-8",
    )
    for args in (
        ("feedback", str(empty)),
        ("feedback", str(verdicts)),
        ("rebuild-memory",),
        ("review", "differentiate"),
    ):
        done = _gil(*args, "-t", str(path), "--json", env=cache_home)
        assert done.returncode == 0, (args, done.stderr)
    assert json.loads(_gil("rebuild-memory", "-t", str(path), "--json", env=cache_home).stdout)["entries"] == 2
    started = list(Path(cache_home["XDG_CACHE_HOME"]).rglob("*"))
    assert started == [], started  # no state file, no server log: no server was started or looked for


@pytest.mark.parametrize("args", [("--help",), ("lint-tree", str(ROOT / "ontologies" / "support.yaml"))])
def test_help_and_lint_tree_import_none_of_the_heavy_libraries(args: tuple[str, ...]) -> None:
    code = (
        "import sys\nfrom flows.cli import app\n"
        f"try:\n    app({list(args)!r})\nexcept SystemExit:\n    pass\n"
        f"print([name for name in {HEAVY!r} if name in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


async def test_the_local_embedder_loads_its_model_on_the_first_texts_it_embeds() -> None:
    from gil_core.runtime import _OnDemandEmbeddingModel

    embedder = _OnDemandEmbeddingModel()
    assert embedder._model is None and embedder.name == "all-MiniLM-L6-v2-int8"  # named without loading
    vectors = (await embedder.embed(["where is my refund?"])).vectors
    assert embedder._model is not None and len(vectors[0]) == 384
