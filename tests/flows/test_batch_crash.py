"""A batch killed with SIGKILL halfway and run again ends with exactly one trace per ticket."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedOpenAIServer, ScriptedReply
from tests.flows._support import write_task_file
from tests.resolver._support import ROOT, Script, SupportModel

TICKETS = 120


class SlowModel(SupportModel):
    """Answers like SupportModel, a little slowly, so the kill lands while the batch is under way."""

    delay = 0.05

    def __call__(self, body: object) -> ScriptedReply:  # type: ignore[override]
        time.sleep(self.delay)
        return super().__call__(body)  # type: ignore[arg-type]


def stored_traces(folder: Path) -> int:
    """Trace rows a batch has flushed so far (it group-commits: one file may hold many tickets)."""
    if not folder.is_dir() or not any(name.endswith(".parquet") for name in os.listdir(folder)):
        return 0
    return TelemetryStore(folder.parent).read("traces").height


def test_a_killed_batch_rerun_has_exactly_one_trace_per_ticket(tmp_path: Path) -> None:
    with ScriptedOpenAIServer(responder=SlowModel({}, default=Script(answers=["None of these"]))) as server:
        task = write_task_file(tmp_path, server.base_url, memory_threshold=None)
        tickets = tmp_path / "tickets.jsonl"
        tickets.write_text(
            "".join(json.dumps({"id": f"t{i}", "text": f"question number {i}"}) + "\n" for i in range(TICKETS))
        )
        out = tmp_path / "results.jsonl"
        command = [sys.executable, "-m", "flows.cli", "resolve-batch", str(tickets), "--out", str(out), "-t", str(task)]
        child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        traces = tmp_path / "store" / "traces"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            if stored_traces(traces) >= 5:
                break
            time.sleep(0.05)
        assert child.poll() is None, child.stderr.read().decode() if child.stderr else "the batch ended early"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        killed_at = TelemetryStore(tmp_path / "store").read("traces").height
        assert 5 <= killed_at < TICKETS

        result = CliRunner().invoke(app, ["resolve-batch", str(tickets), "--out", str(out), "-t", str(task), "--json"])
        assert result.exit_code == 0, result.stderr
        summary = json.loads(result.stdout)
    assert summary["skipped"] >= killed_at and summary["resolved"] + summary["skipped"] == TICKETS
    stored = TelemetryStore(tmp_path / "store").read("traces")
    assert stored.height == TICKETS and stored["trace_id"].n_unique() == TICKETS
    assert len(out.read_text().splitlines()) == TICKETS
