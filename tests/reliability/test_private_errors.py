"""Do-not-record text on every error path. Requests resolved with ``do_not_record=True``, and a task with
``do_not_record: true`` run through the Prefect flows, are sent through contract violations whose replies echo
them, a template whose slot filling fails, a memory guard that refuses a hit, embedders that fail while quoting
them, a memory failure that fails the request, a store that cannot be written and the learned judge; then every
file under the store, the memory folder and the Prefect home, the Prefect database, every log record, every span
and every exception raised is searched for them."""

from __future__ import annotations

import inspect
import json
import logging
import random
import re
import traceback
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gil_core.client import InProcessRequestCache, JsonLinesOperationLog
from gil_core.diagnostics import Diagnostics
from gil_core.errors import MemoryUnavailableError, TelemetryError
from gil_core.llm import (
    EmbeddingModel,
    EmbeddingRecorder,
    Embeddings,
    OpenAICompatibleChatModel,
    OpenAICompatibleEmbeddingModel,
)
from gil_core.llm.trace_vectors import TraceVectorCache
from gil_core.memory import LanceDBMemory
from gil_core.resolver import ClientSetup, Metering, Resolver
from gil_core.runtime import open_runtime
from gil_core.settings import ClientParts
from gil_core.taskfile import load_task_file
from gil_core.tasks import LearnedPolicy, Resolution, TaskDefinition
from gil_core.telemetry import EnergyModel, TelemetryStore
from gil_core.testing import HashEmbeddingModel, ScriptedOpenAIServer, ScriptedReply
from tests.flows._support import write_task_file
from tests.flows.conftest import prefect_harness  # noqa: F401 - the session's Prefect engine, for the flow test
from tests.reliability._support import write_jsonl
from tests.reliability.test_security import assert_nowhere, files_under, lancedb_rows, readable_text
from tests.resolver._support import Script, SupportModel, support_task

pytestmark = pytest.mark.reliability

_REQUEST = re.compile(r"<request>\n(.*)\n</request>", re.DOTALL)
REMEMBERED = "where is my refund for order 5"
REFUND = "Refunds reach the original payment method within 5 business days of approval."
REFUND_ROUTE = Script(route=["billing", "refund status"])
LEARNED_WORDS = frozenset({"served", "not_serving", "negated", "novel", "below_cut", "shadow"})


class EchoingModel:
    """Judges as scripted (``SupportModel``); every generation and slot-filling reply quotes the request back, as
    a confused model does, so each breaks its contract with the request's words in it (the remembered request
    gets its answer)."""

    def __init__(self, scripts: Mapping[str, Script]) -> None:
        self._judge = SupportModel(scripts, default=Script(answers=["None of these"]))

    def __call__(self, body: Mapping[str, Any]) -> ScriptedReply:
        if body.get("logprobs"):
            return self._judge(body)
        match = _REQUEST.search(body["messages"][-1]["content"])
        text = match.group(1) if match else ""
        return ScriptedReply(REFUND if text == REMEMBERED else f"Sorry, I cannot help with: {text}")


class PickyEmbedder:
    """A library user's embedder that refuses some inputs and quotes them in its error, as many libraries do (the
    ``HashEmbeddingModel`` for the rest)."""

    name = "picky"

    def __init__(self, refused: str) -> None:
        self._refused = refused
        self._inner = HashEmbeddingModel()

    async def embed(self, texts: Sequence[str]) -> Embeddings:
        for text in texts:
            if self._refused in text:
                raise ValueError(f"cannot embed {text!r}: unsupported input")
        return await self._inner.embed(texts)


@dataclass
class Searched:
    """Everything a private request could have reached besides files: log records, spans, raised exceptions."""

    spans: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)
    raised: dict[str, BaseException] = field(default_factory=dict)

    def diagnostics(self) -> Diagnostics:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.spans))
        return Diagnostics(tracer_provider=provider)

    def texts(self, caplog: pytest.LogCaptureFixture) -> dict[str, str]:
        return {
            "the log records": "\n".join(log_record_text(record) for record in caplog.records),
            "the spans": "\n".join(span_texts(self.spans.get_finished_spans())),
            "the exceptions": "\n".join(exception_text(error) for error in self.raised.values()),
        }


