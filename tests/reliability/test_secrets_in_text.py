"""Secrets in the text Gil writes: an API key a server echoes where an error message is cut short (or that the
server itself cut in half), object-store keys in a library's error, and a model URL carrying a password or a key
in its query. No run of 8 characters of any of them reaches a table, a results file, a printed line or a log
record; a model URL of another scheme is refused when the task file is read, without repeating it."""

from __future__ import annotations

import asyncio
import base64
import logging
import uuid
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from gil_core.errors import ConfigurationError, ModelUnavailableError
from gil_core.llm import OpenAICompatibleChatModel
from gil_core.storage import load_s3_settings
from gil_core.testing import ScriptedOpenAIServer
from tests.flows._support import write_task_file
from tests.reliability._support import write_jsonl
from tests.reliability.test_security import files_under, readable_text
from tests.resolver._support import Script, SupportModel

pytestmark = pytest.mark.reliability

QUOTED = 300  # characters of a server's error body an adapter error quotes
runner = CliRunner()


def runs_of(*secrets: str, length: int = 8) -> set[str]:
    return {secret[start : start + length] for secret in secrets for start in range(len(secret) - length + 1)}


def assert_no_run_of(secrets: tuple[str, ...], texts: dict[str, str]) -> None:
    runs = runs_of(*secrets)
    for where, text in texts.items():
        found = sorted(run for run in runs if run in text)
        assert not found, f"{found[:3]} (of a secret) found in {where}"


def everything_written(
    root: Path, printed: list[str], caplog: pytest.LogCaptureFixture, *, skip: tuple[Path, ...] = ()
) -> dict[str, str]:
    """Every file under ``root`` but ``skip`` (decoded as ``readable_text`` does), the printed lines, the logs."""
    files = files_under(root, skip=skip)
    texts = {f"{path} ({index})": text for path in files for index, text in enumerate(readable_text(path))}
    texts["what the commands printed"] = "\n".join(printed)
    texts["the log records"] = "\n".join(record.getMessage() for record in caplog.records)
    return texts


def gil(printed: list[str], *args: str) -> str:
    result = runner.invoke(app, list(args))
    printed.extend([result.stdout, result.stderr])
    assert result.exit_code == 0, result.stderr
    return result.stdout


def resolve_batch(root: Path, task: Path, printed: list[str], *, count: int = 3, prefix: str = "t") -> list[str | None]:
    """``gil resolve-batch`` on ``count`` tickets; each result line's failure (None where there is none)."""
    tickets = write_jsonl(
        root / f"{prefix}.jsonl", [{"id": f"{prefix}{i}", "text": f"question {i}"} for i in range(count)]
    )
    out = root / f"{prefix}-results.jsonl"
    gil(printed, "resolve-batch", str(tickets), "--out", str(out), "-t", str(task), "--json", "--concurrency", "1")
    return [yaml.safe_load(line)["failure"] for line in out.read_text(encoding="utf-8").splitlines()]


# -- keys cut in half -----------------------------------------------------------------------------------------


