"""resolve_batch under group commit: a ticket counts (report, progress) only once its trace is durable, a ticket
whose rows the store rejects is reported failed with the reason while the others are written, and
``commit_rows=None`` still writes every request durably on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gil_core.batch import BatchReport, Ticket, resolve_batch
from gil_core.errors import ConfigurationError
from gil_core.resolver import Resolver
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedChatModel, ScriptedReply
from tests.resolver._support import support_task

TICKETS = 120


def sure_of_b(messages: Sequence[Any], **_: Any) -> ScriptedReply:
    """Always "B"; for a request that says "broken", with a logprob above 0, so its calls' label mass is 2.0
    and the store rejects them."""
    broken = "broken" in messages[-1]["content"]
    return ScriptedReply("B", top_logprobs=[("B", 0.7 if broken else 0.0)])


def run_batch(root: Path, tickets: list[Ticket], **options: Any) -> tuple[BatchReport, list[tuple[int, int]]]:
    """Resolve ``tickets``; at each progress report, also note how many traces a fresh reader finds."""
    seen: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> None:
        seen.append((done, TelemetryStore(root).read("traces").height))

    resolver = Resolver(ScriptedChatModel(responder=sure_of_b), TelemetryStore(root))
    task = support_task(memory_threshold=None)
    report = asyncio.run(resolve_batch(resolver, task, tickets, concurrency=8, progress=progress, **options))
    return report, seen


def tickets(count: int, broken: Sequence[int] = ()) -> list[Ticket]:
    return [Ticket(f"t{i}", f"ticket {i}: {'broken' if i in broken else 'fine'} parcel") for i in range(count)]


@pytest.mark.parametrize("options", [{"commit_rows": 30}, {"commit_rows": None}], ids=["grouped", "per request"])
def test_a_ticket_counts_only_once_its_trace_is_durable(tmp_path: Path, options: dict[str, Any]) -> None:
    report, seen = run_batch(tmp_path / "store", tickets(TICKETS), **options)
    assert (report.resolved, report.skipped, report.failed) == (TICKETS, 0, [])
    assert seen[-1][0] == TICKETS
    assert all(durable >= done for done, durable in seen), "a ticket was counted before its trace was durable"
    files = len(list((tmp_path / "store" / "traces").glob("*.parquet")))
    assert files == TICKETS if options["commit_rows"] is None else files < TICKETS // 4


def test_a_ticket_whose_rows_are_rejected_fails_with_the_reason_and_the_others_are_written(tmp_path: Path) -> None:
    root = tmp_path / "store"
    report, _ = run_batch(root, tickets(40, broken=(3, 27)), commit_rows=50)
    assert report.resolved == 38
    assert [item.where for item in report.failed] == ["ticket 't3'", "ticket 't27'"]
    assert all("label_mass" in item.reason for item in report.failed)
    store = TelemetryStore(root)
    assert store.read("traces").height == 38
    assert store.read("calls")["label_mass"].max() <= 1.0  # no row of a rejected request was written

    again, _ = run_batch(root, tickets(40, broken=(3, 27)))  # a rerun tries exactly the two again
    assert (again.skipped, again.resolved, len(again.failed)) == (38, 0, 2)


class InFlight:
    """A chat model that yields to the event loop inside every call and notes how many calls were under way."""

    def __init__(self, model: ScriptedChatModel) -> None:
        self._model, self.now, self.most = model, 0, 0

    @property
    def name(self) -> str:
        return self._model.name

    async def complete(self, messages: Sequence[Any], **options: Any) -> Any:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0)
            return await self._model.complete(messages, **options)
        finally:
            self.now -= 1


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_at_most_concurrency_tickets_resolve_at_once_and_every_ticket_is_taken(
    tmp_path: Path, concurrency: int
) -> None:
    model = InFlight(ScriptedChatModel(responder=sure_of_b))
    resolver = Resolver(model, TelemetryStore(tmp_path / "store"))
    report = asyncio.run(
        resolve_batch(resolver, support_task(memory_threshold=None), tickets(20), concurrency=concurrency)
    )
    assert (report.resolved, report.failed) == (20, [])
    assert model.most == concurrency


def test_a_batch_without_a_worker_is_refused(tmp_path: Path) -> None:
    resolver = Resolver(ScriptedChatModel(responder=sure_of_b), TelemetryStore(tmp_path / "store"))
    with pytest.raises(ConfigurationError, match="concurrency"):
        asyncio.run(resolve_batch(resolver, support_task(memory_threshold=None), tickets(2), concurrency=0))