def log_record_text(record: logging.LogRecord) -> str:
    error = record.exc_info[1] if record.exc_info else None
    return record.getMessage() + (exception_text(error) if error is not None else "")


def span_texts(spans: Sequence[ReadableSpan]) -> Iterator[str]:
    """Everything an exporter would send of each span: name, attributes, status, events and their attributes."""
    for span in spans:
        yield span.name
        yield json.dumps(dict(span.attributes or {}), default=str, ensure_ascii=False)
        yield span.status.description or ""
        for event in span.events:
            yield event.name
            yield json.dumps(dict(event.attributes or {}), default=str, ensure_ascii=False)


def exception_text(error: BaseException) -> str:
    """The exception as a log record or a crash report shows it: message, cause chain and traceback."""
    return "".join(traceback.format_exception(error))


def files_text(*roots: Path) -> dict[str, str]:
    """Every file under ``roots`` decoded (Parquet cells, SQLite values, bytes as UTF-8 and UTF-16), and every
    LanceDB row of the memory folders among them."""
    found = {f"{path} ({i})": text for path in files_under(*roots) for i, text in enumerate(readable_text(path))}
    for database in {table.parent for root in roots for table in root.rglob("*.lance") if table.is_dir()}:
        found[f"the LanceDB rows under {database}"] = lancedb_rows(database)
    return found


def learned_notes_hold_only_ids_and_numbers(task: TaskDefinition, path: list[dict[str, Any]]) -> bool:
    """Every value of every step's learned and audit note (look-ahead items included) is a node or option id of
    the tree, one of the learned judge's decision words, a number, a boolean or null."""
    ids = {node.id for node, _ in task.tree.iter_nodes()} | {option.id for option, _ in task.tree.options()}

    def plain(value: Any) -> bool:
        if isinstance(value, dict):
            return all(isinstance(key, str) and plain(item) for key, item in value.items())
        if isinstance(value, list):
            return all(plain(item) for item in value)
        if isinstance(value, str):
            return value in ids or value in LEARNED_WORDS
        return value is None or isinstance(value, bool | int | float)

    notes = [step[key] for step in path for key in ("learned", "audit") if key in step]
    return bool(notes) and all(plain(note) for note in notes)


def rows_of(store: TelemetryStore, results: Mapping[str, Resolution]) -> dict[str, dict[str, Any]]:
    traces = store.read("traces").filter(pl.col("trace_id").is_in([r.trace_id for r in results.values()]))
    rows = {row["trace_id"]: row for row in traces.iter_rows(named=True)}
    return {case: rows[result.trace_id] for case, result in results.items()}


