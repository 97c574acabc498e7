"""Model faults during a batch, over real HTTP on loopback: whatever the server does, every ticket ends in exactly
one trace with a mode (and a failure reason when there is no output), retries stay bounded and honour
Retry-After, no exception escapes the batch, and no error text is remembered as an answer."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from typer.testing import CliRunner

from flows.cli import app
from gil_core.batch import Verdict, resolve_batch
from gil_core.batch_feedback import apply_verdicts
from gil_core.client import InProcessRequestCache
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.memory import LanceDBMemory
from gil_core.resolver import ClientSetup, Resolver
from gil_core.settings import ClientParts
from gil_core.telemetry import TelemetryStore
from gil_core.testing import FailureKind, HashEmbeddingModel, ScriptedOpenAIServer, ScriptedReply
from tests.flows._support import write_task_file
from tests.reliability._support import (
    REFUND,
    AttemptCounter,
    check_one_trace_per_ticket,
    make_tickets,
    write_jsonl,
)
from tests.resolver._support import Script, SupportModel, support_server, support_task

pytestmark = pytest.mark.reliability

TICKETS = 3
ATTEMPTS = 3  # the adapter's max_attempts in these tests
CLOCK_TIMEOUT = 0.3  # the adapter's timeout where a test is about it (each attempt's deadline is 1.5 times it)
SLACK_TIMEOUT = 10.0  # elsewhere: a loaded machine's slow healthy reply never reads as a fault
GENERATION_ATTEMPTS = 3  # the task's fallback_max_attempts (its default)
HEALTHY = SupportModel({}, default=Script(route=["billing", "refund status"]))
VALID_ANSWERS = {REFUND, "None of these"}


@dataclass(frozen=True)
class Outage:
    """A fault the server shows on every request, whether the adapter retries it, and what the trace says."""

    kind: FailureKind
    retried: bool
    says: str


OUTAGES = [
    Outage("refuse", True, "cannot reach the server"),
    Outage("hang", False, "no reply within 0.3 s"),
    # a byte every 0.1 s: httpx's read timeout (0.3 s) never fires; the attempt's deadline (1.5 x 0.3 s) does
    Outage("drip", False, "the reply did not finish within 0.45 s"),
    Outage("huge", False, "is larger than the cap of 33,554,432 bytes"),
    Outage("429", True, "rate limited"),
    Outage("500", True, "server error"),
    Outage("503", True, "server error"),
    Outage("garbage", False, "reply is not JSON"),
]


async def run_batch(
    server: ScriptedOpenAIServer,
    root: Path,
    *,
    prefix: str = "t",
    counter: AttemptCounter | None = None,
    max_retry_wait: float = 0.05,
    cache: InProcessRequestCache | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    timeout: float = SLACK_TIMEOUT,
) -> tuple[Resolver, LanceDBMemory, Any]:
    """Resolve TICKETS tickets against ``server`` through the real adapter, with LanceDB memory (and ``cache`` as
    the request cache), under ``root``. Retry waits are capped at ``max_retry_wait`` seconds (Retry-After
    included) to keep the tests short; the adapter waits them out with ``sleep``. ``timeout`` is the adapter's
    (CLOCK_TIMEOUT only where a test is about that clock)."""
    hooks = {"request": [counter]} if counter is not None else {}
    async with (
        httpx.AsyncClient(event_hooks=hooks) as client,
        OpenAICompatibleChatModel(
            server.base_url,
            "m",
            timeout=timeout,
            max_attempts=ATTEMPTS,
            max_retry_wait=max_retry_wait,
            client=client,
            sleep=sleep,
        ) as chat,
    ):
        memory = LanceDBMemory(root / "memory", HashEmbeddingModel())
        client = ClientSetup(ClientParts(cache=cache)) if cache is not None else None
        resolver = Resolver(chat, TelemetryStore(root / "store"), memory=memory, client=client)
        report = await resolve_batch(resolver, support_task(), make_tickets(TICKETS, prefix=prefix), concurrency=2)
    return resolver, memory, report


async def approve_everything(resolver: Resolver, trace_ids: list[str]) -> None:
    """A careless reviewer marks every trace correct, failures included."""
    feedback = await apply_verdicts(resolver, support_task(), [Verdict(trace_id, True) for trace_id in trace_ids])
    assert feedback.applied == len(trace_ids) and not feedback.failed


@pytest.mark.parametrize("outage", OUTAGES, ids=[outage.kind for outage in OUTAGES])
async def test_a_model_outage_leaves_one_trace_per_ticket_with_its_reason_and_bounded_retries(
    outage: Outage, tmp_path: Path
) -> None:
    attempts_per_call = ATTEMPTS if outage.retried else 1
    calls = TICKETS * 2 * attempts_per_call  # the judge at the root, then full generation: both fail
    with ScriptedOpenAIServer(hang_seconds=2.0, drip_seconds=0.1) as server:
        if outage.kind == "refuse":
            server.enqueue_failure("refuse")  # the server stops listening for good
        else:
            for _ in range(calls):
                server.enqueue_failure(outage.kind, retry_after=0.01 if outage.kind == "429" else None)
        counter, cache = AttemptCounter(), InProcessRequestCache()
        # Only a hang and a drip are about the adapter's clock; the other faults get a deadline a loaded machine
        # cannot reach, so what the trace says is the fault's (a 32 MiB reply read past 0.45 s read as a drip).
        timeout = CLOCK_TIMEOUT if outage.kind in ("hang", "drip") else SLACK_TIMEOUT
        resolver, memory, report = await run_batch(server, tmp_path, counter=counter, cache=cache, timeout=timeout)
        assert server.pending == 0
        # the server was still sending when the client gave up, every time (checked before closing ends a drip)
        assert all(reply.done.wait(10) and reply.client_hung_up for reply in server.streamed)
        assert len(server.streamed) == (calls if outage.kind in ("drip", "huge") else 0)

    assert (report.resolved, report.failed) == (TICKETS, [])  # nothing escaped: each failure is in its trace
    assert counter.count == calls  # bounded: exactly max_attempts per retried call, one per other call
    traces = check_one_trace_per_ticket(resolver.store, "support", make_tickets(TICKETS))
    for row in traces.iter_rows(named=True):
        assert (row["mode"], row["output"]) == ("fallback", None)
        assert row["failure"].startswith("model failed: ") and outage.says in row["failure"]

    await approve_everything(resolver, traces["trace_id"].to_list())
    assert await memory.entries("support") == []  # an error is never remembered as an answer
    assert cache.stats().entries == 0  # nor cached

    # The same requests once the server is back, with the same cache and memory: real answers, nothing replayed.
    with support_server({}, default=Script(route=["billing", "refund status"])) as healthy:
        again, _, _ = await run_batch(healthy, tmp_path, prefix="again-", cache=cache)
    rerun = check_one_trace_per_ticket(
        again.store, "support", make_tickets(TICKETS) + make_tickets(TICKETS, prefix="again-")
    )
    answers = rerun.filter(rerun["trace_id"].is_in(traces["trace_id"].to_list()).not_())
    assert set(answers["mode"]) == {"habit/answer"} and set(answers["output"]) == {REFUND}


def label_outside_the_scheme(body: Mapping[str, Any]) -> ScriptedReply:
    if body.get("logprobs"):  # the judge: a confident token that is none of the labels shown
        return ScriptedReply("Z", top_logprobs=[("Z", math.log(0.97)), ("Q", math.log(0.03))])
    return ScriptedReply("None of these")


REPLIES: dict[str, tuple[Callable[[Mapping[str, Any]], ScriptedReply], int, int]] = {
    # what every reply is, how many requests one ticket makes, and how many replies the request cache keeps
    "no logprobs": (lambda body: ScriptedReply("A", omit_logprobs=True), 1 + GENERATION_ATTEMPTS, 0),
    "empty content": (lambda body: ScriptedReply(""), 1 + GENERATION_ATTEMPTS, 0),
    "truncated": (lambda body: ScriptedReply("The answer is", finish_reason="length"), 1 + GENERATION_ATTEMPTS, 0),
    # A judge reply is kept like any judgment (replayed, it reads as the same untrusted exit); the generation
    # refusals break the tree contract, so none of them is kept.
    "refusal": (lambda body: ScriptedReply("I'm sorry, but I can't help with that."), 1 + GENERATION_ATTEMPTS, TICKETS),
    "label outside the scheme": (label_outside_the_scheme, 2, 2 * TICKETS),  # each judgment and "None of these"
}


@pytest.mark.parametrize("kind", list(REPLIES))
async def test_a_bad_reply_on_every_request_is_traced_and_never_remembered(kind: str, tmp_path: Path) -> None:
    """The judge never chooses a label it did not show; no bad reply becomes a remembered answer; the request
    cache keeps only replies that keep their contract (see REPLIES for what it keeps)."""
    responder, requests_per_ticket, cached = REPLIES[kind]
    cache = InProcessRequestCache()
    with ScriptedOpenAIServer(responder=responder) as server:
        resolver, memory, report = await run_batch(server, tmp_path, cache=cache)
        assert len(server.requests) == TICKETS * requests_per_ticket

    assert (report.resolved, report.failed) == (TICKETS, [])
    traces = check_one_trace_per_ticket(resolver.store, "support", make_tickets(TICKETS))
    for row in traces.iter_rows(named=True):
        assert row["output"] is None or row["output"] in VALID_ANSWERS
        for step in json.loads(row["path"]):  # the judge never accepts a label it did not show
            assert (step["outcome"], step["chosen"]) == ("exit", None)
    calls = resolver.store.read("calls").filter(pl.col("role") == "judge")
    for call in calls.iter_rows(named=True):
        shown = {candidate["id"] for candidate in json.loads(call["candidates"])} - {None}
        assert set(json.loads(call["distribution"] or "{}")) <= shown
        assert call["outcome"] in (None, "exit")

    await approve_everything(resolver, traces["trace_id"].to_list())
    remembered = {entry.answer for entry in await memory.entries("support")}
    assert remembered <= VALID_ANSWERS  # what was remembered is a tree answer, never the bad reply
    assert cache.stats().entries == cached


async def test_retry_after_is_waited_out_before_the_request_is_sent_again(tmp_path: Path) -> None:
    """One 429 saying "Retry-After: 1", then a healthy server: that request comes again no sooner than a second
    later, the server serves the other tickets' requests meanwhile, and every ticket gets its answer."""
    with ScriptedOpenAIServer(responder=HEALTHY) as server:
        server.enqueue_failure("429", retry_after=1)
        resolver, _, _ = await run_batch(server, tmp_path, max_retry_wait=30.0)
        received = list(server.requests)
    assert len(received) == TICKETS * 2 + 1  # two judgments per ticket, and the one refused request

    limited = received[0]
    (retried,) = [request for request in received[1:] if request.body == limited.body]
    assert retried.received_at - limited.received_at >= 1.0  # measured at the server
    served_meanwhile = [r for r in received if limited.received_at < r.received_at < retried.received_at]
    assert served_meanwhile and all(r.body != limited.body for r in served_meanwhile)  # the others went on
    traces = check_one_trace_per_ticket(resolver.store, "support", make_tickets(TICKETS))
    assert set(traces["output"]) == {REFUND} and traces["failure"].null_count() == TICKETS


