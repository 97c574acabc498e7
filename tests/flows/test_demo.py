"""``gil demo`` end to end on the scripted server: two passes, feedback from the answer key, memory on pass two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from gil_core.telemetry import TelemetryStore
from tests.flows._support import write_task_file
from tests.resolver._support import Script, support_server


@pytest.mark.usefixtures("prefect_harness")
def test_the_demo_answers_the_second_pass_from_memory(tmp_path: Path) -> None:
    with support_server({}, default=Script(answers=["None of these"])) as server:
        task = write_task_file(tmp_path, server.base_url, memory_threshold=0.95)
        result = CliRunner().invoke(app, ["demo", "-t", str(task), "--limit", "6", "--chunk", "3", "--json"])
        again = ["demo", "-t", str(task), "--limit", "3", "--chunk", "3", "--no-fresh", "--json"]
        kept = CliRunner().invoke(app, again)
        shown = CliRunner().invoke(app, ["demo", "-t", str(task), "--limit", "1", "--chunk", "1", "--no-fresh"])
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["first"]["requests"] == summary["second"]["requests"] == 6
    assert summary["second"]["memory_share"] == 1.0 and summary["second"]["accuracy"] == 1.0
    assert summary["first"]["accuracy"] < 1.0  # the scripted model answers "None of these" to everything
    missed = summary["first"]["misses"]
    wrong = round(6 * (1 - summary["first"]["accuracy"]))
    assert sum(missed.values()) == wrong and missed["before any verdict"] >= 1
    # --no-fresh keeps what the first run taught and sends the tickets again as new ones: resolved, not found
    # done (the first run's misses would come back), all from memory, and no miss is "before any verdict".
    assert kept.exit_code == 0, kept.stderr
    said = " ".join(kept.stdout.split())
    assert "the store is kept, with what earlier runs taught" in said, said
    second_run = json.loads(kept.stdout.strip().splitlines()[-1])
    assert second_run["first"]["modes"] == {"memory": 3} and second_run["first"]["accuracy"] == 1.0
    assert second_run["first"]["misses"]["before any verdict"] == 0
    traces = TelemetryStore(tmp_path / "store").read("traces")
    assert traces["trace_id"].n_unique() == 20  # two passes of 6 tickets, two of 3 and two of 1: a trace each
    # Printed for a person: where the store is (resolved) and how to read it again.
    said = " ".join(shown.stdout.split())
    assert shown.exit_code == 0 and f"Everything is in the store at {(tmp_path / 'store').resolve()}:" in said, said
    assert f"`gil stats -t {task}` reads it again" in said, said