async def test_a_private_request_leaves_its_text_on_no_error_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A recorded task (memory with the guard, the learned reflex, the operation log and the request cache on)
    whose requests are resolved with ``do_not_record=True`` through each error path; a twin task whose memory
    failure fails the request; memory behind a user's embedder that quotes what it refuses; a store that cannot
    be written. Callers still learn the kind of failure; the text is in no file, log record, span or exception."""
    caplog.set_level(logging.DEBUG)
    marker = f"zq{uuid.uuid4().hex}"
    amount = str(random.randrange(10**11, 10**12))  # the guard quotes numbers: one of 12 digits is a needle too
    texts = {
        "contract": f"I need help with something odd {marker}",  # none at the root: generation echoes it
        "slot": f"send me the invoice copy please {marker}",  # slot filling echoes (no JSON), then generation
        "guard": f"where is my refund for order {amount}",  # a hit on the remembered request, refused
        "embedder 400": f"is there anything new {marker}",  # the embedding endpoint refuses, quoting it
        "embedder garbage": f"tell me a story {marker}",  # the endpoint answers 200 with it in an HTML page
        "memory fails the request": f"hello there again {marker}",  # the twin: memory_failure error
        "user embedder": f"what about my parcel {marker}",  # PickyEmbedder quotes it in a ValueError
        "user embedder fails the request": f"what about my invoice {marker}",
        "store fails": f"my store is broken {marker}",
    }
    scripts = {texts["slot"]: Script(route=["billing", "invoice copy"]), REMEMBERED: REFUND_ROUTE}
    searched = Searched()
    diagnostics = searched.diagnostics()
    store = TelemetryStore(tmp_path / "store")
    log = JsonLinesOperationLog(tmp_path / "store")
    client = ClientSetup(ClientParts(cache=InProcessRequestCache(), log=log))
    metering = Metering(diagnostics=diagnostics)
    base = support_task("support", memory_threshold=0.5)
    task = replace(base, policy=replace(base.policy, memory_guard=True, learned=LearnedPolicy(precision=0.97)))
    strict = replace(base, name="support-strict", policy=replace(base.policy, memory_failure="error"))
    results: dict[str, Resolution] = {}
    with (
        ScriptedOpenAIServer(responder=EchoingModel(scripts)) as chat_server,
        ScriptedOpenAIServer() as embedding_server,
    ):
        async with (
            OpenAICompatibleChatModel(chat_server.base_url, "scripted", max_attempts=1) as chat,
            OpenAICompatibleEmbeddingModel(embedding_server.base_url, "hash", max_attempts=1) as embedder,
        ):

            def resolver_with(memory_embedder: EmbeddingModel, memory: str, *, learned: bool) -> Resolver:
                vectors = TraceVectorCache(EmbeddingRecorder(memory_embedder, sink=store, energy=EnergyModel.tokens()))
                return Resolver(
                    chat,
                    store,
                    memory=LanceDBMemory(tmp_path / memory, vectors),
                    reflex_embedder=vectors if learned else None,
                    client=client,
                    metering=metering,
                )

            served = resolver_with(embedder, "memory", learned=True)
            picky = resolver_with(PickyEmbedder(marker), "picky-memory", learned=False)
            broken = Resolver(chat, TelemetryStore(tmp_path / "broken"), client=client, metering=metering)
            (tmp_path / "broken").mkdir()
            (tmp_path / "broken" / "traces").write_text("not a folder: the table cannot be read or written")

            for resolver, each in ((served, task), (served, strict), (picky, base), (picky, strict)):
                known = await resolver.resolve(each, REMEMBERED)  # recorded and confirmed: memory holds it
                assert known.output == REFUND
                await resolver.feedback(each, known.trace_id, correct=True)

            async def private(case: str, resolver: Resolver = served, on: TaskDefinition = task) -> None:
                try:
                    results[case] = await resolver.resolve(on, texts[case], do_not_record=True)
                except Exception as error:  # what escapes is searched too
                    searched.raised[case] = error

            await private("contract")
            await private("slot")
            await private("guard")
            embedding_server.enqueue_json({"error": {"message": f"cannot embed {texts['embedder 400']}"}}, status=400)
            await private("embedder 400")
            embedding_server.enqueue_json(f"<html>no model for {texts['embedder garbage']}</html>".encode())
            await private("embedder garbage")
            quoted = {"error": {"message": f"cannot embed {texts['memory fails the request']}"}}
            embedding_server.enqueue_json(quoted, status=400)
            await private("memory fails the request", on=strict)
            await private("user embedder", picky, base)
            await private("user embedder fails the request", picky, strict)
            await private("store fails", broken)

    # Callers still learn the kind of failure.
    rows = rows_of(store, results)
    failures = {case: row["failure"] or "" for case, row in rows.items()}
    recalls = {case: json.loads(row["recall"] or "{}") for case, row in rows.items()}
    assert failures["contract"].startswith("contract violated after 3 attempts: '("), failures
    assert failures["contract"].endswith(" characters, not quoted)' is not one of the choices"), failures
    assert failures["slot"].startswith("contract violated"), failures
    slot_calls = store.read("calls").filter(pl.col("trace_id") == results["slot"].trace_id)["role"].to_list()
    assert slot_calls.count("slot_fill") == 3, slot_calls  # the template was tried, and its filling failed
    assert recalls["guard"]["refused"] == "guard: numbers differ" and "error" not in recalls["guard"], recalls
    assert "HTTP 400" in recalls["embedder 400"]["error"] and "not quoted" in recalls["embedder 400"]["error"]
    assert "not JSON" in recalls["embedder garbage"]["error"], recalls
    assert "embedder 'picky' failed (ValueError: cannot embed '***'" in recalls["user embedder"]["error"], recalls
    for case in ("memory fails the request", "user embedder fails the request"):
        error = searched.raised[case]
        assert isinstance(error, MemoryUnavailableError) and error.__cause__ is None, (case, error)
    assert "embedder 'picky' failed (ValueError: cannot embed '***'" in str(searched.raised[case])
    store_error = searched.raised["store fails"]  # the library's OSError, as the contract wants it: a GilError
    assert isinstance(store_error, TelemetryError) and isinstance(store_error.__cause__, OSError), searched.raised
    withheld = [
        event
        for span in searched.spans.get_finished_spans()
        for event in span.events
        if event.name == "exception" and (event.attributes or {}).get("exception.message", "").startswith("(not")
    ]
    assert withheld, "the store's failure inside the span was recorded by its type only"

    # The learned judge judged the private requests of the learned task: its notes hold ids and numbers only.
    for case in ("contract", "slot", "guard", "embedder 400", "embedder garbage"):
        assert learned_notes_hold_only_ids_and_numbers(task, json.loads(rows[case]["path"])), (case, rows[case])
    # No vector of a private request is kept; the recorded requests' are.
    vectors = set(store.read("vectors")["trace_id"].to_list())
    assert vectors and not vectors & {result.trace_id for result in results.values()}

    found = files_text(tmp_path)
    found["the operation log"] = json.dumps([entry.input_preview + entry.output for entry in log.entries()])
    found |= searched.texts(caplog)
    assert len(found) > 20
    assert_nowhere([marker, amount], found)


def embedding_reply(text: str) -> dict[str, Any]:
    """The embedding endpoint's reply for ``text``, as ``ScriptedOpenAIServer`` gives it unscripted."""
    vector = list(HashEmbeddingModel(64).embed_text(text))
    usage = {"prompt_tokens": 1, "total_tokens": 1}
    return {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": vector}], "usage": usage}


async def drain_prefect_workers() -> None:
    """Send what Prefect's log and event workers still hold to the server, so its database has all of it."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        drained = worker.drain_all(timeout=30, at_exit=False)
        if inspect.isawaitable(drained):
            await drained


async def prefect_records() -> dict[str, str]:
    """What the Prefect API says of every run: flow and task run names, parameters, state messages, logs."""
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        flow_runs = await client.read_flow_runs()
        task_runs = await client.read_task_runs()
        logs = await client.read_logs()
    return {
        "the flow runs": json.dumps([run.model_dump(mode="json") for run in flow_runs], ensure_ascii=False),
        "the task runs": json.dumps([run.model_dump(mode="json") for run in task_runs], ensure_ascii=False),
        "the Prefect logs": json.dumps([entry.model_dump(mode="json") for entry in logs], ensure_ascii=False),
    }


@pytest.mark.usefixtures("prefect_harness")
async def test_a_do_not_record_task_through_the_flows_leaves_its_text_in_no_prefect_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A task switched to ``do_not_record: true`` (its memory still holds what it confirmed before, so lookups
    embed), with ``memory_failure: error``: the resolve-batch flow, where generation's replies echo the
    requests, slot filling fails, and the embedding endpoint refuses one ticket quoting it (the ticket fails and
    the flow logs why), then the apply-feedback flow. Nothing of the tickets' text is in the store, the memory,
    the results, PREFECT_HOME, the Prefect database, its runs, states and logs, or any log record."""
    caplog.set_level(logging.DEBUG)
    # Prefect's run loggers do not propagate to the root logger: the capture listens on them too.
    run_loggers = [logging.getLogger(f"prefect.{name}") for name in ("flow_runs", "task_runs")]
    for logger in run_loggers:
        logger.addHandler(caplog.handler)
    try:
        await _through_the_flows(tmp_path, caplog)
    finally:
        for logger in run_loggers:
            logger.removeHandler(caplog.handler)


async def _through_the_flows(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from prefect.settings import PREFECT_HOME, PREFECT_SERVER_DATABASE_CONNECTION_URL

    marker = f"zq{uuid.uuid4().hex}"
    texts = [f"I need help with something odd {marker}", f"send the invoice copy {marker}", f"hello again {marker}"]
    scripts = {texts[1]: Script(route=["billing", "invoice copy"]), REMEMBERED: REFUND_ROUTE}
    with (
        ScriptedOpenAIServer(responder=EchoingModel(scripts)) as chat_server,
        ScriptedOpenAIServer() as embedding_server,
    ):
        settings: dict[str, Any] = {
            "memory_threshold": 0.5,
            "memory_failure": "error",
            "embedding_model": {"url": embedding_server.base_url, "name": "hash"},
            "client": {"log_path": str(tmp_path / "store")},
        }
        recorded = load_task_file(write_task_file(tmp_path, chat_server.base_url, **settings))
        async with open_runtime(recorded) as runtime:  # before the switch: a confirmed request in memory
            known = await runtime.resolver.resolve(recorded.task, REMEMBERED)
            await runtime.resolver.feedback(recorded.task, known.trace_id, correct=True)
        task_file = str(write_task_file(tmp_path, chat_server.base_url, do_not_record=True, **settings))

        from flows.batch import apply_feedback_flow, resolve_batch_flow

        for text in texts[:2]:  # one lookup per ticket, in order (one at a time): the last one is refused
            embedding_server.enqueue_json(embedding_reply(text))
        embedding_server.enqueue_json({"error": {"message": f"cannot embed {texts[2]}"}}, status=400)
        tickets = tmp_path / "tickets.jsonl"
        write_jsonl(tickets, [{"id": f"t{index}", "text": text} for index, text in enumerate(texts)])
        with tickets.open("a", encoding="utf-8") as lines:
            lines.write('{"id": "t9", "text": 9}\n')  # a bad line: reported by the flow, without its text
        out = tmp_path / "results.jsonl"
        report = await resolve_batch_flow(task_file, str(tickets), out=str(out), concurrency=1)
        results = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        verdicts = [{"trace_id": row["trace_id"], "correct": False, "correction": "We cannot say."} for row in results]
        applied = await apply_feedback_flow(task_file, str(write_jsonl(tmp_path / "verdicts.jsonl", verdicts)))
    await drain_prefect_workers()

    assert (report["resolved"], len(report["failed"])) == (2, 2), report  # t2 failed in memory, t9 was bad
    assert "HTTP 400" in report["failed"][1] and "not quoted" in report["failed"][1], report
    failures = {row["id"]: row["failure"] for row in results}
    assert [failures["t0"][:17], failures["t1"][:17], failures["t2"][:15]] == [
        "contract violated",
        "contract violated",
        "memory failed: ",
    ], results  # t2 is answered as an abstention that says memory failed, without the request's words
    assert applied["applied"] == 3, applied  # a verdict on each answered row, the abstention too

    database = Path(PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split(":///", 1)[1])
    found = files_text(tmp_path, Path(PREFECT_HOME.value()), database.parent)
    found = {path: text for path, text in found.items() if not path.startswith(f"{tickets} ")}  # the input
    assert any(path.endswith(".db (2)") for path in found), "the Prefect database was read as SQLite"
    found |= await prefect_records()
    assert "ticket failed" in found["the Prefect logs"], "the flow logged the failure"
    found["the log records"] = "\n".join(log_record_text(record) for record in caplog.records)
    assert_nowhere([marker], found)
