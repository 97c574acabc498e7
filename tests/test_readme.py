"""The README's example runs as written, against the scripted server instead of a real one."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedOpenAIServer, ScriptedReply
from tests.flows._support import write_task_file

ROOT = Path(__file__).resolve().parent.parent


def readme_example(number: int = 0) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) > number, "the README lacks a Python example"
    return blocks[number]


def test_the_readme_example_walks_the_tree_and_records_priced_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code = readme_example()
    assert "http://127.0.0.1:8080/v1" in code
    # Every judgment picks label B, whichever candidate the order seed put there.
    with ScriptedOpenAIServer(responder=lambda body: ScriptedReply("B", top_logprobs=[("B", 0.0)])) as server:
        monkeypatch.chdir(tmp_path)
        (tmp_path / "ontologies").mkdir()
        (tmp_path / "ontologies" / "support.yaml").write_bytes((ROOT / "ontologies" / "support.yaml").read_bytes())
        exec(compile(code.replace("http://127.0.0.1:8080/v1", server.base_url), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("habit ")
    assert out.count("│ judge") == len(server.requests) >= 2
    assert [p for p in os.listdir(tmp_path / "gil-store" / "calls") if p.endswith(".parquet")]


def test_ci_runs_the_readmes_test_command_and_it_runs_the_heavy_tests_too() -> None:
    """`.ci/run` ends with command 2 of the README, word for word; a plain `pytest` leaves out the tests marked
    `heavy` (pyproject's addopts), so the command must run them in a step of their own."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"```bash\n(python3 -m pip install [^\n]*)\n```", readme)
    assert len(commands) >= 2, "the README's two commands are gone"
    test_command = commands[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").rstrip("\n").splitlines()
    assert ci[-1] == test_command
    steps = [step.strip() for step in test_command.split("&&")]
    assert "python3 -m uv run pytest -m heavy" in steps
    assert steps.index("python3 -m uv run python scripts/check.py") < steps.index("python3 -m uv run pytest -m heavy")
    assert steps[-1] == "python3 -m uv run pytest", "the plain run ends it (with the conformance counts)"


def test_the_readme_s_task_file_example_resolves_learns_and_answers_from_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second example opens a task file in the working folder (``gil.yaml``), resolves, gives a verdict, and
    the same request comes back from memory."""
    code = readme_example(1)
    assert 'load_task_file("gil.yaml")' in code
    with ScriptedOpenAIServer(responder=lambda body: ScriptedReply("B", top_logprobs=[("B", 0.0)])) as server:
        write_task_file(tmp_path, server.base_url).rename(tmp_path / "gil.yaml")
        monkeypatch.chdir(tmp_path)
        exec(compile(code, "README.md", "exec"), {})
    first, second = capsys.readouterr().out.splitlines()
    assert first.split(" ", 1)[0] != "memory" and second == "memory", (first, second)
    assert len(TelemetryStore(tmp_path / "store").read("traces")["trace_id"].unique()) == 2
