"""Security, by tests that try: tenants never share a memory hit, a cache entry or a rate-limit budget; a
do-not-record task leaves its requests in no file, table or log line (every byte written is decoded and
scanned); a restricted store refuses export; API keys reach no log, trace or error; Gil's servers bind to
loopback only."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import lancedb
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli import app
from gil_core.client import TokenBucketLimiter
from gil_core.errors import ModelError
from gil_core.llm import Message, OpenAICompatibleChatModel
from gil_core.llm.options import call_options
from gil_core.maintenance import compact_store
from gil_core.resolver import ClientSetup, Resolver
from gil_core.runtime import client_parts, open_runtime
from gil_core.settings import ClientParts
from gil_core.taskfile import load_task_file
from gil_core.telemetry import TelemetryStore
from gil_core.testing import ScriptedOpenAIServer
from tests.flows._support import write_task_file
from tests.reliability._support import REFUND, ROOT, gil_command, write_jsonl
from tests.resolver._support import Script, SupportModel, support_server, support_task

pytestmark = pytest.mark.reliability

REFUND_QUESTION = "where is my refund?"
runner = CliRunner()


def chat_requests(server: ScriptedOpenAIServer) -> int:
    return sum(request.path.endswith("/chat/completions") for request in server.requests)


# -- tenants ------------------------------------------------------------------------------------------------

HOSTILE_TENANTS = ["alpha' OR '1'='1", "Alpha", "alpha ", "alpha\x00", "*"]


async def test_no_other_tenant_gets_alphas_memory_hit_or_cache_entry_whatever_its_name(tmp_path: Path) -> None:
    """Through ``open_runtime`` (its request cache on, as by default): alpha's confirmed answer and
    alpha's cached judgments serve alpha only; tenants named to collide with it, or to inject into the memory's
    filter, each pay their own model calls and never see a memory hit."""
    with support_server({REFUND_QUESTION: Script(route=["billing", "refund status"])}) as server:
        loaded = load_task_file(write_task_file(tmp_path, server.base_url, memory_threshold=0.5))
        alpha = loaded.task
        async with open_runtime(loaded) as runtime:
            resolver = runtime.resolver
            first = await resolver.resolve(alpha, REFUND_QUESTION)
            per_request = chat_requests(server)
            await resolver.feedback(alpha, first.trace_id, correct=True)
            again = await resolver.resolve(alpha, REFUND_QUESTION)
            assert (again.mode, chat_requests(server)) == ("memory", per_request)
            for name in HOSTILE_TENANTS:
                other = support_task(name, memory_threshold=0.5)
                before = chat_requests(server)
                result = await resolver.resolve(other, REFUND_QUESTION)
                assert result.mode == "habit/answer" and result.recall is None, name  # nothing to recall at all
                assert chat_requests(server) - before == per_request, name  # no cached judgment of alpha's
                repeat = await resolver.resolve(other, REFUND_QUESTION)
                assert repeat.mode == "habit/answer" and chat_requests(server) - before == per_request  # its own
            assert [entry.key for entry in await runtime.memory.entries(alpha.name)] == [first.trace_id]  # type: ignore[union-attr]


async def test_a_tenant_that_spends_its_rate_budget_leaves_the_others_budget_whole(tmp_path: Path) -> None:
    """Each tenant may make 2 calls (on top of a generous provider limit): alpha's third is refused at once,
    while beta, whose budget alpha tried to eat into, still gets both of its calls."""
    now = [0.0]
    limiter = TokenBucketLimiter(
        1000, 1000, max_wait=0.0, tenant_requests_per_second=0.001, tenant_burst=2, clock=lambda: now[0]
    )
    store = TelemetryStore(tmp_path / "store")
    with support_server({REFUND_QUESTION: Script(route=["billing", "refund status"])}) as server:
        async with OpenAICompatibleChatModel(server.base_url, "m") as chat:
            resolver = Resolver(chat, store, client=ClientSetup(ClientParts(limiter=limiter), provider="p"))
            alpha, beta = support_task("alpha", memory_threshold=None), support_task("beta", memory_threshold=None)
            spent = await resolver.resolve(alpha, REFUND_QUESTION)  # two judgments: alpha's whole budget
            refused = await resolver.resolve(alpha, "do you sell gift cards?")
            served = await resolver.resolve(beta, REFUND_QUESTION)
    assert (spent.mode, spent.output) == ("habit/answer", REFUND)
    assert refused.output is None and refused.failure is not None and "limiter" in refused.failure
    assert (served.mode, served.output) == ("habit/answer", REFUND)
    assert limiter.snapshot("p", tenant="alpha").allowed == 2 and limiter.snapshot("p", tenant="alpha").refused >= 1
    assert (limiter.snapshot("p", tenant="beta").allowed, limiter.snapshot("p", tenant="beta").refused) == (2, 0)
    assert chat_requests(server) == 4


# -- do not record ------------------------------------------------------------------------------------------


def files_under(*roots: Path, skip: tuple[Path, ...] = ()) -> list[Path]:
    return [p for root in roots for p in sorted(root.rglob("*")) if p.is_file() and p not in skip]


def readable_text(path: Path) -> Iterator[str]:
    """What a file holds as text, decoded where its format compresses or encodes it: every cell of a Parquet
    file, every row of a LanceDB table, every value of a SQLite file; else the bytes as UTF-8 and UTF-16."""
    data = path.read_bytes()
    yield data.decode("utf-8", errors="replace")
    yield data.decode("utf-16-le", errors="replace")
    if path.suffix == ".parquet" and not path.name.startswith("."):
        yield json.dumps(pq.read_table(path).to_pylist(), default=str, ensure_ascii=False)
    if path.suffix in (".sqlite", ".db"):
        with sqlite3.connect(path) as connection:
            for (table,) in connection.execute("select name from sqlite_master where type = 'table'").fetchall():
                rows = connection.execute(f'select * from "{table}"').fetchall()
                yield json.dumps(rows, default=str, ensure_ascii=False)


def lancedb_rows(memory: Path) -> str:
    if not memory.is_dir():
        return ""
    database = lancedb.connect(memory)
    tables = database.list_tables().tables
    return json.dumps([database.open_table(name).to_arrow().to_pylist() for name in tables], default=str)


def assert_nowhere(needles: list[str], texts: dict[str, str]) -> None:
    for where, text in texts.items():
        for needle in needles:
            assert needle not in text, f"{needle!r} found in {where}"


@pytest.mark.slow
def test_a_do_not_record_task_leaves_its_requests_in_no_file_table_or_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch, feedback (with a correction), stats, reviews, a memory rebuild, compaction and an SQLite export,
    with the operation log on; the server even echoes a request back in an error. Then every file written is
    decoded and scanned, with every line the commands printed and every log record."""
    caplog.set_level(logging.DEBUG)
    secret = f"card 4111-1111-1111-1111 {uuid.uuid4().hex}"
    texts = [f"hello {secret}", f"where is my refund? {secret}", f"do you sell gift cards? {secret}"]
    scripts = {texts[1]: Script(route=["billing", "refund status"])}
    with ScriptedOpenAIServer(responder=SupportModel(scripts, default=Script(answers=["None of these"]))) as server:
        for _ in range(2):  # the first ticket's judgment and its generation: the server quotes the request back
            server.enqueue_json({"error": {"message": f"cannot read this request: {texts[0]}"}}, status=400)
        task = write_task_file(
            tmp_path, server.base_url, do_not_record=True, client={"log_path": str(tmp_path / "store")}
        )
        tickets = write_jsonl(tmp_path / "tickets.jsonl", [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)])
        printed: list[str] = []

        def gil(*args: str, may_refuse: bool = False) -> str:
            result = runner.invoke(app, [*args])
            printed.extend([result.stdout, result.stderr])
            assert result.exit_code == 0 or (may_refuse and result.exit_code == 2), result.stderr
            return result.stdout

        out = tmp_path / "results.jsonl"
        gil("resolve-batch", str(tickets), "--out", str(out), "-t", str(task), "--json", "--concurrency", "1")
        results = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        verdicts = write_jsonl(
            tmp_path / "verdicts.jsonl",
            [{"trace_id": results[0]["trace_id"], "correct": True}]
            + [
                {"trace_id": r["trace_id"], "correct": False, "correction": "We do not sell them."} for r in results[1:]
            ],
        )
        gil("feedback", str(verdicts), "-t", str(task), "--json")
        gil("stats", "-t", str(task), "--json")
        gil("review", "promote", "-t", str(task), "--json", may_refuse=True)  # may find too little to fit
        gil("rebuild-memory", "-t", str(task), "--json")
        compact_store(TelemetryStore(tmp_path / "store"))
        gil("export-sqlite", str(tmp_path / "store"), str(tmp_path / "export.sqlite"), "--json")
    assert [(r["mode"], r["output"] is None, r["failure"] is None) for r in results] == [
        ("fallback", True, False),  # the caller still learns why: the server refused it (HTTP 400)
        ("habit/answer", True, True),  # a private request's output is not written either
        ("fallback", True, True),
    ]
    assert "HTTP 400" in results[0]["failure"]
    assert client_parts(load_task_file(task)).log is not None  # the operation log was on (it kept nothing)

    needles = [secret, "4111-1111-1111-1111"]
    written = files_under(tmp_path, skip=(tickets,))
    texts_found = {f"{path} ({index})": text for path in written for index, text in enumerate(readable_text(path))}
    texts_found["the memory's LanceDB rows"] = lancedb_rows(tmp_path / "memory")
    texts_found["what the commands printed"] = "\n".join(printed)
    texts_found["the log records"] = "\n".join(record.getMessage() for record in caplog.records)
    assert len(written) > 10
    assert_nowhere(needles, texts_found)