@pytest.mark.parametrize("kind", ["500", "503", "refuse"])
async def test_a_transient_fault_is_retried_and_the_batch_answers_normally(kind: FailureKind, tmp_path: Path) -> None:
    """One 500 or 503, or a server that refuses connections until the client's first retry wait (a restart):
    each refused or failed attempt is retried once, counted on the client side, and every ticket is answered."""
    waits: list[float] = []
    with ScriptedOpenAIServer(responder=HEALTHY) as server:

        async def back_while_waiting(seconds: float) -> None:
            waits.append(seconds)
            server.resume_listening()  # the server is back before the refused attempt is sent again
            await asyncio.sleep(seconds)

        server.enqueue_failure(kind)  # "refuse": the server stops listening now
        counter = AttemptCounter()
        resolver, _, _ = await run_batch(server, tmp_path, counter=counter, sleep=back_while_waiting)
        served = len(server.requests)
    assert served == TICKETS * 2 + (kind != "refuse")  # a refused attempt never reached the server
    assert waits and counter.count == TICKETS * 2 + len(waits)  # each failed attempt was tried again, once
    if kind != "refuse":
        assert len(waits) == 1
    traces = check_one_trace_per_ticket(resolver.store, "support", make_tickets(TICKETS))
    assert set(traces["mode"]) == {"habit/answer"} and set(traces["output"]) == {REFUND}


def test_the_gil_command_finishes_a_batch_against_a_server_that_answers_garbage(tmp_path: Path) -> None:
    """Through ``gil resolve-batch``: exit code 0, a result line with the reason for every ticket, no traceback."""
    with ScriptedOpenAIServer() as server:
        for _ in range(TICKETS * 2):
            server.enqueue_failure("garbage")
        task = write_task_file(tmp_path, server.base_url)
        tickets = write_jsonl(tmp_path / "tickets.jsonl", [{"id": t.id, "text": t.text} for t in make_tickets(TICKETS)])
        out = tmp_path / "results.jsonl"
        result = CliRunner().invoke(app, ["resolve-batch", str(tickets), "--out", str(out), "-t", str(task), "--json"])
    assert result.exit_code == 0, result.stderr
    assert "Traceback" not in result.stderr
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [line["id"] for line in lines] == [f"t{index}" for index in range(TICKETS)]
    assert all(line["output"] is None and "reply is not JSON" in line["failure"] for line in lines)
