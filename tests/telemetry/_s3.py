"""What the object-storage tests share: moto's S3 server on loopback, a fresh bucket per test, settings that
reach it, a switch that makes the server check keys, and a few telemetry rows to write."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from moto.server import ThreadedMotoServer

from gil_core.storage import S3Settings, load_s3_settings
from gil_core.telemetry import CallRecord, TelemetryStore, TraceRecord

# Distinctive values, so a test can search any text for them.
ACCESS_KEY_ID = "AKIAGILTESTKEY7Q3ZX9"
SECRET_ACCESS_KEY = "gil-test-secret-Xq7pW2vR9tLm4Kz8"
AT = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


@contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 and a free port, in this process; yields its endpoint URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def serve_s3() -> Iterator[str]:
    """The body of a module-scoped fixture: ``s3_endpoint = pytest.fixture(scope="module")(serve_s3)``."""
    with s3_server() as url:
        yield url


def settings_for(s3_endpoint: str) -> S3Settings:
    """The body of a fixture over ``s3_endpoint``: ``s3 = pytest.fixture(settings_for)``."""
    return s3_settings(s3_endpoint)


def s3_settings(endpoint: str, **overrides: Any) -> S3Settings:
    values: dict[str, Any] = {
        "endpoint": endpoint,
        "access_key_id": ACCESS_KEY_ID,
        "secret_access_key": SECRET_ACCESS_KEY,
        "region": "us-east-1",
        "allow_http": True,
    }
    return load_s3_settings(**(values | overrides))


def environment_for(endpoint: str) -> dict[str, str]:
    """The ``GIL_S3_*`` variables that make the settings ``s3_settings(endpoint)`` makes: what a process, and the
    worker processes it starts, read theirs from."""
    return {
        "GIL_S3_ENDPOINT": endpoint,
        "GIL_S3_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "GIL_S3_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        "GIL_S3_REGION": "us-east-1",
        "GIL_S3_ALLOW_HTTP": "true",
    }


def bucket_in_environment(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The body of a fixture for tests that go through the task file or the ``gil`` command: this process's
    ``GIL_S3_*`` point at the server (whatever opens a store reads them), and a fresh bucket's name is returned.
    ``bucket = pytest.fixture(bucket_in_environment)``."""
    for name, value in environment_for(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    return new_bucket(s3_endpoint)


def assert_no_key(*texts: str) -> None:
    """Neither test key appears in any of ``texts``."""
    for text in texts:
        assert ACCESS_KEY_ID not in text and SECRET_ACCESS_KEY not in text, text[:2000]


def new_bucket(endpoint: str) -> str:
    """Create a bucket with a fresh name (tests share the server's state) and return the name."""
    from pyarrow import fs

    name = f"gil-{secrets.token_hex(6)}"
    host = endpoint.removeprefix("http://")
    creator = fs.S3FileSystem(
        access_key="creator", secret_key="creator", endpoint_override=host, scheme="http", region="us-east-1",
        allow_bucket_creation=True,
    )  # fmt: skip
    creator.create_dir(name)
    return name


def objects(settings: S3Settings, bucket: str, prefix: str) -> list[str]:
    """Every object under ``bucket/prefix``, as paths relative to it."""
    from pyarrow import fs

    found = settings.filesystem(bucket).get_file_info(fs.FileSelector(f"{bucket}/{prefix}", recursive=True))
    return sorted(info.path.removeprefix(f"{bucket}/{prefix}/") for info in found if info.type == fs.FileType.File)


@contextmanager
def keys_checked() -> Iterator[None]:
    """From now on the server refuses a request whose key it does not know (moto knows none); restored after."""
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin

    before = settings.INITIAL_NO_AUTH_ACTION_COUNT
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    ActionAuthenticatorMixin.request_count = 0
    try:
        yield
    finally:
        settings.INITIAL_NO_AUTH_ACTION_COUNT = before


# -- rows a test writes to a store ----------------------------------------------------------------------


def trace(number: int, verdict: str | None = None, *, mode: str = "fallback") -> TraceRecord:
    return TraceRecord(
        trace_id=f"t{number}",
        created_at=AT + timedelta(seconds=number),
        task="support",
        state=f"request {number}",
        mode=mode,
        feedback_verdict=verdict,
        energy=float(number),
    )


def judge_call(number: int) -> CallRecord:
    return CallRecord(
        call_id=f"c{number}", trace_id=f"t{number}", created_at=AT, role="judge", model="m", prompt_tokens=100,
        completion_tokens=1, energy=2.0,
    )  # fmt: skip


def fill(store: TelemetryStore) -> None:
    """Six traces with their calls, then feedback on two of them (superseding rows), each its own append."""
    for number in range(6):
        store.record_trace(trace(number, mode="memory" if number % 3 == 0 else "fallback"), [judge_call(number)])
    store.record_trace(trace(1, "correct"))
    store.record_trace(trace(3, "wrong", mode="memory"))


def iam_keys(endpoint: str, user: str, actions: list[str]) -> dict[str, str]:
    """An IAM user on the server allowed only ``actions`` (e.g. ``["s3:GetObject", "s3:ListBucket"]``), and its
    keys as ``s3_settings`` overrides. Made while the server checks no keys; it refuses other actions to these
    keys once ``keys_checked`` is on."""
    import json

    import boto3

    iam = boto3.client(
        "iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="admin", aws_secret_access_key="admin"
    )
    name = f"{user}-{secrets.token_hex(4)}"
    iam.create_user(UserName=name)
    document = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
    policy = iam.create_policy(PolicyName=f"{name}-policy", PolicyDocument=json.dumps(document))["Policy"]["Arn"]
    iam.attach_user_policy(UserName=name, PolicyArn=policy)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {"access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"]}