@pytest.mark.parametrize("status", [400, 503])
async def test_an_error_of_a_do_not_record_call_does_not_quote_the_server(status: int) -> None:
    """A server may quote the request back in its error body: for a do-not-record call the adapter's error says
    how long the body was, not what it said. Other calls still quote it."""
    secret = f"card 4111-1111-1111-1111 {uuid.uuid4().hex}"
    messages: list[Message] = [{"role": "user", "content": secret}]
    errors: dict[bool, str] = {}
    with ScriptedOpenAIServer() as server:
        async with OpenAICompatibleChatModel(server.base_url, "m", max_attempts=1) as chat:
            for private in (True, False):
                server.enqueue_json({"error": {"message": f"cannot read: {secret}"}}, status=status)
                with call_options(do_not_record=private), pytest.raises(ModelError) as caught:
                    await chat.complete(messages, max_tokens=1)
                errors[private] = str(caught.value)
    assert secret not in errors[True] and "not quoted" in errors[True] and f"HTTP {status}" in errors[True]
    assert secret in errors[False]


# -- restricted stores --------------------------------------------------------------------------------------


def test_a_restricted_store_refuses_export_through_the_command_and_writes_no_file(tmp_path: Path) -> None:
    store = TelemetryStore(tmp_path / "store")
    store.append("store_meta", [{"key": "restricted", "value": "1"}])
    out = tmp_path / "export.sqlite"
    result = runner.invoke(app, ["export-sqlite", str(tmp_path / "store"), str(out)])
    assert result.exit_code == 2 and "restricted" in result.stderr and str(tmp_path / "store") in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.glob("*.tmp")) == [] and list(tmp_path.glob(".*")) == []


