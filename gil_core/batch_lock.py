"""One batch per task at a time: a batch holds its task's turn while it runs, and a second batch (a scheduled run
while a manual one is going, two ``gil resolve-batch`` on the same tickets) waits up to a bound, then skips.

On a local store the turn is a file lock (``<store>/locks/batch-<task>.lock``): the kernel lets go of it when
its process ends, however it ends, so a killed batch never blocks the next. On ``s3://`` it is a lease object
(``<store>/locks/batch-<task>.json``) written put-if-absent (``If-None-Match: *``), renewed while the batch runs
and taken over, once expired, by a write conditional on the expired lease's ETag (``If-Match``), so of two
batches that find it expired one wins. Expiry is judged by the object store's clock (the lease's
``Last-Modified`` against the ``Date`` of the reply that read it), never by this machine's. Those requests are
signed here (AWS Signature V4 over httpx): pyarrow and Polars write no conditional object.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from filelock import FileLock, Timeout

from gil_core.errors import ConfigurationError, TelemetryError
from gil_core.reviews import safe_name
from gil_core.storage import S3Settings, is_object_store, load_s3_settings, location

__all__ = ["LEASE_SECONDS", "WAIT_SECONDS", "BatchTurn", "hold_batch_turn", "hold_batch_turn_async", "skipped_batch"]

WAIT_SECONDS = 60.0
"""How long a batch waits by default for another batch of its task to finish before it skips."""
LEASE_SECONDS = 120.0
"""How long an ``s3://`` lease lasts unless renewed (every third of it while the batch runs): how long a killed
batch's turn stays taken there."""

_LOCKS = "locks"
_POLL_SECONDS = 0.5
_log = logging.getLogger("gil.batch_lock")


def skipped_batch(reason: str) -> dict[str, Any]:
    """The summary (as ``BatchReport.to_json`` has it) of a batch that did not run because another batch of its
    task held the turn: nothing resolved, ``batch_skipped`` says why."""
    return {"resolved": 0, "skipped": 0, "failed": [], "tickets": 0, "batch_skipped": reason}


@dataclass(frozen=True, slots=True)
class BatchTurn:
    """Whether this batch has its task's turn; when not, ``reason`` says who has it and how long we waited."""

    held: bool
    reason: str = ""


