"""Huge ticket files: a file of a million lines is read as a stream (the reader's peak memory, measured by the
kernel's accounting of a child process, grows by the duplicate check's 16-32 bytes a ticket, not by the tickets),
``gil resolve-batch`` over it holds a window of tickets, not the file, and a line over the cap is refused with
file:line while the rest run (a 1 MB ticket still resolves)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from flows.cli import app
from gil_core.batch import MAX_LINE_BYTES, Ticket, ticket_trace_id
from gil_core.telemetry import TelemetryStore
from tests.flows._support import write_task_file
from tests.reliability._support import ROOT, check_one_trace_per_ticket, gil_command, write_jsonl
from tests.resolver._support import Script, support_server

pytestmark = pytest.mark.reliability

LINES = 1_000_000
LONG_LINE = 100_001  # where the file holds a line of 32 MiB, eight times the cap (after the first block)
UNRESOLVED = 500  # the tickets of the million without a trace: the bounded part a batch resolves
READER_GROWTH_MIB = 40  # the fingerprints of a million ids (16 MiB, 24 while they grow) and one line at the cap
BATCH_GROWTH_MIB = 64  # what a million lines may add to a run over the 500 tickets it resolves
READ = (
    "import json, sys, tracemalloc\n"
    "from gil_core.batch import BadInput, iter_tickets, read_tickets\n"
    "tracemalloc.start()\n"
    "if sys.argv[2] == 'whole':\n"
    "    tickets, bad = read_tickets(sys.argv[1])\n"
    "    count, bad = len(tickets), [str(item) for item in bad]\n"
    "else:\n"
    "    count, bad = 0, []\n"
    "    for item in iter_tickets(sys.argv[1]):\n"
    "        if isinstance(item, BadInput):\n"
    "            bad.append(str(item))\n"
    "        else:\n"
    "            count += 1\n"
    "print(json.dumps({'tickets': count, 'bad': bad, 'traced_peak': tracemalloc.get_traced_memory()[1]}))\n"
)


def write_lines(path: Path, count: int, *, long_line_at: int | None = None) -> Path:
    """``count`` tickets ``t0``… one a line, written in blocks of 100,000; a ticket of 32 MiB after the block that
    ends before ``long_line_at``."""
    with path.open("w", encoding="utf-8") as handle:
        for start in range(0, count, 100_000):
            block = range(start, min(count, start + 100_000))
            handle.write("".join(f'{{"id": "t{i}", "text": "where is parcel number {i}?"}}\n' for i in block))
            if long_line_at == block.stop + 1:
                handle.write('{"id": "long", "text": "' + "x" * (32 << 20) + '"}\n')
    return path


def run_measured(argv: list[str], **options: object) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run ``argv``; its result and its peak RSS in KiB, from ``wait4`` (this child only)."""
    child = subprocess.Popen(
        argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, **options,  # type: ignore[arg-type]
    )  # fmt: skip
    output: dict[str, str] = {}
    readers = [
        threading.Thread(target=lambda: output.__setitem__("out", child.stdout.read())),  # type: ignore[union-attr]
        threading.Thread(target=lambda: output.__setitem__("err", child.stderr.read())),  # type: ignore[union-attr]
    ]
    for reader in readers:
        reader.start()
    watchdog = threading.Timer(600.0, child.kill)  # a guard, not a measure
    watchdog.start()
    _, status, usage = os.wait4(child.pid, 0)
    watchdog.cancel()
    for reader in readers:
        reader.join()
    child.returncode = os.waitstatus_to_exitcode(status)
    return subprocess.CompletedProcess(argv, child.returncode, output["out"], output["err"]), usage.ru_maxrss