# -- API keys -----------------------------------------------------------------------------------------------


def test_an_api_key_reaches_no_log_trace_error_or_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key travels only in the Authorization header, even when a proxy echoes it back in an error body, and
    while requests are retried (their reasons logged at DEBUG)."""
    caplog.set_level(logging.DEBUG)
    key = f"sk-live-{uuid.uuid4().hex}"
    monkeypatch.setenv("GIL_RELIABILITY_KEY", key)
    responder = SupportModel({}, default=Script(answers=["None of these"]))
    with ScriptedOpenAIServer(responder=responder, api_key=key) as server:
        server.enqueue_json({"error": {"message": f"bad header 'Authorization: Bearer {key}'"}}, status=401)
        server.enqueue_json({"error": {"message": f"upstream rejected key {key}"}}, status=503)
        server.enqueue_json({"error": {"message": f"upstream rejected key {key}"}}, status=429)
        spec = {"url": server.base_url, "name": "m", "api_key_env": "GIL_RELIABILITY_KEY"}
        task = write_task_file(tmp_path, server.base_url, chat_model=spec)
        tickets = write_jsonl(tmp_path / "tickets.jsonl", [{"id": f"t{i}", "text": f"question {i}"} for i in range(2)])
        out = tmp_path / "results.jsonl"
        result = runner.invoke(app, ["resolve-batch", str(tickets), "--out", str(out), "-t", str(task), "--json"])
        assert all(r.headers.get("authorization") == f"Bearer {key}" for r in server.requests)
    assert result.exit_code == 0, result.stderr
    assert "upstream rejected key ***" in caplog.text  # the echoes reached the retry log, redacted
    found = {f"{path} ({i})": text for path in files_under(tmp_path) for i, text in enumerate(readable_text(path))}
    found["output"] = result.stdout + result.stderr
    found["log records"] = "\n".join(record.getMessage() for record in caplog.records)
    assert_nowhere([key], found)


def test_a_key_written_into_a_task_file_by_mistake_is_not_repeated_in_the_error(tmp_path: Path) -> None:
    key = f"sk-live-{uuid.uuid4().hex}"
    task = write_task_file(
        tmp_path, "http://127.0.0.1:9/v1", chat_model={"url": "http://127.0.0.1:9/v1", "api_key": key}
    )
    result = runner.invoke(app, ["stats", "-t", str(task)])
    assert result.exit_code == 2 and f"{task}:" in result.stderr and "chat_model" in result.stderr
    assert key not in result.stderr + result.stdout


def test_a_missing_key_variable_is_named_without_any_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GIL_RELIABILITY_ABSENT", raising=False)
    spec = {"url": "http://127.0.0.1:9/v1", "name": "m", "api_key_env": "GIL_RELIABILITY_ABSENT"}
    task = write_task_file(tmp_path, "http://127.0.0.1:9/v1", chat_model=spec)
    result = runner.invoke(app, ["resolve", "hello", "-t", str(task)])
    assert result.exit_code == 2 and "GIL_RELIABILITY_ABSENT" in result.stderr


# -- loopback only ------------------------------------------------------------------------------------------


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                address, hex_port = fields[1].split(":")
                if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    raw = bytes.fromhex(address)
                    # /proc prints each 32-bit word in host (little-endian) order
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
                    found.add(socket.inet_ntop(family, words))
    return found


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.heavy
@pytest.mark.slow
def test_gil_ui_serves_prefect_on_loopback_only(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    server = subprocess.Popen(
        gil_command("ui", "--port", str(port)),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # `gil ui` runs the Prefect server as its own child: stop the whole group
    )
    try:
        deadline = time.monotonic() + 180
        while not listening_addresses(port):
            assert server.poll() is None, server.communicate()[1]
            assert time.monotonic() < deadline, "the Prefect server did not start listening"
            time.sleep(0.2)
        addresses = listening_addresses(port)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.communicate(timeout=60)
    assert addresses and all(is_loopback(address) for address in addresses), addresses


def test_the_loopback_check_sees_a_socket_bound_to_every_address() -> None:
    """The check above would catch a server listening on 0.0.0.0."""
    with socket.socket() as wide:
        wide.bind(("0.0.0.0", 0))
        wide.listen()
        port = wide.getsockname()[1]
        assert listening_addresses(port) == {"0.0.0.0"} and not is_loopback("0.0.0.0")
