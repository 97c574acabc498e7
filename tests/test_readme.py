"""The README's example runs as written, against the scripted server instead of a real one."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gil_core.testing import ScriptedOpenAIServer, ScriptedReply

ROOT = Path(__file__).resolve().parent.parent


def readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.DOTALL)
    assert blocks, "the README has no Python example"
    return blocks[0]


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