@pytest.mark.heavy
@pytest.mark.slow
def test_a_million_line_ticket_file_is_read_as_a_stream_in_bounded_memory(tmp_path: Path) -> None:
    """The reader over a million lines (one of them 32 MiB, refused naming its line) allocates at most 40 MiB at
    its peak (tracemalloc, in a child process), and its process peaks (``wait4``) within 40 MiB of the same
    reader over one line; ``read_tickets``, which holds every ticket, peaks near 200 MiB on the same file (past
    150), so the measure sees what holding the file costs."""
    huge = write_lines(tmp_path / "huge.jsonl", LINES, long_line_at=LONG_LINE)
    small = write_lines(tmp_path / "small.jsonl", 1)
    baseline, baseline_kb = run_measured([sys.executable, "-c", READ, str(small), "stream"])
    streamed, streamed_kb = run_measured([sys.executable, "-c", READ, str(huge), "stream"])
    whole, _ = run_measured([sys.executable, "-c", READ, str(huge), "whole"])
    assert baseline.returncode == 0 and streamed.returncode == 0 and whole.returncode == 0, streamed.stderr
    summary, held = json.loads(streamed.stdout), json.loads(whole.stdout)
    assert summary["tickets"] == held["tickets"] == LINES
    assert (
        summary["bad"]
        == held["bad"]
        == [
            f"{huge}:{LONG_LINE}: the line is longer than {MAX_LINE_BYTES:,} bytes "
            "(max_line_bytes; gil resolve-batch --max-line-bytes)"
        ]
    )
    traced_mib, held_mib = summary["traced_peak"] / 2**20, held["traced_peak"] / 2**20
    growth_mib = (streamed_kb - baseline_kb) / 1024
    print(f"reader: traced peak {traced_mib:.1f} MiB streamed, {held_mib:.1f} MiB read whole; process peak")
    print(f"  {streamed_kb / 1024:.1f} MiB over a million lines, {baseline_kb / 1024:.1f} MiB over one")
    assert traced_mib < READER_GROWTH_MIB, f"the reader allocated {traced_mib:.1f} MiB over a million lines"
    assert growth_mib < READER_GROWTH_MIB, f"the reader's process grew by {growth_mib:.1f} MiB"
    assert held_mib > 150


def seed_traces(store_path: Path, task_file: Path, count: int) -> None:
    """Traces for tickets ``t0``… ``t{count-1}``, as one stored file: one real trace (resolved through ``gil``),
    copied under each ticket's trace id."""
    single = write_jsonl(store_path.parent / "one.jsonl", [{"id": "seed", "text": "where is my parcel?"}])
    command = gil_command("resolve-batch", str(single), "-o", str(store_path.parent / "one.out"), "-t", str(task_file))
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=300)
    store = TelemetryStore(store_path)
    row = store.read("traces")
    ids = pl.Series("trace_id", [ticket_trace_id("support", f"t{i}") for i in range(count)])
    copies = row.select(pl.exclude("trace_id")).join(ids.to_frame(), how="cross").select(row.columns)
    store.append("traces", copies)


