"""A disk that fills up in the middle of a batch (a real ENOSPC: the store on a small tmpfs of the test's own,
filled to a few flushes' worth): no torn table, every acknowledged row readable, a clear error that says the batch
stopped, and a rerun once there is room resolves the tickets that were not acknowledged, one trace each."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
from collections.abc import Mapping
from pathlib import Path

import polars as pl
import pytest

from gil_core.batch import Ticket, resolve_batch
from gil_core.errors import TelemetryError
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedChatModel, ScriptedReply
from tests.flows._support import write_task_file
from tests.reliability._support import (
    ROOT,
    check_one_trace_per_ticket,
    every_parquet_file_reads,
    gil_command,
    make_tickets,
    write_jsonl,
)
from tests.resolver._support import Script, support_server, support_task
from tests.telemetry._tmpfs import leave_free, tmpfs

pytestmark = pytest.mark.reliability

TICKETS = 120
ROOM = 120_000  # bytes left on the disk: a few flushes of 40 rows (about 24 kB each), not the whole batch


def scripted_resolver(store: TelemetryStore) -> Resolver:
    return Resolver(ScriptedChatModel(responder=lambda messages, **_: ScriptedReply("B")), store)


def tickets_with_text() -> list[Ticket]:
    """Tickets whose text does not compress away (each its own 512 hex digits, none repeated: a digest written
    four times compressed to a quarter, and a batch that flushed only once, on a quiet machine, then fit in ROOM)."""

    def noise(ticket_id: str) -> str:
        return "".join(hashlib.sha512(f"{ticket_id}:{part}".encode()).hexdigest() for part in range(4))

    return [Ticket(t.id, f"{t.text}: where is my parcel? {noise(t.id)}") for t in make_tickets(TICKETS)]


def no_temporary_files(root: Path) -> bool:
    return not [path for path in root.rglob("*") if path.name.startswith(".") and path.name.endswith(".tmp")]


def test_a_disk_full_mid_batch_tears_nothing_keeps_what_was_acknowledged_and_a_rerun_resolves_the_rest(
    tmp_path: Path,
) -> None:
    task, tickets = support_task(memory_threshold=None), tickets_with_text()
    with tmpfs(tmp_path / "disk", size="4m") as disk:
        root = disk / "store"
        store = TelemetryStore(root)
        filler = leave_free(disk, ROOM)
        acknowledged: list[str] = []

        def flushed(frames: Mapping[str, pl.DataFrame]) -> None:
            if "traces" in frames:
                acknowledged.extend(frames["traces"]["trace_id"])

        # An outer group the batch joins: flushes every 40 rows only (no timer), each one heard of here.
        with (
            pytest.raises(TelemetryError) as raised,
            store.group_commit(max_rows=40, max_delay_s=None, on_flush=flushed),
        ):
            asyncio.run(resolve_batch(scripted_resolver(store), task, tickets))
        message = str(raised.value)
        assert f"at {root}/" in message and "no space left on the device (ENOSPC)" in message
        assert "no partial file is left" in message and "run it again to resolve the others" in message
        resolved = int(message.split("the batch stopped with ", 1)[1].split(" of", 1)[0])
        assert 0 < resolved <= len(acknowledged) < TICKETS

        assert no_temporary_files(root)  # no torn table: every file is whole, and reads
        every_parquet_file_reads(root)
        fresh = TelemetryStore(root)
        traces, calls = fresh.read("traces"), fresh.read("calls")
        assert set(acknowledged) <= set(traces["trace_id"])  # every acknowledged row is there
        assert set(traces["trace_id"]) <= set(calls["trace_id"])  # and every trace has its calls
        kept = traces.sort("trace_id")

        filler.unlink()  # room again
        report = asyncio.run(resolve_batch(scripted_resolver(TelemetryStore(root)), task, tickets))
        assert (report.skipped, report.resolved, report.failed) == (traces.height, TICKETS - traces.height, [])
        after = check_one_trace_per_ticket(TelemetryStore(root), task.name, tickets)
        assert after.filter(pl.col("trace_id").is_in(kept["trace_id"].to_list())).sort("trace_id").equals(kept)
        root_hits = TelemetryStore(root).read("node_stats").filter(pl.col("node_id") == "root")["hits"].sum()
        assert root_hits <= TICKETS  # no ticket's walk counted twice (a flush cut by the disk may count one less)


def test_gil_resolve_batch_on_a_full_disk_says_so_in_one_error_line_and_a_rerun_finishes(tmp_path: Path) -> None:
    tickets = [{"id": t.id, "text": t.text} for t in tickets_with_text()]
    tickets_file = write_jsonl(tmp_path / "tickets.jsonl", tickets)
    out = tmp_path / "results.jsonl"
    with support_server({}, default=Script(answers=["None of these"])) as server, tmpfs(tmp_path / "disk") as disk:
        task_file = write_task_file(tmp_path, server.base_url, store=str(disk / "store"))
        command = gil_command("resolve-batch", str(tickets_file), "--out", str(out), "-t", str(task_file), "--json")
        filler = leave_free(disk, ROOM)
        first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert first.returncode == 2 and "Traceback" not in first.stderr, first.stderr
        last = first.stderr.strip().splitlines()[-1]
        assert last.startswith("error: table '") and "no space left on the device (ENOSPC)" in last, first.stderr
        assert "the batch stopped with" in last and not out.exists()
        assert no_temporary_files(disk / "store")
        every_parquet_file_reads(disk / "store")

        filler.unlink()
        second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr
        check_one_trace_per_ticket(TelemetryStore(disk / "store"), "support", tickets_with_text())
        assert len(out.read_text(encoding="utf-8").splitlines()) == TICKETS
