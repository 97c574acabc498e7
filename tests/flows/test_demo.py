"""``gil demo`` end to end on the scripted server: two passes, feedback from the answer key, memory on pass two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tests.flows._support import write_task_file
from tests.resolver._support import Script, support_server


@pytest.mark.usefixtures("prefect_harness")
def test_the_demo_answers_the_second_pass_from_memory(tmp_path: Path) -> None:
    with support_server({}, default=Script(answers=["None of these"])) as server:
        task = write_task_file(tmp_path, server.base_url, memory_threshold=0.95)
        result = CliRunner().invoke(app, ["demo", "-t", str(task), "--limit", "6", "--chunk", "3", "--json"])
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["first"]["requests"] == summary["second"]["requests"] == 6
    assert summary["second"]["memory_share"] == 1.0 and summary["second"]["accuracy"] == 1.0
    assert summary["first"]["accuracy"] < 1.0  # the scripted model answers "None of these" to everything
    missed = summary["first"]["misses"]
    wrong = round(6 * (1 - summary["first"]["accuracy"]))
    assert sum(missed.values()) == wrong and missed["before any verdict"] >= 1