def test_no_run_of_eight_characters_of_an_api_key_reaches_a_table_log_or_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server echoes the key where the adapter cuts its quote of the body (the key starts 20 characters
    before the cut), in JSON error messages and plain bodies, on statuses retried and not, and once cut in half
    by the server itself. Then every file, printed line and log record (DEBUG) is searched for any 8 characters
    of the key in a row."""
    caplog.set_level(logging.DEBUG)
    key = f"sk-live-{uuid.uuid4().hex}"
    monkeypatch.setenv("GIL_RELIABILITY_KEY", key)
    pad = "x" * (QUOTED - 20)
    responder = SupportModel({}, default=Script(answers=["None of these"]))
    with ScriptedOpenAIServer(responder=responder, api_key=key) as server:
        server.enqueue_json({"error": {"message": f"{pad}{key} is not valid"}}, status=401)
        server.enqueue_json({"error": {"message": f"upstream rejected {pad}{key}"}}, status=503)
        server.enqueue_json({"error": {"message": f"upstream rejected key {key[:24]}"}}, status=429)  # cut by it
        server.enqueue_json(f"{pad}{key} rejected".encode(), status=400)
        server.enqueue_json(f"<html>{pad}{key}</html>".encode(), status=200)  # not JSON at all
        spec = {"url": server.base_url, "name": "m", "api_key_env": "GIL_RELIABILITY_KEY"}
        task = write_task_file(tmp_path, server.base_url, chat_model=spec, client={"log_path": str(tmp_path / "store")})
        printed: list[str] = []
        failures = resolve_batch(tmp_path, task, printed)
        gil(printed, "stats", "-t", str(task), "--json")
        assert server.pending == 0  # every echo was served
    assert any(failure and "***" in failure for failure in failures), failures  # echoes reached the results
    assert "***" in caplog.text  # and the retry log, redacted
    assert_no_run_of((key,), everything_written(tmp_path, printed, caplog))


def test_an_object_store_error_cut_short_leaves_no_run_of_eight_characters_of_a_key() -> None:
    """``S3Settings.describe`` keeps 300 characters of a library's error: a key straddling that cut, and keys a
    library had already cut in half, leave no 8 characters of themselves in the description."""
    key_id, secret = f"AKIA{uuid.uuid4().hex[:16].upper()}", f"{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}"
    settings = load_s3_settings(access_key_id=key_id, secret_access_key=secret, region="us-east-1")
    pad = "x" * (QUOTED - 20)
    errors = [
        OSError(f"{pad}{secret} was refused"),
        OSError(f"signature mismatch for {key_id[:12]} and {secret[:17]}"),  # both already cut by the library
        OSError(f"<?xml version='1.0'?><Error><Code>SignatureDoesNotMatch</Code><Message>{secret[5:30]}</Message>"),
    ]
    described = {f"error {index}": settings.describe(error) for index, error in enumerate(errors)}
    assert all("***" in text for text in described.values()), described
    assert_no_run_of((key_id, secret), described)


# -- URLs with secrets ----------------------------------------------------------------------------------------


def test_a_model_url_with_credentials_or_a_key_in_its_query_reaches_no_log_trace_error_or_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``http://user:password@host/v1?api_key=...``: the server still gets the user and password (basic auth) and
    the query, while errors (a 500, a reply that is not JSON, a proxy echoing the whole URL, the server gone)
    show the URL masked, and no 8 characters of the password or the key reach a file, a line or a log record
    (httpx's own request log at INFO included)."""
    caplog.set_level(logging.DEBUG)
    user, password, query_key = "gil-user", f"pw-{uuid.uuid4().hex}", f"qk-{uuid.uuid4().hex}"
    responder = SupportModel({}, default=Script(answers=["None of these"]))
    printed: list[str] = []
    with ScriptedOpenAIServer(responder=responder) as server:
        url = server.base_url.replace("http://", f"http://{user}:{password}@") + f"?api_key={query_key}"
        server.enqueue_failure("500")
        server.enqueue_failure("garbage")
        server.enqueue_json({"error": {"message": f"no route for {url}"}}, status=404)
        task = write_task_file(tmp_path, url, client={"log_path": str(tmp_path / "store")})
        failures = resolve_batch(tmp_path, task, printed)
        basic = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        assert server.requests and all(
            (r.headers.get("authorization"), r.query) == (basic, f"api_key={query_key}") for r in server.requests
        )
        masked = server.base_url.replace("http://", "http://***@") + "/chat/completions?api_key=***"
    gil(printed, "stats", "-t", str(task), "--json")

    async def gone() -> str:  # the server is closed: the connection is refused
        async with OpenAICompatibleChatModel(url, "m", max_attempts=1) as chat:
            with pytest.raises(ModelUnavailableError) as caught:
                await chat.complete([{"role": "user", "content": "hello"}], max_tokens=1)
        return str(caught.value)

    refused = asyncio.run(gone())
    printed.append(refused)
    assert refused.startswith(f"{masked}: cannot reach the server")
    assert any(failure and masked in failure for failure in failures), failures
    assert "HTTP Request: POST" in caplog.text  # httpx's request log was captured, masked
    written = everything_written(tmp_path, printed, caplog, skip=(task,))  # the task file is where it was written
    assert_no_run_of((password, query_key), written)


SCHEMES = {
    "ftp with a password": ("chat_model", "ftp://user:pw-not-to-repeat@127.0.0.1/v1"),
    "file": ("embedding_model", "file:///etc/passwd-not-to-repeat"),
    "no scheme": ("chat_model", "localhost:8080/v1-not-to-repeat"),
    "unix socket": ("fallback_chat_model", "unix:///run/llama-not-to-repeat.sock"),
    "no host": ("chat_model", "http:///v1-not-to-repeat"),
}


@pytest.mark.parametrize("case", list(SCHEMES))
def test_a_model_url_that_is_not_http_is_refused_when_the_task_file_is_read(case: str, tmp_path: Path) -> None:
    key, url = SCHEMES[case]
    task = write_task_file(tmp_path, "http://127.0.0.1:9/v1", **{key: {"url": url, "name": "m"}})
    line = next(n for n, text in enumerate(task.read_text().splitlines(), 1) if text.startswith(f"{key}:"))
    result = runner.invoke(app, ["stats", "-t", str(task)])
    assert result.exit_code == 2
    (message,) = result.stderr.strip().splitlines()
    assert message.startswith(f"error: {task}:{line}: {key}: url: a model ")
    assert "not-to-repeat" not in result.stderr + result.stdout
    with pytest.raises(ConfigurationError) as caught:
        OpenAICompatibleChatModel(url, "m")  # the library refuses it as well, without repeating it
    assert "not-to-repeat" not in str(caught.value)