@pytest.mark.heavy
@pytest.mark.slow
def test_gil_resolve_batch_over_a_million_lines_holds_a_window_not_the_file(tmp_path: Path) -> None:
    """``gil resolve-batch`` over a million lines whose first 999,500 tickets have a trace already: the other 500
    are resolved, one trace each, and the results file has a line per ticket, in file order. Its peak RSS stays
    within 64 MiB of the same command over a file of only those 500 tickets on a copy of the same store (the
    store's own reads cost both runs alike): what the million lines may add is the duplicate check (16-24 MiB)
    and a window of tickets and of result rows, not the file."""
    huge = write_lines(tmp_path / "huge.jsonl", LINES)
    late = [{"id": f"t{i}", "text": f"where is parcel number {i}?"} for i in range(LINES - UNRESOLVED, LINES)]
    with support_server({}, default=Script(answers=["None of these"])) as server:
        task_file = write_task_file(tmp_path, server.base_url)
        seed_traces(tmp_path / "store", task_file, LINES - UNRESOLVED)
        base = tmp_path / "base"
        shutil.copytree(tmp_path / "store", base / "store")
        base_task = write_task_file(base, server.base_url)
        small = write_jsonl(base / "small.jsonl", late)
        baseline, baseline_kb = run_measured(
            gil_command("resolve-batch", str(small), "-o", str(base / "out.jsonl"), "-t", str(base_task), "--json")
        )
        out = tmp_path / "results.jsonl"
        batch, batch_kb = run_measured(
            gil_command("resolve-batch", str(huge), "-o", str(out), "-t", str(task_file), "--json")
        )
    assert baseline.returncode == 0, baseline.stderr
    assert json.loads(baseline.stdout)["resolved"] == UNRESOLVED
    assert batch.returncode == 0, batch.stderr
    summary = json.loads(batch.stdout)
    assert (summary["resolved"], summary["skipped"], summary["failed"]) == (UNRESOLVED, LINES - UNRESOLVED, [])
    assert summary["tickets"] == LINES and summary["written"] == LINES
    traces = TelemetryStore(tmp_path / "store").scan("traces").select("trace_id").collect()
    assert traces.height == LINES + 1  # and the seed ticket's own
    assert traces["trace_id"].n_unique() == traces.height
    resolved = [ticket_trace_id("support", row["id"]) for row in late]
    assert traces.filter(pl.col("trace_id").is_in(resolved)).height == UNRESOLVED
    with out.open(encoding="utf-8") as lines:
        ids = [json.loads(line)["id"] for line in lines]
    assert ids == [f"t{i}" for i in range(LINES)]
    growth_mib = (batch_kb - baseline_kb) / 1024
    print(f"gil resolve-batch: peak RSS {batch_kb / 1024:.1f} MiB over a million lines, {baseline_kb / 1024:.1f} MiB")
    print("  over the 500 tickets it resolves, on the same store")
    assert growth_mib < BATCH_GROWTH_MIB, f"the batch grew by {growth_mib:.1f} MiB over a million lines"


def test_a_line_over_the_cap_is_refused_with_file_and_line_and_the_rest_run(tmp_path: Path) -> None:
    """Under the default cap (4 MiB) a 1 MB ticket resolves and a 5 MiB line is refused naming file:2; with
    ``--max-line-bytes`` set below it, the 1 MB ticket is refused too; every other ticket resolves either way."""
    megabyte = "where is my parcel? " * 50_000  # 1,000,000 characters
    rows = [
        {"id": "big", "text": megabyte},
        {"id": "huge", "text": "x" * (5 << 20)},
        {"id": "small", "text": "where is my parcel?"},
    ]
    tickets = write_jsonl(tmp_path / "tickets.jsonl", rows)
    with support_server({}, default=Script(answers=["None of these"])) as server:
        task_file = write_task_file(tmp_path, server.base_url)
        first = CliRunner().invoke(
            app, ["resolve-batch", str(tickets), "-o", str(tmp_path / "a.jsonl"), "-t", str(task_file), "--json"]
        )
        assert first.exit_code == 0, first.output
        summary = json.loads(first.stdout.strip().splitlines()[-1])
        assert summary["bad_lines"] == [
            f"{tickets}:2: the line is longer than 4,194,304 bytes (max_line_bytes; gil resolve-batch --max-line-bytes)"
        ]
        assert (summary["resolved"], summary["failed"]) == (2, [])
        results = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines()]
        assert [row["id"] for row in results] == ["big", "small"]

        arguments = ["resolve-batch", str(tickets), "-o", str(tmp_path / "b.jsonl"), "-t", str(task_file), "--json"]
        capped = CliRunner().invoke(app, [*arguments, "--max-line-bytes", "65536"])
        assert capped.exit_code == 0, capped.output
        summary = json.loads(capped.stdout.strip().splitlines()[-1])
        assert [line.split(": ", 1)[0] for line in summary["bad_lines"]] == [f"{tickets}:1", f"{tickets}:2"]
        assert "65,536 bytes" in summary["bad_lines"][0]
        assert (summary["resolved"], summary["skipped"]) == (0, 1)  # "small": resolved by the first run
    resolved = [Ticket(row["id"], row["text"]) for row in (rows[0], rows[2])]
    check_one_trace_per_ticket(TelemetryStore(tmp_path / "store"), "support", resolved)