@contextmanager
def hold_batch_turn(
    store: str | Path,
    task: str,
    *,
    wait_s: float = WAIT_SECONDS,
    lease_s: float = LEASE_SECONDS,
    s3: S3Settings | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[BatchTurn]:
    """Take the turn of ``task`` on the store at ``store`` (a folder or ``s3://bucket/prefix``), waiting up to
    ``wait_s``; yields a ``BatchTurn`` (``held`` False once the wait is over: skip the batch, saying ``reason``)
    and lets go on leaving. ``lease_s`` is the lease of an ``s3://`` turn. ``on_wait(who)`` is called once when
    the turn is taken and the wait begins."""
    if wait_s < 0 or lease_s <= 0:
        raise ConfigurationError(f"wait_s must be ≥ 0 and lease_s > 0, got {wait_s} and {lease_s}")
    where = location(store)
    name = f"batch-{safe_name(task)}"
    if is_object_store(where):
        assert isinstance(where, str)
        lease = _Lease(f"{where}/{_LOCKS}/{name}.json", s3 or load_s3_settings(), lease_s)
        with lease.held(task, wait_s, on_wait) as turn:
            yield turn
        return
    assert isinstance(where, Path)
    with _file_turn(where / _LOCKS / f"{name}.lock", task, wait_s, on_wait) as turn:
        yield turn


def _owner(**extra: Any) -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": datetime.now(UTC).isoformat(), **extra}


def _describe(owner: dict[str, Any] | None) -> str:
    if not owner:
        return "another batch"
    return f"another batch (pid {owner.get('pid')} on {owner.get('host')}, since {owner.get('since')})"


@contextmanager
def _file_turn(path: Path, task: str, wait_s: float, on_wait: Callable[[str], None] | None) -> Iterator[BatchTurn]:
    """The turn as a file lock at ``path``. A lock that cannot be taken at all (the store's folder a file, a folder
    that cannot be written) is a ``TelemetryError`` naming the lock file and the task."""
    # filelock truncates the lock file it opens: who holds it is written beside it.
    owner_file = path.with_suffix(".owner")

    def holder() -> str:
        try:
            owner = json.loads(owner_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            owner = None
        return f"{_describe(owner if isinstance(owner, dict) else None)} of task {task!r} holds {path}"

    lock = FileLock(path, timeout=wait_s, thread_local=False)
    with _lock_errors(path, task):
        path.parent.mkdir(parents=True, exist_ok=True)
        held = _acquired(lock, 0)
    if not held:
        if on_wait is not None:
            on_wait(holder())
        with _lock_errors(path, task):
            held = _acquired(lock, wait_s)
    if not held:
        yield BatchTurn(False, f"{holder()}; waited {wait_s:g} s")
        return
    try:
        with _lock_errors(path, task):
            owner_file.write_text(json.dumps(_owner()), encoding="utf-8")
        yield BatchTurn(True)
    finally:
        lock.release()


def _acquired(lock: FileLock, timeout: float) -> bool:
    """Whether ``lock`` was taken within ``timeout`` (filelock's ``Timeout``, an ``OSError`` too, is no failure)."""
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        return False
    return True


@contextmanager
def _lock_errors(path: Path, task: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise TelemetryError(f"batch turn of task {task!r}: cannot lock {path} ({type(exc).__name__}: {exc})") from exc


class _Lease:
    """A lease object on S3, read and written with conditional requests."""

    def __init__(self, uri: str, settings: S3Settings, lease_s: float) -> None:
        parts = urlsplit(uri)
        self._bucket, self._key = parts.netloc, parts.path.lstrip("/")
        self._uri, self._settings, self._lease_s = uri, settings, lease_s
        self._token = secrets.token_hex(8)
        self._etag: str | None = None
        self._renewals = 0
        self._lost = threading.Event()
        self._changing = threading.Lock()

    @contextmanager
    def held(self, task: str, wait_s: float, on_wait: Callable[[str], None] | None) -> Iterator[BatchTurn]:
        with httpx.Client(timeout=30.0) as client:
            self._client = client

            def waiting(who: dict[str, Any] | None) -> None:
                if on_wait is not None:
                    on_wait(f"{_describe(who)} of task {task!r} holds {self._uri}")

            won, holder = self._acquire(wait_s, waiting)
            if not won:
                yield BatchTurn(False, f"{_describe(holder)} of task {task!r} holds {self._uri}; waited {wait_s:g} s")
                return
            done = threading.Event()
            renewer = threading.Thread(target=self._renew_until, args=(done,), name="gil-batch-lease", daemon=True)
            renewer.start()
            try:
                yield BatchTurn(True)
            finally:
                done.set()
                renewer.join()
                self._release()
            if self._lost.is_set():
                _log.warning(
                    "the batch lease %s expired while the batch ran: another batch may have taken it", self._uri
                )

    def _body(self, *, released: bool = False) -> bytes:
        return json.dumps(_owner(token=self._token, renewal=self._renewals, released=released)).encode()

    def _acquire(
        self, wait_s: float, on_wait: Callable[[dict[str, Any] | None], None] | None = None
    ) -> tuple[bool, dict[str, Any] | None]:
        """(True, None) once the lease is ours; else, after ``wait_s``, (False, the holder's record if it reads)."""
        deadline = time.monotonic() + wait_s
        waiting = False
        while True:
            reply = self._request("PUT", self._body(), {"If-None-Match": "*"})
            if reply.status_code == 200:
                self._etag = reply.headers.get("ETag")
                return True, None
            holder: dict[str, Any] | None = None
            if reply.status_code in (409, 412):  # 409: another conditional write of it was in flight
                current = self._request("GET")
                if current.status_code == 200:
                    holder = _json_or_none(current.content)
                    if _expired(current, holder, self._lease_s):
                        taken = self._request("PUT", self._body(), {"If-Match": current.headers.get("ETag", "")})
                        if taken.status_code == 200:
                            self._etag = taken.headers.get("ETag")
                            return True, None
                elif current.status_code != 404:  # 404: released and gone between the two requests
                    raise self._error("read", current)
            else:
                raise self._error("write", reply)
            if not waiting and on_wait is not None:
                on_wait(holder)
            waiting = True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False, holder
            time.sleep(min(_POLL_SECONDS, remaining))

    def _renew_until(self, done: threading.Event) -> None:
        while not done.wait(self._lease_s / 3):
            try:
                with self._changing:
                    self._renewals += 1
                    reply = self._request("PUT", self._body(), {"If-Match": self._etag or ""})
                    if reply.status_code == 200:
                        self._etag = reply.headers.get("ETag")
                    elif reply.status_code == 412:
                        self._lost.set()
                        return
            except (httpx.HTTPError, TelemetryError) as exc:  # tried again at the next third of the lease
                _log.warning("could not renew the batch lease %s: %s", self._uri, self._settings.redact(str(exc)))

    def _release(self) -> None:
        """Mark the lease released (a conditional write: a lease another batch took over stays theirs)."""
        with self._changing:
            try:
                self._request("PUT", self._body(released=True), {"If-Match": self._etag or ""})
            except (httpx.HTTPError, TelemetryError) as exc:  # it expires on its own
                _log.warning("could not release the batch lease %s: %s", self._uri, self._settings.redact(str(exc)))

    def _error(self, what: str, reply: httpx.Response) -> TelemetryError:
        text = self._settings.redact(reply.text[:2000])
        return TelemetryError(f"batch lease {self._uri}: could not {what} it (HTTP {reply.status_code}): {text[:300]}")

    def _request(self, method: str, body: bytes = b"", headers: dict[str, str] | None = None) -> httpx.Response:
        url, signed = _signed(self._settings, method, self._bucket, self._key, body, headers or {})
        try:
            return self._client.request(method, url, content=body, headers=signed)
        except httpx.HTTPError as exc:
            message = self._settings.redact(f"{type(exc).__name__}: {exc}")
            raise TelemetryError(f"batch lease {self._uri}: the object store did not answer ({message})") from None


def _json_or_none(content: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(content)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _expired(reply: httpx.Response, holder: dict[str, Any] | None, lease_s: float) -> bool:
    """Released, or unrenewed for ``lease_s`` by the object store's clock (its ``Date`` against the lease's
    ``Last-Modified``); a lease that does not parse is taken over as expired."""
    if holder is None or holder.get("released") is True:
        return True
    try:
        now = email.utils.parsedate_to_datetime(reply.headers["Date"])
        written = email.utils.parsedate_to_datetime(reply.headers["Last-Modified"])
    except (KeyError, TypeError, ValueError):
        return False
    return (now - written).total_seconds() >= lease_s


# -- AWS Signature Version 4, for the few conditional requests pyarrow cannot send ------------------------


def _signed(
    settings: S3Settings, method: str, bucket: str, key: str, body: bytes, headers: dict[str, str]
) -> tuple[str, dict[str, str]]:
    keys = settings._keys()  # the settings' own view of its keys (same package)
    access_key = keys.get("aws_access_key_id") or os.environ.get("AWS_ACCESS_KEY_ID")
    secret_key = keys.get("aws_secret_access_key") or os.environ.get("AWS_SECRET_ACCESS_KEY")
    token = keys.get("aws_session_token") or os.environ.get("AWS_SESSION_TOKEN")
    if not access_key or not secret_key:
        raise ConfigurationError(
            "a batch lock on s3:// signs its own requests: set GIL_S3_ACCESS_KEY_ID and GIL_S3_SECRET_ACCESS_KEY "
            "(or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
        )
    settings._checked()
    region = settings._region() or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    region = region or "us-east-1"
    path_key = quote(key, safe="/-_.~")
    if settings.endpoint:
        base = urlsplit(settings.endpoint)
        host, path = base.netloc, f"{base.path.rstrip('/')}/{quote(bucket, safe='')}/{path_key}"
        url = f"{base.scheme}://{host}{path}"
    else:
        host, path = f"{bucket}.s3.{region}.amazonaws.com", f"/{path_key}"
        url = f"https://{host}{path}"
    now = datetime.now(UTC)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(body).hexdigest()
    signed = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": stamp}
    if token:
        signed["x-amz-security-token"] = token
    signed |= {name.lower(): value for name, value in headers.items()}
    names = sorted(signed)
    canonical = "\n".join(
        [method, path, "", *(f"{name}:{signed[name].strip()}" for name in names), "", ";".join(names), payload]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    signing = f"AWS4{secret_key}".encode()
    for part in (day, region, "s3", "aws4_request"):
        signing = hmac.new(signing, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(signing, to_sign.encode(), hashlib.sha256).hexdigest()
    signed["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    del signed["host"]  # httpx sends it from the URL
    return url, signed


@asynccontextmanager
async def hold_batch_turn_async(
    store: str | Path,
    task: str,
    *,
    wait_s: float = WAIT_SECONDS,
    lease_s: float = LEASE_SECONDS,
    s3: S3Settings | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> AsyncIterator[BatchTurn]:
    """``hold_batch_turn`` for a coroutine: the wait (and the letting go) run in a worker thread, so the event
    loop goes on meanwhile."""
    turn = hold_batch_turn(store, task, wait_s=wait_s, lease_s=lease_s, s3=s3, on_wait=on_wait)
    held = await asyncio.to_thread(turn.__enter__)
    try:
        yield held
    except BaseException as exc:
        if not await asyncio.to_thread(turn.__exit__, type(exc), exc, exc.__traceback__):
            raise
    else:
        await asyncio.to_thread(turn.__exit__, None, None, None)
